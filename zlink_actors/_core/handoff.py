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
releases that end another thread's wait for work or for a result: nothing the deferring
thread waits for itself, so deferring them cannot deadlock it.
"""

from __future__ import annotations

import _thread
import threading

__all__ = ["flush", "sleeping", "wake"]


class _Held(threading.local):
    #: The wakes this thread keeps until it sleeps; None: it does not defer.
    wakes: list[_thread.LockType] | None = None


_held = _Held()


def wake(lock: _thread.LockType) -> None:
    """Release `lock`, which a sleeping thread waits on: now, or, on a thread that defers
    its wakes, when that thread next calls `sleeping()`."""
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
        for lock in wakes:
            lock.release()


def flush() -> None:
    """Make the wakes the calling thread deferred now (before it blocks on anything else,
    or stops deferring: a thread that ends calls it last)."""
    wakes = _held.wakes
    if wakes:
        _held.wakes = []
        for lock in wakes:
            lock.release()
