"""Waking a sleeping thread from a thread that goes to sleep soon: the wake waits for it.

In CPython a thread woken while its waker still runs Python cannot run until the waker
lets the GIL go: it wakes, finds the GIL taken, sleeps again, and is woken a second time
when the waker blocks. A thread that runs a short step and then sleeps (the transport's
I/O thread: one step per poll) can instead keep the wakes it makes during the step and
make them just before it sleeps: the woken thread then finds the GIL free, and the
waker's own remaining work no longer sits between the wake and the woken thread's first
line (docs/decisions.md, "A wake from the I/O thread waits for its sleep").

Only a thread that declared it (`sleeping()`, called before each of its sleeps) defers;
everywhere else `wake(lock)` is `lock.release()`. Deferred wakes are only ever lock
releases that end another thread's wait for work or for a result. The woken thread may
hold a lock of its own while it waits (a caller blocked in `submit_sync()` inside a
logging handler holds that handler's lock), so a deferring thread makes its wakes before
it waits for anything or runs code it does not own: before it blocks on a `Completion`
(`Completion._block`), and before it logs (`flush_before_logging`, a filter on the
package's loggers, runs before any handler's lock is taken).
"""

from __future__ import annotations

import _thread
import logging
import threading

__all__ = ["flush", "flush_before_logging", "sleeping", "wake"]

log = logging.getLogger("zlink_actors")


class _Held(threading.local):
    #: The wakes this thread keeps until it sleeps; None: it does not defer.
    wakes: list[_thread.LockType] | None = None


_held = _Held()


def wake(lock: _thread.LockType) -> None:
    """Release `lock`, which a sleeping thread waits on: now, or, on a thread that defers
    its wakes, when that thread next calls `sleeping()` (or `flush()`)."""
    wakes = _held.wakes
    if wakes is None:
        lock.release()
    else:
        wakes.append(lock)


def sleeping() -> None:
    """The calling thread is about to sleep: make the wakes it deferred (in order), and
    defer its wakes from now on, until its next call."""
    wakes = _held.wakes
    if wakes is None:
        _held.wakes = []
    elif wakes:
        _held.wakes = []
        _release(wakes)


def flush() -> None:
    """Make the wakes the calling thread deferred now; it goes on deferring."""
    wakes = _held.wakes
    if wakes:
        _held.wakes = []
        _release(wakes)


def _release(wakes: list[_thread.LockType]) -> None:
    for lock in wakes:
        try:
            lock.release()
        except RuntimeError:  # released twice: a bug, but not the other threads' wakes
            log.exception("a deferred wake failed")


class _FlushFilter(logging.Filter):
    """Makes the logging thread's deferred wakes before the record reaches a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        flush()
        return True


_FLUSH_FILTER = _FlushFilter()


def flush_before_logging(*names: str) -> None:
    """Make a deferring thread's wakes before it logs on the loggers `names` (a filter
    runs before any handler takes its lock); idempotent."""
    for name in names:
        logger = logging.getLogger(name)
        if _FLUSH_FILTER not in logger.filters:
            logger.addFilter(_FLUSH_FILTER)


flush_before_logging("zlink_actors")
