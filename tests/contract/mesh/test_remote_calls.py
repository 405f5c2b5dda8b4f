"""Remote call semantics across two meshed Hosts (issue 15 item 5; design/mesh.md §2, the table
and "Backpressure waits, never drops", "Order", "One budget", "Identity").

Every test runs two real Hosts in this process over tcp loopback: A is the caller, B the
node it calls through `send_to_node` / `request_to_node`. B's node handler is held on an
Event where a test needs an order (the pykka trick); every wait is bounded and asserted.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    ChannelContext,
    ChannelHandler,
    Completion,
    DeadlineExceededError,
    ErrorKind,
    Host,
    InternalFailureError,
    ManualClock,
    NodeContext,
    NodeHandler,
    NotFoundError,
    RejectedError,
    Spot,
    SpotContext,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness, wait_until

from .._support import NEGATIVE_WAIT
from ._nodes import (
    MESH,
    Hold,
    Nodes,
    Note,
    Ping,
    Pong,
    Recorder,
    Work,
    mesh_stats,
    probe,
    recording_gate,
)


@pytest.fixture
def nodes(harness: HostHarness) -> Nodes:
    return Nodes(harness)


# -- one-way sends ---------------------------------------------------------------------


def test_a_one_way_to_a_peer_completes_before_the_remote_handler_runs(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)

    # B's handler is held in Hold: the Note cannot have run, yet the send is complete.
    sent = a.send_to_node(MESH, rid, Note(1)).submit()
    assert sent.wait(WAIT)
    assert sent.result() is None
    assert rec.snapshot() == ["hold"]

    rec.latch.set()
    assert probe(a, rid) == ["hold", 1]


def test_one_ways_wait_for_credit_then_all_complete_once_and_arrive_in_order(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    window = {"credit_window": 4096}
    a = nodes.add(mesh=window)
    # A queue of 2 on B: B's node handler held, its queue full, B admits nothing more,
    # so it returns no credit and A's window (4 KiB, about 3 of these) fills up.
    b = nodes.add(mesh=window, node_handler=recording_gate(rec), application_lane_items=2)
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)

    sends = [a.send_to_node(MESH, rid, Note(i, bytes(1000))).submit() for i in range(12)]
    last = sends[-1]
    assert not last.wait(NEGATIVE_WAIT)  # it waits: no time limit, no failure
    assert last.cancel() is False  # a waiting one-way refuses cancellation (SC §5/§7)
    assert not last.done()
    assert mesh_stats(a).parked_sends > 0
    assert all(s.exception() is None for s in sends if s.done())

    rec.latch.set()
    for s in sends:
        assert s.wait(WAIT)
        assert s.result() is None
    # The Probe travels behind the 12 notes on the same pipe: once it is answered, every
    # note has run, and each exactly once, in submission order.
    seen = probe(a, rid)
    assert seen == ["hold", *range(12)]
    assert wait_until(lambda: mesh_stats(a).parked_sends == 0)


def test_the_receivers_credit_window_governs_the_pair(harness: HostHarness, nodes: Nodes) -> None:
    rec = Recorder(harness)
    a = nodes.add()  # the default window, 16 MiB
    b = nodes.add(
        mesh={"credit_window": 4096}, node_handler=recording_gate(rec), application_lane_items=2
    )
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)

    sends = [a.send_to_node(MESH, rid, Note(i, bytes(1000))).submit() for i in range(12)]
    # B grants A 4 KiB: about 3 of these 1 KiB notes can be unreleased at once.
    assert not sends[-1].wait(NEGATIVE_WAIT)
    assert mesh_stats(a).credit_in_use <= 4096

    rec.latch.set()
    assert all(s.wait(WAIT) for s in sends)


def _idle(host: Host) -> bool:
    stats = host.statistics()
    return stats.queued_records == 0 and stats.waiting_sends == 0 and stats.pending_calls == 0


def _credit_exhausted(
    harness: HostHarness, nodes: Nodes, b_options: dict[str, Any] | None = None, **a_options: Any
) -> tuple[Host, Host, Recorder]:
    """A and B with 4 KiB windows, B's node handler held and its queue (2) full, and A's
    window used up by 8 padded notes (some of them wait). B has one inbound permit, which
    a queued note holds: B reads no more and is PAUSED (a full target alone no longer
    holds its senders' credit: its sender keeps what waits for it, test_target_flow.py)."""
    rec = Recorder(harness)
    window = {"credit_window": 4096}
    a = nodes.add(mesh=window, **a_options)
    b = nodes.add(
        mesh={**window, "inbound_permits": 1, "target_permits": 1},
        node_handler=recording_gate(rec),
        application_lane_items=2,
        **(b_options or {}),
    )
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)
    for i in range(8):
        a.send_to_node(MESH, rid, Note(i, bytes(1000))).submit()
    assert wait_until(lambda: mesh_stats(a).parked_sends > 0)
    return a, b, rec


def test_a_request_that_timed_out_waiting_for_credit_never_runs_remotely(
    harness: HostHarness, nodes: Nodes
) -> None:
    ran: list[int] = []

    class Worker(ChannelHandler):
        @handler
        def work(self, ctx: ChannelContext, msg: Work) -> int:
            ran.append(msg.n)
            return msg.n

    # B on a clock that never moves: only the budget the request carries can make B skip
    # it, not B's own timer racing B's handler (mesh.md: deadlines on the Host's clock).
    # The request goes to B's idle channel, so B's full node queue cannot refuse it.
    a, b, rec = _credit_exhausted(
        harness, nodes, {"clock": ManualClock(), "channels": {"work": Worker}}
    )

    call = a.request_to_channel("work", Work(5), reply=int).timeout(0.3).submit()
    assert type(call.exception(WAIT)) is DeadlineExceededError

    rec.latch.set()
    assert wait_until(lambda: mesh_stats(a).credit_in_use == 0 and _idle(b))
    # Behind the timed-out request on the same pipe: once answered, that one ran or not.
    assert a.request_to_channel("work", Work(-1), reply=int).submit_sync() == -1
    assert ran == [-1]


def test_a_send_waiting_for_credit_holds_no_gate(harness: HostHarness, nodes: Nodes) -> None:
    target: list[str] = []
    waiting: list[Completion[None]] = []

    class Room(Spot):
        @handler
        def flood(self, ctx: SpotContext, msg: Work) -> None:
            for i in range(msg.n):
                waiting.append(ctx.send_to_node(MESH, target[0], Note(100 + i)).submit())

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    a, b, rec = _credit_exhausted(harness, nodes, spots=[Room], app_threads=2)
    target.append(b.node.routing_id)
    a.spots.get_or_create("room", Room).submit_sync()

    a.request_to_spot("room", Work(3), reply=type(None)).submit_sync()  # its turn ends
    assert waiting[-1].done() is False  # ... while its sends still wait for credit
    assert a.request_to_spot("room", Ping(4), reply=Pong).submit_sync() == Pong(4)

    rec.latch.set()
    assert all(c.wait(WAIT) and c.exception() is None for c in waiting)
    seen = probe(a, target[0])
    assert seen == ["hold", *range(8), 100, 101, 102]


def test_two_hundred_one_ways_from_one_host_are_handled_in_submission_order(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    rid = b.node.routing_id

    sends = [a.send_to_node(MESH, rid, Note(i)).submit() for i in range(200)]
    for s in sends:
        assert s.wait(WAIT)
        assert s.result() is None
    assert probe(a, rid) == list(range(200))


# -- requests: remote errors -----------------------------------------------------------


class Failing(NodeHandler):
    @handler
    def work(self, ctx: NodeContext, msg: Work) -> int:
        if msg.n == 1:
            raise RejectedError("card declined")
        if msg.n == 2:
            raise NotFoundError("no such account")
        raise ValueError("a plain bug")


@pytest.mark.parametrize(
    ("n", "expected", "kind", "text"),
    [
        (1, RejectedError, ErrorKind.REJECTED, "card declined"),
        (2, NotFoundError, ErrorKind.NOT_FOUND, "no such account"),
        (3, InternalFailureError, ErrorKind.INTERNAL_FAILURE, "ValueError"),
    ],
)
def test_a_remote_handlers_error_arrives_as_the_same_kind(
    nodes: Nodes, n: int, expected: type[ZlinkError], kind: ErrorKind, text: str
) -> None:
    a = nodes.add()
    b = nodes.add(node_handler=Failing)

    call = a.request_to_node(MESH, b.node.routing_id, Work(n), reply=int).submit()
    exc = call.exception(WAIT)
    assert type(exc) is expected
    assert exc.kind is kind
    assert text in str(exc)


# -- requests: deadline and cancellation -----------------------------------------------


def test_a_timeout_is_deadline_exceeded_and_the_late_reply_is_dropped(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    # B runs on a ManualClock that never moves, so B itself never times the request out:
    # the only reply that comes back is the handler's own, after A gave up (mesh.md:
    # liveness uses real time, deadlines the Host's clock).
    b = nodes.add(node_handler=recording_gate(rec), clock=ManualClock())
    rid = b.node.routing_id

    call = a.request_to_node(MESH, rid, Hold(), reply=str).timeout(0.3).submit()
    assert rec.entered.wait(WAIT)
    assert type(call.exception(WAIT)) is DeadlineExceededError
    before = mesh_stats(a).late_replies

    rec.latch.set()  # the handler returns "held": its reply finds nothing and is dropped
    assert wait_until(lambda: mesh_stats(a).late_replies == before + 1)
    assert type(call.exception()) is DeadlineExceededError
    # The dropped reply completed nothing else: the next request gets its own reply.
    assert a.request_to_node(MESH, rid, Work(7), reply=int).submit_sync() == 7
    assert a.statistics().pending_calls == 0
    assert mesh_stats(a).late_replies == before + 1


class Echo(ChannelHandler):
    @handler
    def ping(self, ctx: ChannelContext, msg: Ping) -> Pong:
        return Pong(msg.n)


def test_cancelling_a_request_gives_cancelled_and_its_unstarted_handler_never_runs(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec), channels={"echo": Echo})
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)

    source = CancellationSource()
    call = a.request_to_node(MESH, rid, Work(1), reply=int).timeout(30.0).submit(source.token)
    assert wait_until(lambda: b.statistics().queued_records == 1)  # queued behind Hold
    source.cancel()
    with pytest.raises(CancelledError):
        call.result(WAIT)

    # The cancel notice went out before this request, on the same pipe, and B's channel
    # is not held: once it answers, B has read the notice, before the request's turn.
    assert a.request_to_channel("echo", Ping(3), reply=Pong).submit_sync() == Pong(3)
    rec.latch.set()
    assert probe(a, rid) == ["hold"]
    assert a.statistics().pending_calls == 0


def test_a_request_whose_deadline_passed_in_the_remote_queue_never_runs(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)

    call = a.request_to_node(MESH, rid, Work(6), reply=int).timeout(0.3).submit()
    assert wait_until(lambda: b.statistics().queued_records == 1)  # queued behind Hold
    assert type(call.exception(WAIT)) is DeadlineExceededError
    # B holds the same budget: once it has run out there too, B finishes the request.
    assert wait_until(lambda: b.statistics().pending_calls == 0)

    rec.latch.set()
    assert probe(a, rid) == ["hold"]


#: Rounds of a race a buggy node loses almost always.
ROUNDS = 3


def test_cancelling_a_request_that_waits_for_credit_means_it_never_runs(
    harness: HostHarness, nodes: Nodes
) -> None:
    latches = [harness.latch() for _ in range(ROUNDS)]
    entered = [threading.Event() for _ in range(ROUNDS)]
    ran: list[int] = []

    class Gate(NodeHandler):
        @handler
        def hold(self, ctx: NodeContext, msg: Hold) -> None:
            entered[int(msg.tag)].set()
            assert latches[int(msg.tag)].wait(WAIT + 5)

        @handler
        def note(self, ctx: NodeContext, msg: Note) -> None:
            pass

    class Worker(ChannelHandler):
        @handler
        def work(self, ctx: ChannelContext, msg: Work) -> int:
            ran.append(msg.n)
            return msg.n

    window = {"credit_window": 4096}
    a = nodes.add(mesh=window)
    # One inbound permit on B, which a queued note holds: B reads no more (PAUSED), as in
    # `_credit_exhausted`.
    b = nodes.add(
        mesh={**window, "inbound_permits": 1, "target_permits": 1},
        node_handler=Gate,
        channels={"work": Worker},
        application_lane_items=2,
    )
    rid = b.node.routing_id
    for r in range(ROUNDS):
        # B's node handler held with its queue full: A's window to B fills up.
        a.send_to_node(MESH, rid, Hold(str(r))).submit_sync()
        assert entered[r].wait(WAIT)
        notes = [a.send_to_node(MESH, rid, Note(i, bytes(1000))).submit() for i in range(8)]
        assert wait_until(lambda: mesh_stats(a).parked_sends > 0)

        # A request to B's idle channel waits for that credit; its caller cancels it.
        source = CancellationSource()
        call = a.request_to_channel("work", Work(r), reply=int).timeout(30.0).submit(source.token)
        assert not call.wait(NEGATIVE_WAIT)
        # More notes behind it before the cancel: its notice needs credit of its own too.
        notes += [a.send_to_node(MESH, rid, Note(i, bytes(1000))).submit() for i in range(8)]
        source.cancel()
        with pytest.raises(CancelledError):
            call.result(WAIT)

        latches[r].set()
        assert all(n.wait(WAIT) for n in notes)
        # Everything A sent was admitted at B (its credit came back) and B is idle.
        assert wait_until(lambda: mesh_stats(a).credit_in_use == 0 and _idle(b))
    assert ran == []


def test_a_remote_handler_sees_the_callers_remaining_deadline(nodes: Nodes) -> None:
    seen: list[float] = []

    class Gate(NodeHandler):
        @handler
        def work(self, ctx: NodeContext, msg: Work) -> int:
            seen.append(ctx.deadline.remaining())
            return 0

    a = nodes.add()
    # B's own default (30 s) must not be what its handler sees.
    b = nodes.add(node_handler=Gate, default_request_timeout=30.0)

    call = a.request_to_node(MESH, b.node.routing_id, Work(), reply=int).timeout(4.0)
    assert call.submit_sync() == 0
    [remaining] = seen
    assert 2.0 < remaining <= 4.0


def test_a_remote_handler_sees_its_callers_cancellation(harness: HostHarness, nodes: Nodes) -> None:
    entered = threading.Event()
    noticed = threading.Event()
    outcome: list[bool] = []

    class Gate(NodeHandler):
        @handler
        def work(self, ctx: NodeContext, msg: Work) -> int:
            ctx.cancellation.register(noticed.set)
            entered.set()
            outcome.append(noticed.wait(WAIT) and ctx.cancellation.cancelled)
            return 0

    a = nodes.add()
    b = nodes.add(node_handler=Gate)
    source = CancellationSource()
    call = (
        a.request_to_node(MESH, b.node.routing_id, Work(), reply=int)
        .timeout(30.0)
        .submit(source.token)
    )
    assert entered.wait(WAIT)
    source.cancel()

    with pytest.raises(CancelledError):
        call.result(WAIT)
    assert wait_until(lambda: outcome == [True])


# -- requests: a full queue on the remote side -----------------------------------------


def test_a_full_remote_target_queue_is_unavailable(harness: HostHarness, nodes: Nodes) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    # Two slots: the held handler keeps one until it returns (docs/turns.md), one queues.
    b = nodes.add(node_handler=recording_gate(rec), application_lane_items=2)
    rid = b.node.routing_id
    held = a.request_to_node(MESH, rid, Hold(), reply=str).timeout(30.0).submit()
    assert rec.entered.wait(WAIT)
    queued = a.request_to_node(MESH, rid, Work(1), reply=int).timeout(30.0).submit()
    assert wait_until(lambda: b.statistics().queued_records == 1)

    refused = a.request_to_node(MESH, rid, Work(2), reply=int).timeout(30.0).submit()
    exc = refused.exception(WAIT)
    assert type(exc) is UnavailableError
    # Raised on B, it reached A with its reason; B counts what it answered so.
    assert exc.reason is UnavailableReason.QUEUE_FULL
    assert mesh_stats(b).unavailable == {"queue_full": 1}
    assert mesh_stats(a).unavailable == {}

    rec.latch.set()
    assert held.result(WAIT) == "held"
    assert queued.result(WAIT) == 1
    assert "work2" not in rec.snapshot()


@pytest.mark.parametrize("reason", [*UnavailableReason], ids=lambda reason: reason.value)
def test_a_remote_handlers_unavailable_error_reaches_the_caller_with_its_reason(
    reason: UnavailableReason, nodes: Nodes
) -> None:
    class Refuser(NodeHandler):
        @handler
        def work(self, ctx: NodeContext, msg: Work) -> int:
            raise UnavailableError(f"refused {msg.n}", reason=reason)

    a = nodes.add()
    b = nodes.add(node_handler=Refuser)
    call = a.request_to_node(MESH, b.node.routing_id, Work(3), reply=int).timeout(WAIT)
    exc = call.submit().exception(WAIT)
    assert type(exc) is UnavailableError
    assert exc.reason is reason
    assert str(exc) == "refused 3"
    counted = {} if reason is UnavailableReason.UNSPECIFIED else {reason.value: 1}
    assert mesh_stats(b).unavailable == counted


# -- turns: await keeps the gate, yield_() releases it ---------------------------------


def _room_host(nodes: Nodes, target: list[str], *, yielding: bool) -> Host:
    class Room(Spot):
        @handler
        async def slow(self, ctx: SpotContext, msg: Work) -> str:
            call = ctx.request_to_node(MESH, target[0], Hold(), reply=str).timeout(30.0)
            return await (call.yield_() if yielding else call.submit())

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = nodes.add(spots=[Room], app_threads=2)
    host.spots.get_or_create("room", Room).submit_sync()
    return host


def test_awaiting_a_remote_request_in_a_spotwide_handler_keeps_the_gate(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    target: list[str] = []
    a = _room_host(nodes, target, yielding=False)
    b = nodes.add(node_handler=recording_gate(rec))
    target.append(b.node.routing_id)

    slow = a.request_to_spot("room", Work(), reply=str).timeout(30.0).submit()
    assert rec.entered.wait(WAIT)
    ping = a.request_to_spot("room", Ping(1), reply=Pong).timeout(30.0).submit()
    assert not ping.wait(NEGATIVE_WAIT)  # the gate is still held by `slow`

    rec.latch.set()
    assert slow.result(WAIT) == "held"
    assert ping.result(WAIT) == Pong(1)


def test_yielding_a_remote_request_in_a_spotwide_handler_releases_the_gate(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    target: list[str] = []
    a = _room_host(nodes, target, yielding=True)
    b = nodes.add(node_handler=recording_gate(rec))
    target.append(b.node.routing_id)

    slow = a.request_to_spot("room", Work(), reply=str).timeout(30.0).submit()
    assert rec.entered.wait(WAIT)
    # The other message runs while `slow` waits for B.
    assert a.request_to_spot("room", Ping(2), reply=Pong).timeout(WAIT).submit_sync() == Pong(2)
    assert not slow.done()

    rec.latch.set()
    assert slow.result(WAIT) == "held"
