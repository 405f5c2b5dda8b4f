"""The owner's controls of credit and reading: `set_peer_window` (a sender sends a peer at
most the window that peer grants) and `read_budget` (a receiver reads at most what its
owner can admit)."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Sequence

import pytest

import transports as t

from .helpers import FAST, WAIT, Owner, pair, transport, wait_until


def test_a_smaller_peer_window_parks_sooner_and_a_larger_one_admits(
    tmp_path: pathlib.Path,
) -> None:
    holder = Owner(auto_release=False)
    with pair("tcp", tmp_path, b_owner=holder) as (a, _, _b, _bo):
        a.set_peer_window(b"B", 1024)
        assert a.peer_statistics(b"B").credit_window == 1024
        results = [a.submit(b"B", [bytes(300)]) for _ in range(4)]
        # 300 B each (above the 256 B minimum charge): three fit in 1,024, the fourth parks.
        assert [r.status for r in results] == [t.SubmitStatus.OK] * 3 + [
            t.SubmitStatus.BACKPRESSURED
        ]
        parked = results[3].admitted
        assert parked is not None
        assert not parked.done()
        a.set_peer_window(b"B", 4096)  # more room: what is parked is admitted now
        assert parked.result(5) is None
        assert a.peer_statistics(b"B").credit_in_use == 1200


@pytest.mark.parametrize("nbytes", [0, 255, 2**40, True, 1.5])
def test_a_window_outside_min_charge_to_the_configured_window_is_refused(
    tmp_path: pathlib.Path, nbytes: object
) -> None:
    with pair("tcp", tmp_path) as (a, _, _b, _bo):
        with pytest.raises(t.TransportUsageError):
            a.set_peer_window(b"B", nbytes)  # type: ignore[arg-type]
        with pytest.raises(t.UnknownPeer):
            a.set_peer_window(b"nobody", 1024)


def test_the_read_budget_caps_what_one_wake_reads(tmp_path: pathlib.Path) -> None:
    """The owner's free permits bound the application records read; at 0 it pauses, and
    RUNNING lets the rest in."""
    got: list[t.Inbound] = []
    changed = threading.Condition()
    limit = [3]
    holder: list[t.Transport] = []

    def on_receive(batch: Sequence[t.Inbound]) -> None:
        with changed:
            got.extend(batch)
            changed.notify_all()
        if len(got) >= limit[0]:
            holder[0].set_flow(t.FlowState.PAUSED)

    b = t.Transport(b"B", on_receive, config=FAST, read_budget=lambda: limit[0] - len(got))
    holder.append(b)
    owner = Owner()
    try:
        with transport(b"A", owner) as a:
            a.connect(b"B", b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
            for i in range(10):
                a.submit(b"B", [b"%d" % i])
            with changed:
                assert changed.wait_for(lambda: len(got) >= 3, WAIT)
            # Paused at the budget: nothing more is read (the PAUSED frame also parks
            # A's later sends); a bounded look finds exactly 3.
            assert not owner.wait(lambda: len(got) > 3, 0.3)
            assert [r.frames[0] for r in got] == [b"0", b"1", b"2"]
            limit[0] = 100
            b.set_flow(t.FlowState.RUNNING)
            with changed:
                assert changed.wait_for(lambda: len(got) == 10, WAIT)
            assert [r.frames[0] for r in got] == [b"%d" % i for i in range(10)]
    finally:
        b.close()


def test_a_notice_goes_on_the_completion_connection_while_the_peer_is_paused(
    tmp_path: pathlib.Path,
) -> None:
    with pair("tcp", tmp_path) as (a, _, b, b_owner):
        b.set_flow(t.FlowState.PAUSED)
        assert wait_until(lambda: a.peer_statistics(b"B").paused_by_peer)
        parked = a.submit(b"B", [b"message"])  # a message waits for RUNNING
        assert parked.status is t.SubmitStatus.BACKPRESSURED
        a.notify(b"B", [b"notice"])  # a notice does not
        assert b_owner.wait(lambda: bool(b_owner.of_kind(t.InboundKind.NOTICE)))
        [notice] = b_owner.of_kind(t.InboundKind.NOTICE)
        assert (notice.frames, notice.charge, notice.route_id) == ([b"notice"], 0, 0)
        assert b_owner.of_kind(t.InboundKind.MESSAGE) == []
        assert a.peer_statistics(b"B").slots_in_use == 0
        with pytest.raises(t.UnknownPeer):
            a.notify(b"nobody", [b"x"])


def test_a_withdrawn_message_is_never_sent_and_what_waits_behind_it_goes(
    tmp_path: pathlib.Path,
) -> None:
    holder = Owner(auto_release=False, replies=False)
    with pair("tcp", tmp_path, b_owner=holder) as (a, _, _b, _bo):
        a.set_peer_window(b"B", 1100)
        first = [a.submit(b"B", [bytes(400)]) for _ in range(2)]  # 800 of 1,100
        request = a.submit_request(b"B", 7, [b"r" * 400])  # does not fit: parked
        behind = a.submit(b"B", [bytes(100)])  # parked behind it (FIFO)
        assert [r.status for r in first] == [t.SubmitStatus.OK] * 2
        assert request.admitted is not None
        assert behind.admitted is not None
        assert a.peer_statistics(b"B").slots_in_use == 1
        assert a.withdraw(b"B", request.admitted) is True
        with pytest.raises(t.Withdrawn):
            request.admitted.result(1)
        assert behind.admitted.result(WAIT) is None  # its 256 (the minimum charge) fit now
        stats = a.peer_statistics(b"B")
        assert (stats.slots_in_use, stats.parked_messages) == (0, 0)
        assert a.withdraw(b"B", behind.admitted) is False  # it went already
        assert holder.wait(lambda: len(holder.records) == 3)
        assert all(r.kind is t.InboundKind.MESSAGE for r in holder.records)


def test_withdraw_matching_takes_back_the_matching_parked_messages_in_order(
    tmp_path: pathlib.Path,
) -> None:
    """What the mesh does when a target says FULL: its parked one-ways come back (never
    sent, their futures pending), in order; what waited behind them goes."""
    holder = Owner(auto_release=False, replies=False)
    with pair("tcp", tmp_path, b_owner=holder) as (a, _, b, _bo):
        a.set_peer_window(b"B", 1024)
        sent = [a.submit(b"B", [b"x" + bytes(300)]) for _ in range(3)]  # 903 of 1,024
        assert [r.status for r in sent] == [t.SubmitStatus.OK] * 3
        parked = [a.submit(b"B", [tag + bytes(300)]) for tag in (b"x", b"y", b"x", b"y")]
        request = a.submit_request(b"B", 9, [b"x" + bytes(10)])  # a request is never taken
        futures = [r.admitted for r in parked]
        assert all(f is not None and not f.done() for f in futures)
        taken = a.withdraw_matching(b"B", lambda frames: frames[0][:1] == b"x")
        assert [(tuple(frames), future) for frames, future in taken] == [
            ((b"x" + bytes(300),), futures[0]),
            ((b"x" + bytes(300),), futures[2]),
        ]
        assert not any(f is not None and f.done() for f in (futures[0], futures[2]))
        stats = a.peer_statistics(b"B")
        assert stats.parked_messages == 3  # the two y's and the request
        assert stats.parked_bytes == 2 * 301 + 256
        assert a.withdraw_matching(b"nobody", lambda frames: True) == []
        # B releases the three sent: the y's and the request go, the x's never do.
        assert holder.wait(lambda: len(holder.records) == 3)
        for record in list(holder.records):
            b.release(record.peer, record.charge)
        for future in (futures[1], futures[3], request.admitted):
            assert future is not None
            assert future.result(WAIT) is None
        assert holder.wait(lambda: len(holder.records) == 6)
        assert [r.frames[0][:1] for r in holder.records] == [b"x"] * 3 + [b"y", b"y", b"x"]
        assert not any(f is not None and f.done() for f in (futures[0], futures[2]))
