"""Cooperative cancellation: `CancellationSource`, `CancellationToken` (CS §1-3).

A token is passed to a terminator as `cancel=`. Cancelling never changes a result that is
already complete and never recalls an accepted one-way message. A token that is already
cancelled when a terminator runs completes the (validated) call as cancelled without
admitting or starting anything.

User callbacks registered on a token run once, on the completion dispatcher, never on the
thread that called `cancel()`. The framework's own registrations race for an operation's
terminal and run inline (they run no user code).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .dispatcher import get_dispatcher

__all__ = [
    "CancellationRegistration",
    "CancellationSource",
    "CancellationToken",
    "check_token",
]

log = logging.getLogger("zlink_actors")


class _TokenState:
    __slots__ = ("cancelled", "lock", "next_key", "registrations")

    def __init__(self) -> None:
        # Reentrant: `cancel()` is what a signal handler calls, and a handler can land on
        # a thread inside this lock (registering a call on the same token).
        self.lock = threading.RLock()
        self.cancelled = False
        self.next_key = 0
        self.registrations: dict[int, CancellationRegistration] = {}

    def reentered(self) -> bool:
        """Inside `lock`, after checking `cancelled` is False: True if a `cancel()` ran
        since, on this thread (a signal handler that landed inside the section)."""
        return self.cancelled


class CancellationRegistration:
    """A callback registered on a token. Created by `CancellationToken.register`."""

    __slots__ = ("_fn", "_internal", "_key", "_state")

    def __init__(
        self, state: _TokenState | None, key: int, fn: Callable[[], object], internal: bool
    ) -> None:
        self._state = state
        self._key = key
        self._fn = fn
        self._internal = internal

    def unregister(self) -> bool:
        """Remove the callback; True if it had not run (and now never will)."""
        state = self._state
        if state is None:
            return False
        with state.lock:
            return state.registrations.pop(self._key, None) is not None

    def _run(self) -> None:
        if self._internal:
            try:
                self._fn()
            except Exception:
                log.exception("internal cancellation hook %r raised", self._fn)
        else:
            get_dispatcher().post(_call, self._fn, None)


def _call(fn: Callable[[], object]) -> None:
    fn()


class CancellationToken:
    """The observing side of a `CancellationSource`; pass it as `cancel=`."""

    __slots__ = ("_state",)

    def __init__(self, state: _TokenState) -> None:
        self._state = state

    @property
    def cancelled(self) -> bool:
        """True once the source was cancelled."""
        return self._state.cancelled

    def register(self, fn: Callable[[], object]) -> CancellationRegistration:
        """Run `fn()` once when cancelled, on the completion dispatcher.

        Registered on a token that is already cancelled, `fn` still runs, once.
        """
        if not callable(fn):
            raise TypeError(f"callback must be callable, got {type(fn).__name__}")
        return self._add(fn, internal=False)

    def _register_internal(self, fn: Callable[[], object]) -> CancellationRegistration:
        """Framework hook: run `fn()` inline on the cancelling thread."""
        return self._add(fn, internal=True)

    def _add(self, fn: Callable[[], object], internal: bool) -> CancellationRegistration:
        state = self._state
        with state.lock:
            if not state.cancelled:
                state.next_key += 1
                key = state.next_key
                reg = CancellationRegistration(state, key, fn, internal)
                state.registrations[key] = reg
                if not state.reentered():
                    return reg
                # A `cancel()` reentered this section (a signal handler) and may have
                # missed `reg`: run it here unless that cancel already did.
                if state.registrations.pop(key, None) is None:
                    return reg
            else:
                reg = CancellationRegistration(None, 0, fn, internal)
        reg._run()
        return reg

    def __repr__(self) -> str:
        return f"<CancellationToken cancelled={self.cancelled}>"


class CancellationSource:
    """Owns a cancellation signal; `token` is what calls observe."""

    __slots__ = ("_state", "_token")

    def __init__(self) -> None:
        self._state = _TokenState()
        self._token = CancellationToken(self._state)

    @property
    def token(self) -> CancellationToken:
        """The token to pass as `cancel=`."""
        return self._token

    @property
    def cancelled(self) -> bool:
        """True once `cancel()` was called."""
        return self._state.cancelled

    def cancel(self) -> None:
        """Signal cancellation; registered callbacks run once. Idempotent."""
        state = self._state
        with state.lock:
            if state.cancelled:
                return
            state.cancelled = True
            registrations = list(state.registrations.values())
            state.registrations.clear()
        for reg in registrations:
            reg._run()


def check_token(cancel: object) -> CancellationToken | None:
    """Validate a `cancel=` argument."""
    if cancel is None or isinstance(cancel, CancellationToken):
        return cancel
    raise TypeError(f"cancel= takes a CancellationToken, got {type(cancel).__name__}")
