"""Membership: `join_spot(...).defer()` and `leave_spot().defer()` (digest §3-4).

`defer()` only registers the move; it runs after the handler that registered it ends
normally (an exception discards it). From that moment until the move is decided, the
Actor's queue claim is held, so its next records wait and keep their order. The target
Spot approves in `on_actor_join` (a lifecycle record under its gate); on approval the
Actor's mailbox moves under the Spot's gate (SpotWide) or a gate of its own (PerActor,
Entry). Either way the Actor then hears `on_join_completed(ctx, JoinResult)`, as a
lifecycle record that runs before its queued messages. The Spot it left (by a Leave, a
Join elsewhere or its close) hears `on_actor_leave(ctx, ActorRef)` in its own turn.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .._core.errors import InvalidOperationError, NotFoundError
from .._core.pool import ADMITTED, Gate, Record
from .._core.state import HostState
from .lifecycle import _maybe_await
from .objects import ActorRef, InstanceSpot, JoinResult, Spot, check_id
from .turn import K_CALL, current_turn

if TYPE_CHECKING:
    from .kernel import Runtime
    from .registry import Activation
    from .turn import TurnContext

__all__ = [
    "JoinCall",
    "LeaveCall",
    "join_call",
    "leave_call",
    "start_move",
    "tell_left",
]

log = logging.getLogger("zlink_actors")


class _DeferCall:
    __slots__ = ("_ctx", "_spot_id", "_used")

    def __init__(self, ctx: TurnContext, spot_id: str | None) -> None:
        self._ctx = ctx
        self._spot_id = spot_id
        self._used = False

    def defer(self) -> None:
        """Register the move to run after this handler ends normally; returns at once.

        Keeps the gate and the Actor's queue claim. Raises `InvalidOperationError` when
        called twice in one handler, outside the handler's own turn, or after it ended.
        """
        ctx = self._ctx
        if self._used:
            raise InvalidOperationError("defer() was already called on this call")
        if current_turn() is not ctx or not ctx._scope:
            raise InvalidOperationError(
                "defer() is only valid inside the Actor handler whose context built the call, "
                "while it runs"
            )
        if ctx._defer is not None:
            raise InvalidOperationError("this handler already deferred a Join or Leave")
        self._used = True
        ctx._defer = self

    @property
    def spot_id(self) -> str | None:
        return self._spot_id


class JoinCall(_DeferCall):
    """`ctx.join_spot(spot_id)`: finish it with `defer()`. Created by the runtime."""

    __slots__ = ()


class LeaveCall(_DeferCall):
    """`ctx.leave_spot()`: back to the Entry Spot; finish it with `defer()`."""

    __slots__ = ()


def join_call(ctx: TurnContext, spot_id: str) -> JoinCall:
    check_id("spot_id", spot_id)
    if ctx._act.kind != "actor":
        raise InvalidOperationError("join_spot() is for Actor handlers")
    return JoinCall(ctx, spot_id)


def leave_call(ctx: TurnContext) -> LeaveCall:
    if ctx._act.kind != "actor":
        raise InvalidOperationError("leave_spot() is for Actor handlers")
    return LeaveCall(ctx, None)


def start_move(runtime: Runtime, act: Activation, spot_id: str | None) -> None:
    """Post-turn work of a handler that deferred a Join (or a Leave: `spot_id` None)."""
    pool = runtime.pool
    engine = runtime.engine
    pool.claim(act.box)  # its next records wait, in order, until the move is decided
    target = engine.entry if spot_id is None else engine.spots.get(spot_id)
    wanted = engine.entry.id if spot_id is None else spot_id
    if target is None or target.closed:
        _finish(runtime, act, JoinResult(wanted, False, NotFoundError(f"no Spot {wanted!r}")))
        return
    if (target is engine.entry and spot_id is not None) or issubclass(
        target.type.cls, InstanceSpot
    ):
        error = InvalidOperationError(f"Spot {wanted!r} cannot take Actors")
        _finish(runtime, act, JoinResult(wanted, False, error))
        return
    if target is act.spot:
        _finish(runtime, act, JoinResult(wanted, True))
        return
    if target is engine.entry:
        _finish(runtime, act, JoinResult(wanted, _move(runtime, act, target)))
        return
    ref = ActorRef(act.id, act.generation)

    asked = False

    def ask(inst: Any, ctx: Any) -> Any:
        nonlocal asked
        asked = True
        return inst.on_actor_join(ctx, ref)

    def decided(value: Any, exc: BaseException | None) -> None:
        approved = exc is None and bool(value)
        if approved and not act.closed and _move(runtime, act, target):
            _finish(runtime, act, JoinResult(wanted, True))
        else:
            if exc is not None and asked:  # not asked: dropped unrun (the Spot closed)
                engine.handler_failures += 1
                log.error("%r on_actor_join raised", target, exc_info=exc)
            _finish(runtime, act, JoinResult(wanted, False, exc))

    if pool.enqueue(target.box, Record(K_CALL, ask, decided), lifecycle=True) != ADMITTED:
        _finish(runtime, act, JoinResult(wanted, False, NotFoundError(f"Spot {wanted!r} closed")))


def _move(runtime: Runtime, act: Activation, target: Activation) -> bool:
    """Make `act` a member of `target`; False if `target` closed or is closing.

    Membership changes under the engine lock, where `close()` checks for members, so a
    Spot never closes with a member and never gains one while closing.
    """
    engine = runtime.engine
    with engine.lock:
        if target.closed or (target.closing is not None and target is not engine.entry):
            return False
        old = act.spot
        left = old.drop_member(act.id)
        act.spot = target
        if target is not engine.entry:  # the Entry Spot keeps no member list
            target.add_member(ActorRef(act.id, act.generation))
    gate = target.box.gate if target.box.gate.spotwide else Gate(runtime.pool)
    runtime.pool.move(act.box, gate)
    if left is not None:
        tell_left(runtime, old, left)
    return True


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

    def tell(inst: Any, ctx: Any) -> Any:
        nonlocal ran
        if spot.closing is not None:  # a close accepted after the Actor left
            return None
        ran = True
        return inst.on_actor_leave(ctx, ref)

    def told(value: Any, exc: BaseException | None) -> None:
        if exc is not None and ran:  # not ran: dropped because the Spot closed
            runtime.engine.handler_failures += 1
            log.error("%r on_actor_leave raised", spot, exc_info=exc)

    # Past the lifecycle lane's limit: one notice per member that left, so bounded by
    # the Joins this Spot approved, and a leave must never be lost to a full lane.
    runtime.pool.force(spot.box, Record(K_CALL, tell, told), lifecycle=True)


def _finish(runtime: Runtime, act: Activation, result: JoinResult) -> None:
    told_it = False

    def tell(inst: Any, ctx: Any) -> Any:
        nonlocal told_it
        told_it = True
        return _maybe_await(inst.on_join_completed(ctx, result))

    def told(value: Any, exc: BaseException | None) -> None:
        if exc is not None and told_it:  # not told: dropped unrun (the Actor closed)
            runtime.engine.handler_failures += 1
            log.error("%r on_join_completed raised", act, exc_info=exc)

    # Lifecycle first: the outcome runs before the messages that waited for the move.
    runtime.pool.enqueue(act.box, Record(K_CALL, tell, told), lifecycle=True)
    runtime.pool.release_claim(act.box)
