"""`host.wait_ready(timeout)` (issue 26, item 5): it returns once the owner lease admits,
the store's node list was read and every node listed there is READY here, and every
`peers=` endpoint has a live peer; else `DeadlineExceededError` names what is missing."""

from __future__ import annotations

import asyncio
import socket

import pytest

import zlink_actors as z
from zlink_actors.location.nodes import NodeDescriptor, publish_node
from zlink_actors.testing import WAIT, HostHarness

from ._mesh import MESH, mesh_config


def _free_endpoint() -> str:
    """A loopback endpoint nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


class Echo(z.ChannelHandler):
    @z.handler
    def echo(self, ctx: z.ChannelContext, msg: int) -> int:
        return msg


def test_wait_ready_returns_once_the_lease_admits_and_every_listed_node_is_ready(
    harness: HostHarness,
) -> None:
    store = z.MemoryLocationStore()
    server = harness.host(mesh=mesh_config(), location=store, channels={"echo": Echo})
    server.wait_ready(WAIT)  # its descriptor is in the store: it read the list after it
    client = harness.host(mesh=mesh_config(), location=store)
    client.wait_ready(WAIT)
    assert client.statistics().mesh is not None
    assert client.statistics().mesh.lease_admitting  # type: ignore[union-attr]
    [peer] = [p for p in client.peers() if p.routing_id == server.node.routing_id]
    assert peer.state is z.PeerState.READY
    # Ready means reachable: the listed channel server answers at once.
    assert client.request_to_channel("echo", 7, reply=int).submit_sync() == 7


def test_wait_ready_names_a_listed_node_that_is_not_ready(harness: HostHarness) -> None:
    store = z.MemoryLocationStore()
    ghost = NodeDescriptor(MESH, "node-ghost", (_free_endpoint(),), 1)
    asyncio.run(publish_node(store, ghost, 60.0))  # listed, and nobody answers there
    host = harness.host(mesh=mesh_config(), location=store)
    with pytest.raises(z.DeadlineExceededError) as caught:
        host.wait_ready(0.5)
    message = str(caught.value)
    assert f"node 'node-ghost' at {ghost.endpoints[0]} is" in message, message
    assert "owner lease" not in message  # the lease admits: only the ghost is missing


def test_wait_ready_names_a_peers_endpoint_with_no_live_peer(harness: HostHarness) -> None:
    nobody = _free_endpoint()
    host = harness.host(mesh=mesh_config(peers=(nobody,)))
    with pytest.raises(z.DeadlineExceededError, match=f"peers= endpoint {nobody} has no READY"):
        host.wait_ready(0.3)
    listener = harness.host(mesh=mesh_config())
    dialler = harness.host(mesh=mesh_config(peers=(listener.node.endpoint,)))
    dialler.wait_ready(WAIT)
    assert [p.routing_id for p in dialler.peers()] == [listener.node.routing_id]


def test_wait_ready_before_start_after_shutdown_and_without_a_mesh(harness: HostHarness) -> None:
    host = z.Host(mesh=mesh_config())
    try:
        with pytest.raises(z.InvalidOperationError):
            host.wait_ready(WAIT)
        host.start()
        host.wait_ready(WAIT)  # no store and no peers=: ready once it serves
    finally:
        assert host.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    with pytest.raises(z.ShuttingDownError):
        host.wait_ready(WAIT)
    harness.host().wait_ready(WAIT)
    with pytest.raises(ValueError, match="timeout"):
        harness.host().wait_ready(0)
