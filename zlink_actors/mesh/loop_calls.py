"""Calls whose work runs on the Host's I/O loop (the global objects' steps: resolving a
route, creating, closing, activating), and the small helpers that tie an asyncio step
to a `Completion` or a `concurrent.futures.Future`.

`LoopCalls` holds only the runtime: each call is one pending entry (`Runtime.begin`),
ended by the work's result or typed error; the functions carry no state at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from .._core.cancellation import CancellationToken
from .._core.completion import Completion
from .._core.errors import (
    DeadlineExceededError,
    ZlinkError,
    internal_failure,
    shutting_down,
)
from .._core.pending import PendingCell
from .._engine.kernel import Runtime

__all__ = ["LoopCalls", "failure", "outcome", "pause", "quietly", "refuse_cancel", "wait"]

T = TypeVar("T")

log = logging.getLogger("zlink_actors.mesh")


def refuse_cancel() -> bool:
    """The cancel hook of a handle that refuses caller cancellation (a one-way)."""
    return False


class LoopCalls:
    """Calls run on the I/O loop of `runtime` (see the module docstring)."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def left(self, due: float) -> float:
        """What is left of a call's deadline `due` (Host clock) for its next step, rounded
        up to a 10 ms grid (steps with about the same budget share one timer FIFO);
        `DeadlineExceededError` when nothing is left."""
        left = due - self._runtime.timers._now()
        if left <= 0:
            raise DeadlineExceededError("no result within the call's deadline")
        return min(math.ceil(left * 100.0) / 100.0, threading.TIMEOUT_MAX)

    def spawn(self, work: Coroutine[Any, Any, T]) -> Future[T]:
        """Run `work` on the I/O loop (`RuntimeError` once the loop has stopped)."""
        return asyncio.run_coroutine_threadsafe(work, self._runtime.io.loop)

    def begin_call(
        self, timeout: float | None, cancel: CancellationToken | None
    ) -> tuple[Completion[Any], int | None]:
        """The caller's handle on a new pending entry, and its route id (None: refused
        by shutdown or a cancelled token; start nothing). A one-way (`timeout` None) has
        no deadline and refuses cancellation (SC §5, §7); shutdown still ends it once."""
        runtime = self._runtime
        entry = PendingCell(runtime.pending.cell_lock)
        runtime.begin(entry, timeout, cancel)
        handle = runtime.handle(entry) if timeout is not None else Completion(entry, refuse_cancel)
        route_id = entry.route_id
        if route_id not in runtime.pending:
            return handle, None
        return handle, route_id

    def run_for(self, route_id: int, work: Coroutine[Any, Any, object]) -> None:
        """Run `work` on the I/O loop; its result (or typed error) ends entry `route_id`."""
        runtime = self._runtime
        try:
            running = self.spawn(work)
        except RuntimeError:  # the loop has stopped
            work.close()
            runtime.pending.finish(route_id, exc=shutting_down())
            return

        def finished(done: Future[object]) -> None:
            found = outcome(done)
            if isinstance(found, BaseException):
                runtime.pending.finish(route_id, exc=found)
            else:
                runtime.pending.finish(route_id, found)

        running.add_done_callback(finished)

    def one_way(self, work: Coroutine[Any, Any, object]) -> Completion[None]:
        """A one-way send whose work runs on the I/O loop (see `begin_call`)."""
        handle, route_id = self.begin_call(None, None)
        if route_id is None:
            work.close()
        else:
            self.run_for(route_id, work)
        return handle

    def call(
        self,
        work: Callable[[float, CancellationToken | None], Awaitable[object]],
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A call whose work runs on the I/O loop, under one pending entry: its deadline
        and its caller's cancellation race with the work's result."""
        handle, route_id = self.begin_call(timeout, cancel)
        if route_id is not None:
            due = self._runtime.timers._now() + timeout

            async def run() -> object:
                return await work(due, cancel)

            self.run_for(route_id, run())
        return handle

    def stop_task(self, stop: threading.Event, wake: asyncio.Event) -> None:
        """Tell a polling task of the I/O loop to end (from any thread)."""
        stop.set()
        with contextlib.suppress(RuntimeError):  # the loop has stopped already
            self._runtime.io.loop.call_soon_threadsafe(wake.set)


def outcome(done: Future[Any]) -> object:
    """A finished future's value, or the typed error that ends the call."""
    if done.cancelled():
        return shutting_down("the call finished")
    exc = done.exception()
    if exc is None:
        return done.result()
    return failure(exc)


def failure(found: object) -> BaseException | None:
    """The typed error `found` stands for (None: it is a value): a `ZlinkError` as it
    is, an asyncio cancellation as the call's deadline, anything else an internal
    failure of the global objects."""
    if found is None or not isinstance(found, BaseException):
        return None
    if isinstance(found, ZlinkError):
        return found
    if isinstance(found, asyncio.CancelledError):
        return DeadlineExceededError("no result within the call's deadline")
    return internal_failure("the global objects", found)


def wait(completion: Completion[T]) -> asyncio.Future[T]:
    """An asyncio future on the running loop that settles with `completion`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(done: Completion[T]) -> None:
        if future.done():
            return
        exc = done._cell._exc
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(done._cell._value)  # type: ignore[arg-type]

    def done(result: Completion[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop stopped: nobody waits
            loop.call_soon_threadsafe(settle, result)

    completion._add_inline(done)
    return future


async def quietly(work: Awaitable[object]) -> None:
    """A clean-up write: its failure is logged, never the call's error."""
    try:
        await work
    except Exception as exc:
        log.warning("mesh: a clean-up write failed: %s", exc)


async def pause(seconds: float, wake: asyncio.Event) -> None:
    """Sleep on the I/O loop for `seconds`, or until `wake` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), seconds)
