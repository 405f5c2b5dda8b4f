"""The route cache of global objects forgets what it no longer uses (issue 16): a route
lives `route_cache_max_age`, and expired routes are purged, so a node that reached many
ids does not keep them all; the next call to a purged id resolves it again."""

from __future__ import annotations

import msgspec

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness, wait_until

from ._mesh import mesh_config


class Ask(msgspec.Struct):
    n: int


class Hall(z.Spot):
    mode = z.SpotMode.SPOT_WIDE
    type_name = "route-cache.Hall"

    @z.handler
    def ask(self, ctx: z.SpotContext, msg: Ask) -> int:
        return msg.n + 1


def _mesh(stats: z.Host) -> z.MeshStatistics:
    mesh = stats.statistics().mesh
    assert mesh is not None
    return mesh


def test_expired_routes_are_purged_and_resolved_again(harness: HostHarness) -> None:
    store = z.MemoryLocationStore()
    lease = z.LeaseConfig(renew_interval=0.1, ttl=2.0, renew_timeout=0.1, fencing_margin=0.5)
    server = harness.host(spots=[Hall], mesh=mesh_config(lease=lease), location=store)
    client = harness.host(
        mesh=mesh_config(lease=lease, route_cache_max_age=1.0, peers=(server.node.endpoint,)),
        location=store,
    )
    client.wait_for_peers(1, timeout=WAIT)
    ids = [client.spots.create(Hall).submit_sync().ref.spot_id for _ in range(5)]
    for n, spot_id in enumerate(ids):
        assert client.request_to_spot(spot_id, Ask(n), reply=int).submit_sync() == n + 1
    # Cached (filled by the creates and the calls; one may have expired under load).
    assert 1 <= _mesh(client).route_cache_size <= len(ids)
    # Unused for longer than route_cache_max_age: purged by the node itself.
    assert wait_until(lambda: _mesh(client).route_cache_size == 0)
    misses = _mesh(client).route_cache_misses
    assert client.request_to_spot(ids[0], Ask(7), reply=int).submit_sync() == 8
    assert _mesh(client).route_cache_misses == misses + 1
    assert _mesh(client).route_cache_size == 1
