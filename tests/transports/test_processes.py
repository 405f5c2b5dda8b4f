"""Two transports in two processes over tcp loopback: request/reply, a peer killed by
SIGKILL while messages are parked, and a frozen (SIGSTOP) peer found by the heartbeat."""

from __future__ import annotations

import signal
import time

import pytest

import transports as t

from .helpers import FAST, WAIT, Owner, child, transport

#: a parent window of 16 KiB: four 4 KiB messages fit, the rest park
SMALL = t.TransportConfig(credit_window=16 * 1024, heartbeat_interval=0.1, heartbeat_timeout=0.6)


def test_requests_to_another_process_come_back_in_order() -> None:
    owner = Owner()
    with child("echo") as (_, endpoints), transport(b"P", owner) as parent:
        parent.connect(b"CHILD", endpoints)
        assert owner.wait(lambda: t.PeerEventKind.READY in owner.event_kinds(b"CHILD"))
        for i in range(200):
            result = parent.submit_request(b"CHILD", i, [b"%d" % i])
            if result.admitted is not None:
                assert result.admitted.result(WAIT) is None
        assert owner.wait(lambda: len(owner.of_kind(t.InboundKind.REPLY)) == 200)
        replies = owner.of_kind(t.InboundKind.REPLY)
        assert [(r.route_id, list(r.frames)) for r in replies] == [
            (i, [b"%d" % i]) for i in range(200)
        ]
        assert parent.peer_statistics(b"CHILD").slots_in_use == 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_lost_peer_fails_every_parked_future_with_peer_lost_within_the_timeout(
    sig: signal.Signals,
) -> None:
    owner = Owner()
    with child("hold") as (proc, endpoints), transport(b"P", owner, SMALL) as parent:
        parent.connect(b"CHILD", endpoints)
        assert owner.wait(lambda: t.PeerEventKind.READY in owner.event_kinds(b"CHILD"))
        results = [parent.submit(b"CHILD", [b"x" * 4096]) for _ in range(20)]
        parked = [r.admitted for r in results if r.admitted is not None]
        assert len(parked) == 16
        proc.send_signal(sig)
        start = time.monotonic()
        # Frozen, it went silent (it may come back); killed, its connections closed.
        silent = sig is signal.SIGSTOP
        for future in parked:
            error = future.exception(SMALL.heartbeat_timeout + WAIT)
            assert isinstance(error, t.PeerLost)
            assert error.silent is silent
        elapsed = time.monotonic() - start
        # silence for the timeout, found at the next heartbeat tick (a loaded machine
        # may add scheduling delay, never a second timeout)
        assert elapsed < 2 * SMALL.heartbeat_timeout + 0.5
        assert owner.wait(lambda: t.PeerEventKind.LOST in owner.event_kinds(b"CHILD"))
        lost = [e for e in owner.events if e.kind is t.PeerEventKind.LOST]
        assert [e.silent for e in lost] == [silent], lost
        stats = parent.statistics()
        assert (stats.lost_peers, stats.peers, stats.parked_messages) == (1, 0, 0)
        with pytest.raises(t.UnknownPeer):
            parent.submit(b"CHILD", [b"after"])


def test_a_connect_to_nothing_is_lost_after_the_hello_timeout() -> None:
    owner = Owner()
    with transport(b"P", owner) as parent:
        # a port nobody listens on (bound and closed by a throwaway transport)
        with transport(b"Q", Owner()) as gone:
            endpoints = gone.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        parent.connect(b"Q", endpoints)
        result = parent.submit(b"Q", [b"x"])
        assert result.status is t.SubmitStatus.OK  # admitted: frames wait in libzmq
        assert owner.wait(
            lambda: t.PeerEventKind.LOST in owner.event_kinds(b"Q"),
            FAST.heartbeat_timeout + WAIT,
        )
        assert "no hello answered" in owner.events[-1].reason
        assert owner.events[-1].silent is False  # never heard from: not a silent peer


def test_a_frame_above_the_hard_cap_drops_the_connection_and_counts_as_peer_loss() -> None:
    sender = t.TransportConfig(
        max_message_size=64 * 1024, heartbeat_interval=0.1, heartbeat_timeout=0.6
    )
    receiver = t.TransportConfig(
        max_message_size=1024, hard_message_cap=2048, heartbeat_interval=0.1, heartbeat_timeout=0.6
    )
    a_owner, b_owner = Owner(), Owner()
    with transport(b"A", a_owner, sender) as a, transport(b"B", b_owner, receiver) as b:
        a.connect(b"B", b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
        assert a_owner.wait(lambda: t.PeerEventKind.READY in a_owner.event_kinds(b"B"))
        assert t.PeerEventKind.CONNECTED in a_owner.event_kinds(b"B")  # from the monitor
        assert a.submit(b"B", [b"x" * 8192]).status is t.SubmitStatus.OK
        assert a_owner.wait(lambda: t.PeerEventKind.LOST in a_owner.event_kinds(b"B"))
        assert b_owner.wait(
            lambda: t.PeerEventKind.LOST in b_owner.event_kinds(b"A"),
            receiver.heartbeat_timeout + WAIT,
        )
        assert b_owner.records == []  # the oversize frame never reached the owner
        assert (a.statistics().lost_peers, b.statistics().lost_peers) == (1, 1)
