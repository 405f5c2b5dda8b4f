"""Shutdown across meshed Hosts (issue 15 item 8; design/mesh.md §2, CS §5).

`Host.shutdown()` of a node marks it DRAINING to its peers (never selected again),
finishes accepted work by the deadline, completes every outstanding remote call once,
tells its peers it is gone and closes the transport.

B is the node that stops; its handler is held on an Event so the test can watch it
drain. `ShutdownThread` runs the shutdown on a thread of its own.
"""

from __future__ import annotations

import pytest

from zlink_actors import (
    ChannelContext,
    ChannelHandler,
    PeerState,
    ShutdownOutcome,
    ShuttingDownError,
    UnavailableError,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness, wait_until

from .._support import ShutdownThread
from ._nodes import (
    MESH,
    Hold,
    Nodes,
    Note,
    Recorder,
    Work,
    mesh_stats,
    peer_state,
    recording_gate,
)


@pytest.fixture
def nodes(harness: HostHarness) -> Nodes:
    return Nodes(harness)


class Server(ChannelHandler):
    """Answers with the routing id of the node it runs on."""

    @handler
    def work(self, ctx: ChannelContext, msg: Work) -> str:
        assert ctx.node is not None
        return str(ctx.node.routing_id)


def test_a_stopping_node_is_draining_to_its_peers_and_never_selected_again(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    client = nodes.add()
    a = nodes.add(channels={"work": Server})
    b = nodes.add(channels={"work": Server}, node_handler=recording_gate(rec))
    a_rid, b_rid = a.node.routing_id, b.node.routing_id
    picked = {client.request_to_channel("work", Work(), reply=str).submit_sync() for _ in range(8)}
    assert picked == {a_rid, b_rid}  # both serve while B runs

    held = client.request_to_node(MESH, b_rid, Hold(), reply=str).timeout(30.0).submit()
    assert rec.entered.wait(WAIT)
    stopping = ShutdownThread(b, WAIT)  # B drains while its handler is held
    assert wait_until(lambda: peer_state(client, b_rid) in (PeerState.DRAINING, PeerState.LOST))

    for _ in range(20):
        assert client.request_to_channel("work", Work(), reply=str).submit_sync() == a_rid
    with pytest.raises(UnavailableError):
        client.request_to_node(MESH, b_rid, Work(1), reply=int).submit_sync()

    rec.latch.set()
    assert held.result(WAIT) == "held"  # accepted before the drain: it finishes
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    assert wait_until(lambda: peer_state(client, b_rid) is PeerState.LOST)
    assert wait_until(lambda: peer_state(a, b_rid) is PeerState.LOST)
    assert client.request_to_channel("work", Work(), reply=str).submit_sync() == a_rid


def test_a_request_in_flight_to_a_stopping_node_gets_its_reply_when_the_handler_ends_in_time(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    call = a.request_to_node(MESH, b.node.routing_id, Hold(), reply=str).timeout(30.0).submit()
    assert rec.entered.wait(WAIT)

    stopping = ShutdownThread(b, WAIT)
    assert wait_until(lambda: peer_state(a, b.node.routing_id) is not PeerState.READY)
    assert not call.done()
    rec.latch.set()

    assert call.result(WAIT) == "held"
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    assert mesh_stats(a).late_replies == 0
    assert a.statistics().pending_calls == 0


def test_a_request_in_flight_to_a_stopping_node_that_overruns_its_deadline_ends_once_with_an_error(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    call = a.request_to_node(MESH, b.node.routing_id, Hold(), reply=str).timeout(30.0).submit()
    assert rec.entered.wait(WAIT)

    stopping = ShutdownThread(b, 0.5)  # the held handler outlives it
    exc = call.exception(WAIT)
    # The error reply of the forced shutdown, or, if the closing transport dropped it,
    # the loss of the peer: one terminal either way, long before the call's 30 s.
    assert type(exc) in (ShuttingDownError, UnavailableError)
    assert stopping.join().outcome is ShutdownOutcome.FORCE_STOPPED
    rec.latch.set()  # the abandoned handler returns now: nothing more reaches A
    assert wait_until(lambda: peer_state(a, b.node.routing_id) is PeerState.LOST)
    assert type(call.exception()) is type(exc)
    assert mesh_stats(a).late_replies == 0
    assert a.statistics().pending_calls == 0


def test_one_ways_a_stopping_node_had_accepted_are_handled(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)
    for i in range(20):
        assert a.send_to_node(MESH, rid, Note(i)).submit_sync() is None
    assert wait_until(lambda: b.statistics().queued_records == 20)  # all admitted at B

    stopping = ShutdownThread(b, WAIT)
    assert wait_until(lambda: peer_state(a, rid) is not PeerState.READY)
    rec.latch.set()

    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    assert rec.snapshot() == ["hold", *range(20)]


def test_a_stopping_nodes_own_request_gets_the_reply_that_comes_within_its_deadline(
    harness: HostHarness, nodes: Nodes
) -> None:
    at_a = Recorder(harness)
    a = nodes.add(node_handler=recording_gate(at_a))
    b = nodes.add()
    own = b.request_to_node(MESH, a.node.routing_id, Hold(), reply=str).timeout(30.0).submit()
    assert at_a.entered.wait(WAIT)

    stopping = ShutdownThread(b, WAIT)
    assert wait_until(lambda: peer_state(a, b.node.routing_id) is not PeerState.READY)
    at_a.latch.set()

    assert own.result(WAIT) == "held"
    assert stopping.join().outcome is ShutdownOutcome.STOPPED


def test_a_stopping_nodes_own_request_without_a_reply_ends_shutting_down(
    harness: HostHarness, nodes: Nodes
) -> None:
    at_a = Recorder(harness)
    a = nodes.add(node_handler=recording_gate(at_a))
    b = nodes.add()
    own = b.request_to_node(MESH, a.node.routing_id, Hold(), reply=str).timeout(30.0).submit()
    assert at_a.entered.wait(WAIT)

    stopping = ShutdownThread(b, 0.5)
    assert type(own.exception(WAIT)) is ShuttingDownError
    result = stopping.join()
    assert result.forced_operations == 1
    at_a.latch.set()  # A's reply now finds B gone; A carries on
    assert wait_until(lambda: peer_state(a, b.node.routing_id) is PeerState.LOST)
    assert type(own.exception()) is ShuttingDownError


def test_sends_waiting_for_credit_towards_a_stopping_node_each_end_once(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    window = {"credit_window": 4096}
    a = nodes.add(mesh=window)
    b = nodes.add(mesh=window, node_handler=recording_gate(rec), application_lane_items=2)
    rid = b.node.routing_id
    a.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)
    sends = [a.send_to_node(MESH, rid, Note(i, bytes(1000))).submit() for i in range(12)]
    assert wait_until(lambda: mesh_stats(a).parked_sends > 0)

    # B's held handler outlives its shutdown: what B had not admitted is refused there,
    # and A's waiting sends end as B goes away, none stays waiting.
    stopping = ShutdownThread(b, 0.5)
    for s in sends:
        assert s.wait(WAIT)
        assert s.exception() is None or type(s.exception()) is UnavailableError
    assert stopping.join().outcome is ShutdownOutcome.FORCE_STOPPED
    assert wait_until(lambda: peer_state(a, rid) is PeerState.LOST)
    assert mesh_stats(a).parked_sends == 0


def test_a_stopped_node_tells_its_peers_it_is_gone(nodes: Nodes) -> None:
    # Liveness slow enough that only the node's own goodbye (or its closed connection)
    # can make its peer see it LOST within the wait.
    quiet = {"liveness_interval": 30.0, "liveness_timeout": 60.0, "peer_expiry": 120.0}
    a = nodes.add(mesh=quiet)
    b = nodes.add(mesh=quiet)
    rid = b.node.routing_id

    assert b.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED
    assert wait_until(lambda: peer_state(a, rid) is PeerState.LOST)
    with pytest.raises(UnavailableError):
        a.request_to_node(MESH, rid, Work(1), reply=int).submit_sync()
