"""What the chaos run's nodes host and the driver calls: a global Spot (`Tally`) and a
global Actor (`Walker`) whose handler logs its start and end, and the node handler the
driver asks for probes and statistics."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

import zlink_actors as z

from .events import EventLog

__all__ = [
    "ALL_TYPES",
    "ChaosControl",
    "Hit",
    "Hitted",
    "MakeHere",
    "NodeStats",
    "Ping",
    "Pong",
    "Tally",
    "Walker",
    "mesh_figures",
    "set_host",
    "set_log",
]

#: The log of this process (set by the node main; nothing is logged without it).
_log: list[EventLog] = []


#: The Host of this node process (set by the node main).
_hosts: list[z.Host] = []


def set_log(log: EventLog) -> None:
    _log[:] = [log]


def set_host(host: z.Host) -> None:
    _hosts[:] = [host]


class Hit(msgspec.Struct, frozen=True):
    """One call of the driver, one-way or request: `call` is its id in the log."""

    call: str


class Hitted(msgspec.Struct, frozen=True):
    call: str
    node: str
    life: str


class Ping(msgspec.Struct, frozen=True):
    n: int


class Pong(msgspec.Struct, frozen=True):
    n: int
    node: str


class MakeHere(msgspec.Struct, frozen=True):
    """Ask a node to get-or-create an object itself (placed on it: it registers the
    types): the probe that it creates and serves objects again."""

    kind: str  # "spot" or "actor"
    id: str


class NodeStats(msgspec.Struct, frozen=True):
    """Ask a node for its mesh figures (`mesh_figures`)."""


ALL_TYPES: tuple[type, ...] = (Hit, Hitted, Ping, Pong, MakeHere, NodeStats)


def _node(ctx: Any) -> str:
    info = ctx.node
    return str(info.routing_id) if info is not None else ""


def _hit(ctx: Any, obj: str, life: str, msg: Hit) -> Hitted:
    node = _node(ctx)
    for log in _log:
        log.write("start", id=msg.call, obj=obj, life=life, node=node)
    for log in _log:
        log.write("done", id=msg.call, life=life)
    return Hitted(msg.call, node, life)


class Tally(z.Spot):
    """A global Spot: one turn at a time; `life` names this instance."""

    mode = z.SpotMode.SPOT_WIDE

    def __init__(self) -> None:
        super().__init__()
        self.life = uuid.uuid4().hex[:12]

    @z.handler
    def hit(self, ctx: z.SpotContext, msg: Hit) -> Hitted:
        return _hit(ctx, f"spot:{ctx.spot_id}", self.life, msg)


class Walker(z.Actor):
    """A global Actor (in no Spot)."""

    def __init__(self) -> None:
        super().__init__()
        self.life = uuid.uuid4().hex[:12]

    @z.handler
    def hit(self, ctx: z.ActorContext, msg: Hit) -> Hitted:
        return _hit(ctx, f"actor:{ctx.actor_id}", self.life, msg)


def mesh_figures(host: z.Host) -> dict[str, Any]:
    """The mesh statistics the checker reads (`host.statistics().mesh`): as a sender,
    `dropped_after_admission` (one-ways counted lost with a peer that is gone); as a
    receiver, `dropped_messages` (one-ways received that reached no handler),
    `duplicate_messages`, `late_records` (records read late from a peer found silent:
    not a `MeshStatistics` field, read from the node itself), and the lease's state."""
    mesh = host.statistics().mesh
    if mesh is None:
        return {}
    node = getattr(host, "_mesh", None)  # read only: `late_records` is not in the statistics
    return {
        "dropped_after_admission": mesh.dropped_after_admission,
        "dropped_by_peer": dict(mesh.dropped_by_peer),
        "dropped_messages": mesh.dropped_messages,
        "duplicate_messages": mesh.duplicate_messages,
        "late_records": int(getattr(node, "late_records", 0)),
        "decode_errors": mesh.decode_errors,
        "late_replies": mesh.late_replies,
        "lost_peers": mesh.lost_peers,
        "lease_state": mesh.lease_state,
        "lease_admitting": mesh.lease_admitting,
        "lease_generation": mesh.lease_generation,
        "lease_recoveries": mesh.lease_recoveries,
        "objects_reclaimed": mesh.objects_reclaimed,
        "ownership_lost": mesh.ownership_lost,
        "unavailable": dict(mesh.unavailable),
        "peers": dict(mesh.peers),
    }


class ChaosControl(z.NodeHandler):
    """The node handler: ping, create-here, statistics."""

    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> Pong:
        return Pong(msg.n, _node(ctx))

    @z.handler
    async def make_here(self, ctx: z.NodeContext, msg: MakeHere) -> str:
        if msg.kind == "spot":
            made = await ctx.spots.get_or_create(msg.id, Tally).timeout(5.0).submit()
            return str(made.ref.routing_id)
        created = await ctx.actors.get_or_create(msg.id, Walker).timeout(5.0).submit()
        return str(created.ref.routing_id)

    @z.handler
    def stats(self, ctx: z.NodeContext, msg: NodeStats) -> dict[str, Any]:
        return mesh_figures(_hosts[0])
