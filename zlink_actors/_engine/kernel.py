"""The runtime pieces one Host owns, and the rules every call shares.

`Runtime` is internal; `Host` is its public face. It owns the timer service, the pending
table, the CPU pool and the I/O executor, and it knows the lifecycle state that decides
admission.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .._calls.call import failed
from .._core.cancellation import CancellationToken
from .._core.clock import Clock, SystemClock, TimerService
from .._core.completion import Completion, _Cell
from .._core.dispatcher import get_dispatcher
from .._core.errors import (
    InvalidOperationError,
    ShuttingDownError,
    UnavailableError,
    shutting_down,
)
from .._core.pending import DeadlineScan, PendingEntry, PendingTable, settle
from .._core.pool import AppPool
from .._core.state import HostState, ShutdownOutcome, ShutdownResult
from .._core.workers import CpuPool, IoExecutor
from .lifecycle import close_activation, drop_record
from .multicast import Publisher
from .objects import CloseReason
from .spot_timers import TimerSet

if TYPE_CHECKING:
    from .lifecycle import Attempt
    from .registry import Activation

__all__ = ["Runtime"]

log = logging.getLogger("zlink_actors")

#: Seconds teardown may take after the shutdown deadline (see `Runtime._drain`).
TEARDOWN_GRACE = 1.0
#: Seconds a thread that is not in user code gets to end once told to.
JOIN_FLOOR = 0.25


class Runtime:
    """Timer, pending table, worker pools and lifecycle of one Host."""

    def __init__(
        self,
        *,
        clock: Clock,
        cpu_workers: int,
        app_threads: int,
        lane_items: int,
        default_request_timeout: float,
        name: str,
        publish_concurrency: int = 64,
    ) -> None:
        from .._calls.create import ActorManager, SpotManager
        from .registry import Engine

        self.clock = clock
        self.name = name
        self.default_request_timeout = default_request_timeout
        self.timers = TimerService(clock, name=f"{name}-timer")
        #: The Host runs on real time: a thread blocked in `submit_sync()` can keep its
        #: own deadline with a timed wait (an injected clock needs the timer thread).
        self.real_time = type(clock) is SystemClock
        self.pending = PendingTable()
        #: The deadline of every request on `default_request_timeout`.
        self.deadlines = DeadlineScan(self.pending, self.timers)
        self.cpu_pool = CpuPool(cpu_workers, name=f"{name}-cpu")
        self.io = IoExecutor(name=f"{name}-io")
        self.engine = Engine(self)
        self.pool = AppPool(
            app_threads,
            self.engine.run_record,
            f"{name}-app",
            lane_items,
            fail_record=self.engine.fail_record,
        )
        # Records a batch took but could not run before their mailbox closed.
        self.pool.drop_record = self._drop_record  # type: ignore[method-assign]
        self.publisher = Publisher(self, publish_concurrency)
        self.spot_manager = SpotManager(self)
        self.actor_manager = ActorManager(self)
        #: get-or-create attempts in progress: (kind, id) -> (result cell, type).
        self.creating: dict[tuple[str, str], Attempt] = {}
        #: Serialises cold activations of Instance Spots (their factory runs once).
        self.activation_lock = threading.RLock()
        self.state = HostState.PREPARING
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._result: ShutdownResult | None = None

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
        return failed(ShuttingDownError("the Host is shutting down and admits no new calls"))

    def begin(
        self, cell: _Cell[Any], timeout: float | None, cancel: CancellationToken | None
    ) -> PendingEntry:
        """Register a pending entry for `cell` before anything is submitted (SC §10),
        with its caller's cancellation and its deadline; all race for the entry."""
        entry = PendingEntry(cell)
        if self.register(entry, cancel) and timeout is not None:
            self.arm_deadline(entry, timeout)
        return entry

    def register(self, entry: PendingEntry, cancel: CancellationToken | None) -> bool:
        """Put `entry` in the pending table and hook its caller's cancellation.

        False if shutdown sealed admission meanwhile: the entry is then already completed
        with `ShuttingDownError` (if the shutdown sweep got it first, that finds nothing).
        """
        route = self.pending.register(entry)
        if self.state is not HostState.SERVING:
            self.pending.finish(route, exc=shutting_down())
            return False
        if cancel is not None:
            entry.registration = cancel._register_internal(entry.cancel)
        return True

    def arm_deadline(self, entry: PendingEntry, timeout: float) -> None:
        """Arm `entry`'s deadline; dropped at once if another path already won."""
        timer = self.timers.call_after(timeout, entry.expire)
        entry.timer = timer
        if entry.route_id not in self.pending:
            timer.cancel()

    def handle(self, entry: PendingEntry) -> Completion[Any]:
        """The caller's handle: cancelling it races the entry's other terminal paths."""
        return Completion(entry.cell, entry.cancel)

    def timers_for(self, act: Activation) -> TimerSet:
        """The timer set of `act`, created on first use."""
        timers = act.timers
        if timers is None:
            with self._lock:
                timers = act.timers
                if timers is None:
                    timers = act.timers = TimerSet(self, act)
        return timers

    def _drop_record(self, box: Any, rec: Any) -> None:
        exc = (
            UnavailableError("the object closed before this record ran")
            if self.state is HostState.SERVING
            else ShuttingDownError("the Host stopped before this record ran")
        )
        drop_record(self, box, rec, exc)

    def log_dropped_callback(self, fn: Any) -> None:
        log.warning("done-callback %r dropped: its owner closed before it could run", fn)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self.state is HostState.PREPARING:
                self.pool.start()
                self.state = HostState.SERVING
            elif self.state is not HostState.SERVING:
                raise InvalidOperationError(f"a {self.state.value} Host cannot be started again")

    def shutdown(self, deadline: float) -> ShutdownResult:
        with self._lock:
            if self.state in (HostState.DRAINING, HostState.STOPPED):
                first = False
            else:
                first = True
                self.state = HostState.DRAINING
        if not first:
            self._stopped.wait()
            assert self._result is not None
            return self._result
        try:
            self._result = self._drain(deadline)
        finally:
            self.state = HostState.STOPPED
            self._stopped.set()
        return self._result

    def _drain(self, seconds: float) -> ShutdownResult:
        end = time.monotonic() + seconds

        def left() -> float:
            # Clamped: float rounding must not take a `TIMEOUT_MAX` deadline past it.
            return min(max(0.0, end - time.monotonic()), threading.TIMEOUT_MAX)

        pool = self.pool
        activations = self.engine.all_activations()
        # Sealed: waiting one-way sends and publishes end now, timers arm no new ticks.
        pool.seal()
        self.publisher.seal()
        for act in activations:
            pool.fail_waiters(act.box, shutting_down())
            if act.timers is not None:
                act.timers.cancel_all()
        # Committed publish transactions finish delivering (CS §4).
        clean = self.publisher.wait_idle(left())
        # Accepted work runs until the deadline; then every pending call completes once.
        clean = pool.wait_quiet(left()) and clean
        clean = self.pending.wait_empty(left()) and clean
        # Creations accepted before the seal finish first: what they make is closed too.
        clean = self.engine.wait_no_attempts(left()) and clean
        live = self.engine.all_activations()
        # Then every Spot and Actor hears `on_closing(HOST_SHUTDOWN)` under its gate.
        closings = [
            close_activation(self, act, CloseReason.HOST_SHUTDOWN)
            for act in live
            if act.kind != "channel" and act is not self.engine.entry and not act.closed
        ]
        for closing in closings:
            if closing is not None and not closing.wait(left()):
                clean = False
                break
        forced = self.pending.pop_all()
        for entry in forced:
            settle(entry, exc=ShuttingDownError("the Host stopped before the call finished"))
        # What is still queued never runs: requests were just completed; one-way records
        # are counted in `dropped_records` (a batch a stuck thread holds is counted when
        # that thread returns and finds its mailbox closed).
        stopped = ShuttingDownError("the Host stopped before this record ran")
        for act in {id(a): a for a in (*activations, *live)}.values():
            act.closed = True
            for box in (act.box, *act.timer_boxes()):
                for rec in pool.close_box(box):
                    drop_record(self, box, rec, stopped)
        # Teardown (running the callbacks of what was just completed, joining threads
        # that are not stuck in user code) gets a short grace even after the deadline.
        end = max(end, time.monotonic() + TEARDOWN_GRACE)
        dispatcher = get_dispatcher()
        drained = dispatcher.drain(left())
        callbacks_pending = 0 if drained else dispatcher.statistics().queued
        # Threads not in user code end at once when told; give their joins a floor.
        abandoned = pool.stop(max(left(), JOIN_FLOOR))
        joined = self.io.stop(max(left(), JOIN_FLOOR))
        joined = self.cpu_pool.stop(max(left(), JOIN_FLOOR)) and joined and not abandoned
        self.timers.stop(max(left(), JOIN_FLOOR))
        abandoned += self.cpu_pool.running_threads() + self.io.running_threads()
        outcome = (
            ShutdownOutcome.STOPPED
            if clean and drained and joined and not forced
            else ShutdownOutcome.FORCE_STOPPED
        )
        return ShutdownResult(
            outcome=outcome,
            forced_operations=len(forced),
            abandoned_threads=abandoned,
            callbacks_pending=callbacks_pending,
        )
