"""One RouteMesh node in a process of its own, for the multi-process tests.

Run as `python -m tests.integration.mesh.node_main '<json config>'`. The config keys:

- `mesh` (the mesh name), `listen`, `peers` (endpoints), `liveness_interval`,
  `liveness_timeout`, `credit_window`, `peer_expiry`, `routing_id` (optional): as
  `MeshConfig`;
- `channels`: ChannelName -> weight, each served by `Worker`;
- `lane_items`: `Host(application_lane_items=...)` (optional);
- `redis`: `{"url": ..., "key_prefix": ...}` for a `RedisLocationStore` (discovery);
- `expect_peers`: how many peers to wait for (default: as many as `peers`);
- `rooms`: true to register the global `Room` Spot (rooms.py; needs `redis`), with
  `lease`: `LeaseConfig` keywords (optional), `placement_weight` (optional) and
  `on_lease_lost` (optional, as `MeshConfig`).

The node handler (`Control`) answers `Ping`, echoes a `Blob` with its SHA-256, relays a
`Blob` to another node, naps, reports the channel handler's count and the Host's
statistics, and sets a channel weight. `Worker` counts every message it handles.

Once started the process prints one JSON line, `{"routing_id": ..., "endpoint": ...}`;
once `expect_peers` peers are READY here, a second, `{"ready": [routing ids]}` (so a
first request either way finds both sides of each pair READY). It serves until stdin
closes or SIGTERM arrives, shuts the Host down (exit status 0 when it stopped cleanly, 3
otherwise), prints `{"stopped": outcome, "reason": reason, "handled": n}` (`handled`:
the channel handler's count) and closes its store. Each `StateChange` of its owner
lease is printed as `{"state_change": kind, "generation": n}`; with
`on_lease_lost="shutdown"` a lost lease ends the process at once, exit status 4 (what
a supervisor restarts).
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import threading
from typing import Any

import zlink_actors as z

from .messages import (
    ALL_TYPES,
    Blob,
    Count,
    Done,
    Echoed,
    HowMany,
    Job,
    JobLog,
    Load,
    Nap,
    Napped,
    Ping,
    Pong,
    Relay,
    Seq,
    SeqLog,
    SetWeight,
    Stats,
    StatsReply,
)
from .rooms import ROOM_TYPES, CreateRooms, Made, Room, RoomCounts, Rooms, counts

#: Set when the node is asked to stop; every nap ends at once then.
_stopping = threading.Event()
_count_lock = threading.Lock()
_print_lock = threading.Lock()
_handled = 0
_napping = 0
#: The numbers of the `Seq` one-ways the channel handler ran, in the order it ran them.
_seqs: list[int] = []
#: The numbers of the `Job` requests the channel handler ran, in the order it ran them.
_jobs: list[int] = []
_host: list[z.Host] = []


def _say(line: dict[str, Any]) -> None:
    """Print one JSON line whole (the completion dispatcher prints state changes)."""
    with _print_lock:
        print(json.dumps(line), flush=True)


def _count() -> None:
    global _handled
    with _count_lock:
        _handled += 1


def _rid(ctx: z.NodeContext | z.ChannelContext) -> str:
    info = ctx.node
    assert info is not None
    return str(info.routing_id)


def _nap(msg: Nap) -> None:
    global _napping
    with _count_lock:
        _napping += 1
    try:
        if msg.through_stop:
            threading.Event().wait(msg.seconds)  # the node's shutdown waits for it
        else:
            _stopping.wait(msg.seconds)
    finally:
        with _count_lock:
            _napping -= 1


def _echo(rid: str, data: bytes) -> Echoed:
    return Echoed(hashlib.sha256(data).hexdigest(), len(data), data, rid)


class Control(z.NodeHandler):
    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> Pong:
        return Pong(msg.n + 1, _rid(ctx))

    @z.handler
    def blob(self, ctx: z.NodeContext, msg: Blob) -> Echoed:
        return _echo(_rid(ctx), msg.data)

    @z.handler
    async def relay(self, ctx: z.NodeContext, msg: Relay) -> Echoed:
        info = ctx.node
        assert info is not None
        call = ctx.request_to_node(info.mesh, msg.target, Blob(msg.data), reply=Echoed)
        reply: Echoed = await call.timeout(8.0).submit()
        return reply

    @z.handler
    def nap(self, ctx: z.NodeContext, msg: Nap) -> Napped:
        _nap(msg)
        return Napped(_rid(ctx))

    @z.handler
    def how_many(self, ctx: z.NodeContext, msg: HowMany) -> Count:
        with _count_lock:
            return Count(_handled, _rid(ctx))

    @z.handler
    def seq_log(self, ctx: z.NodeContext, msg: SeqLog) -> list[int]:
        with _count_lock:
            return list(_seqs)

    @z.handler
    def job_log(self, ctx: z.NodeContext, msg: JobLog) -> list[int]:
        with _count_lock:
            return list(_jobs)

    @z.handler
    def set_weight(self, ctx: z.NodeContext, msg: SetWeight) -> int:
        _host[0].set_channel_weight(msg.channel, msg.weight)
        return msg.weight

    @z.handler
    def room_counts(self, ctx: z.NodeContext, msg: RoomCounts) -> Rooms:
        constructed, handled = counts()
        return Rooms(constructed, handled, _rid(ctx))

    @z.handler
    async def create_rooms(self, ctx: z.NodeContext, msg: CreateRooms) -> list[Made]:
        made = []
        for spot_id in msg.ids:
            result = await ctx.spots.get_or_create(spot_id, Room).timeout(8.0).submit()
            ref = result.ref
            made.append(Made(type(result).__name__, ref.spot_id, ref.generation, ref.routing_id))
        return made

    @z.handler
    def stats(self, ctx: z.NodeContext, msg: Stats) -> StatsReply:
        host = _host[0]
        stats = host.statistics()
        peers = {p.routing_id: p.state.value for p in host.peers()}
        with _count_lock:
            napping = _napping
        return StatsReply(_rid(ctx), stats.waiting_sends, stats.queued_records, napping, peers)


class Worker(z.ChannelHandler):
    @z.handler
    def job(self, ctx: z.ChannelContext, msg: Job) -> Done:
        _count()
        with _count_lock:
            _jobs.append(msg.n)
        return Done(msg.n, _rid(ctx))

    @z.handler
    def nap(self, ctx: z.ChannelContext, msg: Nap) -> Napped:
        _count()
        _nap(msg)
        return Napped(_rid(ctx))

    @z.handler
    def load(self, ctx: z.ChannelContext, msg: Load) -> None:
        _count()

    @z.handler
    def seq(self, ctx: z.ChannelContext, msg: Seq) -> None:
        _count()
        with _count_lock:
            _seqs.append(msg.n)


def _build(
    config: dict[str, Any], stop: threading.Event
) -> tuple[z.Host, z.RedisLocationStore | None]:
    mesh_options: dict[str, Any] = {
        "listen": config.get("listen", "tcp://127.0.0.1:0"),
        "peers": tuple(config.get("peers", ())),
        "liveness_interval": config.get("liveness_interval", 0.2),
        "liveness_timeout": config.get("liveness_timeout", 1.0),
    }
    for key in ("credit_window", "peer_expiry", "routing_id"):
        if key in config:
            mesh_options[key] = config[key]
    if "lease" in config:
        mesh_options["lease"] = z.LeaseConfig(**config["lease"])
    if "placement_weight" in config:
        mesh_options["placement_weight"] = config["placement_weight"]
    if "on_lease_lost" in config:
        mesh_options["on_lease_lost"] = config["on_lease_lost"]

    def state_changed(change: z.StateChange) -> None:
        line = {"state_change": change.kind.value, "generation": change.lease_generation}
        _say(line)
        if change.kind is z.StateChangeKind.LEASE_LOST:
            stop.set()  # the Host shuts itself down: so does the process

    store = None
    if "redis" in config:
        store = z.RedisLocationStore(
            config["redis"]["url"], key_prefix=config["redis"]["key_prefix"]
        )
    channels = {
        name: z.ChannelServer(Worker, weight=weight)
        for name, weight in config.get("channels", {}).items()
    }
    host = z.Host(
        spots=[Room] if config.get("rooms") else [],
        channels=channels,
        node_handler=Control,
        mesh=z.MeshConfig(config.get("mesh", "game"), **mesh_options),
        location=store,
        message_types=(*ALL_TYPES, *ROOM_TYPES),
        application_lane_items=config.get("lane_items", 1024),
        on_state_change=state_changed,
    )
    return host, store


def main() -> int:
    config = json.loads(sys.argv[1])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin() -> None:
        sys.stdin.read()  # until the parent closes our stdin (or dies)
        stop.set()

    host, store = _build(config, stop)
    _host.append(host)
    try:
        host.start()
        info = host.node
        _say({"routing_id": info.routing_id, "endpoint": info.endpoint})
        expect = config.get("expect_peers", len(config.get("peers", ())))
        if expect:
            try:
                ready = host.wait_for_peers(expect, timeout=config.get("peer_wait", 20.0))
                line: dict[str, Any] = {"ready": sorted(p.routing_id for p in ready)}
            except z.DeadlineExceededError as exc:
                line = {"ready_error": str(exc)}
            _say(line)
        threading.Thread(target=watch_stdin, daemon=True).start()
        while not stop.wait(0.1):  # wake now and then so SIGTERM's handler runs
            pass
    finally:
        _stopping.set()
        result = host.shutdown(5.0)
        if store is not None:
            store.close()
    with _count_lock:
        handled = _handled
    _say({"stopped": result.outcome.value, "reason": result.reason.value, "handled": handled})
    if result.reason is z.ShutdownReason.LEASE_LOST:
        return 4
    return 0 if result.outcome is z.ShutdownOutcome.STOPPED else 3


if __name__ == "__main__":
    sys.exit(main())
