"""The single-use call builder every operation shares (design/architecture.md §6).

A builder collects options (`timeout`, `metadata`) and is finished by exactly one
terminator. A second terminator, or an option after the terminator, raises
`InvalidOperationError` from the call itself; so does repeating an option. Usage errors
raise where the mistake is made (a bad argument from the builder method, a wrong context
or a second terminator from the terminator), before anything is submitted, and leave the
builder unused; operational failures complete the returned `Completion` exceptionally
(and so raise from `submit_sync()`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

from .._core import context as _context
from .._core.cancellation import CancellationToken, check_token
from .._core.completion import Completion, failed
from .._core.errors import CancelledError, InvalidOperationError
from .._core.validation import add_metadata, check_seconds
from .._engine.driver import YieldAwaitable
from .._engine.kernel import Runtime
from .._engine.turn import require_yield_turn

__all__ = ["Call", "YieldableCall"]

T = TypeVar("T")


class Call(Generic[T]):
    """Base of every call builder. Created by the runtime; not constructed by users."""

    __slots__ = ("_metadata", "_runtime", "_timeout", "_used")

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._timeout: float | None = None
        self._used = False
        self._metadata: dict[str, object] | None = None

    def timeout(self, seconds: float) -> Self:
        """Set the end-to-end budget, fixed when the terminator starts.

        Args:
            seconds: more than 0 and at most `threading.TIMEOUT_MAX` (docs/validation.md).

        Raises:
            InvalidOperationError: the option was already set, or the call was submitted.
            TypeError: `seconds` is not a real number, or is a bool.
            ValueError: `seconds` is 0, negative, NaN, infinite or above
                `threading.TIMEOUT_MAX`.
        """
        self._check_open("timeout()")
        if self._timeout is not None:
            raise InvalidOperationError("timeout() was already set on this call")
        self._timeout = check_seconds("timeout", seconds)
        return self

    def metadata(self, key: str, value: object) -> Self:
        """Attach `key=value` to the call; a handler it reaches sees it in `ctx.metadata`.

        Raises:
            InvalidOperationError: `key` was already set, or the call was submitted.
            TypeError: `key` is not a str.
        """
        self._check_open("metadata()")
        self._metadata = add_metadata(self._metadata, key, value)
        return self

    # -- terminators -------------------------------------------------------------------

    def submit(self, cancel: CancellationToken | None = None) -> Completion[T]:
        """Start the call and return its `Completion`.

        Completes when: the operation's application result is terminal (for one-way
        calls: admission, with `None`).
        Turn: `await` on it keeps the current turn (the gate stays held).
        Raises: `InvalidOperationError` for a second terminator or a wrong context;
        operational failures complete the `Completion` exceptionally instead.
        """
        token = check_token(cancel)
        self._claim()
        return self._start_claimed(token)

    def submit_sync(self, cancel: CancellationToken | None = None) -> T:
        """Start the call and block the calling application thread for its result.

        Completes when: as `submit()`.
        Turn: application threads only; inside any runtime context it raises
        `InvalidOperationError` before anything is submitted.
        Raises: the operation's error (`DeadlineExceededError`, `ShuttingDownError`,
        `CancelledError`, ...), or `InvalidOperationError` for misuse.
        """
        token = check_token(cancel)
        _context.forbid_blocking("submit_sync()")
        self._claim()
        return self._wait_sync(self._start_claimed(token))

    # -- for subclasses ----------------------------------------------------------------

    @staticmethod
    def _wait_sync(done: Completion[T]) -> T:
        """How `submit_sync()` blocks for its result (a request's also ends the call on
        an interrupt: `pending.result_or_cancel`)."""
        return done.result()

    def _start(self, cancel: CancellationToken | None) -> Completion[T]:
        raise NotImplementedError

    def _start_claimed(
        self,
        cancel: CancellationToken | None,
        start: Callable[[CancellationToken | None], Completion[T]] | None = None,
    ) -> Completion[T]:
        """Run `start` (default `_start`) for a claimed call; a usage error it raises
        before anything was submitted leaves the call unused, so it can be fixed and
        submitted again."""
        try:
            return (start or self._start)(cancel)
        except BaseException:
            # A usage error raised before anything was submitted: the call stays unused.
            self._used = False
            raise

    def _check_open(self, what: str) -> None:
        if self._used:
            raise InvalidOperationError(f"{what} after the call was submitted")

    def _claim(self) -> None:
        if self._used:
            raise InvalidOperationError("this call was already submitted; builders are single-use")
        self._used = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    def _refused(self, cancel: CancellationToken | None) -> Completion[Any] | None:
        """Every terminator's opening, before anything is registered or submitted: the
        failed completion of a call the Host does not admit (`ShuttingDownError`) or
        whose token is already cancelled (`CancelledError`); None to go on.

        Raises `InvalidOperationError` before `start()` (a usage error, not an outcome).
        """
        return self._runtime.admission_failure() or self._pre_cancelled(cancel)

    @staticmethod
    def _pre_cancelled(cancel: CancellationToken | None) -> Completion[Any] | None:
        """CS §2: a valid call with a cancelled token completes cancelled, unstarted."""
        if cancel is not None and cancel.cancelled:
            return failed(CancelledError())
        return None


class YieldableCall(Call[T]):
    """A call whose result may also be awaited with the gate released (`yield_()`)."""

    __slots__ = ()

    def yield_(self, cancel: CancellationToken | None = None) -> YieldAwaitable[T]:
        """Start the call; `await` the result releases the Spot gate meanwhile.

        Completes when: as `submit()`.
        Turn: releases the gate (SpotWide or Instance Spot `async def` turns only; a
        member Actor keeps its queue claim). The continuation runs later as a new turn,
        queued behind work already waiting: re-read state after it.
        Raises: `InvalidOperationError` outside an eligible turn, before anything starts.
        """
        token = check_token(cancel)
        require_yield_turn(type(self).__name__)
        self._claim()
        return YieldAwaitable(self._start_claimed(token))
