"""`Completion[T]`, the one async result type, and `CompletionSource[T]`.

One operation has one `Cell`: the first completion wins atomically under the cell's lock
and every later attempt returns `False` (SC §2, §10). Callers never see the cell; they get
`Completion` handles, a fresh one per call. A handle's own cancellation ends only that
handle's wait (SC §2 stage isolation): it never changes the cell, nor any other handle.
Operations whose cancellation means something (a pending request, a worker) give their
handle a *canceller* that races for the operation's single terminal instead.

Done-callbacks never run on the completing stack or under the cell lock (SC §11): they are
posted to the process-shared completion dispatcher, or, when added inside a handler turn,
handed to that owner to run as a record under its gate.
"""

from __future__ import annotations

import _thread
import asyncio
import logging
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from . import context as _context
from .dispatcher import get_dispatcher
from .errors import CancelledError
from .handoff import flush, wake
from .validation import MAX_SECONDS, check_optional_seconds

__all__ = [
    "DONE",
    "PENDING",
    "Cell",
    "CellLock",
    "Completion",
    "CompletionSource",
    "Notify",
    "deliver",
    "failed",
    "settled",
]

T = TypeVar("T")
log = logging.getLogger("zlink_actors")
#: A `Cell`'s state: no completion won yet; then settled (for `_core`'s fast paths).
PENDING = 0
DONE = 1

#: What guards a cell: its own lock, or one it shares (a gate's, a pending table's).
CellLock = _thread.LockType | _thread.RLock

#: A canceller races for the operation's terminal; True when cancellation won.
Canceller = Callable[[], bool]


#: Blocked waiters to release and handles to fire, once a cell's lock is released.
Notify = tuple[list[_thread.LockType], list["Completion[Any]"]]


def deliver(notify: Notify) -> None:
    """Wake the waiters and fire the handles a publish returned (`Cell._publish`); called
    once the cell's lock is released (SC §11)."""
    woken, handles = notify
    for waiter in woken:
        wake(waiter)
    for handle in handles:
        handle._fire()


class Cell(Generic[T]):
    """The shared result of one operation: pending, then settled once.

    For the framework's own parts (the pending entries of `pending.py`, a one-way send
    waiting for lane space, a creation attempt): users hold `Completion` handles, never a
    cell. The first completion wins under the cell's lock (`try_set`); its fields are
    private to `_core`, so a kind of result that settles differently subclasses
    `pending.PendingCell` rather than writing them.
    """

    __slots__ = ("_exc", "_listeners", "_lock", "_state", "_value")

    def __init__(self, lock: CellLock | None = None) -> None:
        #: Guards the state and the listeners. A one-way send waiting for lane space
        #: shares its target's gate lock, so that admission settles it in the critical
        #: section that admits it (`_publish`).
        self._lock: CellLock = _thread.allocate_lock() if lock is None else lock
        self._state = PENDING
        self._value: T | None = None
        self._exc: BaseException | None = None
        self._listeners: list[Completion[T]] | None = None

    def try_set(self, value: T | None, exc: BaseException | None) -> bool:
        """Settle the cell with `value` or `exc` if it is pending; False if another
        completion won first."""
        with self._lock:
            if self._state:
                return False
            notify = self._publish(value, exc)
        # SC §11: confirm, release the lock, then notify.
        if notify is not None:
            deliver(notify)
        return True

    def _publish(self, value: T | None, exc: BaseException | None) -> Notify | None:
        """Set the result of a pending cell; the caller holds `_lock`. Returns what must
        be notified once the lock is released (`deliver`), or None."""
        self._value = value
        self._exc = exc
        self._state = DONE
        listeners = self._listeners
        if not listeners:
            return None
        self._listeners = None
        # Handles with only blocked waiters fire here, under the same lock; handles with
        # callbacks fire after it (keeping their callbacks' order).
        woken: list[_thread.LockType] = []
        rest = []
        for handle in listeners:
            if handle._callbacks is None and not handle._fired:
                handle._fired = True
                if handle._waiters:
                    woken.extend(handle._waiters)
                    handle._waiters = None
            else:
                rest.append(handle)
        return woken, rest

    def set_result(self, value: T) -> bool:
        """`try_set(value, None)`."""
        return self.try_set(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        """`try_set(None, exc)`."""
        return self.try_set(None, exc)

    def cancel(self) -> bool:
        """Settle as cancelled (`CancelledError`) if still pending."""
        return self.try_set(None, CancelledError())

    def done(self) -> bool:
        """True once settled."""
        return self._state == DONE

    def outcome(self) -> tuple[T | None, BaseException | None]:
        """The settled (value, error); (None, None) while pending."""
        return self._value, self._exc

    def claim(self) -> bool:
        """Atomically check that no terminal won yet, for work about to start.

        A terminal that wins before this returns prevents the start; one that comes
        after it only ends the caller's wait (the work runs; its late result is dropped).
        """
        with self._lock:
            return self._state == PENDING

    def handle(self, canceller: Canceller | None = None) -> Completion[T]:
        """A fresh handle on this cell; cancelling it calls `canceller` if given."""
        return Completion(self, canceller)

    @classmethod
    def settled(cls, value: T | None, exc: BaseException | None) -> Cell[T]:
        """A cell born settled."""
        cell: Cell[T] = cls()
        cell._value = value
        cell._exc = exc
        cell._state = DONE
        return cell


class Completion(Generic[T]):
    """The result of one call: a reply, `None` for a one-way admission, or an error.

    Created by the runtime (terminators, `CompletionSource.completion`); not meant to be
    constructed by users. Each call returns a fresh handle: cancelling, consuming or
    waiting on one never changes another, even when both observe one finished result.

    Blocking observation (`result`, `exception`, `wait`) of an unsettled completion is for
    application threads only; inside a handler, timer, worker or callback it raises
    `InvalidOperationError` at once (use `await`). An observation timeout raises the
    builtin `TimeoutError` and neither completes nor cancels the result.

    An observation `timeout` is `None` (wait as long as it takes), or seconds from 0 (poll)
    to `threading.TIMEOUT_MAX`; anything else raises `TypeError` (not a number, a bool)
    or `ValueError` (negative, NaN, infinite, too large) at once, settled or not.
    """

    __slots__ = (
        "_callbacks",
        "_cancelled",
        "_canceller",
        "_cell",
        "_fired",
        "_listening",
        "_waiters",
    )

    def __init__(self, cell: Cell[T], canceller: Canceller | None = None) -> None:
        self._cell = cell
        self._canceller = canceller
        self._cancelled = False
        self._fired = False
        #: In the cell's listener list: the cell's completion will call `_fire()`.
        self._listening = False
        self._waiters: list[_thread.LockType] | None = None
        self._callbacks: list[tuple[Callable[[Completion[T]], object], Any]] | None = None

    # -- state -------------------------------------------------------------------------

    def done(self) -> bool:
        """True once the result is settled or this handle was cancelled."""
        return self._cancelled or self._cell._state == DONE

    def cancelled(self) -> bool:
        """True if this handle was cancelled or the operation ended cancelled."""
        return self._cancelled or (
            self._cell._state == DONE and isinstance(self._cell._exc, CancelledError)
        )

    def cancel(self) -> bool:
        """End this caller's wait with `CancelledError`.

        Returns `False` if already done, or if the operation refuses cancellation (a
        one-way send waiting for capacity). For a pending request or worker the
        cancellation races the other terminal paths; the handler or callable may still
        run, and its late result is dropped.
        """
        if self.done():
            return False
        if self._canceller is not None:
            return self._canceller()
        with self._cell._lock:
            if self._cancelled or self._cell._state == DONE:
                return False
            self._cancelled = True
            listeners = self._cell._listeners
            if listeners is not None and self in listeners:
                listeners.remove(self)
                self._listening = False
        self._fire()
        return True

    # -- observation -------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; return `False` if `timeout` seconds passed first.

        Raises:
            TypeError, ValueError: a bad `timeout` (see the class docstring).
            InvalidOperationError: unsettled, and called inside a runtime context.
        """
        if timeout is not None:
            timeout = check_optional_seconds("timeout", timeout)
        if self.done():
            return True
        _context.forbid_blocking("Completion.wait()")
        return self._block(timeout)

    def result(self, timeout: float | None = None) -> T:
        """Return the value, or raise the operation's error (`CancelledError` if cancelled).

        Raises:
            TimeoutError: `timeout` passed first (the builtin, not `DeadlineExceededError`).
            TypeError, ValueError: a bad `timeout` (see the class docstring).
            InvalidOperationError: unsettled, and called inside a runtime context.
        """
        if timeout is not None:
            # A float or int in range passes `check_optional_seconds` as is (but as a
            # float): checked here without its two frames, since `result(timeout)` is
            # how a pipelined caller collects every reply.
            kind = type(timeout)
            if (kind is float or kind is int) and 0 <= timeout <= MAX_SECONDS:
                timeout = float(timeout)
            else:
                timeout = check_optional_seconds("timeout", timeout)
        cell = self._cell
        if cell._state != DONE and not self._cancelled:
            _context.forbid_blocking("Completion.result()")
            if not self._block(timeout):
                raise TimeoutError(f"the result was not settled within {timeout} s")
        if self._cancelled:
            raise CancelledError()
        exc = cell._exc
        if exc is not None:
            raise exc
        return cell._value  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Return the operation's error, or `None` if it succeeded.

        Raises `CancelledError` if cancelled, and the same `TimeoutError`, `TypeError`,
        `ValueError` and `InvalidOperationError` as `result()`.
        """
        if timeout is not None:
            timeout = check_optional_seconds("timeout", timeout)
        if not self.done():
            _context.forbid_blocking("Completion.exception()")
            if not self._block(timeout):
                raise TimeoutError(f"the result was not settled within {timeout} s")
        if self.cancelled():
            raise CancelledError()
        return self._cell._exc

    def add_done_callback(self, fn: Callable[[Completion[T]], object]) -> None:
        """Call `fn(self)` once this handle is done, on a fresh turn.

        Never on the completing thread's stack: callbacks go to the completion dispatcher
        (also when added after completion). Added inside a handler turn, the callback runs
        as a record of that owner, under its gate. An exception from `fn` is logged and
        does not stop other callbacks.
        """
        if not callable(fn):
            raise TypeError(f"callback must be callable, got {type(fn).__name__}")
        ctx = _context.current()
        poster = ctx.callback_poster() if ctx is not None else None
        if self._add_listener(fn, poster):
            get_dispatcher().post(fn, self, poster)

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            if asyncio._get_running_loop() is not None:
                # Inside asyncio (an I/O worker): bridge through an asyncio future.
                yield from self._asyncio_future().__await__()
            else:
                # Inside a handler coroutine: the framework's driver parks the turn.
                yield self
        return self.result()

    # -- internals ---------------------------------------------------------------------

    def _listen(self) -> None:
        # Caller holds the cell lock.
        if self._listening:
            return
        self._listening = True
        listeners = self._cell._listeners
        if listeners is None:
            self._cell._listeners = [self]
        else:
            listeners.append(self)

    def _block(self, timeout: float | None) -> bool:
        # `timeout` was validated by the caller: None, or 0 <= timeout <= TIMEOUT_MAX.
        waiter = _thread.allocate_lock()
        waiter.acquire()
        cell = self._cell
        with cell._lock:
            if self._cancelled or cell._state == DONE:
                return True
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
            self._listen()
        self._fire_if_missed()
        flush()  # a thread that defers its wakes makes them before it blocks
        if waiter.acquire(True, -1 if timeout is None else timeout):
            return True
        with cell._lock:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return self.done()

    def _fire_if_missed(self) -> None:
        """Right after this handle registered a waiter or callback: if the result was
        published meanwhile by code that ran on this thread inside the cell's (reentrant)
        lock (a signal handler that settled or cancelled the operation), that publish
        could not see the handle, so fire it now. `_fire` runs once whoever calls it."""
        if self._cell._state == DONE and not self._fired:
            self._fire()

    def _fire(self) -> None:
        """Wake waiters and post callbacks; runs once, outside the cell lock."""
        with self._cell._lock:
            if self._fired:
                return
            self._fired = True
            waiters, self._waiters = self._waiters, None
            callbacks, self._callbacks = self._callbacks, None
        if waiters:
            for waiter in waiters:
                wake(waiter)
        if callbacks:
            dispatcher = get_dispatcher()
            for fn, poster in callbacks:
                if poster is _INLINE:
                    _run_inline(fn, self)
                else:
                    dispatcher.post(fn, self, poster)

    def _asyncio_future(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake(_: Completion[T]) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)

        # `call_soon_threadsafe` never blocks: wake the loop from the completing thread.
        self._add_inline(wake)
        return future

    def _add_inline(self, fn: Callable[[Completion[T]], object]) -> None:
        """Framework-internal: run `fn(self)` on the completing thread, after the cell lock
        is released (now, if already done). Only for runtime work that runs no user code
        and does not block: queueing a resume record, waking a gate."""
        if self._add_listener(fn, _INLINE):
            _run_inline(fn, self)

    def _add_listener(self, fn: Callable[[Completion[T]], object], poster: Any) -> bool:
        """Register `fn`; True if already done (the caller runs it)."""
        cell = self._cell
        with cell._lock:
            # While the cell is publishing its result, a listening handle has not fired
            # yet: queue behind its earlier callbacks so their order is kept.
            if not self._fired and (
                self._listening or (not self._cancelled and cell._state != DONE)
            ):
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((fn, poster))
                self._listen()
                registered = True
            else:
                registered = False
        if registered:
            self._fire_if_missed()
        return not registered

    def __repr__(self) -> str:
        if not self.done():
            return "<Completion pending>"
        if self.cancelled():
            return "<Completion cancelled>"
        exc = self._cell._exc
        if exc is not None:
            return f"<Completion raised {type(exc).__name__}>"
        return f"<Completion result={self._cell._value!r}>"


_INLINE: Any = object()


def _run_inline(fn: Callable[[Any], object], arg: Any) -> None:
    try:
        fn(arg)
    except BaseException:
        log.exception("internal completion hook %r raised", fn)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class CompletionSource(Generic[T]):
    """A result the application completes itself; the first completion wins.

    `completion` returns a fresh handle on each access; all observe the same result.
    Dropping the source or a handle completes and cancels nothing.
    """

    __slots__ = ("_cell",)

    def __init__(self) -> None:
        self._cell: Cell[T] = Cell()

    @property
    def completion(self) -> Completion[T]:
        """A fresh handle on this source's result."""
        return Completion(self._cell)

    def set_result(self, value: T) -> bool:
        """Complete with `value`; return whether this call won."""
        return self._cell.try_set(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        """Complete with `exc`; return whether this call won."""
        if not isinstance(exc, BaseException):
            raise TypeError("set_exception() takes an exception instance")
        return self._cell.try_set(None, exc)

    def cancel(self) -> bool:
        """Complete as cancelled; return whether this call won."""
        return self._cell.try_set(None, CancelledError())

    def done(self) -> bool:
        """True once completed."""
        return self._cell.done()


def settled(value: T) -> Completion[T]:
    """A fresh, already-successful completion."""
    return Completion(Cell.settled(value, None))


def failed(exc: BaseException) -> Completion[Any]:
    """A fresh, already-failed completion (a pre-cancelled call uses `CancelledError`)."""
    return Completion(Cell.settled(None, exc))
