"""Global Spots and Actors across meshed Hosts in one process (issue 16; design/mesh.md §2
"Global objects", "Owner leases").

`GlobalMesh` starts Hosts that share one `MemoryLocationStore` (they keep their authority
records, owner leases and node descriptors in it), each on tcp loopback with the short
liveness of `_mesh.py`, each dialling the live Hosts started before it (discovery through
the store would find them too, a second later). `add()` returns a Host only once it and
every live Host before it see each other READY (bounded by `WAIT`, asserted). Closing the
mesh (the end of its `with` block, also when the test failed) sets every latch first, then
shuts every Host still serving down in parallel (a meshed Host with `location=` takes
about a second to stop, so one at a time would cost the suite seconds per test), asserts
that each stopped cleanly, and closes the store last.

The store's clock is a `StoreClock` the test can move forward (the owner leases expire in
the store when it passes their TTL). `Cuttable` wraps the store for one Host so the test
can cut that Host off from it; `GlobalMesh.kill()` cuts a Host off from the store and
from its peers at once: what the rest of the mesh sees of a process that was SIGKILLed.

The object classes are module-level, with a fixed `type_name`, and registered by every
Host that serves them; they report what they do to the test's `Journal` (`journal()`),
which `GlobalMesh` installs for the length of a test.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import msgspec

from zlink_actors import (
    Actor,
    ActorContext,
    ActorRef,
    Host,
    HostState,
    InstanceSpot,
    JoinResult,
    LeaseConfig,
    MemoryLocationStore,
    MeshStatistics,
    PeerState,
    Rejected,
    RejectedError,
    ShutdownOutcome,
    ShutdownResult,
    Spot,
    SpotConfig,
    SpotContext,
    UnavailableError,
    handler,
)
from zlink_actors.location.spi import (
    Committed,
    Conflict,
    Delete,
    Found,
    IfMissing,
    IfVersion,
    LocationStore,
    Missing,
    Put,
    ScanPage,
)
from zlink_actors.testing import WAIT, wait_until

from ._mesh import mesh_config

__all__ = [
    "MESH",
    "SHARED",
    "Board",
    "Cuttable",
    "Faulty",
    "Enter",
    "GlobalMesh",
    "Hall",
    "Hit",
    "Hold",
    "Journal",
    "Lounge",
    "Match",
    "News",
    "Note",
    "Ping",
    "Player",
    "Room",
    "StoreClock",
    "Ticker",
    "Where",
    "WhichSpot",
    "journal",
    "mesh_stats",
    "run_racers",
]

#: The mesh name of every Host these tests start.
MESH = "global"


# -- payloads ----------------------------------------------------------------------------


class Where(msgspec.Struct, frozen=True):
    """Asks an object for the routing id of the node it runs on."""


class Ping(msgspec.Struct, frozen=True):
    n: int = 0


class WhichSpot(msgspec.Struct, frozen=True):
    """Asks an Actor for the id of the Spot it is a member of."""


class Note(msgspec.Struct, frozen=True):
    """A numbered one-way message; the object journals `(its id, n)`."""

    n: int


class Hold(msgspec.Struct, frozen=True):
    """Makes the handler journal `entered`, then wait for the latch `tag` of the test."""

    tag: str = "hold"


class Hit(msgspec.Struct, frozen=True):
    """A message to an Instance Spot, tagged with who sent it."""

    sender: str
    n: int


class News(msgspec.Struct, frozen=True):
    n: int


class Enter(msgspec.Struct, frozen=True):
    """Makes a Player join the Spot `room` (`join_spot(room).defer()`)."""

    room: str


#: The payload types every Host of these tests knows (a Host encodes only what it knows).
SHARED: tuple[type, ...] = (Where, Ping, WhichSpot, Note, Hold, Hit, News, Enter)


# -- what the objects report -------------------------------------------------------------


class Journal:
    """What the objects of one test did, by key, in order (thread-safe), and the latches
    their `Hold` handlers wait on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list[object]] = {}
        self._latches: dict[str, threading.Event] = {}
        self._events: dict[str, threading.Event] = {}

    def note(self, key: str, item: object) -> None:
        """Append `item` under `key` and set the event `key`."""
        with self._lock:
            self._entries.setdefault(key, []).append(item)
            event = self._events.setdefault(key, threading.Event())
        event.set()

    def items(self, key: str) -> list[object]:
        with self._lock:
            return list(self._entries.get(key, ()))

    def count(self, key: str) -> int:
        with self._lock:
            return len(self._entries.get(key, ()))

    def counts(self, key: str) -> Counter[object]:
        """How often each item was noted under `key`."""
        return Counter(self.items(key))

    def event(self, key: str) -> threading.Event:
        """Set once something was noted under `key`."""
        with self._lock:
            return self._events.setdefault(key, threading.Event())

    def latch(self, tag: str) -> threading.Event:
        """The latch a `Hold(tag)` handler waits on; `release_all()` sets every one."""
        with self._lock:
            return self._latches.setdefault(tag, threading.Event())

    def wait_count(self, key: str, n: int, within: float = WAIT) -> bool:
        """Wait (bounded) until at least `n` items were noted under `key`."""
        return wait_until(lambda: self.count(key) >= n, within)

    def release_all(self) -> None:
        with self._lock:
            latches = list(self._latches.values())
        for latch in latches:
            latch.set()


_current = Journal()


def journal() -> Journal:
    """The journal of the test running now (installed by `GlobalMesh`)."""
    return _current


def _rid(ctx: Any) -> str:
    node = ctx.node
    assert node is not None, "a Host of a GlobalMesh always has a node"
    rid: str = node.routing_id
    return rid


def _hold(ctx: Any, msg: Hold, who: str) -> str:
    log = journal()
    log.note("entered", (who, msg.tag))
    assert log.latch(msg.tag).wait(WAIT + 5), f"latch {msg.tag!r} was never set"
    log.note("held", (who, msg.tag))
    return "held"


# -- objects -----------------------------------------------------------------------------


class Room(Spot):
    """A User Spot that journals its life: `room-built` (its constructor: the factory
    ran), `created` (spot_id, routing id) in `on_create`, `closed` in `on_closing`.
    `on_create` waits for the latch "create" on the request `"hold-create"`, returns
    `Rejected("no")` for `"reject"`, else `"made on <routing id>"`."""

    type_name = "g.Room"

    def __init__(self) -> None:
        super().__init__()
        journal().note("room-built", None)

    def on_create(self, ctx: SpotContext, request: object) -> object:
        log = journal()
        log.note("created", (ctx.spot_id, _rid(ctx)))
        if request == "hold-create":
            assert log.latch("create").wait(WAIT + 5)
        if request == "reject":
            return Rejected("no")
        return f"made on {_rid(ctx)}"

    def on_closing(self, ctx: SpotContext, reason: object) -> None:
        journal().note("closed", (ctx.spot_id, _rid(ctx)))

    @handler
    def where(self, ctx: SpotContext, msg: Where) -> str:
        journal().note("where", ctx.spot_id)
        return _rid(ctx)

    @handler
    def note(self, ctx: SpotContext, msg: Note) -> None:
        journal().note("note", (ctx.spot_id, msg.n, _rid(ctx)))

    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        journal().note("ping", (ctx.spot_id, msg.n))
        return msg.n

    @handler
    def hold(self, ctx: SpotContext, msg: Hold) -> str:
        return _hold(ctx, msg, ctx.spot_id)


class Hall(Spot):
    """Another User Spot type (for type mismatches)."""

    type_name = "g.Hall"

    @handler
    def where(self, ctx: SpotContext, msg: Where) -> str:
        return _rid(ctx)


class Board(Spot):
    """A Spot subscribed to ("news", "all"); journals `news` (spot_id, n)."""

    type_name = "g.Board"

    def configure(self, cfg: SpotConfig) -> None:
        cfg.subscribe("news", "all")

    @handler
    def news(self, ctx: SpotContext, msg: News) -> None:
        journal().note("news", (ctx.spot_id, msg.n))

    @handler
    def where(self, ctx: SpotContext, msg: Where) -> str:
        return _rid(ctx)


class Lounge(Spot):
    """A Spot an Actor may try to join; journals `on_actor_join` and approves."""

    type_name = "g.Lounge"

    def on_actor_join(self, ctx: SpotContext, actor: ActorRef) -> bool:
        journal().note("on_actor_join", (ctx.spot_id, actor.actor_id))
        return True

    @handler
    def where(self, ctx: SpotContext, msg: Where) -> str:
        return _rid(ctx)


class Player(Actor):
    """An Actor: `built` in its constructor; joins a Spot on `Enter`; journals
    `join_completed` (actor_id, JoinResult)."""

    type_name = "g.Player"

    def __init__(self) -> None:
        super().__init__()
        journal().note("player-built", None)

    @handler
    def where(self, ctx: ActorContext, msg: Where) -> str:
        return _rid(ctx)

    @handler
    def ping(self, ctx: ActorContext, msg: Ping) -> int:
        journal().note("ping", (ctx.actor_id, msg.n))
        return msg.n

    @handler
    def note(self, ctx: ActorContext, msg: Note) -> None:
        journal().note("note", (ctx.actor_id, msg.n, _rid(ctx)))

    @handler
    def hold(self, ctx: ActorContext, msg: Hold) -> str:
        return _hold(ctx, msg, ctx.actor_id)

    @handler
    def enter(self, ctx: ActorContext, msg: Enter) -> None:
        ctx.join_spot(msg.room).defer()

    @handler
    def spot_of(self, ctx: ActorContext, msg: WhichSpot) -> str:
        return ctx.spot_id

    def on_join_completed(self, ctx: ActorContext, result: JoinResult) -> None:
        journal().note("join_completed", (ctx.actor_id, result))


class Match(InstanceSpot):
    """An Instance Spot: `match-built` (spot_id, routing id) in `on_initialize` (once per
    activation), `hit` (spot_id, sender, n) per message."""

    type_name = "g.Match"

    def on_initialize(self, ctx: SpotContext) -> None:
        journal().note("match-built", (ctx.spot_id, _rid(ctx)))

    @handler
    def hit(self, ctx: SpotContext, msg: Hit) -> str:
        journal().note("hit", (ctx.spot_id, msg.sender, msg.n))
        return _rid(ctx)


class Ticker(Spot):
    """A Spot whose timer "t" ticks every 20 ms from `on_initialize`; journals `tick`."""

    type_name = "g.Ticker"

    def on_initialize(self, ctx: SpotContext) -> None:
        ctx.timers.start("t", 0.02, self._tick)

    def _tick(self, ctx: SpotContext, tick: object) -> None:
        journal().note("tick", ctx.spot_id)


class Faulty(Spot):
    """A Spot whose handlers fail: `Ping(0)` raises a `ZlinkError` (RejectedError), any
    other `Ping` a plain `ValueError`."""

    type_name = "g.Faulty"

    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        if msg.n == 0:
            raise RejectedError("no pings today")
        raise ValueError(f"bad ping {msg.n}")


# -- the store ---------------------------------------------------------------------------


class StoreClock:
    """The `MemoryLocationStore`'s clock: real epoch time plus an offset the test moves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset = 0.0

    def __call__(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds


class Cuttable:
    """A `LocationStore` that passes everything to `inner` until `cut()`; from then on
    every operation raises `UnavailableError`, as for a store that became unreachable
    (the renewals of the Host using it fail, and its lease runs out in the store)."""

    def __init__(self, inner: LocationStore) -> None:
        self._inner = inner
        self._cut = threading.Event()

    def cut(self) -> None:
        self._cut.set()

    def _check(self) -> None:
        if self._cut.is_set():
            raise UnavailableError("the test cut this Host off from the store")

    async def read(self, key: str) -> Found | Missing:
        self._check()
        return await self._inner.read(key)

    async def write(
        self, conditions: Sequence[IfMissing | IfVersion], mutations: Sequence[Put | Delete]
    ) -> Committed | Conflict:
        self._check()
        return await self._inner.write(conditions, mutations)

    async def scan(self, prefix: str, *, cursor: str | None = None, limit: int = 1000) -> ScanPage:
        self._check()
        return await self._inner.scan(prefix, cursor=cursor, limit=limit)

    def close(self) -> None:
        """The shared store is closed by `GlobalMesh`, not here."""


# -- the mesh ----------------------------------------------------------------------------


def mesh_stats(host: Host) -> MeshStatistics:
    """`host.statistics().mesh`, which a meshed Host always has."""
    stats = host.statistics().mesh
    assert stats is not None
    return stats


def _ready(host: Host, routing_id: str) -> bool:
    return any(p.routing_id == routing_id and p.state is PeerState.READY for p in host.peers())


class GlobalMesh:
    """Hosts of one test sharing one `MemoryLocationStore`; a context manager.

    Args:
        lease: the `LeaseConfig` of every Host unless `add()` is given another (the
            default timings unless a test is about leases).
    """

    def __init__(self, lease: LeaseConfig | None = None) -> None:
        self.clock = StoreClock()
        self.store = MemoryLocationStore(clock=self.clock)
        self.lease = lease if lease is not None else LeaseConfig()
        self.hosts: list[Host] = []
        self.journal = Journal()
        self._killed: list[Host] = []
        self._cuttable: dict[int, Cuttable] = {}

    def add(
        self,
        *,
        spots: Iterable[type[Spot]] = (),
        actors: Iterable[type[Actor]] = (),
        mesh: dict[str, Any] | None = None,
        cuttable: bool = False,
        **options: Any,
    ) -> Host:
        """Start a Host on the shared store; return it once it and every live Host
        before it see each other READY.

        Args:
            spots: its Spot types (none and no `actors`: an Object Client).
            actors: its Actor types.
            mesh: `MeshConfig` options over `_mesh.mesh_config()`'s and `lease`.
            cuttable: reach the store through a `Cuttable` (needed for `kill()`).
            **options: other `Host` options (`message_types` defaults to `SHARED`).
        """
        options.setdefault("message_types", SHARED)
        earlier = self.live()
        # The store's discovery would find the earlier Hosts too, but only on its next
        # poll (about a second): dialling them at start makes the mesh READY at once.
        dial = tuple(h.node.endpoint for h in earlier)
        config = mesh_config(MESH, **{"lease": self.lease, "peers": dial, **(mesh or {})})
        location: LocationStore = self.store
        if cuttable:
            location = Cuttable(self.store)
        host = Host(
            spots=list(spots), actors=list(actors), mesh=config, location=location, **options
        )
        if isinstance(location, Cuttable):
            self._cuttable[id(host)] = location
        self.hosts.append(host)
        host.start()
        assert len(host.wait_for_peers(len(earlier), timeout=WAIT)) >= len(earlier)
        rid = host.node.routing_id
        for other in earlier:
            assert wait_until(lambda other=other: _ready(host, other.node.routing_id)), (
                f"{rid} never saw {other.node.routing_id} READY"
            )
            assert wait_until(lambda other=other: _ready(other, rid)), (
                f"{other.node.routing_id} never saw {rid} READY"
            )
        return host

    def live(self) -> list[Host]:
        """The Hosts still serving that were not killed."""
        return [h for h in self.hosts if h.state is HostState.SERVING and h not in self._killed]

    def kill(self, host: Host) -> None:
        """What the rest of the mesh sees of a SIGKILLed process: `host` is cut off from
        the store (no lease renewal, no record change, no descriptor) and its mesh node is
        closed without draining (no DRAINING, no record deleted; its peers list it LOST).
        The Host object itself is shut down at the end of the test, outcome unchecked.

        There is no public way to stop a node's networking alone; this reaches into the
        Host's mesh node (`Host._mesh`), the in-process stand-in for SIGKILL.
        """
        store = self._cuttable.get(id(host))
        assert store is not None, "kill() needs a Host added with cuttable=True"
        rid = host.node.routing_id
        self._killed.append(host)
        store.cut()
        node = host._mesh
        assert node is not None
        node.close(0.0)
        for other in self.live():
            assert wait_until(
                lambda other=other: any(
                    p.routing_id == rid and p.state is not PeerState.READY for p in other.peers()
                )
            ), f"{other.node.routing_id} still lists {rid} READY"

    def cut(self, host: Host) -> None:
        """Cut `host` off from the store only (added with `cuttable=True`)."""
        store = self._cuttable.get(id(host))
        assert store is not None, "cut() needs a Host added with cuttable=True"
        store.cut()

    def close(self) -> None:
        """Set every latch, shut every Host still serving down (in parallel), assert the
        ones not killed stopped cleanly, then close the store."""
        global _current
        try:
            self.journal.release_all()
            serving = [h for h in self.hosts if h.state is HostState.SERVING]
            results: dict[int, ShutdownResult] = {}

            def stop(h: Host) -> None:
                results[id(h)] = h.shutdown(deadline=WAIT)

            threads = [threading.Thread(target=stop, args=(h,), daemon=True) for h in serving]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT + 5)
            stuck = [t for t in threads if t.is_alive()]
            assert not stuck, "a Host's shutdown did not return"
            failures = [
                f"{h!r}: {results.get(id(h))}"
                for h in serving
                if h not in self._killed
                and (id(h) not in results or results[id(h)].outcome is not ShutdownOutcome.STOPPED)
            ]
            assert not failures, "a Host did not stop cleanly: " + "; ".join(failures)
        finally:
            self.store.close()
            _current = Journal()

    def __enter__(self) -> Self:
        global _current
        _current = self.journal
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run_racers(count: int, body: Callable[[int], object]) -> list[object]:
    """Run `body(i)` for i in 0..count-1 on `count` threads started together on a
    barrier; return their results in order (bounded, asserted)."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(WAIT)
            results[i] = body(i)
        except BaseException as exc:  # re-raised on the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
        assert not t.is_alive(), "a racer did not finish"
    if errors:
        raise errors[0]
    return results
