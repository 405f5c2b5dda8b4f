"""The turn seam of the HTTP client: an injectable completion scheduler (HX §5).

The client runs each request as a task on an asyncio loop and settles one `Completion`
per request. Where that loop is and how a settled result reaches its caller is the
scheduler's: the Host injects one on its I/O executor (`hosted.py`), whose results
resume the caller's turn through the framework's `Completion` (an `await` in a handler
resumes as that owner's continuation, a done-callback added in a turn runs as a new turn
of that owner); `LoopScheduler` runs the client without a Host, on a loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from .._core.completion import Cell
from .._core.errors import shutting_down

__all__ = ["CompletionScheduler", "LoopScheduler"]

T = TypeVar("T")


class CompletionScheduler(Protocol):
    """Where a client's requests run and how their completions are delivered."""

    def admission(self) -> BaseException | None:
        """None if a new request may start; else the error it completes with
        (`ShuttingDownError`). May raise `InvalidOperationError` for a usage error (a
        Host that was not started)."""
        ...

    def execute(self, make: Callable[[], Awaitable[None]]) -> bool:
        """From any thread: run `await make()` as a task on the loop; False once stopped."""
        ...

    def call_soon(self, fn: Callable[[], object]) -> bool:
        """From any thread: run `fn()` on the loop's thread; False once stopped."""
        ...

    def resume(self, cell: Cell[T], value: T | None, exc: BaseException | None) -> bool:
        """Settle `cell` (first terminal wins) so that its waiters resume; True if this won."""
        ...


class LoopScheduler:
    """A scheduler with its own asyncio loop on its own thread: the client without a Host.

    A result settles the completion directly, so a done-callback runs on the process
    completion dispatcher and an application thread's `result()` wakes. `close()` stops
    the loop (close the clients first).
    """

    def __init__(self, name: str = "zlink-http") -> None:
        self._loop = asyncio.new_event_loop()
        self._closed = False
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def admission(self) -> BaseException | None:
        return shutting_down() if self._closed else None

    def execute(self, make: Callable[[], Awaitable[None]]) -> bool:
        def start() -> None:
            task = self._loop.create_task(_run(make), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return self.call_soon(start)

    def call_soon(self, fn: Callable[[], object]) -> bool:
        with self._lock:
            if self._closed:
                return False
            try:
                self._loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop closed meanwhile
                return False
        return True

    def resume(self, cell: Cell[T], value: T | None, exc: BaseException | None) -> bool:
        return cell.try_set(value, exc)

    def close(self, timeout: float = 5.0) -> bool:
        """Cancel what still runs, stop the loop and join its thread; True if it ended."""
        with self._lock:
            if self._closed:
                return not self._thread.is_alive()
            self._closed = True
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _stop(self) -> None:
        # A task created just before (its start was queued ahead of this) has not run
        # its first step: cancelled now, its request would never start, so never settle
        # its completion. One more pass lets each start; then a cancel ends each request
        # with ShuttingDownError (`_Exchange.run`).
        self._loop.call_soon(self._cancel_and_stop)

    def _cancel_and_stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._loop.call_soon(self._loop.stop)


async def _run(make: Callable[[], Awaitable[None]]) -> None:
    await make()
