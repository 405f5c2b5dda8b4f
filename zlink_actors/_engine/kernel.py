"""The runtime kernel of one Host: its lifecycle state, admission and the pending protocol.

`Runtime` is internal; `Host` is its public face, and `_host.py` builds every part it
holds. It decides whether a call is admitted (`admission_failure`), registers a call's
pending entry before anything is submitted and arms its deadline (`begin`), and carries
the Host's state from PREPARING to STOPPED (the shutdown sequence itself is
`shutdown.py`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .._core.cancellation import CancellationToken
from .._core.clock import Clock, SystemClock, TimerService
from .._core.completion import Completion, failed
from .._core.errors import InvalidOperationError, shutting_down
from .._core.pending import DeadlineScan, PendingCell, PendingTable, begin
from .._core.pool import AppPool, Runner
from .._core.state import HostState, ShutdownReason, ShutdownResult
from .._core.workers import CpuPool, IoExecutor
from .multicast import Publisher
from .registry import Engine
from .remote import GlobalObjects, RemoteRoutes
from .services import Services

__all__ = ["Runtime"]

log = logging.getLogger("zlink_actors")


class Runtime:
    """State, admission and the pending protocol of one Host, and the parts it runs on."""

    def __init__(
        self,
        *,
        name: str,
        clock: Clock,
        timers: TimerService,
        default_request_timeout: float,
        pool: AppPool,
        engine: Engine,
        cpu_pool: CpuPool,
        io: IoExecutor,
        publisher: Publisher,
        services: Services,
        remote: RemoteRoutes,
    ) -> None:
        self.name = name
        self.clock = clock
        self.timers = timers
        self.default_request_timeout = default_request_timeout
        #: The Host runs on real time: a thread blocked in `submit_sync()` can keep its
        #: own deadline with a timed wait (an injected clock needs the timer thread).
        self.real_time = type(clock) is SystemClock
        self.pending = PendingTable()
        #: The deadline of every request on `default_request_timeout`.
        self.deadlines = DeadlineScan(self.pending, timers)
        self.pool = pool
        self.engine = engine
        self.cpu_pool = cpu_pool
        self.io = io
        self.publisher = publisher
        #: What the Host was configured with, by key (`services.py`).
        self.services = services
        #: Where calls to targets this Host does not hold go (`remote.py`).
        self.remote = remote
        #: Global Spots and Actors (a Host with `location=`); None: they are local.
        self.objects: GlobalObjects | None = None
        #: The owner lease's admission deadline (local monotonic seconds; None: this Host
        #: holds no owner lease, `location=` is not set). Past it the Host is `fenced`.
        #: Set only through `fence_until` (the mesh's lease keeper, at each renewal:
        #: `mesh/lease.py`); the check itself reads the clock, so it holds even when
        #: the keeper's loop stalls. Read as an attribute on the hot paths.
        self.admission_deadline: float | None = None
        #: Tier work a shutdown runs once every object closed, before the threads stop
        #: (the I/O loop still runs); each gets the seconds the shutdown has left.
        self.finishers: list[Callable[[float], None]] = []
        #: `Host(check_codec=True)`: `check(value, into)` returns `value` as it would
        #: cross the wire (or raises `ProtocolError`); None: local values are not checked.
        self.codec_check: Callable[[object, object], object] | None = None
        #: Why the Host shuts down (`ShutdownResult.reason`): set before the shutdown
        #: begins by the tier that starts it on its own (a lost owner lease).
        self.shutdown_reason = ShutdownReason.REQUESTED
        self.state = HostState.PREPARING
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._result: ShutdownResult | None = None

    def serving(self) -> bool:
        """The Host admits new work (SERVING): not yet, or no longer, otherwise."""
        return self.state is HostState.SERVING

    @property
    def fenced(self) -> bool:
        """The owner lease's admission deadline has passed: the Spots and Actors this
        Host owns admit no new messages, timer ticks, publishes or creations."""
        deadline = self.admission_deadline
        return deadline is not None and time.monotonic() >= deadline

    def fence_until(self, deadline: float | None) -> None:
        """Set the owner lease's admission deadline (local monotonic seconds): past it
        the Host is `fenced`; `-math.inf` fences it now (no lease, or one that does not
        admit); None: it holds no lease and is never fenced. The one writer of
        `admission_deadline` (tests/test_layering.py refuses any other)."""
        self.admission_deadline = deadline

    # -- admission ---------------------------------------------------------------------

    def admission_failure(self) -> Completion[Any] | None:
        """None while SERVING; a `ShuttingDownError` completion once sealed.

        Raises `InvalidOperationError` before `start()`: a usage error, not an outcome.
        """
        state = self.state
        if state is HostState.SERVING:
            return None
        if state is HostState.PREPARING:
            raise InvalidOperationError("the Host is not started; call host.start() first")
        return failed(shutting_down())

    def begin(
        self, entry: PendingCell, timeout: float | None, cancel: CancellationToken | None
    ) -> bool:
        """The pending protocol (`pending.begin`) for `entry`, whose work its caller
        starts next: registered before anything is submitted (SC §10), with its caller's
        cancellation and its deadline (`timeout` None: none); all race for the entry.
        False if shutdown sealed admission meanwhile: the entry is then already completed
        with `ShuttingDownError`."""
        due = math.inf if timeout is None else self.timers._now() + timeout
        return begin(self, entry, timeout, due, cancel)

    def handle(self, entry: PendingCell) -> Completion[Any]:
        """The caller's handle: cancelling it races the entry's other terminal paths."""
        return Completion(entry, entry.cancel)

    def fail_entry(self, entry: PendingCell, exc: BaseException) -> None:
        """End a registered entry with `exc` (if no other path won already)."""
        self.pending.finish(entry.route_id, exc=exc)

    def log_dropped_callback(self, fn: Callable[..., object]) -> None:
        log.warning("done-callback %r dropped: its owner closed before it could run", fn)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, runner: Runner) -> None:
        """PREPARING -> SERVING: the pool starts running records through `runner`."""
        with self._lock:
            if self.state is HostState.PREPARING:
                self.pool.start(runner)
                self.state = HostState.SERVING
            elif self.state is not HostState.SERVING:
                raise InvalidOperationError(f"a {self.state.value} Host cannot be started again")

    def begin_shutdown(self) -> bool:
        """SERVING (or PREPARING) -> DRAINING; False if a shutdown already began."""
        with self._lock:
            if self.state in (HostState.DRAINING, HostState.STOPPED):
                return False
            self.state = HostState.DRAINING
            return True

    def end_shutdown(self, result: ShutdownResult | None) -> None:
        """-> STOPPED; callers waiting in `shutdown_result` get `result`."""
        self._result = result
        self.state = HostState.STOPPED
        self._stopped.set()

    def shutdown_result(self) -> ShutdownResult:
        """Wait for the shutdown another caller runs, and return its result."""
        self._stopped.wait()
        if self._result is None:
            raise shutting_down("its shutdown finished")
        return self._result
