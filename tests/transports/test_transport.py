"""Two transports in one process, over tcp and ipc on loopback: messages, requests and
replies, the typed errors, close with parked messages, slots, PAUSED/RUNNING, and
malformed frames from a raw pyzmq socket."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import struct
import threading
import time

import pytest
import zmq

import transports as t
from transports._wire import VERSION, Envelope, Kind, encode

from .helpers import FAST, WAIT, Owner, pair, transport, wait_until

KINDS = ["tcp", "ipc"]


@pytest.mark.parametrize("kind", KINDS)
def test_messages_and_a_request_reach_the_peer_and_the_reply_comes_back(
    kind: str, tmp_path: pathlib.Path
) -> None:
    with pair(kind, tmp_path) as (a, a_owner, b, b_owner):
        assert a.submit(b"B", [b"one", b"two"]).status is t.SubmitStatus.OK
        assert a.submit_request(b"B", 2**64 - 1, [b"q"]).status is t.SubmitStatus.OK
        assert b_owner.wait(lambda: len(b_owner.records) == 2)
        message, request = b_owner.records
        assert (message.kind, list(message.frames), message.peer) == (
            t.InboundKind.MESSAGE,
            [b"one", b"two"],
            b"A",
        )
        assert (request.kind, request.route_id) == (t.InboundKind.REQUEST, 2**64 - 1)
        assert message.charge == FAST.min_charge  # small messages pay the minimum
        assert a_owner.wait(lambda: len(a_owner.of_kind(t.InboundKind.REPLY)) == 1)
        reply = a_owner.of_kind(t.InboundKind.REPLY)[0]
        assert (reply.route_id, list(reply.frames), reply.charge) == (2**64 - 1, [b"re:q"], 0)
        # credit returns and the slot frees: the accounting is back to zero
        assert wait_until(lambda: a.peer_statistics(b"B").credit_in_use == 0)
        stats = a.peer_statistics(b"B")
        assert (stats.slots_in_use, stats.parked_messages, stats.ready) == (0, 0, True)
        # the bound side can send to the peer that connected to it, too
        assert b.submit(b"A", [b"back"]).status is t.SubmitStatus.OK
        assert a_owner.wait(lambda: len(a_owner.of_kind(t.InboundKind.MESSAGE)) == 1)


def test_submit_to_an_unknown_peer_is_an_error_not_a_silent_drop(tmp_path: pathlib.Path) -> None:
    with pair("tcp", tmp_path) as (a, _, b, _b):
        with pytest.raises(t.UnknownPeer):
            a.submit(b"nobody", [b"x"])
        with pytest.raises(t.UnknownPeer):
            a.submit_request(b"nobody", 1, [b"x"])
        with pytest.raises(t.UnknownPeer):
            b.reply(b"nobody", 1, [b"x"])
        with pytest.raises(t.UnknownPeer):
            a.peer_statistics(b"nobody")
        assert a.statistics().parked_messages == 0


def test_bad_arguments_are_usage_errors_and_nothing_is_accepted(tmp_path: pathlib.Path) -> None:
    with pair("tcp", tmp_path) as (a, _, b, _b):
        with pytest.raises(t.PayloadTooLarge):
            a.submit(b"B", [b"x" * (FAST.max_message_size + 1)])
        with pytest.raises(t.TransportUsageError):
            a.submit(b"B", b"one frame")  # type: ignore[arg-type]
        with pytest.raises(t.TransportUsageError):
            a.submit(b"B", ["text"])  # type: ignore[list-item]
        with pytest.raises(t.TransportUsageError):
            a.submit_request(b"B", -1, [b"x"])
        with pytest.raises(t.TransportUsageError):
            a.set_flow("PAUSED")  # type: ignore[arg-type]
        with pytest.raises(t.TransportUsageError):
            a.connect(b"B", t.Endpoints("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"))
        with pytest.raises(t.InvalidRelease):
            b.release(b"A", 1)  # nothing delivered yet
        with pytest.raises(t.InvalidRelease):
            b.release(b"A", -1)
        assert a.statistics().credit_in_use == 0
        assert a.peer_statistics(b"B").slots_in_use == 0
    with pytest.raises(t.TransportUsageError):
        t.Transport(b"", Owner().on_receive)


def test_close_fails_each_parked_message_with_closed_and_joins_the_thread(
    tmp_path: pathlib.Path,
) -> None:
    config = t.TransportConfig(credit_window=4096, heartbeat_interval=0.1, heartbeat_timeout=5)
    holder = Owner(auto_release=False)
    with pair("tcp", tmp_path, a_config=config, b_owner=holder) as (a, _, _b, _bo):
        results = [a.submit(b"B", [b"x" * 1000]) for _ in range(10)]
        parked = [r.admitted for r in results if r.admitted is not None]
        assert len(parked) == 6  # 4 x 1000 bytes fit a 4096-byte window
        assert a.statistics().parked_messages == 6
        io_thread = a._io
        a.close()
        assert not io_thread.is_alive()
        for future in parked:
            assert isinstance(future.exception(WAIT), t.Closed)
        with pytest.raises(t.Closed):
            a.submit(b"B", [b"x"])
        with pytest.raises(t.Closed):
            a.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        a.close()  # idempotent


def test_a_request_with_no_free_slot_gets_no_wait_token_until_a_reply_frees_one(
    tmp_path: pathlib.Path,
) -> None:
    config = t.TransportConfig(slots=2, heartbeat_interval=0.1, heartbeat_timeout=5)
    silent = Owner(replies=False)
    with pair("tcp", tmp_path, a_config=config, b_owner=silent) as (a, a_owner, b, _):
        assert a.submit_request(b"B", 1, [b"q1"]).status is t.SubmitStatus.OK
        assert a.submit_request(b"B", 2, [b"q2"]).status is t.SubmitStatus.OK
        refused = a.submit_request(b"B", 3, [b"q3"])
        assert refused.no_slot
        assert a.peer_statistics(b"B").slots_in_use == 2
        assert a.submit(b"B", [b"one-way needs no slot"]).status is t.SubmitStatus.OK
        assert silent.wait(lambda: len(silent.of_kind(t.InboundKind.REQUEST)) == 2)
        b.reply(b"A", 1, [b"r1"])
        assert a_owner.wait(lambda: len(a_owner.of_kind(t.InboundKind.REPLY)) == 1)
        assert a.peer_statistics(b"B").slots_in_use == 1
        assert a.submit_request(b"B", 3, [b"q3"]).status is t.SubmitStatus.OK


def test_paused_stops_delivery_replies_keep_flowing_and_running_resumes(
    tmp_path: pathlib.Path,
) -> None:
    silent = Owner(replies=False)
    with pair("tcp", tmp_path, b_owner=silent) as (a, a_owner, b, _):
        assert a.submit_request(b"B", 5, [b"before"]).status is t.SubmitStatus.OK
        assert silent.wait(lambda: len(silent.records) == 1)
        b.set_flow(t.FlowState.PAUSED)
        b.set_flow(t.FlowState.PAUSED)  # no change: never repeated
        assert wait_until(lambda: a.peer_statistics(b"B").paused_by_peer)
        parked = a.submit(b"B", [b"while paused"])
        assert parked.status is t.SubmitStatus.BACKPRESSURED
        assert parked.admitted is not None
        # the completion connection still carries the reply
        b.reply(b"A", 5, [b"reply while paused"])
        assert a_owner.wait(lambda: len(a_owner.of_kind(t.InboundKind.REPLY)) == 1)
        # heartbeats have crossed both ways, and still nothing was delivered
        seen = b.peer_statistics(b"A").received_frames
        assert wait_until(lambda: b.peer_statistics(b"A").received_frames >= seen + 2)
        assert not parked.admitted.done()
        assert len(silent.records) == 1
        assert b.statistics().flow is t.FlowState.PAUSED
        b.set_flow(t.FlowState.RUNNING)
        assert parked.admitted.result(WAIT) is None
        assert silent.wait(lambda: len(silent.records) == 2)
        assert list(silent.records[1].frames) == [b"while paused"]


def test_paused_before_the_peer_connects_reaches_it_with_the_hello(
    tmp_path: pathlib.Path,
) -> None:
    a_owner, b_owner = Owner(), Owner()
    with transport(b"A", a_owner) as a, transport(b"B", b_owner) as b:
        b.set_flow(t.FlowState.PAUSED)
        a.connect(b"B", b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
        assert wait_until(lambda: a.peer_statistics(b"B").paused_by_peer)


def test_the_bound_side_stops_reading_while_paused_so_frames_wait_in_libzmq(
    tmp_path: pathlib.Path,
) -> None:
    owner = Owner()
    with transport(b"B", owner) as b, zmq.Context() as ctx:
        endpoints = b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        b.set_flow(t.FlowState.PAUSED)
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.ROUTING_ID, b"R")
        try:
            raw.connect(endpoints.application)
            raw.send_multipart(encode(Kind.HELLO))
            raw.send_multipart(encode(Kind.MESSAGE, credit=256, frames=[b"held"]))
            received = b.statistics().received_frames
            b.set_flow(t.FlowState.RUNNING)
            assert owner.wait(lambda: len(owner.records) == 1)
            assert received == 0  # nothing had been read while paused
        finally:
            raw.close(0)


def test_malformed_frames_from_a_raw_socket_are_counted_drops_with_a_log_line(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="transports")
    head, body = encode(Kind.MESSAGE, credit=256, frames=[b"no hello first"])
    bad_frames = [
        [b"garbage"],  # one frame: no body
        [b"garbage", b""],  # not a head
        [head[:10], body],  # truncated
        [struct.pack("!BBHIQQI", VERSION + 1, 3, 1, 0, 0, 0, 1), b"x"],  # wrong version
        [head, body, b"a third frame"],
        [head, body],  # no hello first
        [head + struct.pack("!BBHIQQ", VERSION, 99, 0, 0, 0, 0), body],  # a bad second record
    ]
    with pair("tcp", tmp_path) as (a, _, b, b_owner), zmq.Context() as ctx:
        endpoints = b.peer_statistics(b"A") and b.statistics()
        assert endpoints.peers == 1
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        try:
            app = b._io.app.getsockopt(zmq.LAST_ENDPOINT)
            assert isinstance(app, bytes)
            raw.connect(app.decode())
            for frames in bad_frames:
                raw.send_multipart(frames)
            raw.send(b"")  # an empty message: a ROUTER delivers [id, b""]
            assert wait_until(lambda: b.statistics().dropped_frames == len(bad_frames) + 1)
            # one line per reason a second: the empty message has the first one's reason
            lines = [r.getMessage() for r in caplog.records if "dropped a frame" in r.getMessage()]
            assert len([line for line in lines if "more like this" not in line]) == 7
            # the I/O thread is alive and the real peer is served as before
            assert a.submit(b"B", [b"still fine"]).status is t.SubmitStatus.OK
            assert b_owner.wait(lambda: len(b_owner.records) == 1)
        finally:
            raw.close(0)
    # at close, the line held back is counted
    held = [r.getMessage() for r in caplog.records if "1 more like this" in r.getMessage()]
    assert len(held) == 1
    assert "no body after its head" in held[0]


def test_a_payload_above_the_receivers_limit_is_rejected_with_its_route_id(
    tmp_path: pathlib.Path,
) -> None:
    big = t.TransportConfig(max_message_size=64 * 1024, heartbeat_interval=0.1, heartbeat_timeout=5)
    small = t.TransportConfig(max_message_size=1024, heartbeat_interval=0.1, heartbeat_timeout=5)
    with pair("tcp", tmp_path, a_config=big, b_config=small) as (a, _, _b, b_owner):
        assert a.submit_request(b"B", 42, [b"x" * 4096]).status is t.SubmitStatus.OK
        assert b_owner.wait(lambda: len(b_owner.records) == 1)
        record = b_owner.records[0]
        assert isinstance(record.rejected, t.PayloadTooLarge)
        assert (record.route_id, record.frames, record.charge) == (42, (), 0)
        # its credit went straight back, and the error reply found its route
        assert wait_until(lambda: a.peer_statistics(b"B").slots_in_use == 0)
        assert wait_until(lambda: a.peer_statistics(b"B").credit_in_use == 0)


def test_batches_hold_at_most_the_configured_number_of_records(tmp_path: pathlib.Path) -> None:
    config = t.TransportConfig(batch=8, heartbeat_interval=0.1, heartbeat_timeout=5)
    gate = threading.Event()
    owner = Owner()
    first = owner.on_receive

    def slow_first(batch: list[t.Inbound]) -> None:
        first(batch)
        gate.wait(WAIT)  # hold the I/O thread so that frames pile up behind it

    owner.on_receive = slow_first  # type: ignore[method-assign]
    with pair("tcp", tmp_path, b_config=config, b_owner=owner) as (a, _, _b, _bo):
        for i in range(100):
            assert a.submit(b"B", [b"%d" % i]).status is t.SubmitStatus.OK
        assert owner.wait(lambda: len(owner.records) >= 1)
        gate.set()
        assert owner.wait(lambda: len(owner.records) == 100)
        assert max(owner.batches) == 8
        assert [bytes(r.frames[0]) for r in owner.records] == [b"%d" % i for i in range(100)]


def test_a_peer_that_restarts_under_its_name_is_lost_then_ready_again(
    tmp_path: pathlib.Path,
) -> None:
    b_owner = Owner(auto_release=False)
    with transport(b"B", b_owner) as b:
        endpoints = b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        for incarnation in range(2):
            owner = Owner()
            with transport(b"A", owner) as a:
                a.connect(b"B", endpoints)
                assert owner.wait(lambda o=owner: t.PeerEventKind.READY in o.event_kinds(b"B"))
                assert a.submit(b"B", [b"from %d" % incarnation]).status is t.SubmitStatus.OK
                assert b_owner.wait(lambda n=incarnation: len(b_owner.records) == n + 1)
        assert b_owner.event_kinds(b"A")[:2] == [t.PeerEventKind.CONNECTED, t.PeerEventKind.READY]
        assert t.PeerEventKind.LOST in b_owner.event_kinds(b"A")
        assert b_owner.event_kinds(b"A").count(t.PeerEventKind.READY) == 2
        assert [list(r.frames) for r in b_owner.records] == [[b"from 0"], [b"from 1"]]


def test_a_flow_frame_of_an_older_epoch_is_stale_and_ignored(tmp_path: pathlib.Path) -> None:
    with pair("tcp", tmp_path) as (a, _, b, _b):
        b.set_flow(t.FlowState.PAUSED)  # epoch 1
        assert wait_until(lambda: a.peer_statistics(b"B").paused_by_peer)
        b.set_flow(t.FlowState.RUNNING)  # epoch 2
        assert wait_until(lambda: not a.peer_statistics(b"B").paused_by_peer)
        # a late PAUSED of epoch 1, as the I/O thread would receive it
        stale = Envelope(Kind.FLOW, t.FlowState.PAUSED.value, 1, 0)
        with a._core.lock:
            state = a._core.peers[b"B"]
            a._io.receiver.completion_locked(state, stale, [], [], 0.0)
            assert not state.paused_by_peer
            assert state.flow_epoch_seen == 2


def test_statistics_are_frozen_snapshots_that_count_the_traffic(tmp_path: pathlib.Path) -> None:
    with pair("tcp", tmp_path) as (a, _, b, b_owner):
        for i in range(10):
            assert a.submit(b"B", [b"%d" % i]).status is t.SubmitStatus.OK
        assert b_owner.wait(lambda: len(b_owner.records) == 10)
        theirs = b.peer_statistics(b"A")
        assert theirs.received_frames >= 11  # the hellos and the ten messages
        mine = a.statistics()
        assert mine.sent_frames == mine.per_peer[0].sent_frames  # one peer, none lost
        assert (mine.peers, mine.lost_peers, mine.flow) == (1, 0, t.FlowState.RUNNING)
        with pytest.raises(dataclasses.FrozenInstanceError):
            mine.peers = 2  # type: ignore[misc]


def test_disconnect_fails_the_parked_futures_and_forgets_the_peer(tmp_path: pathlib.Path) -> None:
    config = t.TransportConfig(credit_window=4096, heartbeat_interval=0.1, heartbeat_timeout=5)
    holder = Owner(auto_release=False)
    with pair("tcp", tmp_path, a_config=config, b_owner=holder) as (a, a_owner, _b, _bo):
        results = [a.submit(b"B", [b"x" * 2048]) for _ in range(4)]
        parked = [r.admitted for r in results if r.admitted is not None]
        assert len(parked) == 2
        a.disconnect(b"B")
        for future in parked:
            assert isinstance(future.exception(WAIT), t.PeerLost)
        assert a_owner.wait(lambda: t.PeerEventKind.LOST in a_owner.event_kinds(b"B"))
        assert a_owner.events[-1].reason == "disconnected by its owner"
        assert a.peers() == ()
        with pytest.raises(t.UnknownPeer):
            a.disconnect(b"B")


def test_setup_calls_from_a_callback_run_on_the_io_thread_without_waiting(
    tmp_path: pathlib.Path,
) -> None:
    done: list[t.Endpoints] = []
    owner = Owner()
    first = owner.on_receive

    def bind_from_callback(batch: list[t.Inbound]) -> None:
        first(batch)
        assert owner.transport is not None
        if not done:
            done.append(owner.transport.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))

    owner.on_receive = bind_from_callback  # type: ignore[method-assign]
    with pair("tcp", tmp_path, b_owner=owner) as (a, _, _b, _bo):
        assert a.submit(b"B", [b"go"]).status is t.SubmitStatus.OK
        assert owner.wait(lambda: len(owner.records) == 1)
        assert wait_until(lambda: len(done) == 1)
        assert done[0].application.startswith("tcp://127.0.0.1:")


def test_a_side_that_paused_before_it_dials_keeps_the_peer_and_tells_it(
    tmp_path: pathlib.Path,
) -> None:
    """Found by review: a flow change before `connect()` was sent to the peer before it
    was dialled (the peer was lost at once and `connect` raised KeyError), and a side
    that dials out while paused never told the peer."""
    a_owner, b_owner = Owner(), Owner()
    with transport(b"A", a_owner) as a, transport(b"B", b_owner) as b:
        a.set_flow(t.FlowState.PAUSED)
        a.connect(b"B", b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
        assert a_owner.wait(lambda: t.PeerEventKind.READY in a_owner.event_kinds(b"B"))
        assert b_owner.wait(lambda: t.PeerEventKind.READY in b_owner.event_kinds(b"A"))
        assert wait_until(lambda: b.peer_statistics(b"A").paused_by_peer)
        assert t.PeerEventKind.LOST not in a_owner.event_kinds(b"B")
        assert a.peers() == (b"B",)


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "heard-from"])
def test_a_connection_closed_after_the_peer_went_quiet_is_a_silent_loss(
    quiet: bool, tmp_path: pathlib.Path
) -> None:
    """libzmq's own ZMTP heartbeat closes the connection of a peer that stopped
    answering, as ours would have a moment later (both wait `heartbeat_timeout`): that
    loss is silence (the peer may be frozen and come back), not a peer whose process
    ended. Here B's connection closes while A has not heard from it for most of the
    timeout (set on A's state: nothing else is sent meanwhile, the heartbeats are slow),
    or while A heard from it just now (a process that ended: not silent)."""
    slow = t.TransportConfig(heartbeat_interval=2.0, heartbeat_timeout=4.0)
    with pair("tcp", tmp_path, a_config=slow, b_config=slow) as (a, a_owner, b, _):
        if quiet:
            core = a._core
            with core.lock:  # last heard from 3.5 s ago: past half way from 2 s to 4 s
                core.peers[b"B"].deadline = time.monotonic() + 0.5
        b.close()
        assert a_owner.wait(lambda: t.PeerEventKind.LOST in a_owner.event_kinds(b"B"))
        lost = [e for e in a_owner.events if e.kind is t.PeerEventKind.LOST]
        assert len(lost) == 1, lost
        assert "disconnected" in lost[0].reason
        assert lost[0].silent is quiet
