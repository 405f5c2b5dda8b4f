"""The record runner: what a pool thread calls for each record it takes.

`RecordRunner.run_record` builds the turn context, runs the handler (stepping it with
the coroutine driver when it is `async def`) and does the record's post-turn work (the
reply, the failure count) before the gate moves on. It is the engine's side of
`_core.pool.RecordRunner`; the Host gives it the context class of each object kind, so
that this module knows no call builder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from contextvars import Context
from types import CoroutineType
from typing import Any, cast

from .._core.context import runtime_var
from .._core.errors import (
    InternalFailureError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
from .._core.mailbox import Mailbox
from .._core.pending import Request, SyncRequest
from .._core.record import (
    K_CALL,
    K_CALLBACK,
    K_MESSAGE,
    K_REQUEST,
    K_RESUME,
    K_TICK,
    CallbackRecord,
    Job,
    Message,
    OnDone,
    Record,
    Resume,
    Tick,
)
from .._core.state import HostState
from .driver import Frame, TurnHost
from .kernel import Runtime
from .lifecycle import drop_record, maybe_await, remove_activation
from .membership import start_move
from .objects import ObjectKind
from .registry import Activation
from .remote import RemoteMetadata
from .turn import TurnContext

__all__ = ["ContextTypes", "RecordRunner"]

log = logging.getLogger("zlink_actors")

#: The turn-context class of each object kind (`SpotContext`, ...), given by the Host.
ContextTypes = dict[ObjectKind, type[TurnContext]]

_ACTOR = ObjectKind.ACTOR

#: A message or request record: what a handler turn delivers.
Delivery = Message | Request | SyncRequest


class RecordRunner:
    """Runs the records of one Host's objects (see the module docstring)."""

    def __init__(self, runtime: Runtime, contexts: ContextTypes) -> None:
        self.runtime = runtime
        self.engine = runtime.engine
        self.pool = runtime.pool
        self.contexts = contexts

    def run_record(self, box: Mailbox, rec: Record) -> bool:
        """Run one record under its gate; True if the turn was handed off.

        The hot path is the second branch: a message or request to a Spot (or channel
        or node handler) whose last turn left its context pristine (synchronous, no
        context variable of its own) reuses that context, with this record's metadata;
        everything else builds a turn context and runs through `_run_turn`.
        """
        kind = rec.kind
        if kind == K_RESUME:
            return cast(Resume, rec).frame.resume()
        act: Activation = box.owner
        if kind <= K_REQUEST:
            # Annotations, not `cast()`: that is a Python call each, on every record.
            msg: Delivery = rec  # type: ignore[assignment]
            if kind == K_REQUEST:
                req: Request | SyncRequest = rec  # type: ignore[assignment]
                if req.route_id not in req.table._entries:
                    # Already terminal (cancelled, expired, or shut down while queued):
                    # its caller has its result, so its handler never runs.
                    return False
            if act.kind is _ACTOR or act.init_pending:
                return self._run_delivery(act, box, msg)
            ctx: TurnHost | None = act.spare
            context = act.spare_context
            if ctx is None or context is None:
                ctx = self.contexts[act.kind](self.runtime, act, box, None)
                context = Context()
                context.run(runtime_var.set, ctx)
            else:
                act.spare = None
            ctx._rec = msg
            metadata = msg.metadata
            if metadata is not None:
                # Every record another node sends has metadata (`RemoteMetadata`): it
                # takes this path too, its context only carrying it for this turn.
                ctx._metadata = metadata
                if type(metadata) is RemoteMetadata:
                    # Its inbound permit goes back now: `RemoteMetadata.started`, written
                    # out (a frame less on every remote record).
                    start, metadata._on_start = metadata._on_start, None
                    if start is not None:
                        start()
            try:
                result = context.run(msg.handler.fn, act.instance, ctx, msg.payload)
            except BaseException as exc:
                (self._message_done if kind == K_MESSAGE else msg.reply)(None, exc)
                return False
            if type(result) is CoroutineType:
                on_done = self._message_done if kind == K_MESSAGE else msg.reply
                return self._drive(result, ctx, context, msg, on_done, act)
            marker = context.get(runtime_var)
            spare: object = ctx  # an annotation, not `cast()` (a Python call per record)
            if len(context) == 1 and marker is spare and ctx._box is box:
                ctx._rec = None  # a spare context keeps no request (nor its reply) alive
                ctx._metadata = None  # nor metadata: the next record brings its own
                act.spare_context = context
                act.spare = ctx
            if kind != K_MESSAGE:
                msg.reply(result, None)  # a one-way message's success needs nothing
            return False
        if kind == K_TICK and cast(Tick, rec).timer.cancelled:
            return False  # restarted or cancelled after this tick was queued
        ctx_ = self.contexts[act.kind](self.runtime, act, box, None)
        fn: Callable[..., object]
        args: tuple[object, ...]
        on_done_: OnDone
        if kind == K_CALL:
            job = cast(Job, rec)
            fn, args, on_done_ = job.fn, (act.instance, ctx_), job.on_done
        elif kind == K_CALLBACK:
            callback = cast(CallbackRecord, rec)
            fn, args, on_done_ = callback.fn, (callback.completion,), self._callback_done
        elif kind == K_TICK:
            tick = cast(Tick, rec)
            timer = tick.timer
            fn, args, on_done_ = timer.callback, (ctx_, tick.tick), timer.tick_done
        else:  # pragma: no cover - the scheduler only carries these kinds
            raise AssertionError(f"unknown record kind {kind}")
        return self._run_turn(ctx_, rec, fn, args, on_done_)

    def _run_delivery(self, act: Activation, box: Mailbox, msg: Delivery) -> bool:
        """A message or request to an Actor, or an Instance Spot's first."""
        metadata = msg.metadata
        ctx = self.contexts[act.kind](self.runtime, act, box, metadata)
        ctx._rec = msg
        if type(metadata) is RemoteMetadata:  # `started(metadata)`, without its frame
            metadata.started()  # a remote record's inbound permit goes back now
        fn: Callable[..., object] = msg.handler.fn
        args: tuple[object, ...] = (act.instance, ctx, msg.payload)
        on_done: OnDone = self._message_done if msg.kind == K_MESSAGE else msg.reply
        if act.kind is _ACTOR:
            # The registration scope of defer(): the handler's own run.
            ctx._scope = True
            on_done = _ActorHandlerDone(self.runtime, ctx, on_done)
        if act.init_pending:
            act.init_pending = False
            fn, args = _initialize_then, (self.runtime, fn, args)
        return self._run_turn(ctx, msg, fn, args, on_done)

    def _run_turn(
        self,
        ctx: TurnContext,
        rec: Record,
        fn: Callable[..., object],
        args: tuple[object, ...],
        on_done: OnDone,
    ) -> bool:
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
            return self._drive(result, ctx, context, rec, on_done, ctx._act)
        on_done(result, None)
        return False

    def _drive(
        self,
        coro: Coroutine[Any, Any, object],
        ctx: TurnHost,
        context: Context,
        rec: Record,
        on_done: OnDone,
        act: Activation,
    ) -> bool:
        frame = Frame(coro, ctx, context, rec, on_done, self.pool, act.resume_box)
        return frame.resume()

    def fail_record(self, box: Mailbox, rec: Record) -> None:
        """The runtime's own work around `rec` raised (`AppPool._internal_error`): a
        request's caller hears `InternalFailureError` now instead of waiting for its
        deadline (if its outcome was already delivered, this finds nothing to end)."""
        if rec.kind == K_REQUEST:
            rec.drop(InternalFailureError("the runtime failed while running this request"))

    def drop_record(self, box: Mailbox, rec: Record) -> None:
        """A record a batch took but could not run before its mailbox closed."""
        exc = (
            UnavailableError(
                "the object closed before this record ran", reason=UnavailableReason.CLOSED
            )
            if self.runtime.state is HostState.SERVING
            else shutting_down("this record ran")
        )
        drop_record(self.runtime, box, rec, exc)

    def _message_done(self, value: object, exc: BaseException | None) -> None:
        # SC §4: a one-way call completed at admission; a later failure is only logged.
        if exc is not None:
            self.engine.handler_failures += 1
            log.error("one-way handler raised", exc_info=exc)

    def _callback_done(self, value: object, exc: BaseException | None) -> None:
        if exc is not None:
            self.engine.handler_failures += 1
            log.error("completion callback raised", exc_info=exc)


class _ActorHandlerDone:
    """Post-turn work of an Actor's handler: close the `defer()` scope, start a deferred
    Join or Leave if the handler ended normally, then the record's own post-turn work."""

    __slots__ = ("ctx", "inner", "runtime")

    def __init__(self, runtime: Runtime, ctx: TurnContext, inner: OnDone) -> None:
        self.runtime = runtime
        self.ctx = ctx
        self.inner = inner

    def __call__(self, value: object, exc: BaseException | None) -> None:
        ctx = self.ctx
        ctx._scope = False
        deferred, ctx._defer = ctx._defer, None
        if deferred is not None and exc is None:
            # Before the reply: a caller holding the reply knows the move has begun.
            start_move(self.runtime, ctx._act, deferred.spot_id)
        self.inner(value, exc)


async def _initialize_then(
    runtime: Runtime, fn: Callable[..., object], args: tuple[object, ...]
) -> object:
    """An Instance Spot's first record: `on_initialize`, then the message's handler.

    If `on_initialize` fails the Spot is removed (the next message with instance intent
    activates a fresh one) and this record fails with that error.
    """
    instance, ctx = args[0], args[1]
    assert isinstance(ctx, TurnContext)
    try:
        await maybe_await(instance.on_initialize(ctx))  # type: ignore[attr-defined]
    except BaseException:
        remove_activation(runtime, ctx._act)
        raise
    return await maybe_await(fn(*args))
