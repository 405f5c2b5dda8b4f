"""The registry of one Host: registered types, live objects and creations in progress.

An `Activation` is one live Spot, Actor or channel handler: the user's instance, its
handler table, its mailbox and its gate. `Engine` holds every table and the lock that
guards them (the engine lock); running records is the record runner's (`runner.py`).
"""

from __future__ import annotations

import enum
import inspect
import threading
import uuid
from collections.abc import Callable
from contextvars import Context
from typing import Final, Protocol

from .._core.completion import Cell
from .._core.errors import ConfigurationError
from .._core.gate import Gate
from .._core.mailbox import Mailbox
from .._core.validation import check_id
from .driver import Frame, TurnHost
from .handlers import HandlerTable
from .objects import (
    Actor,
    ActorRef,
    ChannelHandler,
    InstanceSpot,
    NodeHandler,
    ObjectKind,
    Spot,
    SpotMode,
    SpotRef,
)

__all__ = [
    "CLOSING",
    "EXISTING",
    "JOIN",
    "OWN",
    "SEALED",
    "Activation",
    "Attempt",
    "Claim",
    "Engine",
    "ObjectTimers",
    "TypeInfo",
]

SPOT: Final = ObjectKind.SPOT
ACTOR: Final = ObjectKind.ACTOR
CHANNEL: Final = ObjectKind.CHANNEL
NODE: Final = ObjectKind.NODE


class ObjectTimers(Protocol):
    """An object's timers as the registry and the close path see them
    (`spot_timers.TimerSet`)."""

    def own_boxes(self) -> list[Mailbox]: ...

    def cancel_all(self) -> None: ...


class TypeInfo:
    """A registered user class: its stable name, kind and handler table."""

    __slots__ = ("cls", "kind", "name", "table")

    def __init__(self, cls: type, kind: ObjectKind, name: str) -> None:
        self.cls = cls
        self.kind = kind
        self.name = name
        self.table = HandlerTable.build(cls)


class Activation:
    """One live Spot, Actor or channel handler."""

    __slots__ = (
        "box",
        "closed",
        "closing",
        "generation",
        "id",
        "init_pending",
        "instance",
        "kind",
        "member_refs",
        "members",
        "parked",
        "routing_id",
        "spare",
        "spare_context",
        "spot",
        "subscriptions",
        "timers",
        "type",
    )

    def __init__(
        self,
        kind: ObjectKind,
        obj_id: str,
        type_info: TypeInfo,
        instance: object,
        generation: int,
        gate: Gate[Mailbox],
        spot: Activation | None = None,
    ) -> None:
        self.kind = kind
        self.id = obj_id
        self.type = type_info
        self.instance = instance
        self.generation = generation
        self.box = Mailbox(self, gate)
        #: The Spot this object belongs to (itself for a Spot).
        self.spot: Activation = self if spot is None else spot
        self.timers: ObjectTimers | None = None
        self.closed = False
        #: A pristine turn context, and the `Context` that holds it, left by the last
        #: plain turn (reused by the next one; no tuple, since most Spots keep one).
        self.spare: TurnHost | None = None
        self.spare_context: Context | None = None
        #: The close in progress (`lifecycle.Closing`); later closes observe its result.
        self.closing: object = None
        #: A User Spot's members in join order, Actor id -> ref; allocated on first
        #: member, dropped when the last one leaves. Changed under the engine lock.
        self.members: dict[str, ActorRef] | None = None
        #: `members` as a tuple (`SpotContext.members`): built on the first read after a
        #: change, under the engine lock, so every read is a consistent snapshot.
        self.member_refs: tuple[ActorRef, ...] | None = None
        #: (channel, topic) pairs from `configure`, live while the Spot is Ready.
        self.subscriptions: list[tuple[str, str]] | tuple[()] = ()
        #: An Instance Spot runs `on_initialize` at the start of its first record.
        self.init_pending = False
        #: Handler coroutines parked in `yield_()` (discarded if the object closes).
        self.parked: set[Frame] | None = None
        #: The owner node's routing id its refs carry (None without a mesh).
        self.routing_id: str | None = None

    @property
    def resume_box(self) -> Mailbox:
        """Where a `yield_()` continuation of this object queues: its Spot's mailbox."""
        return self.spot.box

    def timer_boxes(self) -> list[Mailbox]:
        """Mailboxes of timers with gates of their own (PerActor Spots)."""
        return [] if self.timers is None else self.timers.own_boxes()

    def add_member(self, ref: ActorRef) -> None:
        """Make `ref` this Spot's newest member. Caller holds the engine lock."""
        members = self.members
        if members is None:
            self.members = members = {}  # allocated on first member: idle Spots stay small
        members[ref.actor_id] = ref
        self.member_refs = None

    def drop_member(self, actor_id: str) -> ActorRef | None:
        """Remove a member; returns its ref, or None if it was none. Caller holds the
        engine lock."""
        members = self.members
        if members is None:
            return None
        ref = members.pop(actor_id, None)
        if ref is not None:
            self.member_refs = None
            if not members:
                self.members = None
        return ref

    def ref(self) -> SpotRef | ActorRef:
        if self.kind is ACTOR:
            return ActorRef(self.id, self.generation, self.routing_id)
        return SpotRef(self.id, self.generation, self.routing_id)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.id!r} {self.type.name}>"


class Attempt(Cell[object]):
    """One creation in progress, and its terminal: the callers that join it observe this
    cell (each through a handle of its own).

    Its lock is the Host's shared result-cell lock (`PendingTable.cell_lock`): a cell
    never takes another lock while it holds its own, so sharing one is safe, and an
    attempt costs no lock object of its own.
    """

    __slots__ = ("generation", "info", "kind", "obj_id")

    def __init__(
        self,
        kind: ObjectKind,
        obj_id: str,
        info: TypeInfo,
        lock: threading.RLock,
        generation: int = 0,
    ) -> None:
        super().__init__(lock)
        # Not the key tuple: the handle of a created object keeps its attempt (the
        # result cell) alive, and one tracked object less per create is less collection.
        self.kind = kind
        self.obj_id = obj_id
        self.info = info
        #: The object generation its authority record issued (0: the Host's own counter).
        self.generation = generation

    @property
    def key(self) -> tuple[ObjectKind, str]:
        """The attempt's key in `Engine.creating`: (kind, id)."""
        return (self.kind, self.obj_id)


class Claim(enum.Enum):
    """What a create finds for its (kind, id) (`Engine.claim`)."""

    #: A live object holds the id: the `Activation` comes with it.
    EXISTING = "existing"
    #: A live object holds the id and its close is in progress.
    CLOSING = "closing"
    #: Another caller's creation attempt is in progress: join it (the `Attempt`).
    JOIN = "join"
    #: The id was free: this caller owns the new attempt (the `Attempt`), now in
    #: `Engine.creating`, and must end it (Ready or aborted).
    OWN = "own"
    #: The id was free but the Host no longer serves: no attempt may start.
    SEALED = "sealed"


# Read as module constants on the create path (a global read, not an Enum attribute).
EXISTING: Final = Claim.EXISTING
CLOSING: Final = Claim.CLOSING
JOIN: Final = Claim.JOIN
OWN: Final = Claim.OWN
SEALED: Final = Claim.SEALED


class Engine:
    """The registry of types, live objects and creations in progress of one Host."""

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()
        self.types: dict[str, TypeInfo] = {}
        self.by_class: dict[type, TypeInfo] = {}
        self.spots: dict[str, Activation] = {}
        self.actors: dict[str, Activation] = {}
        self.channels: dict[str, Activation] = {}
        #: The node handler (`Host(node_handler=...)`), under its `node_key`.
        self.nodes: dict[str, Activation] = {}
        #: The live-object table of each kind.
        self.tables = {
            SPOT: self.spots,
            ACTOR: self.actors,
            CHANNEL: self.channels,
            NODE: self.nodes,
        }
        self.generations = 0
        #: This node's routing id, carried by every ref (None on a Host without a mesh).
        self.routing_id: str | None = None
        self.handler_failures = 0
        self.dropped_records = 0
        #: (channel, topic) -> ids of the Ready Spots subscribed to it.
        self.subscribers: dict[tuple[str, str], set[str]] = {}
        #: get-or-create attempts in progress: (kind, id) -> the attempt.
        self.creating: dict[tuple[ObjectKind, str], Attempt] = {}
        #: Serialises cold activations of Instance Spots (their factory runs once).
        self.activation_lock = threading.RLock()
        #: Notified whenever a creation attempt leaves `creating` while a thread waits
        #: for that (`wait_no_attempts`: shutdown); counted under `lock`, so a create
        #: pays for no notify when nobody waits.
        self.attempt_ended = threading.Condition(self.lock)
        self._attempt_waiters = 0
        entry_info = TypeInfo(_EntrySpot, SPOT, "zlink.EntrySpot")
        #: The Host's Entry Spot: the default membership of Actors, a gate per Actor.
        self.entry = self._activate(SPOT, f"{name}-entry-{uuid.uuid4()}", entry_info, _EntrySpot())
        self.spots[self.entry.id] = self.entry

    # -- registration ------------------------------------------------------------------

    def register(self, cls: type, kind: ObjectKind) -> TypeInfo:
        """Register a user class; every mistake that would only fail later is refused
        here (docs/validation.md, "Registration").

        Raises:
            ConfigurationError: not a proper subclass of the kind's base class, a bad
                `type_name` or `mode`, a constructor that needs arguments, or a handler
                declared wrongly (`HandlerTable.build`).
        """
        base = {SPOT: Spot, ACTOR: Actor, CHANNEL: ChannelHandler, NODE: NodeHandler}[kind]
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ConfigurationError(f"{cls!r} is not a subclass of {base.__name__}")
        if cls in _BASES:
            raise ConfigurationError(
                f"{cls.__qualname__} is a base class: register a subclass of it"
            )
        name = getattr(cls, "type_name", None)
        if name is None:
            name = cls.__qualname__
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"{cls.__qualname__}.type_name must be a non-empty str, got {name!r}"
            )
        if name in self.types:
            raise ConfigurationError(f"type name {name!r} is registered twice in one Host")
        mode = getattr(cls, "mode", None)
        if kind is SPOT and not isinstance(mode, SpotMode):
            raise ConfigurationError(f"{cls.__qualname__}.mode must be a SpotMode")
        if issubclass(cls, InstanceSpot) and mode is not SpotMode.SPOT_WIDE:
            raise ConfigurationError(
                f"{cls.__qualname__} is an InstanceSpot: it is serialised as a whole, so "
                f"its mode is SpotMode.SPOT_WIDE, not {mode}"
            )
        _check_constructor(cls)
        info = TypeInfo(cls, kind, name)
        self.types[name] = info
        self.by_class[cls] = info
        return info

    def add_channels(self, channels: dict[str, type]) -> None:
        """Make one channel handler (an instance and a gate) per channel name."""
        for name, cls in channels.items():
            try:
                check_id("channel name", name)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"Host(channels=...): {exc}") from None
            # One handler class may serve several names: one instance (and gate) each.
            info = self.by_class.get(cls) or self.register(cls, CHANNEL)
            try:
                instance = cls()
            except Exception as exc:
                raise ConfigurationError(f"channel handler {cls.__qualname__}() raised") from exc
            self.channels[name] = self._activate(CHANNEL, name, info, instance)

    def add_node_handler(self, key: str, cls: type) -> None:
        """Make the node handler (an instance and a gate) under `key` (`node_key`)."""
        info = self.register(cls, NODE)
        try:
            instance = cls()
        except Exception as exc:
            raise ConfigurationError(f"node handler {cls.__qualname__}() raised") from exc
        self.nodes[key] = self._activate(NODE, key, info, instance)

    def _activate(
        self,
        kind: ObjectKind,
        obj_id: str,
        info: TypeInfo,
        instance: object,
        spot: Activation | None = None,
        generation: int = 0,
    ) -> Activation:
        if not generation:
            self.generations += 1
            generation = self.generations
        if spot is not None:
            # SpotWide: the Spot's gate covers its members; Entry / PerActor: own gate.
            gate: Gate[Mailbox] = spot.box.gate if spot.box.gate.spotwide else Gate()
        else:
            spotwide = kind is SPOT and getattr(info.cls, "mode", None) is SpotMode.SPOT_WIDE
            gate = Gate(spotwide=spotwide and info.cls is not _EntrySpot)
        act = Activation(kind, obj_id, info, instance, generation, gate, spot)
        act.routing_id = self.routing_id
        return act

    def new_spot(
        self, spot_id: str, info: TypeInfo, instance: object, generation: int = 0
    ) -> Activation:
        return self._activate(SPOT, spot_id, info, instance, generation=generation)

    def new_actor(
        self, actor_id: str, info: TypeInfo, instance: object, generation: int = 0
    ) -> Activation:
        return self._activate(
            ACTOR, actor_id, info, instance, spot=self.entry, generation=generation
        )

    def claim(
        self,
        kind: ObjectKind,
        obj_id: str,
        info: TypeInfo,
        cell_lock: threading.RLock,
        serving: Callable[[], bool],
        generation: int = 0,
    ) -> tuple[Claim, Activation | Attempt | None]:
        """Decide, under the engine lock, what a create of (`kind`, `obj_id`) finds:
        `EXISTING` or `CLOSING` with the live `Activation`; `JOIN` with the attempt in
        progress; `OWN` with a new `Attempt` for `info` (its result cell on `cell_lock`,
        its object generation `generation`, 0 for the Host's own counter), registered in
        `creating`; or `SEALED` (with None) when the id was free and `serving()` is false:
        shutdown may already have waited for the attempts in progress, so none may start.

        Only the decision is made here; the caller builds results after the lock.
        """
        key = (kind, obj_id)
        with self.lock:
            act = self.tables[kind].get(obj_id)
            if act is not None and not act.closed:
                return (EXISTING if act.closing is None else CLOSING), act
            attempt = self.creating.get(key)
            if attempt is not None:
                return JOIN, attempt
            if not serving():
                return SEALED, None
            attempt = self.creating[key] = Attempt(kind, obj_id, info, cell_lock, generation)
            return OWN, attempt

    def make_ready(self, act: Activation, attempt_key: tuple[ObjectKind, str] | None) -> None:
        """Register `act` (it becomes reachable) and apply its subscriptions."""
        with self.lock:
            table = self.spots if act.kind is SPOT else self.actors
            table[act.id] = act
            if attempt_key is not None:
                self.end_attempt(attempt_key)
            for key in act.subscriptions:
                self.subscribers.setdefault(key, set()).add(act.id)

    def end_attempt(self, key: tuple[ObjectKind, str]) -> None:
        """Take a creation attempt out of `creating`. Caller holds `lock`."""
        self.creating.pop(key, None)
        if self._attempt_waiters:
            self.attempt_ended.notify_all()

    def wait_no_attempts(self, timeout: float) -> bool:
        """Wait until no creation attempt is in progress; False if `timeout` passed."""
        with self.lock:
            self._attempt_waiters += 1
            try:
                return self.attempt_ended.wait_for(lambda: not self.creating, timeout)
            finally:
                self._attempt_waiters -= 1

    def unregister(self, act: Activation) -> ActorRef | None:
        """Remove `act` from every table; it is unreachable from now on. Returns the ref
        of an Actor that was a User Spot's member (that Spot is still `act.spot`)."""
        with self.lock:
            act.closed = True
            table = self.spots if act.kind is SPOT else self.actors
            if table.get(act.id) is act:
                del table[act.id]
            for key in act.subscriptions:
                ids = self.subscribers.get(key)
                if ids is not None:
                    ids.discard(act.id)
                    if not ids:
                        del self.subscribers[key]
            return act.spot.drop_member(act.id) if act.kind is ACTOR else None

    def subscribed(self, channel: str, topic: str) -> list[Activation]:
        """The Ready Spots subscribed to (`channel`, `topic`) now: a snapshot."""
        with self.lock:
            ids = self.subscribers.get((channel, topic), ())
            return [self.spots[i] for i in ids if i in self.spots]

    def member_refs(self, spot: Activation) -> tuple[ActorRef, ...]:
        """`spot`'s members in join order: a consistent snapshot (members change under
        the engine lock, on the threads of the Actors moving), kept in
        `spot.member_refs` until they change again."""
        with self.lock:
            refs = spot.member_refs
            if refs is None:
                members = spot.members
                spot.member_refs = refs = () if members is None else tuple(members.values())
            return refs

    def all_activations(self) -> list[Activation]:
        with self.lock:
            return [
                *self.spots.values(),
                *self.actors.values(),
                *self.channels.values(),
                *self.nodes.values(),
            ]


class _EntrySpot(Spot):
    """The framework's default membership for Actors: a gate per Actor, no handlers."""

    mode = SpotMode.PER_ACTOR


#: The framework's base classes: only their subclasses are registered.
_BASES: Final = (Spot, Actor, InstanceSpot, ChannelHandler, NodeHandler)


def _check_constructor(cls: type) -> None:
    """The framework creates instances with `cls()`: refuse a constructor that needs
    arguments now. (One that merely raises is still reported when it is called.)"""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read (a C type): find out later
        return
    try:
        signature.bind()
    except TypeError as exc:
        raise ConfigurationError(
            f"{cls.__qualname__}() must take no arguments (the framework creates it): {exc}"
        ) from None
