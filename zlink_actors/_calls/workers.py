"""`run_cpu_worker` and `run_io_worker`: calls that offload work to the Host's workers.

Every worker call is a pending operation: its result, its deadline, its caller's
cancellation and shutdown race for one terminal. A callable that finishes after losing
that race makes no second terminal; its result is dropped. The threads themselves are
`_core/workers.py`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._core.cancellation import CancellationSource, CancellationToken
from .._core.completion import Completion
from .._core.errors import internal_failure, shutting_down
from .._core.pending import PendingCell
from .._core.state import HostState
from .._engine.kernel import Runtime
from .call import YieldableCall

__all__ = ["CpuWorkerCall", "IoWorkerCall"]

T = TypeVar("T")


class _CpuJob:
    __slots__ = ("args", "entry", "fn", "runtime")

    def __init__(
        self, runtime: Runtime, entry: PendingCell, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self.runtime = runtime
        self.entry = entry
        self.fn = fn
        self.args = args

    def run(self) -> None:
        entry = self.entry
        # A job whose deadline passed, or that was cancelled while queued, never starts.
        if not entry.claim():
            return
        try:
            value = self.fn(*self.args)
        except BaseException as exc:
            _fail(self.runtime, entry.route_id, self.fn, exc)
        else:
            self.runtime.pending.finish(entry.route_id, value)


def _fail(runtime: Runtime, route: int, fn: object, exc: BaseException) -> None:
    # SC §3: the work itself failed; whatever it raised is the cause.
    runtime.pending.finish(route, exc=internal_failure(f"worker {fn!r}", exc))


def _is_async(fn: object) -> bool:
    """True for a coroutine function, a `functools.partial` of one, or an object whose
    `__call__` is one: calling it only makes a coroutine."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isroutine(fn) or isinstance(fn, type):
        return False
    return inspect.iscoroutinefunction(type(fn).__call__)


class CpuWorkerCall(YieldableCall[T]):
    """`run_cpu_worker(fn, *args)`: run `fn(*args)` on the CPU pool.

    Created by `Host.run_cpu_worker` (or a context); not constructed by users.

    Raises:
        TypeError: `fn` is not callable, or is async (a coroutine function, a partial of
            one, an object with an `async def __call__`): that is `run_io_worker`'s.
    """

    __slots__ = ("_args", "_fn")

    def __init__(self, runtime: Runtime, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        if not callable(fn):
            raise TypeError(f"run_cpu_worker() takes a callable, got {type(fn).__name__}")
        if _is_async(fn):
            # On a CPU thread it would only make a coroutine, never run it.
            raise TypeError(
                f"run_cpu_worker() runs a plain callable on a thread; {fn!r} is async: "
                "use run_io_worker(async_fn) for coroutines"
            )
        super().__init__(runtime)
        self._fn = fn
        self._args = args

    def _start(self, cancel: CancellationToken | None) -> Completion[T]:
        runtime = self._runtime
        early = self._refused(cancel)
        if early is not None:
            return early
        entry = PendingCell(runtime.pending.cell_lock)
        runtime.begin(entry, self._timeout, cancel)
        if not runtime.cpu_pool.submit(_CpuJob(runtime, entry, self._fn, self._args)):
            runtime.fail_entry(entry, shutting_down())
        return runtime.handle(entry)


class IoWorkerCall(YieldableCall[T]):
    """`run_io_worker(async_fn)`: run `await async_fn(token)` on the I/O executor.

    `token` is a `CancellationToken` cancelled when the caller cancels or the deadline
    passes. Created by `Host.run_io_worker` (or a context); not constructed by users.

    Raises:
        TypeError: `fn` is not a coroutine function, a `functools.partial` of one, or an
            object whose `__call__` is `async def` (a plain callable is
            `run_cpu_worker`'s).
    """

    __slots__ = ("_fn",)

    def __init__(self, runtime: Runtime, fn: Callable[[CancellationToken], Awaitable[T]]) -> None:
        if not callable(fn):
            raise TypeError(f"run_io_worker() takes an async callable, got {type(fn).__name__}")
        if not _is_async(fn):
            raise TypeError(
                f"run_io_worker() awaits a coroutine function (async def); {fn!r} is not "
                "one: use run_cpu_worker(fn, *args) for a plain callable"
            )
        super().__init__(runtime)
        self._fn = fn

    def _start(self, cancel: CancellationToken | None) -> Completion[T]:
        runtime = self._runtime
        early = self._refused(cancel)
        if early is not None:
            return early
        entry = PendingCell(runtime.pending.cell_lock)
        # Tells the coroutine its caller is gone (cancel, deadline, shutdown): cancelled
        # when the call ends without its result (`PendingCell.settle`).
        worker_token = entry.source = CancellationSource()
        runtime.begin(entry, self._timeout, cancel)
        fn = self._fn

        def start() -> None:
            if not entry.claim():
                return
            runtime.io.create_task(
                lambda: _drive(runtime, entry, fn, worker_token.token), worker=True
            )

        if not runtime.io.call_soon(start):
            runtime.fail_entry(entry, shutting_down())
        return runtime.handle(entry)


async def _drive(
    runtime: Runtime,
    entry: PendingCell,
    fn: Callable[[CancellationToken], Awaitable[Any]],
    token: CancellationToken,
) -> None:
    route = entry.route_id
    try:
        value = await fn(token)
    except asyncio.CancelledError:
        if runtime.state is HostState.SERVING:
            # The coroutine cancelled itself: that is a failure of the work, not a stop.
            _fail(runtime, route, fn, asyncio.CancelledError())
        else:
            runtime.pending.finish(route, exc=shutting_down("the worker finished"))
        raise
    except BaseException as exc:
        _fail(runtime, route, fn, exc)
    else:
        runtime.pending.finish(route, value)
