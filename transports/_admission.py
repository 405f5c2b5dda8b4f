"""`Admission`: the `admitted` future of a parked message, small enough to park 100,000;
and `Parked`, a parked message that is its own `Admission` (one object, not two).

A `concurrent.futures.Future` makes a `threading.Condition` (an RLock, a deque, bound
methods) and two lists when it is made: about 1.6 KiB, more than the rest of a parked
message. An `Admission` is a `Future[None]` that makes none of them: its state is guarded
by one lock shared by every admission (a message is admitted or fails once, under it,
for a few instructions), its done-callbacks are one callable or a list, and a
`Condition` (with a lock of its own) is made only for a thread that blocks in `result()`
or `exception()`, or for `concurrent.futures.wait()` / `as_completed()`. It is made
running (it cannot be cancelled: a parked message is taken back with
`Transport.withdraw`).

Locks: the shared lock is a leaf (nothing else is taken while it is held), so it never
takes part in a lock-order cycle; `concurrent.futures.wait()` takes the conditions of the
futures it is given in the order of their ids, which is only deadlock-free when each
future's condition has a lock of its own (a condition on the shared lock made two
`wait()` calls that mixed admissions with other futures deadlock). Once an admission has
a condition, it finishes under it too, so a waiter is installed either before the
admission finished (and is told) or after (and sees it done), never both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import FINISHED, LOGGER, RUNNING, _Waiter

from ._wire import Kind

__all__ = ["Admission", "Parked"]

#: Guards the state of every `Admission`; a leaf lock: held for a few instructions, never
#: while taking another lock or calling out.
_LOCK = threading.Lock()

_Callback = Callable[[Future[None]], object]


class Admission(Future[None]):
    """A `Future[None]` for a parked message (see the module docstring)."""

    # Class defaults: an instance stores only what it changed (its state once done, its
    # outcome, a callback), so a parked one holds a dict of at most one entry.
    _state = RUNNING
    _result = None
    _exception: BaseException | None = None
    _callbacks: _Callback | list[_Callback] | None = None
    _cond: threading.Condition | None = None
    _waiter_list: list[_Waiter] | None = None

    def __init__(self) -> None:  # not Future's: no Condition, no lists
        pass

    # -- what concurrent.futures.wait() and as_completed() use ------------------------

    @property
    def _condition(self) -> threading.Condition:
        with _LOCK:
            cond = self._cond
            if cond is None:
                cond = self._cond = threading.Condition(threading.Lock())
            return cond

    @_condition.setter
    def _condition(self, value: threading.Condition) -> None:
        raise AttributeError("an Admission's condition is its own")

    @property
    def _waiters(self) -> list[_Waiter]:
        with _LOCK:
            waiters = self._waiter_list
            if waiters is None:
                waiters = self._waiter_list = []
            return waiters

    @_waiters.setter
    def _waiters(self, value: list[_Waiter]) -> None:
        raise AttributeError("an Admission's waiters are its own")

    # -- Future -------------------------------------------------------------------------

    def cancel(self) -> bool:
        """Never cancelled (it is running from the start): False."""
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return self._state == RUNNING

    def done(self) -> bool:
        return self._state == FINISHED

    def add_done_callback(self, fn: _Callback) -> None:
        """Call `fn(self)` once done: at once (on this thread) when it is already."""
        with _LOCK:
            if self._state != FINISHED:
                held = self._callbacks
                if held is None:
                    self._callbacks = fn
                elif isinstance(held, list):
                    held.append(fn)
                else:
                    self._callbacks = [held, fn]
                return
        self._call(fn)

    def result(self, timeout: float | None = None) -> None:
        if self._state != FINISHED:
            self._wait(timeout)
        exc = self._exception
        if exc is not None:
            raise exc

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state != FINISHED:
            self._wait(timeout)
        return self._exception

    def set_running_or_notify_cancel(self) -> bool:
        """Running from the start: RuntimeError, as for a `Future` already running."""
        raise RuntimeError("an Admission is running from the start")

    def set_result(self, result: None) -> None:
        self._finish(None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(exception)

    def __repr__(self) -> str:
        outcome = "" if self._state != FINISHED else f" {self._exception!r}"
        return f"<Admission at {id(self):#x} state={self._state.lower()}{outcome}>"

    # -- inside ---------------------------------------------------------------------

    def _finish(self, exc: BaseException | None) -> None:
        with _LOCK:
            cond = self._cond
            if cond is None:  # nobody waits, and a later waiter sees it done
                held = self._done_locked(exc)
        if cond is not None:
            with cond:  # a waiter is installed (under `cond`) before or after, not during
                with _LOCK:
                    held = self._done_locked(exc)
                for waiter in self._waiter_list or ():
                    if exc is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                cond.notify_all()
        if held is None:
            return
        for fn in held if isinstance(held, list) else (held,):
            self._call(fn)

    def _done_locked(self, exc: BaseException | None) -> _Callback | list[_Callback] | None:
        """Mark it done with `exc` (under `_LOCK`); the callbacks to run (outside it)."""
        if self._state == FINISHED:
            raise InvalidStateError(f"{self!r} is done already")
        if exc is not None:
            self._exception = exc
        self._state = FINISHED
        held = self._callbacks
        if held is not None:
            self._callbacks = None  # not `del`: a subclass may keep it in a slot (`Parked`)
        return held

    def _invoke_callbacks(self) -> None:  # Future's, for anything that calls it
        return None  # each callback runs once, from `_finish` or `add_done_callback`

    def _call(self, fn: _Callback) -> None:
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    def _wait(self, timeout: float | None) -> None:
        cond = self._condition
        with cond:  # it finishes under `cond` once `cond` exists: no wake-up is missed
            if not cond.wait_for(self.done, timeout):
                raise TimeoutError()


class Parked(Admission):
    """Frames waiting for credit, and itself the future that tells when they are admitted
    (`SubmitResult.admitted`, an `Admission`): a parked message costs its sender what its
    frames hold and about 120 bytes (docs/transports.md, "What each submit result
    promises")."""

    # `_callbacks` shadows `Admission`'s class default with a slot of its own, set in
    # `__init__`: the one callback a parked message gets then needs no instance dict.
    __slots__ = ("_callbacks", "charge", "frames", "kind", "refresh", "route_id")

    def __init__(
        self,
        kind: Kind,
        route_id: int,
        frames: Sequence[bytes],
        charge: int,
        refresh: Callable[[], Sequence[bytes]] | None = None,
    ) -> None:
        self._callbacks = None
        self.kind = kind
        self.route_id = route_id
        self.frames = frames
        self.charge = charge
        #: Called (under the lock) when the frames are admitted after waiting: the
        #: frames to send instead, of the same size (a request's envelope with its
        #: budget left).
        self.refresh = refresh

    @property
    def future(self) -> Future[None]:
        """The `admitted` future: the record itself."""
        return self
