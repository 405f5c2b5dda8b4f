"""Discovery through the Location Store (issue 15, item 2): Hosts with `location=` and no
`peers=` find each other from the node descriptors they publish, and a node that shuts
down withdraws its descriptor. In one process on a `MemoryLocationStore`, and across
processes on a real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import zlink_actors as z
from zlink_actors.location import LocationStore, list_nodes
from zlink_actors.testing import WAIT, HostHarness

from .messages import ALL_TYPES, Ping, Pong
from .node_main import Control
from .nodes import FAST, NodeProcesses, wait_until

MESH = "game"
#: Descriptors are polled about once a second and a node waits up to 3 s for a peer with
#: a lower routing id to dial it first: discovery takes a few seconds, not WAIT.
DISCOVERY_WAIT = 2 * WAIT


def _listed(store: LocationStore) -> set[str]:
    """The routing ids with a live descriptor in `store` (on a loop of its own)."""
    return {node.routing_id for node in asyncio.run(list_nodes(store, MESH))}


def _discovering(harness: HostHarness, store: LocationStore) -> z.Host:
    return harness.host(
        mesh=z.MeshConfig(MESH, **FAST),
        location=store,
        node_handler=Control,
        message_types=ALL_TYPES,
    )


def _ping(host: z.Host, rid: str, n: int) -> Any:
    call = host.request_to_node(MESH, rid, Ping(n), reply=Pong)
    return call.timeout(WAIT).submit_sync()


def test_three_hosts_on_one_memory_store_find_each_other_without_peers(
    harness: HostHarness,
) -> None:
    store = z.MemoryLocationStore()
    try:
        hosts = [_discovering(harness, store) for _ in range(3)]
        infos = {h.node.routing_id: h.node for h in hosts}
        # Each publishes its descriptor once it serves (on its I/O loop).
        assert wait_until(lambda: _listed(store) == set(infos))
        for host in hosts:
            ready = host.wait_for_peers(2, timeout=DISCOVERY_WAIT)
            assert {p.routing_id: p.endpoint for p in ready} == {
                rid: info.endpoint for rid, info in infos.items() if rid != host.node.routing_id
            }
        for host in hosts:  # every side READY: each reaches the two others
            for rid in set(infos) - {host.node.routing_id}:
                assert _ping(host, rid, 1) == Pong(2, rid)
        # A Host that shuts down withdraws its descriptor; the others see it leave.
        gone = hosts[0]
        rid = gone.node.routing_id
        assert gone.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
        assert _listed(store) == set(infos) - {rid}
        for host in hosts[1:]:
            assert wait_until(
                lambda host=host: any(
                    p.routing_id == rid and p.state is z.PeerState.LOST for p in host.peers()
                )
            )
    finally:
        harness.close()
        store.close()


def test_two_node_processes_and_this_host_find_each_other_through_redis(
    harness: HostHarness,
    nodes: NodeProcesses,
    redis_store: tuple[z.RedisLocationStore, dict[str, str]],
) -> None:
    store, redis = redis_store
    a = nodes.launch(redis=redis, expect_peers=2, peer_wait=DISCOVERY_WAIT)
    b = nodes.launch(redis=redis, expect_peers=2, peer_wait=DISCOVERY_WAIT)
    host = _discovering(harness, store)
    nodes.ready(a, b)
    me = host.node.routing_id
    ready = host.wait_for_peers(2, timeout=DISCOVERY_WAIT)
    assert {p.routing_id: p.endpoint for p in ready} == {
        a.routing_id: a.endpoint,
        b.routing_id: b.endpoint,
    }
    # The two node processes found each other and this Host too.
    nodes.joined(a, b, timeout=DISCOVERY_WAIT)
    assert set(a.ready_peers) == {me, b.routing_id}
    assert set(b.ready_peers) == {me, a.routing_id}
    for node in (a, b):
        assert _ping(host, node.routing_id, 5) == Pong(6, node.routing_id)
    assert wait_until(lambda: _listed(store) == {me, a.routing_id, b.routing_id})

    # A node process that stops cleanly has withdrawn its descriptor when it exits.
    assert b.stop() == 0, b.log()
    assert b.gone()
    assert _listed(store) == {me, a.routing_id}
    assert wait_until(
        lambda: any(
            p.routing_id == b.routing_id and p.state is z.PeerState.LOST for p in host.peers()
        )
    )
    # So does this Host.
    assert host.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert _listed(store) == {a.routing_id}
    assert a.stop() == 0, a.log()
    assert _listed(store) == set()
