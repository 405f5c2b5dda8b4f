"""Activations, the object registry and record execution for one Host.

An `Activation` is one live Spot, Actor or channel handler: the user's instance, its
handler table, its mailbox and its gate. `Engine.run_record` is what a pool thread calls
for each record: it builds the turn context, runs the handler (stepping it with the
coroutine driver when it is `async def`) and does the record's post-turn work (the reply,
the failure count) before the gate moves on.
"""

from __future__ import annotations

import inspect
import logging
import threading
import uuid
from collections.abc import Callable
from contextvars import Context
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

from .._core.context import runtime_var
from .._core.errors import (
    ConfigurationError,
    InternalFailureError,
)
from .._core.pool import Gate, Mailbox, Record
from .._core.validation import check_id
from .driver import Frame
from .handlers import HandlerInfo, HandlerTable
from .objects import (
    Actor,
    ActorRef,
    ChannelHandler,
    InstanceSpot,
    Spot,
    SpotMode,
    SpotRef,
)
from .turn import K_CALL, K_CALLBACK, K_MESSAGE, K_REQUEST, K_RESUME, K_TICK, TurnContext

if TYPE_CHECKING:
    from .kernel import Runtime
    from .spot_timers import TimerSet

__all__ = ["Activation", "Engine", "TypeInfo"]

log = logging.getLogger("zlink_actors")

SPOT: Final = "spot"
ACTOR: Final = "actor"
CHANNEL: Final = "channel"


class TypeInfo:
    """A registered user class: its stable name, kind and handler table."""

    __slots__ = ("cls", "kind", "name", "table")

    def __init__(self, cls: type, kind: str, name: str) -> None:
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
        "ctx_type",
        "generation",
        "id",
        "init_pending",
        "instance",
        "kind",
        "member_refs",
        "members",
        "parked",
        "spare",
        "spare_context",
        "spot",
        "subscriptions",
        "timers",
        "type",
    )

    def __init__(
        self,
        kind: str,
        obj_id: str,
        type_info: TypeInfo,
        instance: Any,
        generation: int,
        ctx_type: type[TurnContext],
    ) -> None:
        self.kind = kind
        self.id = obj_id
        self.type = type_info
        self.instance = instance
        self.generation = generation
        self.ctx_type = ctx_type
        self.box: Mailbox = None  # type: ignore[assignment]  # set right after
        #: The Spot this object belongs to (itself for a Spot).
        self.spot: Activation = self
        self.timers: TimerSet | None = None
        self.closed = False
        #: A pristine turn context, and the `Context` that holds it, left by the last
        #: plain turn (reused by the next one; no tuple, since most Spots keep one).
        self.spare: TurnContext | None = None
        self.spare_context: Any = None
        #: Set once a close was queued; later closes observe the same result.
        self.closing: Any = None
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
        if self.kind == ACTOR:
            return ActorRef(self.id, self.generation)
        return SpotRef(self.id, self.generation)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.id!r} {self.type.name}>"


class Engine:
    """The registry of types and live objects, and the record runner."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.lock = threading.Lock()
        self.types: dict[str, TypeInfo] = {}
        self.by_class: dict[type, TypeInfo] = {}
        self.spots: dict[str, Activation] = {}
        self.actors: dict[str, Activation] = {}
        self.channels: dict[str, Activation] = {}
        #: The live-object table of each call target kind ("Spot", "Actor", "channel").
        self.tables = {"Spot": self.spots, "Actor": self.actors, "channel": self.channels}
        self.generations = 0
        self.handler_failures = 0
        self.dropped_records = 0
        #: (channel, topic) -> ids of the Ready Spots subscribed to it.
        self.subscribers: dict[tuple[str, str], set[str]] = {}
        self.entry: Activation = None  # type: ignore[assignment]  # made by setup()
        #: Notified whenever a creation attempt leaves `runtime.creating` while a thread
        #: waits for that (`wait_no_attempts`: shutdown); counted under `lock`, so a
        #: create pays for no notify when nobody waits.
        self.attempt_ended = threading.Condition(self.lock)
        self._attempt_waiters = 0
        from .._calls.contexts import ActorContext, SpotContext  # _contexts imports this module

        self._spot_context = SpotContext
        self._actor_context = ActorContext

    # -- registration ------------------------------------------------------------------

    def register(self, cls: type, kind: str) -> TypeInfo:
        """Register a user class; every mistake that would only fail later is refused
        here (docs/validation.md, "Registration").

        Raises:
            ConfigurationError: not a proper subclass of the kind's base class, a bad
                `type_name` or `mode`, a constructor that needs arguments, or a handler
                declared wrongly (`HandlerTable.build`).
        """
        base = {SPOT: Spot, ACTOR: Actor, CHANNEL: ChannelHandler}[kind]
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
        if kind == SPOT and not isinstance(mode, SpotMode):
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

    def setup(self, channels: dict[str, type]) -> None:
        from .._calls.contexts import ChannelContext, SpotContext

        entry_info = TypeInfo(_EntrySpot, SPOT, "zlink.EntrySpot")
        entry_id = f"{self.runtime.name}-entry-{uuid.uuid4()}"
        self.entry = self._activate(SPOT, entry_id, entry_info, _EntrySpot(), SpotContext)
        self.spots[entry_id] = self.entry
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
            self.channels[name] = self._activate(CHANNEL, name, info, instance, ChannelContext)

    def _activate(
        self,
        kind: str,
        obj_id: str,
        info: TypeInfo,
        instance: Any,
        ctx_type: type[TurnContext],
        spot: Activation | None = None,
    ) -> Activation:
        self.generations += 1
        act = Activation(kind, obj_id, info, instance, self.generations, ctx_type)
        pool = self.runtime.pool
        if spot is not None:
            act.spot = spot
            # SpotWide: the Spot's gate covers its members; Entry / PerActor: own gate.
            gate = spot.box.gate if spot.box.gate.spotwide else Gate(pool)
        else:
            spotwide = kind == SPOT and getattr(info.cls, "mode", None) is SpotMode.SPOT_WIDE
            gate = Gate(pool, spotwide=spotwide and info.cls is not _EntrySpot)
        act.box = Mailbox(act, gate)
        return act

    def new_spot(self, spot_id: str, info: TypeInfo, instance: Any) -> Activation:
        return self._activate(SPOT, spot_id, info, instance, self._spot_context)

    def new_actor(self, actor_id: str, info: TypeInfo, instance: Any) -> Activation:
        return self._activate(ACTOR, actor_id, info, instance, self._actor_context, spot=self.entry)

    def make_ready(self, act: Activation, attempt_key: tuple[str, str] | None) -> None:
        """Register `act` (it becomes reachable) and apply its subscriptions."""
        with self.lock:
            table = self.spots if act.kind == SPOT else self.actors
            table[act.id] = act
            if attempt_key is not None:
                self.end_attempt(attempt_key)
            for key in act.subscriptions:
                self.subscribers.setdefault(key, set()).add(act.id)

    def end_attempt(self, key: tuple[str, str]) -> None:
        """Take a creation attempt out of `runtime.creating`. Caller holds `lock`."""
        self.runtime.creating.pop(key, None)
        if self._attempt_waiters:
            self.attempt_ended.notify_all()

    def wait_no_attempts(self, timeout: float) -> bool:
        """Wait until no creation attempt is in progress; False if `timeout` passed."""
        with self.lock:
            self._attempt_waiters += 1
            try:
                return self.attempt_ended.wait_for(lambda: not self.runtime.creating, timeout)
            finally:
                self._attempt_waiters -= 1

    def unregister(self, act: Activation) -> ActorRef | None:
        """Remove `act` from every table; it is unreachable from now on. Returns the ref
        of an Actor that was a User Spot's member (that Spot is still `act.spot`)."""
        with self.lock:
            act.closed = True
            table = self.spots if act.kind == SPOT else self.actors
            if table.get(act.id) is act:
                del table[act.id]
            for key in act.subscriptions:
                ids = self.subscribers.get(key)
                if ids is not None:
                    ids.discard(act.id)
                    if not ids:
                        del self.subscribers[key]
            return act.spot.drop_member(act.id) if act.kind == ACTOR else None

    def all_activations(self) -> list[Activation]:
        with self.lock:
            return [*self.spots.values(), *self.actors.values(), *self.channels.values()]

    # -- running records ---------------------------------------------------------------

    def run_record(self, box: Mailbox, rec: Record) -> bool:
        """Run one record under its gate; True if the turn was handed off."""
        kind = rec.kind
        if kind == K_RESUME:
            frame: Frame = rec.a
            return frame.resume()
        if kind == K_REQUEST and rec.route_id not in rec.table._entries:  # type: ignore[attr-defined]
            # Already terminal (cancelled, expired, or shut down while queued): its caller
            # has its result, so its handler never runs.
            return False
        act: Activation = box.owner
        on_done: Callable[[Any, BaseException | None], None]
        args: tuple[Any, ...]
        if kind <= K_REQUEST and rec.b is None and act.kind != ACTOR and not act.init_pending:
            # A plain turn: reuse the last turn's context objects if that turn left them
            # pristine (synchronous, no context variable of its own, no metadata).
            ctx = act.spare
            fn = rec.c.fn
            if ctx is None:
                ctx = act.ctx_type(self.runtime, act, box, None)
                context = Context()
                context.run(runtime_var.set, ctx)
            else:
                act.spare = None
                context = act.spare_context
            ctx._rec = rec
            try:
                result = context.run(fn, act.instance, ctx, rec.a)
            except BaseException as exc:
                (self._message_done if kind == K_MESSAGE else rec.reply)(None, exc)
                return False
            if type(result) is CoroutineType:
                on_done = self._message_done if kind == K_MESSAGE else rec.reply
                frame = Frame(result, ctx, context, rec, on_done, self.runtime.pool, act.resume_box)
                return frame.resume()
            if len(context) == 1 and context.get(runtime_var) is ctx and ctx._box is box:
                ctx._rec = None  # a spare context keeps no request (nor its reply) alive
                act.spare_context = context
                act.spare = ctx
            if kind != K_MESSAGE:
                rec.reply(result, None)  # a one-way message's success needs nothing
            return False
        if kind == K_MESSAGE:
            info: HandlerInfo = rec.c
            ctx = act.ctx_type(self.runtime, act, box, rec.b)
            ctx._rec = rec
            fn, args, on_done = info.fn, (act.instance, ctx, rec.a), self._message_done
        elif kind == K_REQUEST:
            info, on_done = rec.c, rec.reply
            ctx = act.ctx_type(self.runtime, act, box, rec.b)
            ctx._rec = rec
            fn, args = info.fn, (act.instance, ctx, rec.a)
        elif kind == K_CALL:
            ctx = act.ctx_type(self.runtime, act, box, None)
            fn, args, on_done = rec.a, (act.instance, ctx), rec.b
        elif kind == K_CALLBACK:
            ctx = act.ctx_type(self.runtime, act, box, None)
            fn, args, on_done = rec.a, (rec.b,), self._callback_done
        elif kind == K_TICK:
            timer, tick = rec.a, rec.b
            if timer.cancelled:  # restarted or cancelled after this tick was queued
                return False
            ctx = act.ctx_type(self.runtime, act, box, None)
            fn, args, on_done = timer.callback, (ctx, tick), timer.tick_done
        else:  # pragma: no cover - the scheduler only carries these kinds
            raise AssertionError(f"unknown record kind {kind}")
        if kind <= K_REQUEST:
            if act.kind == ACTOR:
                # The registration scope of defer(): the handler's own run.
                ctx._scope = True
                on_done = _ActorHandlerDone(self.runtime, ctx, on_done)
            if act.init_pending:
                act.init_pending = False
                fn, args = _initialize_then, (fn, args)
        # Each turn runs in a context of its own (a coroutine keeps its context across
        # resumptions, as an asyncio task does): context variables set by one owner's
        # handler never leak into another's, whatever thread runs them.
        context = Context()
        context.run(runtime_var.set, ctx)
        try:
            result = context.run(fn, *args)
        except BaseException as exc:
            on_done(None, exc)
            return False
        if type(result) is CoroutineType:
            frame = Frame(result, ctx, context, rec, on_done, self.runtime.pool, act.resume_box)
            return frame.resume()
        on_done(result, None)
        return False

    def fail_record(self, box: Mailbox, rec: Record) -> None:
        """The runtime's own work around `rec` raised (`AppPool._internal_error`): a
        request's caller hears `InternalFailureError` now instead of waiting for its
        deadline (if its outcome was already delivered, this finds nothing to end)."""
        if rec.kind == K_REQUEST:
            rec.drop(InternalFailureError("the runtime failed while running this request"))

    def _message_done(self, value: Any, exc: BaseException | None) -> None:
        # SC §4: a one-way call completed at admission; a later failure is only logged.
        if exc is not None:
            self.handler_failures += 1
            log.error("one-way handler raised", exc_info=exc)

    def _callback_done(self, value: Any, exc: BaseException | None) -> None:
        if exc is not None:
            self.handler_failures += 1
            log.error("completion callback raised", exc_info=exc)


#: The framework's base classes: only their subclasses are registered.
_BASES: Final = (Spot, Actor, InstanceSpot, ChannelHandler)


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


class _ActorHandlerDone:
    """Post-turn work of an Actor's handler: close the `defer()` scope, start a deferred
    Join or Leave if the handler ended normally, then the record's own post-turn work."""

    __slots__ = ("ctx", "inner", "runtime")

    def __init__(
        self,
        runtime: Runtime,
        ctx: TurnContext,
        inner: Callable[[Any, BaseException | None], None],
    ) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.inner = inner

    def __call__(self, value: Any, exc: BaseException | None) -> None:
        ctx = self.ctx
        ctx._scope = False
        deferred, ctx._defer = ctx._defer, None
        if deferred is not None and exc is None:
            from .membership import start_move

            # Before the reply: a caller holding the reply knows the move has begun.
            start_move(self.runtime, ctx._act, deferred.spot_id)
        self.inner(value, exc)


async def _initialize_then(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """An Instance Spot's first record: `on_initialize`, then the message's handler.

    If `on_initialize` fails the Spot is removed (the next message with instance intent
    activates a fresh one) and this record fails with that error.
    """
    from .lifecycle import _maybe_await, remove_activation

    instance, ctx = args[0], args[1]
    try:
        await _maybe_await(instance.on_initialize(ctx))
    except BaseException:
        remove_activation(ctx._runtime, ctx._act)
        raise
    return await _maybe_await(fn(*args))


class _EntrySpot(Spot):
    """The framework's default membership for Actors: a gate per Actor, no handlers."""

    mode = SpotMode.PER_ACTOR
