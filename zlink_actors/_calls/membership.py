"""`ctx.join_spot(spot_id).defer()` and `ctx.leave_spot().defer()`: the membership calls.

`defer()` only registers the move; the engine runs it after the handler that registered
it ends normally (`_engine/membership.py`, which also says what happens then).
"""

from __future__ import annotations

from .._core.errors import InvalidOperationError
from .._core.validation import check_id
from .._engine.objects import ObjectKind
from .._engine.turn import TurnContext, current_turn

__all__ = ["JoinCall", "LeaveCall", "join_call", "leave_call"]


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
    if ctx._act.kind is not ObjectKind.ACTOR:
        raise InvalidOperationError("join_spot() is for Actor handlers")
    return JoinCall(ctx, spot_id)


def leave_call(ctx: TurnContext) -> LeaveCall:
    if ctx._act.kind is not ObjectKind.ACTOR:
        raise InvalidOperationError("leave_spot() is for Actor handlers")
    return LeaveCall(ctx, None)
