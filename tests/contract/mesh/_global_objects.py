"""The payloads and object classes of the global-objects contract tests (issue 16), and
the `Journal` they report to.

The classes are module-level, with a fixed `type_name`, so every Host of a test registers
the very same class under the same name. What they do goes to the test's `Journal`
(`journal()`), which `_global.GlobalMesh` installs for the length of a test (`install`).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import msgspec

from zlink_actors import (
    Actor,
    ActorContext,
    ActorRef,
    Host,
    InstanceSpot,
    JoinResult,
    Rejected,
    RejectedError,
    Spot,
    SpotConfig,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, wait_until

__all__ = [
    "SHARED",
    "Board",
    "Enter",
    "Faulty",
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
    "Ticker",
    "Where",
    "WhichSpot",
    "install",
    "journal",
]

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


def where(host: Host, spot_id: str) -> str:
    """The routing id of the node that runs `spot_id`, asked from `host`."""
    return host.request_to_spot(spot_id, Where(), reply=str).submit_sync()


def install(log: Journal) -> None:
    """Make `log` the journal every object reports to from now on."""
    global _current
    _current = log


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
    `on_create` waits for the latch "create" on the requests `"hold-create"` and
    `"hold-reject"`, returns `Rejected("no")` for `"reject"` and `"hold-reject"`, else
    `"made on <routing id>"`."""

    type_name = "g.Room"

    def __init__(self) -> None:
        super().__init__()
        journal().note("room-built", None)

    def on_create(self, ctx: SpotContext, request: object) -> object:
        log = journal()
        log.note("created", (ctx.spot_id, _rid(ctx)))
        if request in ("hold-create", "hold-reject"):
            assert log.latch("create").wait(WAIT + 5)
        if request in ("reject", "hold-reject"):
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

    @handler
    def where(self, ctx: SpotContext, msg: Where) -> str:
        return _rid(ctx)


class Faulty(Spot):
    """A Spot whose handlers fail: `Ping(0)` raises a `ZlinkError` (RejectedError), any
    other `Ping` a plain `ValueError`."""

    type_name = "g.Faulty"

    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        if msg.n == 0:
            raise RejectedError("no pings today")
        raise ValueError(f"bad ping {msg.n}")
