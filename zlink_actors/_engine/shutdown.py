"""The shutdown sequence of one Host (`Host.shutdown()`; docs/completion.md).

Seal admission, let accepted work run until the deadline, close every object under its
gate (`on_closing(HOST_SHUTDOWN)`), complete what is still pending once with
`ShuttingDownError`, drop what is still queued, drain the completion dispatcher and join
the Host's threads. Teardown after the deadline gets `TEARDOWN_GRACE` more.
"""

from __future__ import annotations

import logging
import threading
import time

from .._core.dispatcher import get_dispatcher
from .._core.errors import shutting_down
from .._core.pending import settle
from .._core.state import ShutdownOutcome, ShutdownResult
from .kernel import Runtime
from .lifecycle import close_activation, drop_record
from .objects import CloseReason, ObjectKind
from .registry import Activation

__all__ = ["JOIN_FLOOR", "TEARDOWN_GRACE", "shutdown"]

log = logging.getLogger("zlink_actors")

#: Seconds teardown may take after the shutdown deadline.
TEARDOWN_GRACE = 1.0
#: Seconds a thread that is not in user code gets to end once told to.
JOIN_FLOOR = 0.25
#: The kinds that hear `on_closing` (handlers of channels and of the node do not).
_CLOSABLE = (ObjectKind.SPOT, ObjectKind.ACTOR)


def shutdown(runtime: Runtime, seconds: float) -> ShutdownResult:
    """Stop `runtime` within `seconds` (+ `TEARDOWN_GRACE`); idempotent: a second caller
    waits for the first one's result."""
    if not runtime.begin_shutdown():
        return runtime.shutdown_result()
    try:
        result = _Drain(runtime, seconds).run()
    except BaseException:
        runtime.end_shutdown(None)
        raise
    runtime.end_shutdown(result)
    return result


class _Drain:
    """One shutdown, step by step; `left()` is what remains of its deadline."""

    def __init__(self, runtime: Runtime, seconds: float) -> None:
        self.runtime = runtime
        self.end = time.monotonic() + seconds
        self.clean = True

    def left(self) -> float:
        # Clamped: float rounding must not take a `TIMEOUT_MAX` deadline past it.
        return min(max(0.0, self.end - time.monotonic()), threading.TIMEOUT_MAX)

    def run(self) -> ShutdownResult:
        before = self.seal()
        self.wait_for_accepted_work()
        live = self.close_objects()
        forced = self.complete_pending()
        self.drop_queued([*before, *live])
        # Teardown (running the callbacks of what was just completed, joining threads
        # that are not stuck in user code) gets a short grace even after the deadline.
        self.end = max(self.end, time.monotonic() + TEARDOWN_GRACE)
        for finish in self.runtime.finishers:  # tiers: every object has closed
            try:
                finish(self.left())
            except Exception:
                log.exception("a shutdown finisher failed")
                self.clean = False
        dispatcher = get_dispatcher()
        drained = dispatcher.drain(self.left())
        callbacks_pending = 0 if drained else dispatcher.statistics().queued
        abandoned, joined = self.stop_threads()
        outcome = (
            ShutdownOutcome.STOPPED
            if self.clean and drained and joined and not forced
            else ShutdownOutcome.FORCE_STOPPED
        )
        return ShutdownResult(
            outcome=outcome,
            forced_operations=forced,
            abandoned_threads=abandoned,
            callbacks_pending=callbacks_pending,
            reason=self.runtime.shutdown_reason,
        )

    def seal(self) -> list[Activation]:
        """No new waits: waiting one-way sends and publishes end now, timers arm no new
        ticks. Returns the objects live at the seal."""
        runtime = self.runtime
        pool = runtime.pool
        activations = runtime.engine.all_activations()
        pool.seal()
        runtime.publisher.seal()
        for act in activations:
            pool.fail_waiters(act.box, shutting_down())
            if act.timers is not None:
                act.timers.cancel_all()
        return activations

    def wait_for_accepted_work(self) -> None:
        runtime = self.runtime
        # Committed publish transactions finish delivering (CS §4).
        self.clean = runtime.publisher.wait_idle(self.left()) and self.clean
        # Accepted work runs until the deadline; then every pending call completes once.
        self.clean = runtime.pool.wait_quiet(self.left()) and self.clean
        self.clean = runtime.pending.wait_empty(self.left()) and self.clean
        # Creations accepted before the seal finish first: what they make is closed too.
        self.clean = runtime.engine.wait_no_attempts(self.left()) and self.clean

    def close_objects(self) -> list[Activation]:
        """Every Spot and Actor hears `on_closing(HOST_SHUTDOWN)` under its gate; returns
        the objects live now (a fresh snapshot: creations finished meanwhile)."""
        runtime = self.runtime
        engine = runtime.engine
        live = engine.all_activations()
        closings = [
            close_activation(runtime, act, CloseReason.HOST_SHUTDOWN)
            for act in live
            if act.kind in _CLOSABLE and act is not engine.entry and not act.closed
        ]
        for closing in closings:
            if closing is not None and not closing.wait(self.left()):
                self.clean = False
                break
        return live

    def complete_pending(self) -> int:
        """Every call still pending completes once with `ShuttingDownError`."""
        forced = self.runtime.pending.pop_all()
        for entry in forced:
            settle(entry, exc=shutting_down("the call finished"))
        return len(forced)

    def drop_queued(self, activations: list[Activation]) -> None:
        """What is still queued never runs: requests were just completed; one-way records
        are counted in `dropped_records` (a batch a stuck thread holds is counted when
        that thread returns and finds its mailbox closed)."""
        runtime = self.runtime
        stopped = shutting_down("this record ran")
        for act in {id(a): a for a in activations}.values():
            act.closed = True
            for box in (act.box, *act.timer_boxes()):
                for rec in runtime.pool.close_box(box):
                    drop_record(runtime, box, rec, stopped)

    def stop_threads(self) -> tuple[int, bool]:
        """Join the Host's threads (those not in user code end at once when told; their
        joins get a floor). Returns (threads abandoned, all joined)."""
        runtime = self.runtime
        in_pool = runtime.pool.stop(max(self.left(), JOIN_FLOOR))
        joined = runtime.io.stop(max(self.left(), JOIN_FLOOR))
        joined = runtime.cpu_pool.stop(max(self.left(), JOIN_FLOOR)) and joined and not in_pool
        runtime.timers.stop(max(self.left(), JOIN_FLOOR))
        workers = runtime.cpu_pool.running_threads() + runtime.io.running_threads()
        return in_pool + workers, joined
