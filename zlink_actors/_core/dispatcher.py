"""The completion dispatcher: one process-shared lane for completion callbacks (SC §11).

Posting never fails and has no bound: what waits here is what completions already
accepted (one post per callback a caller registered), never new work. Callbacks run in
FIFO order on the dispatcher's own thread, each on a fresh turn (never on the completing
stack); one callback's exception is logged and never blocks the next. The lane starts on
first use, outlives any `Host`, and at interpreter exit runs what it had accepted.
"""

from __future__ import annotations

import _thread
import atexit
import contextvars
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .context import CallbackPoster, RuntimeContext, runtime_var

__all__ = [
    "CompletionDispatcher",
    "DispatcherStatistics",
    "completion_dispatcher",
    "get_dispatcher",
]

log = logging.getLogger("zlink_actors")

_EXIT_DRAIN_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    """A snapshot of the completion dispatcher.

    Attributes:
        queued: callbacks accepted and not yet run.
        executed: callbacks run since the process started (raising ones included).
    """

    queued: int
    executed: int


class CompletionDispatcher:
    """The process-shared completion lane. Obtain it with `completion_dispatcher()`."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Callable[[Any], object], Any, CallbackPoster | None]] = deque()
        self._mutex = threading.Lock()
        self._wake = _thread.allocate_lock()
        self._wake.acquire()
        self._sleeping = False
        self._executed = 0
        self._thread: threading.Thread | None = None
        self._context = RuntimeContext("completion callback")

    def post(self, fn: Callable[[Any], object], arg: Any, poster: CallbackPoster | None) -> None:
        """Queue `fn(arg)`; with a `poster`, hand it to that owner instead of running it."""
        with self._mutex:
            self._queue.append((fn, arg, poster))
            if self._thread is None:
                self._start()
            elif self._sleeping:
                self._sleeping = False
                self._wake.release()

    def drain(self, timeout: float | None) -> bool:
        """Wait until everything posted before this call has run; False on timeout."""
        if threading.current_thread() is self._thread:
            return False
        with self._mutex:
            if self._thread is None:
                return True
        done = _thread.allocate_lock()
        done.acquire()
        self.post(_release, done, None)
        return done.acquire(True, -1 if timeout is None else max(timeout, 0.0))

    def statistics(self) -> DispatcherStatistics:
        """Queued and executed callback counts."""
        return DispatcherStatistics(queued=len(self._queue), executed=self._executed)

    def _start(self) -> None:
        # Called with the mutex held, on first post.
        thread = threading.Thread(target=self._run, name="zlink-dispatcher", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        base = contextvars.copy_context()
        base.run(runtime_var.set, self._context)
        queue = self._queue
        while True:
            try:
                fn, arg, poster = queue.popleft()
            except IndexError:
                with self._mutex:
                    if queue:
                        continue
                    self._sleeping = True
                self._wake.acquire()
                continue
            try:
                if poster is not None:
                    poster(fn, arg)
                else:
                    # A fresh context per callback: one callback's context changes
                    # never leak into the next.
                    base.copy().run(fn, arg)
            except BaseException:
                log.exception("completion callback %r raised", fn)
            if fn is not _release:
                self._executed += 1


def _release(lock: _thread.LockType) -> None:
    lock.release()


_dispatcher: CompletionDispatcher | None = None
_dispatcher_lock = threading.Lock()


def get_dispatcher() -> CompletionDispatcher:
    """The process-shared dispatcher, created on first use."""
    dispatcher = _dispatcher
    if dispatcher is not None:
        return dispatcher
    return _create()


def _create() -> CompletionDispatcher:
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None:
            _dispatcher = CompletionDispatcher()
            atexit.register(_drain_at_exit)
        return _dispatcher


def _drain_at_exit() -> None:
    dispatcher = _dispatcher
    if dispatcher is not None and not dispatcher.drain(_EXIT_DRAIN_SECONDS):
        log.warning("completion dispatcher still busy at interpreter exit")


def completion_dispatcher() -> CompletionDispatcher:
    """The process-shared completion dispatcher (for `statistics()` and draining)."""
    return get_dispatcher()
