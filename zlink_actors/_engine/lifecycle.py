"""Object lifecycle in one process: creation attempts, Ready, close (digest §3).

Creation runs the factory (the no-argument constructor) and `configure` on the creating
thread, then `on_create` and `on_initialize` as one lifecycle record under the new
object's own gate. Only then is the object Ready: registered, reachable, subscribed. A
concurrent get-or-create of the same id joins the attempt in progress; every caller has
its own deadline and cancellation, and all observe the attempt's one terminal.

Close runs `on_closing` as a lifecycle record (ahead of queued application work), then
removes the object: queued requests end with `UnavailableError`, queued one-way messages
are dropped (and counted), waiting sends end with `UnavailableError`, parked `yield_()`
continuations are discarded, timers stop. A later object with the same id is a new
generation and never sees any of it (SC §9).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

from .._core.completion import Cell, Completion
from .._core.errors import (
    CapacityExceededError,
    NotFoundError,
    UnavailableError,
    UnavailableReason,
    internal_failure,
)
from .._core.gate import Gate
from .._core.mailbox import Mailbox
from .._core.pool import ADMITTED
from .._core.record import K_CALL, K_REQUEST, K_RESUME, Job, Message, Record, Resume
from .._core.state import HostState
from .kernel import Runtime
from .objects import (
    ActorRef,
    CloseReason,
    Created,
    ObjectKind,
    Rejected,
    Spot,
    _Lifecycle,
    configure_spot,
)
from .registry import Activation, Attempt
from .remote import dropped

__all__ = [
    "Closing",
    "close_activation",
    "close_by_id",
    "create_now",
    "drop_record",
    "has_hooks",
    "maybe_await",
    "remove_activation",
    "request_close",
    "start_attempt",
    "tell_left",
]

log = logging.getLogger("zlink_actors")


def has_hooks(cls: type) -> bool:
    """True if `cls` overrides `on_create` or `on_initialize` (code to run under its gate)."""
    return cls.on_create is not _Lifecycle.on_create or (  # type: ignore[attr-defined]
        cls.on_initialize is not _Lifecycle.on_initialize  # type: ignore[attr-defined]
    )


def create_now(runtime: Runtime, attempt: Attempt) -> Completion[Any]:
    """Create an object whose class has no creation hooks, on the calling thread.

    Returns a handle on the attempt, already settled: `Created(ref, None)`, or the
    exception that ended the attempt. Callers that joined it observe the same cell.
    """
    start_attempt(runtime, attempt, None, hooks=False)
    return Completion(attempt)


def start_attempt(runtime: Runtime, attempt: Attempt, request: object, *, hooks: bool) -> None:
    """Run the factory, then queue the creation hooks on the new object's own gate; with
    no hooks to run (`hooks`, from `has_hooks`), the object is Ready at once (no turn
    needed)."""
    engine = runtime.engine
    kind, obj_id, info = attempt.kind, attempt.obj_id, attempt.info
    try:
        instance = info.cls()
        subscriptions = configure_spot(instance) if kind is ObjectKind.SPOT else ()
    except Exception as exc:
        _abort(runtime, attempt, internal_failure(f"{info.name}()", exc))
        return
    act = (
        engine.new_spot(obj_id, info, instance, attempt.generation)
        if kind is ObjectKind.SPOT
        else engine.new_actor(obj_id, info, instance, attempt.generation)
    )
    act.subscriptions = subscriptions
    ref = act.ref()
    if not hooks:
        engine.make_ready(act, attempt.key)
        attempt.try_set(Created(ref, None), None)
        return

    async def creation_hooks(inst: _Lifecycle, ctx: object) -> object:
        reply = await maybe_await(inst.on_create(ctx, request))
        if isinstance(reply, Rejected):
            return reply
        await maybe_await(inst.on_initialize(ctx))
        return Created(ref, reply)

    def done(value: object, exc: BaseException | None) -> None:
        if exc is not None:
            _abort(runtime, attempt, internal_failure(f"{info.name} creation hook", exc))
        elif isinstance(value, Rejected):
            _abort(runtime, attempt, None, value)
        else:
            engine.make_ready(act, attempt.key)
            attempt.set_result(value)

    runtime.pool.enqueue(act.box, Job(creation_hooks, done), lifecycle=True)


def _abort(
    runtime: Runtime, attempt: Attempt, exc: BaseException | None, value: object = None
) -> None:
    # The id stays free: the attempt leaves the table before its callers hear of it.
    with runtime.engine.lock:
        runtime.engine.end_attempt(attempt.key)
    attempt.try_set(value, exc)


async def maybe_await(value: object) -> object:
    """`await value` if it is awaitable (a hook may be plain or `async def`)."""
    if inspect.isawaitable(value):
        return await cast(Awaitable[object], value)
    return value


class CloseCaller(Protocol):
    """One caller waiting for a close that may give up (`_calls/create._CloseWait`)."""

    gave_up: bool


class Closing:
    """One close of one object in progress; the callers that asked for it share `cell`.

    A close is a call like a request: a caller whose deadline passes, or who cancels,
    before `on_closing` began gives up, and when the last caller that could give up has
    done so (and nobody holds the close: shutdown, or a close made from the object's own
    turn), the close is withdrawn. The object then admits work again; the queued
    `on_closing` record does nothing when its turn comes. Once `on_closing` began nobody
    can give up: the close completes with True. Every state change happens under the
    engine lock, where `close()`, `get_or_create()` and a Join look at `act.closing`.
    """

    __slots__ = ("act", "callers", "cell", "held", "record", "runtime", "started", "withdrawn")

    def __init__(self, runtime: Runtime, act: Activation) -> None:
        self.runtime = runtime
        self.act = act
        #: The queued `on_closing` record (taken out of its lane if the close is withdrawn).
        self.record: Record | None = None
        self.cell: Cell[bool] = Cell()
        #: Callers that may still give up (a deadline or a cancellation of their own).
        self.callers = 0
        #: Someone that never gives up asked for it (shutdown, the object's own turn).
        self.held = False
        self.started = False
        self.withdrawn = False

    def give_up(self, caller: CloseCaller) -> bool:
        """`caller`'s deadline or cancellation: False once `on_closing` began (too late;
        the caller waits for the close to complete) or if this caller already gave up
        (its deadline and its cancellation may race). Withdraws the close when it was the
        last caller that wanted it."""
        runtime = self.runtime
        with runtime.engine.lock:
            if self.started or caller.gave_up:
                return False
            caller.gave_up = True
            self.callers -= 1
            if self.callers or self.held or self.withdrawn:
                return True
            self.withdrawn = True
            act = self.act
            if act.closing is self:
                act.closing = None
            settle = runtime.pool.unmark_closing(act.box, self.record)
        settle()
        return True

    def begin(self) -> bool:
        """`on_closing` is about to run: False if the close was withdrawn (skip it)."""
        with self.runtime.engine.lock:
            if self.withdrawn:
                return False
            self.started = True
            return True

    def __call__(self, value: object, exc: BaseException | None) -> None:
        """The post-turn work of the `on_closing` record (or its drop): take the object
        out of service and complete the close."""
        if value is _Skipped:
            return
        act = self.act
        if exc is not None and self.started:  # not started: dropped unrun (shutdown)
            self.runtime.engine.handler_failures += 1
            log.error("%r on_closing raised", act, exc_info=exc)
        remove_activation(self.runtime, act)
        self.cell.set_result(True)


def request_close(
    runtime: Runtime, act: Activation, reason: CloseReason, *, hold: bool
) -> Closing | BaseException:
    """Queue `on_closing` and the removal of `act`, or join the close already queued.

    `hold`: the caller never gives up (see `Closing`); otherwise it counts as a caller
    that may. Returns the close, or the error that refused it. Caller holds the engine
    lock.
    """
    closing = act.closing
    if closing is None:
        closing = Closing(runtime, act)
        rec = closing.record = Job(_on_closing(closing, reason), closing)
        status = runtime.pool.enqueue(act.box, rec, lifecycle=True)
        if status != ADMITTED:
            return CapacityExceededError(f"{act!r}: lifecycle lane is full")
        runtime.pool.mark_closing(act.box)
        act.closing = closing
    assert isinstance(closing, Closing)
    if hold:
        closing.held = True
    else:
        closing.callers += 1
    return closing


def close_by_id(
    runtime: Runtime, kind: ObjectKind, obj_id: str, turn_gate: Gate[Mailbox] | None
) -> Closing | BaseException | bool:
    """An explicit close of (`kind`, `obj_id`), asked by a caller whose turn holds
    `turn_gate` (None: not from a turn), decided under the engine lock.

    Returns the `Closing` to wait for; True when the caller's turn holds the object's
    gate (the close is held, and runs once that turn ends); False for a User Spot that
    still has members (nothing is closed); or the error that refused it
    (`NotFoundError`: no such live object, or the Entry Spot).
    """
    engine = runtime.engine
    with engine.lock:
        act = engine.tables[kind].get(obj_id)
        if act is None or act.closed or act is engine.entry:
            return NotFoundError(f"no {kind} {obj_id!r} to close")
        if act.members:
            return False
        # Inside the object's own turn the close cannot run before this turn ends.
        own = turn_gate is act.box.gate
        closing = request_close(runtime, act, CloseReason.EXPLICIT_CLOSE, hold=own)
    if own and not isinstance(closing, BaseException):
        return True
    return closing


def close_activation(
    runtime: Runtime, act: Activation, reason: CloseReason
) -> Completion[bool] | None:
    """Close `act` on the runtime's own behalf (shutdown): it never gives up."""
    with runtime.engine.lock:
        closing = request_close(runtime, act, reason, hold=True)
    if isinstance(closing, BaseException):
        return Completion(Cell.settled(None, closing))
    return Completion(closing.cell)


class _Skipped:
    """What a withdrawn close's `on_closing` record returns instead of running."""


def _on_closing(closing: Closing, reason: CloseReason) -> Callable[[_Lifecycle, object], object]:
    def on_closing(inst: _Lifecycle, ctx: object) -> object:
        if not closing.begin():
            return _Skipped
        return inst.on_closing(ctx, reason)

    return on_closing


def remove_activation(runtime: Runtime, act: Activation) -> None:
    """Take `act` out of service (see the module docstring for what happens to its work)."""
    engine = runtime.engine
    left = engine.unregister(act)
    pool = runtime.pool
    closed = UnavailableError(f"{act.kind} {act.id!r} closed", reason=UnavailableReason.CLOSED)
    boxes = [act.box, *(act.timer_boxes())]
    for box in boxes:
        records = pool.close_box(box)
        pool.fail_waiters(box, closed)
        for rec in records:
            drop_record(runtime, box, rec, closed)
    for frame in list(act.parked or ()):
        frame.discard(closed)
    if act.timers is not None:
        act.timers.cancel_all()
    if left is not None:
        tell_left(runtime, act.spot, left)
    if runtime.objects is not None and act.kind in _GLOBAL_KINDS:
        runtime.objects.removed(act)


_GLOBAL_KINDS = frozenset({ObjectKind.SPOT, ObjectKind.ACTOR})


def drop_record(runtime: Runtime, box: Mailbox, rec: Record, exc: BaseException) -> None:
    """End a record that will never run: a request's caller hears `exc`."""
    if rec.kind <= K_REQUEST:
        dropped(cast(Message, rec).metadata)  # a remote record's permit goes back
    if rec.kind == K_REQUEST:
        rec.drop(exc)  # not a handler failure: the handler never ran
    elif rec.kind == K_RESUME:
        cast(Resume, rec).frame.discard(exc)
    elif rec.kind == K_CALL:
        job = cast(Job, rec)
        # Lifecycle work (a Join decision, say) still hears that it will never run.
        try:
            job.on_done(None, exc)
        except Exception:
            log.exception("dropping lifecycle record %r", job.fn)
    else:
        runtime.engine.dropped_records += 1
    if rec.reserved:
        rec.reserved = False
        runtime.pool.release_reservation(box)


def tell_left(runtime: Runtime, spot: Activation, ref: ActorRef) -> None:
    """`ref` is no longer a member of `spot`: queue `spot.on_actor_leave(ctx, ref)`, a
    lifecycle record under the Spot's gate, unless the Spot's own close has begun.

    Leaves during shutdown are not reported (object-model.md, "Members"): every Spot
    hears `on_closing(HOST_SHUTDOWN)`, whatever its members did meanwhile.
    """
    if spot.type.cls.on_actor_leave is Spot.on_actor_leave:  # type: ignore[attr-defined]
        return  # not overridden: nothing to run, no record
    if spot.closing is not None or runtime.state is not HostState.SERVING:
        return
    ran = False

    def tell(inst: Spot, ctx: object) -> object:
        nonlocal ran
        if spot.closing is not None:  # a close accepted after the Actor left
            return None
        ran = True
        return inst.on_actor_leave(ctx, ref)

    def told(value: object, exc: BaseException | None) -> None:
        if exc is not None and ran:  # not ran: dropped because the Spot closed
            runtime.engine.handler_failures += 1
            log.error("%r on_actor_leave raised", spot, exc_info=exc)

    # Past the lifecycle lane's limit: one notice per member that left, so bounded by
    # the Joins this Spot approved, and a leave must never be lost to a full lane.
    runtime.pool.force(spot.box, Job(tell, told), lifecycle=True)
