"""Node-direct calls (issue 15 item 3; design/mesh.md §2 "Node direct"): `send_to_node`
and `request_to_node` to this node's own routing id (local), to a peer (`ctx.sender`,
`ctx.node`), and every refusal: unknown routing id, another mesh, a peer without a node
handler, a peer not READY, a Host without a mesh; from application threads and from a
handler's turn."""

from __future__ import annotations

import queue
import threading
from typing import ClassVar

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from .._support import ShutdownThread
from ._mesh import MESH, mesh_config, mesh_hosts, wait_for_state


class Ping(msgspec.Struct):
    n: int


class Seen(msgspec.Struct):
    """What a node handler saw: the caller and the node it ran on."""

    n: int
    sender: str | None
    node: tuple[str, str, str] | None


class Relay(msgspec.Struct):
    """Ask a Spot to call node `rid` from inside its turn."""

    rid: str
    n: int


def _seen(ctx: z.NodeContext, n: int) -> Seen:
    info: z.NodeInfo | None = ctx.node
    node = None if info is None else (info.mesh, info.routing_id, info.endpoint)
    return Seen(n, ctx.sender, node)


class Gate(z.NodeHandler):
    """Answers requests with what it saw; one-way messages go to `sent`."""

    sent: ClassVar[queue.Queue[Seen]]
    entered: ClassVar[threading.Event]
    release: ClassVar[threading.Event]

    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> Seen:
        return _seen(ctx, msg.n)

    @z.handler
    def note(self, ctx: z.NodeContext, msg: Seen) -> None:
        Gate.sent.put(_seen(ctx, msg.n))

    @z.handler
    def hold(self, ctx: z.NodeContext, msg: Relay) -> int:
        Gate.entered.set()
        assert Gate.release.wait(WAIT)
        return msg.n


class Caller(z.Spot):
    """Calls a node from inside its own turn (`await` keeps the turn)."""

    @z.handler
    async def relay(self, ctx: z.SpotContext, msg: Relay) -> Seen:
        return await ctx.request_to_node(MESH, msg.rid, Ping(msg.n), reply=Seen).submit()


@pytest.fixture(autouse=True)
def _gate_state() -> None:
    Gate.sent = queue.Queue()
    Gate.entered = threading.Event()
    Gate.release = threading.Event()


def _node(host: z.Host) -> tuple[str, str, str]:
    info = host.node
    return (info.mesh, info.routing_id, info.endpoint)


# -- to this node ------------------------------------------------------------------------


def test_a_request_to_the_own_routing_id_is_delivered_locally(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config(), node_handler=Gate)
    rid = host.node.routing_id
    seen = host.request_to_node(MESH, rid, Ping(1), reply=Seen).submit_sync()
    assert seen == Seen(1, None, _node(host))
    stats = host.statistics().mesh
    assert stats is not None
    assert stats.frames_out == 0  # nothing went on the wire


def test_a_send_to_the_own_routing_id_is_delivered_locally(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config(), node_handler=Gate)
    host.send_to_node(MESH, host.node.routing_id, Seen(2, None, None)).submit_sync()
    assert Gate.sent.get(timeout=WAIT) == Seen(2, None, _node(host))


def test_the_own_routing_id_without_a_node_handler_is_not_found(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config())
    with pytest.raises(z.NotFoundError):
        host.request_to_node(MESH, host.node.routing_id, Ping(1)).submit_sync()


# -- to a peer ------------------------------------------------------------------------------


def test_a_request_to_a_peer_sees_the_callers_routing_id_and_its_own_node(
    harness: HostHarness,
) -> None:
    callee, caller = mesh_hosts(harness, 2, node_handler=Gate)
    seen = caller.request_to_node(MESH, callee.node.routing_id, Ping(3), reply=Seen).submit_sync()
    assert seen == Seen(3, caller.node.routing_id, _node(callee))


def test_a_send_to_a_peer_sees_the_callers_routing_id_and_its_own_node(
    harness: HostHarness,
) -> None:
    callee, caller = mesh_hosts(harness, 2, node_handler=Gate)
    caller.send_to_node(MESH, callee.node.routing_id, Seen(4, None, None)).submit_sync()
    assert Gate.sent.get(timeout=WAIT) == Seen(4, caller.node.routing_id, _node(callee))


def test_a_request_to_a_peer_from_inside_a_spot_handler(harness: HostHarness) -> None:
    callee, caller = mesh_hosts(
        harness, 2, each=[{"node_handler": Gate}, {"spots": [Caller], "message_types": [Ping]}]
    )
    caller.spots.get_or_create("caller", Caller).submit_sync()
    rid = callee.node.routing_id
    seen = caller.request_to_spot("caller", Relay(rid, 5), reply=Seen).submit_sync()
    assert seen == Seen(5, caller.node.routing_id, _node(callee))


def test_a_request_to_the_own_routing_id_from_inside_a_spot_handler_is_local(
    harness: HostHarness,
) -> None:
    host = harness.host(mesh=mesh_config(), node_handler=Gate, spots=[Caller])
    host.spots.get_or_create("caller", Caller).submit_sync()
    rid = host.node.routing_id
    seen = host.request_to_spot("caller", Relay(rid, 7), reply=Seen).submit_sync()
    assert seen == Seen(7, None, _node(host))


# -- refusals -------------------------------------------------------------------------------


def test_an_unknown_routing_id_is_not_found(harness: HostHarness) -> None:
    a, _ = mesh_hosts(harness, 2, node_handler=Gate)
    with pytest.raises(z.NotFoundError):
        a.request_to_node(MESH, "node-nobody", Ping(1)).submit_sync()
    with pytest.raises(z.NotFoundError):
        a.send_to_node(MESH, "node-nobody", Ping(1)).submit_sync()


def test_another_mesh_name_is_not_found_even_for_a_known_routing_id(
    harness: HostHarness,
) -> None:
    a, b = mesh_hosts(harness, 2, node_handler=Gate)
    for rid in (b.node.routing_id, a.node.routing_id):
        with pytest.raises(z.NotFoundError):
            a.request_to_node("elsewhere", rid, Ping(1)).submit_sync()
        with pytest.raises(z.NotFoundError):
            a.send_to_node("elsewhere", rid, Ping(1)).submit_sync()


def test_a_peer_without_a_node_handler_is_not_found(harness: HostHarness) -> None:
    plain, caller = mesh_hosts(harness, 2, each=[{}, {"node_handler": Gate}])
    with pytest.raises(z.NotFoundError):
        caller.request_to_node(MESH, plain.node.routing_id, Ping(1)).submit_sync()
    with pytest.raises(z.NotFoundError):
        caller.send_to_node(MESH, plain.node.routing_id, Ping(1)).submit_sync()


def test_a_lost_peer_is_unavailable(harness: HostHarness) -> None:
    callee, caller = mesh_hosts(harness, 2, node_handler=Gate)
    rid = callee.node.routing_id
    assert callee.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(caller, rid, z.PeerState.LOST)
    with pytest.raises(z.UnavailableError):
        caller.request_to_node(MESH, rid, Ping(1)).submit_sync()
    with pytest.raises(z.UnavailableError):
        caller.send_to_node(MESH, rid, Ping(1)).submit_sync()


def test_a_draining_peer_is_unavailable(harness: HostHarness) -> None:
    Gate.release = harness.latch()
    callee, caller = mesh_hosts(harness, 2, node_handler=Gate)
    rid = callee.node.routing_id
    held = caller.request_to_node(MESH, rid, Relay(rid, 6), reply=int).timeout(WAIT).submit()
    assert Gate.entered.wait(WAIT)
    stopping = ShutdownThread(callee, WAIT)
    try:
        # its handler is held, so its shutdown cannot finish: it stays DRAINING meanwhile
        assert wait_for_state(caller, rid, z.PeerState.DRAINING)
        with pytest.raises(z.UnavailableError):
            caller.request_to_node(MESH, rid, Ping(1)).submit_sync()
    finally:
        Gate.release.set()
    assert held.result(WAIT) == 6
    assert stopping.join().outcome is z.ShutdownOutcome.STOPPED


def test_a_host_without_a_mesh_finds_no_node(harness: HostHarness) -> None:
    host = harness.host()
    with pytest.raises(z.NotFoundError):
        host.request_to_node(MESH, "node-1", Ping(1)).submit_sync()
    with pytest.raises(z.NotFoundError):
        host.send_to_node(MESH, "node-1", Ping(1)).submit_sync()
