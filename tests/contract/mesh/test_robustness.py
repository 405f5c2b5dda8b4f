"""What the newcomer review of the mesh found, each kept fixed: a draining node's word
does not wait behind credit, an error too large for a reply still reaches its caller, a
broken link between live nodes heals through discovery, an ipc path may hold a "|", and
waiting for peers on a stopped node is `ShuttingDownError`."""

from __future__ import annotations

import threading

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness, wait_until

from ._mesh import MESH, mesh_config, mesh_hosts, peer_state, wait_for_state


class Note(msgspec.Struct):
    n: int


class Boom(msgspec.Struct):
    size: int


release = threading.Event()


class Slow(z.NodeHandler):
    @z.handler
    def note(self, ctx: z.NodeContext, msg: Note) -> None:
        release.wait(WAIT)

    @z.handler
    def boom(self, ctx: z.NodeContext, msg: Boom) -> None:
        raise ValueError("x" * msg.size)


@pytest.fixture(autouse=True)
def _released() -> object:
    release.clear()
    yield None
    release.set()


def test_a_draining_node_is_seen_draining_by_a_peer_that_paused_it(
    harness: HostHarness,
) -> None:
    # P pauses A (its permits are full of A's notes, its handler held); A then stops:
    # its DRAINING word travels on the completion connection, not behind its notes.
    a, p = mesh_hosts(
        harness,
        2,
        each=[{}, {"node_handler": Slow, "mesh": mesh_config(inbound_permits=2)}],
    )
    rid = p.node.routing_id
    for i in range(6):
        a.send_to_node(MESH, rid, Note(i)).submit()
    assert wait_until(lambda: _paused(p))
    stopping = threading.Thread(target=a.shutdown, args=(2.0,), daemon=True)
    stopping.start()
    try:
        assert wait_for_state(p, a.node.routing_id, z.PeerState.DRAINING, z.PeerState.LOST)
    finally:
        release.set()
        stopping.join(WAIT)
    assert not stopping.is_alive()


def _paused(host: z.Host) -> bool:
    stats = host.statistics().mesh
    assert stats is not None
    return stats.paused


def test_an_error_too_large_for_a_reply_still_reaches_its_caller(harness: HostHarness) -> None:
    caller, server = mesh_hosts(
        harness, 2, each=[{}, {"node_handler": Slow, "mesh": mesh_config(max_message_size=1000)}]
    )
    call = caller.request_to_node(MESH, server.node.routing_id, Boom(200_000)).submit()
    exc = call.exception(WAIT)
    assert type(exc) is z.InternalFailureError
    assert "ValueError" in str(exc)
    assert len(str(exc)) < 20_000  # cut to fit a reply


def test_a_broken_link_between_live_nodes_heals_through_discovery(harness: HostHarness) -> None:
    store = z.MemoryLocationStore()
    try:
        a = harness.host(mesh=mesh_config(), location=store, node_handler=Slow)
        b = harness.host(mesh=mesh_config(), location=store)
        b.wait_for_peers(1, timeout=WAIT)
        a.wait_for_peers(1, timeout=WAIT)
        node = a._mesh
        assert node is not None
        transport = node.shared.transport
        assert transport is not None
        for conn in list(transport.peers()):
            transport.disconnect(conn)  # the link breaks; both nodes live on
        assert wait_for_state(a, b.node.routing_id, z.PeerState.LOST, z.PeerState.CONNECTING)
        # Both descriptors are still listed: discovery dials again, and the pair is READY.
        assert wait_until(lambda: peer_state(a, b.node.routing_id) is z.PeerState.READY, 3 * WAIT)
        assert wait_until(lambda: peer_state(b, a.node.routing_id) is z.PeerState.READY, 3 * WAIT)
    finally:
        harness.close()
        store.close()


def test_an_ipc_path_may_hold_a_bar(tmp_path: object) -> None:
    config = z.MeshConfig("m", listen="ipc:///tmp/zlink|test-node")
    assert config.listen == "ipc:///tmp/zlink|test-node"


def test_waiting_for_peers_on_a_stopped_node_is_shutting_down(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config())
    host.shutdown(WAIT)
    with pytest.raises(z.ShuttingDownError):
        host.wait_for_peers(1, timeout=WAIT)
