"""A request's deadline across nodes (issue 26 item 2; docs/mesh.md "Deadlines across
nodes"): the receiver judges it on its caller's clock, through the heartbeat's bound on
the clock offset, and never starts the handler of a request whose caller's deadline has
passed: not on arrival, and not when it leaves the target's queue, even when the
receiver's own timer for it has not fired yet.

Two real Hosts in this process over tcp loopback (A calls, B serves); the judgement
itself is checked with injected clocks (`caller_deadline`)."""

from __future__ import annotations

import threading

import pytest

import transports as t
from zlink_actors import DeadlineExceededError, NodeContext, NodeHandler, handler
from zlink_actors.mesh.inbound import caller_deadline
from zlink_actors.testing import WAIT, HostHarness, wait_until

from ._nodes import MESH, Nodes, Recorder, Work, held_gate, mesh_stats, probe, recording_gate


def test_a_request_whose_callers_deadline_passed_in_the_queue_never_starts_though_its_timer_is_late(
    harness: HostHarness, nodes: Nodes
) -> None:
    """B's timer thread is held, so B's own timer for the request never fires: only the
    check when the request leaves the queue can keep its handler from starting."""
    rec, a, b = held_gate(harness, nodes)
    rid = b.node.routing_id

    stalled, release = threading.Event(), threading.Event()

    def stall() -> None:
        stalled.set()
        release.wait(WAIT)

    b._runtime.timers.call_after(0.0, stall)
    try:
        assert stalled.wait(WAIT)
        late_before = mesh_stats(a).late_replies
        call = a.request_to_node(MESH, rid, Work(6), reply=int).timeout(0.3).submit()
        assert wait_until(lambda: b.statistics().queued_records == 1)  # behind Hold
        assert type(call.exception(WAIT)) is DeadlineExceededError  # A's own deadline

        rec.latch.set()  # Hold returns: B takes Work(6) from the queue, its timer held
        # Asked after it on the same gate: had Work(6) run, the gate would have seen it.
        assert probe(a, rid) == ["hold"]
        # B answered it (DeadlineExceededError, unrun): a reply A no longer waits for.
        assert wait_until(lambda: mesh_stats(a).late_replies == late_before + 1)
        assert b.statistics().pending_calls == 0
    finally:
        release.set()


def test_a_remote_handler_sees_a_deadline_no_later_than_its_callers(nodes: Nodes) -> None:
    """`ctx.deadline` at B is the caller's deadline read on A's clock: never later."""
    seen: list[float] = []

    class Gate(NodeHandler):
        @handler
        def work(self, ctx: NodeContext, msg: Work) -> int:
            seen.append(ctx.deadline.at)
            return 0

    a = nodes.add()
    b = nodes.add(node_handler=Gate, default_request_timeout=30.0)
    start = a._runtime.timers._now()
    assert (
        a.request_to_node(MESH, b.node.routing_id, Work(), reply=int).timeout(2.0).submit_sync()
        == 0
    )
    end = a._runtime.timers._now()
    [at] = seen
    # Both Hosts read the same monotonic clock: B's deadline is A's (start + 2 s, taken
    # just after `start`), less at most the heartbeat's band, never more.
    assert start + 2.0 - 0.5 < at <= end + 2.0


def test_the_dialling_node_has_its_peers_clock_from_the_handshake(nodes: Nodes) -> None:
    """The ADMIT carries the admitting node's clock: the dialling node (B dials A) can
    judge A's first request even if the heartbeat's first PONG comes after it (A's
    PONG and its first request race: they travel on two connections)."""
    a = nodes.add()
    b = nodes.add()
    peer = b._node()._peers.by_rid[a.node.routing_id]  # set before B saw A READY
    band = peer.clock
    assert band is not None
    assert band.low <= 0.0 <= band.high  # one process, one clock: the true offset is 0
    assert band.high - band.low < 0.5


def test_a_peers_clock_band_outlives_the_connection_that_measured_it(nodes: Nodes) -> None:
    """A second connection of the same lifecycle (the same process: the same clock)
    reads the band an earlier connection measured until its own heartbeat has one."""
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(Recorder(nodes.harness)))
    assert a.request_to_node(MESH, b.node.routing_id, Work(3), reply=int).submit_sync() == 3
    node = b._node()
    peer = node._peers.by_rid[a.node.routing_id]
    transport = node.shared.transport
    assert transport is not None
    kept = peer.clock  # kept on the peer as the request was judged
    assert kept is not None
    assert node._caller_clock(b"a connection with no sample yet", peer) is kept
    # A connection with a sample of its own (once its first PONG came) gives it, and the
    # peer keeps that one.
    assert wait_until(lambda: transport.clock_offset(peer.conn) is not None)
    band = transport.clock_offset(peer.conn)
    assert band is not None
    assert node._caller_clock(peer.conn, peer) is band
    assert peer.clock is band


# -- the judgement, with injected clocks --------------------------------------------------


def test_without_a_sample_or_a_callers_deadline_the_budget_counts_from_arrival() -> None:
    band = t.ClockOffset(-0.001, 0.001, 50.0)
    assert caller_deadline(100.0, 2.5, 0.0, band) == 102.5  # an older peer: no due
    assert caller_deadline(100.0, 2.5, 1234.0, None) == 102.5  # no heartbeat sample yet


def test_the_callers_deadline_is_read_on_its_clock_through_the_offset() -> None:
    # The caller's clock reads ours + 1000 s (within 1 ms); it sent the request with
    # 0.3 s left at its 1100.0: its deadline is 1100.3 there, 100.3 here.
    band = t.ClockOffset(999.999, 1000.001, 100.0)
    # The request arrives at our 100.05 (on time): the deadline is 100.3 less the band.
    due = caller_deadline(100.05, 0.3, 1100.3, band)
    assert 100.29 < due < 100.3
    # The same request read 1.2 s later (the receiver was paused, or the request sat
    # in a socket): its deadline passed long ago, where the budget alone, counted from
    # arrival, would give it until 101.55.
    due = caller_deadline(101.25, 0.3, 1100.3, band)
    assert due < 101.25 < 101.25 + 0.3
    # Never later than the budget counted from arrival, whatever the band says.
    assert caller_deadline(100.0, 0.3, 1200.0, band) == 100.3


def test_a_caller_behind_us_and_a_wide_band_make_the_judgement_earlier_never_later() -> None:
    narrow = t.ClockOffset(-5.0005, -4.9995, 14.0)  # the caller is 5 s behind us
    wide = t.ClockOffset(-5.05, -4.95, 14.0)  # the same, from a 100 ms round trip
    # Its deadline 10.0 on its clock is our 15.0: judged early by the band's upper
    # side (and the drift over the second from the sample to then, 0.5 ms at most).
    assert caller_deadline(14.0, 5.0, 10.0, narrow) == pytest.approx(14.9995, abs=6e-4)
    assert caller_deadline(14.0, 5.0, 10.0, wide) == pytest.approx(14.95, abs=6e-4)
    assert caller_deadline(14.0, 5.0, 10.0, wide) < caller_deadline(14.0, 5.0, 10.0, narrow)
