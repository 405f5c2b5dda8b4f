"""Worker threads: a bounded CPU pool and a one-loop asyncio I/O executor (SC §3).

A CPU slot is held only while the callable runs. Jobs wait for a slot in submission
order. An I/O worker's coroutine runs on the I/O executor's event loop and holds no CPU
slot while it waits, so far more I/O calls than CPU threads can be pending at once. The
calls that use them (`run_cpu_worker`, `run_io_worker`) are in `_calls/workers.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .context import RuntimeContext, runtime_var

__all__ = [
    "CpuJob",
    "CpuPool",
    "CpuPoolStatistics",
    "IoExecutor",
    "IoStatistics",
]

log = logging.getLogger("zlink_actors")

_CPU_CONTEXT = RuntimeContext("CPU worker")
_IO_CONTEXT = RuntimeContext("I/O worker")


class CpuJob(Protocol):
    """What the CPU pool runs: `run()` on a pool thread, once."""

    def run(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CpuPoolStatistics:
    """A snapshot of a Host's CPU worker pool (`HostStatistics.cpu`).

    Attributes:
        threads: pool threads started (on demand, up to `max_threads`; they stay until
            the Host stops).
        busy_threads: threads running a job now (a `run_cpu_worker` callable, or the
            check that drops a job whose call already ended).
        queued_jobs: jobs waiting for a free thread, in submission order. A job whose
            call ended meanwhile (deadline, cancellation) is still counted until its
            turn comes; it is then dropped unrun.
        max_threads: the pool's size, `Host(cpu_workers=...)`.
    """

    threads: int
    busy_threads: int
    queued_jobs: int
    max_threads: int


class CpuPool:
    """A bounded pool of threads started on demand; jobs start in submission order."""

    def __init__(self, max_threads: int, name: str = "zlink-cpu") -> None:
        self.max_threads = max_threads
        self._name = name
        self._jobs: deque[CpuJob] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []
        self._idle = 0
        #: Threads between taking a job and coming back for the next one.
        self._busy = 0
        self._stopped = False

    def submit(self, job: CpuJob) -> bool:
        """Queue `job`; False once the pool was stopped."""
        with self._cond:
            if self._stopped:
                return False
            self._jobs.append(job)
            if self._idle:
                self._cond.notify()
            # Idle threads already woken may not have taken their job yet: grow while
            # more jobs wait than idle threads can take.
            if len(self._jobs) > self._idle and len(self._threads) < self.max_threads:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return True

    def running_threads(self) -> int:
        """Threads the pool has started and not yet ended."""
        return sum(1 for t in self._threads if t.is_alive())

    def statistics(self) -> CpuPoolStatistics:
        """Threads, busy threads and queued jobs now (takes the pool's lock briefly)."""
        with self._cond:
            return CpuPoolStatistics(
                threads=len(self._threads),
                busy_threads=self._busy,
                queued_jobs=len(self._jobs),
                max_threads=self.max_threads,
            )

    def stop(self, timeout: float) -> bool:
        """End every thread; a thread still in user code after `timeout` is abandoned."""
        with self._cond:
            self._stopped = True
            self._jobs.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def _work(self) -> None:
        ctx = contextvars.copy_context()
        ctx.run(runtime_var.set, _CPU_CONTEXT)
        ran = False
        while True:
            with self._cond:
                if ran:  # the job before: counted here, in the acquisition made anyway
                    self._busy -= 1
                while not self._jobs and not self._stopped:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if self._stopped:
                    return
                job = self._jobs.popleft()
                self._busy += 1
                ran = True
            try:
                ctx.run(job.run)
            except BaseException:
                log.exception("CPU worker job failed")


@dataclass(frozen=True, slots=True)
class IoStatistics:
    """A snapshot of a Host's I/O executor (`HostStatistics.io`).

    Attributes:
        running: `run_io_worker` coroutines started on the loop and not yet ended
            (awaiting counts: a worker waiting for I/O holds no thread). A worker's
            task is counted until it ends, a moment after its call completed.
        tasks: every task on the loop now: those workers, plus the deliveries of
            committed publishes (see `PublisherStatistics.running`).
        threads: 1 while the loop's thread is alive (it starts on first use), else 0.
    """

    running: int
    tasks: int
    threads: int


class IoExecutor:
    """One asyncio event loop on its own thread, started on first use."""

    def __init__(self, name: str = "zlink-io") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Worker tasks among `_tasks`. Both change on the loop thread only, so they need
        #: no lock; other threads only read them (`statistics`).
        self._workers = 0
        self._stopped = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The executor's loop (started if needed)."""
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(ready,), name=self._name, daemon=True
                )
                self._thread.start()
                ready.wait()
            assert self._loop is not None
            return self._loop

    def call_soon(self, fn: Callable[..., object], *args: object) -> bool:
        """Run `fn(*args)` on the loop thread; False once stopped."""
        with self._lock:
            if self._stopped:
                return False
        loop = self.loop
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    def create_task(self, make: Callable[[], Awaitable[Any]], *, worker: bool = False) -> None:
        """On the loop thread: start `make()` in a fresh I/O-worker context.

        `worker`: the task runs a `run_io_worker` coroutine (counted in `running`).
        """
        ctx = contextvars.Context()
        ctx.run(runtime_var.set, _IO_CONTEXT)
        loop = asyncio.get_running_loop()
        task = loop.create_task(_as_coroutine(make), context=ctx)
        self._tasks.add(task)
        if worker:
            self._workers += 1
            task.add_done_callback(self._worker_done)
        else:
            task.add_done_callback(self._tasks.discard)

    def _worker_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._workers -= 1

    def statistics(self) -> IoStatistics:
        """Running workers and tasks now; takes no lock (the loop thread is their only
        writer)."""
        return IoStatistics(
            running=self._workers, tasks=len(self._tasks), threads=self.running_threads()
        )

    def stop(self, timeout: float) -> bool:
        """Cancel what still runs, stop the loop and join its thread."""
        with self._lock:
            self._stopped = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return True
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(self._cancel_all_and_stop)
        thread.join(timeout)
        return not thread.is_alive()

    def running_threads(self) -> int:
        """1 while the loop thread is alive, else 0."""
        thread = self._thread
        return 1 if thread is not None and thread.is_alive() else 0

    def _cancel_all_and_stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        loop = asyncio.get_running_loop()
        # Let cancelled tasks unwind for one pass before stopping.
        loop.call_soon(loop.stop)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()


async def _as_coroutine(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()
