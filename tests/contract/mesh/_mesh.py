"""Meshed Hosts for the RouteMesh contract tests: several Hosts in one process on tcp
loopback (port 0), with short liveness, connected to each other and READY.

`mesh_hosts(harness, n, ...)` builds them through a `HostHarness` (the suite's `harness`
fixture), so they are shut down at the end of the test whether it passed or not. `MESH`,
`INTERVAL` and `TIMEOUT` are the mesh name and liveness timings every test uses unless it
says otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Unpack

from zlink_actors import Host, MeshConfig, PeerInfo, PeerState
from zlink_actors.testing import WAIT, HostHarness, HostOptions, wait_until

__all__ = [
    "INTERVAL",
    "MESH",
    "TIMEOUT",
    "find_peer",
    "mesh_config",
    "mesh_hosts",
    "peer_state",
    "ready_ids",
    "wait_for_state",
]

MESH = "game"
#: Liveness probe interval and timeout of every test mesh (real time; short on purpose).
INTERVAL = 0.2
TIMEOUT = 1.0


def mesh_config(name: str = MESH, **options: Any) -> MeshConfig:
    """A `MeshConfig` on tcp loopback, port 0, with the short test liveness."""
    options.setdefault("liveness_interval", INTERVAL)
    options.setdefault("liveness_timeout", TIMEOUT)
    return MeshConfig(name, **options)


def mesh_hosts(
    harness: HostHarness,
    n: int,
    *,
    name: str = MESH,
    each: Sequence[HostOptions] = (),
    **options: Unpack[HostOptions],
) -> list[Host]:
    """Start `n` meshed Hosts, each dialling every one before it; return once every Host
    sees the `n - 1` others READY (bounded by `WAIT`, asserted).

    Args:
        harness: shuts the Hosts down at the end of the test.
        n: how many Hosts.
        name: the mesh name.
        each: per-Host options (index i for Host i), over `options`.
        **options: `Host` options for every Host (`mesh=` is made here unless given).
    """
    hosts: list[Host] = []
    for i in range(n):
        merged: HostOptions = {**options, **(each[i] if i < len(each) else {})}
        mesh = merged.get("mesh") or mesh_config(name)
        dial = tuple(h.node.endpoint for h in hosts)
        merged["mesh"] = dataclasses.replace(mesh, peers=(*mesh.peers, *dial))
        hosts.append(harness.host(**merged))
    for host in hosts:
        ready = host.wait_for_peers(n - 1, timeout=WAIT)
        assert len(ready) >= n - 1
    return hosts


def peer_state(host: Host, routing_id: str) -> PeerState | None:
    """The state `host` lists for `routing_id`, None when it does not know it."""
    for peer in host.peers():
        if peer.routing_id == routing_id:
            return peer.state
    return None


def ready_ids(host: Host) -> set[str]:
    """The routing ids `host` lists READY."""
    return {p.routing_id for p in host.peers() if p.state is PeerState.READY}


def wait_for_state(host: Host, routing_id: str, *states: PeerState) -> bool:
    """Wait (bounded by `WAIT`) until `host` lists `routing_id` in one of `states`."""
    return wait_until(lambda: peer_state(host, routing_id) in states)


def find_peer(host: Host, routing_id: str) -> PeerInfo:
    """The `PeerInfo` `host` lists for `routing_id` (AssertionError when none)."""
    found = [p for p in host.peers() if p.routing_id == routing_id]
    assert found, f"{routing_id} not in peers()"
    return found[0]
