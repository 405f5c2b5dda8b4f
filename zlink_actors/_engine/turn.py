"""The turn context: what the runtime knows about the handler turn running now.

Every user-facing context (`SpotContext`, `ActorContext`, `ChannelContext`) is a
`TurnContext`, and the same object is the runtime marker in the context variable while
the turn runs. Terminators read it to refuse reentrant waits and ineligible `yield_()`
before anything is submitted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .._core.context import CallbackPoster, RuntimeContext, runtime_var
from .._core.errors import InvalidOperationError
from .._core.gate import Gate
from .._core.mailbox import Mailbox
from .._core.record import CallbackRecord, Record
from .driver import Frame
from .kernel import Runtime
from .registry import Activation

__all__ = ["DeferredMove", "TurnContext", "current_turn", "require_yield_turn"]


class DeferredMove(Protocol):
    """A Join or Leave a handler deferred (`_calls/membership`): the Spot it goes to
    (None: back to the Entry Spot)."""

    @property
    def spot_id(self) -> str | None: ...


class TurnContext(RuntimeContext):
    """Base of the handler contexts. Created by the runtime for each record it runs."""

    __slots__ = (
        "_act",
        "_box",
        "_defer",
        "_frame",
        "_gate",
        "_metadata",
        "_rec",
        "_runtime",
        "_scope",
    )

    def __init__(
        self,
        runtime: Runtime,
        act: Activation,
        box: Mailbox,
        metadata: dict[str, object] | None,
    ) -> None:
        self.kind = "handler turn"
        self._runtime = runtime
        self._act = act
        self._box = box
        self._gate: Gate[Mailbox] = box.gate
        self._frame: Frame | None = None
        self._metadata = metadata
        #: True while an Actor's message handler runs: the scope in which `defer()` works.
        self._scope = False
        #: The Join or Leave a handler deferred (runs after it ends normally).
        self._defer: DeferredMove | None = None
        #: The message or request record this turn handles (None for other turns): where
        #: `deadline` and `cancellation` come from.
        self._rec: Record | None = None

    def callback_poster(self) -> CallbackPoster:
        box = self._box
        pool = self._runtime.pool

        def post(fn: Callable[[object], object], completion: object) -> None:
            # Already-admitted work: never refused for capacity (dropped only if the
            # owner closed meanwhile).
            if not pool.force(box, CallbackRecord(fn, completion)):
                self._runtime.log_dropped_callback(fn)

        return post


def current_turn() -> TurnContext | None:
    """The running turn's context, or None outside a handler turn."""
    ctx = runtime_var.get()
    return ctx if isinstance(ctx, TurnContext) else None


def require_yield_turn(what: str) -> TurnContext:
    """The running turn, if `yield_()` may release its gate; else `InvalidOperationError`.

    Eligible: an `async def` handler (or timer / callback) turn in a SpotWide User Spot or
    Instance Spot, including a SpotWide member Actor's turn.
    """
    ctx = current_turn()
    if ctx is None:
        raise InvalidOperationError(
            f"{what}.yield_() is only valid inside an async handler of a SpotWide or "
            "Instance Spot turn; outside one use submit()"
        )
    if not ctx._gate.spotwide:
        raise InvalidOperationError(
            f"{what}.yield_() is not allowed here: this turn's gate (Entry, PerActor, "
            "Channel or Actor) cannot be released; use `await ...submit()`"
        )
    if ctx._frame is None:
        raise InvalidOperationError(
            f"{what}.yield_() needs an `async def` handler to await it; use submit()"
        )
    return ctx
