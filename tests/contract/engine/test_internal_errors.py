"""An internal error in the runtime's own work around a record never wedges its owner
(docs/turns.md, "When the runtime itself fails").

The post-turn work of a record (a reply, a timer's re-arming, the failure log of a one-way
handler) is the framework's code. If it raises, the error is logged and counted in
`HostStatistics.internal_errors`, and the gate moves on: the owner keeps serving and
shutdown still stops cleanly, instead of the gate staying held forever.

The faults are planted by replacing one internal function with one that raises: the
only way to make correct framework code fail on purpose.
"""

import logging
import threading

import pytest

from zlink_actors import (
    InternalFailureError,
    ManualClock,
    ShutdownOutcome,
    Spot,
    SpotContext,
    TimerTick,
    handler,
)
from zlink_actors._core import pending as _pending
from zlink_actors._core import pool as _pool
from zlink_actors._engine import runner as _runner
from zlink_actors._engine import spot_timers as _spot_timers
from zlink_actors.testing import WAIT, HostHarness, advance_and_settle, wait_until

from ._support import Note, Ping, Pong


class _Planted(RuntimeError):
    pass


def _raise(*args: object) -> None:
    raise _Planted("planted internal fault")


def test_a_failing_timer_rearm_leaves_the_spot_serving(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ticked = threading.Event()

    class Ticking(Spot):
        @handler
        def start(self, ctx: SpotContext, msg: Note) -> None:
            ctx.timers.start("t", 1.0, self.tick)

        def tick(self, ctx: SpotContext, tick: TimerTick) -> None:
            ticked.set()

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    clock = ManualClock()
    host = harness.host(spots=[Ticking], clock=clock)
    host.spots.get_or_create("s", Ticking).submit_sync()
    host.request_to_spot("s", Note()).submit_sync()
    monkeypatch.setattr(_spot_timers._Timer, "tick_done", _raise)

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        advance_and_settle(host, clock, 1.0)
        assert ticked.wait(WAIT)
        assert host.request_to_spot("s", Ping(3)).timeout(60).submit_sync() == Pong(3)
    assert host.statistics().internal_errors == 1
    assert any(r.exc_info and r.exc_info[0] is _Planted for r in caplog.records)
    assert host.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED


def test_a_failing_post_turn_step_of_a_one_way_message_leaves_the_spot_serving(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    handled = threading.Event()

    class Room(Spot):
        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            handled.set()
            raise ValueError("the handler's own failure")

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(spots=[Room])
    host.spots.get_or_create("r", Room).submit_sync()
    monkeypatch.setattr(_runner.RecordRunner, "_message_done", _raise)

    for _ in range(3):
        host.send_to_spot("r", Note()).submit_sync()
    assert handled.wait(WAIT)
    assert host.request_to_spot("r", Ping(1)).submit_sync() == Pong(1)
    assert host.statistics().internal_errors == 3
    assert host.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED


def test_a_failing_reply_step_ends_the_request_with_internal_failure(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Room(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(spots=[Room], default_request_timeout=3600)
    host.spots.get_or_create("r", Room).submit_sync()
    # A reply of the wrong type takes the general reply path, which now fails.
    monkeypatch.setattr(_pending, "_reply", _raise)

    call = host.request_to_spot("r", Ping(1), reply=str).submit()  # a wrong reply type
    with pytest.raises(InternalFailureError):
        call.result(WAIT)
    assert host.statistics().internal_errors == 1
    assert host.statistics().pending_calls == 0
    assert host.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED


def test_a_fault_in_the_batch_loop_loses_no_taken_record(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered = threading.Event()
    latch = harness.latch()

    class Room(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Note) -> None:
            entered.set()
            assert latch.wait(WAIT)

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(spots=[Room], default_request_timeout=3600, application_lane_items=2)
    host.spots.get_or_create("r", Room).submit_sync()
    host.send_to_spot("r", Note()).submit_sync()
    assert entered.wait(WAIT)
    queued = host.request_to_spot("r", Ping(1)).submit()  # taken with the next run
    real_trim = _pool.trim
    fired: list[bool] = []

    def trim_once(box: object) -> None:
        if not fired:
            fired.append(True)
            raise _Planted("planted fault in the batch loop")
        real_trim(box)  # type: ignore[arg-type]

    monkeypatch.setattr(_pool, "trim", trim_once)
    latch.set()

    assert queued.result(WAIT) == Pong(1)
    assert host.statistics().internal_errors == 1
    # No lane slot leaked: with the Spot busy again (one slot), one more request fits.
    entered.clear()
    latch.clear()
    host.send_to_spot("r", Note()).submit_sync()
    assert entered.wait(WAIT)
    fits = host.request_to_spot("r", Ping(2)).submit()
    latch.set()
    assert fits.result(WAIT) == Pong(2)
    assert host.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED


@pytest.mark.parametrize("held", [False, True], ids=["handed-over", "batched"])
def test_a_fault_in_the_fault_handling_neither_reruns_a_record_nor_leaks_its_lane_slot(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch, held: bool
) -> None:
    """Found by review: a fault raised while the pool handled a record's own internal
    error put that record back to run again (batched), or kept its lane slot forever
    (the record handed straight to an idle thread)."""
    runs: dict[int, int] = {}
    entered = threading.Event()
    latch = harness.latch()

    class Room(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Ping) -> Pong:
            entered.set()
            assert latch.wait(WAIT)
            return Pong(msg.n)

        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            runs[msg.n] = runs.get(msg.n, 0) + 1
            # Its failure takes the post-turn step planted below.
            raise ValueError("the handler's own failure")

    host = harness.host(spots=[Room], application_lane_items=8)
    host.spots.get_or_create("r", Room).submit_sync()
    box = host._runtime.engine.spots["r"].box
    holding = None
    if held:  # the notes queue behind a running turn and are taken as one batch
        holding = host.request_to_spot("r", Ping(0)).submit()
        assert entered.wait(WAIT)
    real_internal_error = _pool.AppPool._internal_error
    faults: list[bool] = []

    def internal_error_once(self: _pool.AppPool, *args: object) -> bool:
        if not faults:
            faults.append(True)
            raise _Planted("planted fault in the fault handling")
        return real_internal_error(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(_runner.RecordRunner, "_message_done", _raise)
    monkeypatch.setattr(_pool.AppPool, "_internal_error", internal_error_once)
    for n in range(1, 4):
        host.send_to_spot("r", Note(n)).submit_sync()
    latch.set()
    if holding is not None:
        assert holding.result(WAIT) == Pong(0)

    assert host.request_to_spot("r", Ping(9)).submit_sync() == Pong(9)
    assert runs == {1: 1, 2: 1, 3: 1}
    assert faults == [True]
    # Every lane slot comes back (the reply's own slot right after its turn ends).
    assert wait_until(lambda: box.app_reserved == 0)
    assert host.statistics().internal_errors >= 2
    assert host.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED
