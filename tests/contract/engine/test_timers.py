"""Spot timers (digest §3 "Timers").

A tick is a record under the owner's gate. A key never overlaps itself: the next tick is
armed only when the previous one finished, from the clock at that moment. Restarting a
key bumps its generation (queued ticks of the old one are skipped); cancelling stops
ticks not yet started and never interrupts a running one. Tick fields: `delivery_index`
contiguous, `scheduled_index` never decreasing, `skipped_ticks` = gap - 1.

Time is a `ManualClock`. `advance_and_settle` moves it and waits until the Host's timer
heap fired everything due; a `Probe` to the Spot then waits until those ticks ran.
"""

import queue
import threading
from collections.abc import Callable

import msgspec

from zlink_actors import (
    Host,
    ManualClock,
    OverrunPolicy,
    Spot,
    SpotContext,
    SpotMode,
    TimerTick,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness, advance_and_settle

from ._support import NEGATIVE_WAIT, Hold, Probe, flush_ticks

TickCallback = Callable[[SpotContext, TimerTick], None]


class StartTimer(msgspec.Struct, frozen=True):
    pass


class CancelTimer(msgspec.Struct, frozen=True):
    pass


def _fields(tick: TimerTick) -> tuple[int, int, int]:
    return tick.delivery_index, tick.scheduled_index, tick.skipped_ticks


class Clocked:
    """A Spot class built per test with one timer "t" (interval 1 s) and a blocking hold.

    `on_hold` runs inside `Hold` after the latch opens, still in that turn.
    """

    def __init__(
        self,
        harness: HostHarness,
        on_tick: TickCallback,
        policy: OverrunPolicy = OverrunPolicy.SKIP_LATE_TICKS,
        max_catch_up: int = 1,
        mode: SpotMode = SpotMode.SPOT_WIDE,
        on_hold: Callable[[SpotContext], object] | None = None,
        clock: ManualClock | None = None,
    ) -> None:
        self.clock = clock if clock is not None else ManualClock()
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.busy = False
        self.hold_results: list[object] = []
        clocked = self

        class Room(Spot):
            @handler
            def start(self, ctx: SpotContext, msg: StartTimer) -> None:
                ctx.timers.start("t", 1.0, on_tick, policy, max_catch_up=max_catch_up)

            @handler
            def cancel(self, ctx: SpotContext, msg: CancelTimer) -> bool:
                return ctx.timers.cancel("t")

            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> None:
                clocked.busy = True
                clocked.entered.set()
                clocked.latch.wait(WAIT)
                if on_hold is not None:
                    clocked.hold_results.append(on_hold(ctx))
                clocked.busy = False

            @handler
            def probe(self, ctx: SpotContext, msg: Probe) -> None:
                pass

        Room.mode = mode
        self.host: Host = harness.host(spots=[Room], clock=self.clock, app_threads=2)
        self.host.spots.get_or_create("room", Room).submit_sync()
        self.host.request_to_spot("room", StartTimer()).submit_sync()

    def sync(self) -> None:
        """Return once every record queued on the Spot's own gate so far has run."""
        self.host.request_to_spot("room", Probe()).submit_sync()

    def settle(self, seconds: float) -> None:
        advance_and_settle(self.host, self.clock, seconds)

    def flush(self) -> None:
        flush_ticks(self.host, self.clock, "room")


def test_due_tick_is_a_record_that_waits_for_the_spotwide_gate(harness: HostHarness) -> None:
    ticks: queue.Queue[tuple[TimerTick, bool]] = queue.Queue()
    clocked: Clocked

    def on_tick(ctx: SpotContext, tick: TimerTick) -> None:
        ticks.put((tick, clocked.busy))

    clocked = Clocked(harness, on_tick)
    clocked.host.send_to_spot("room", Hold()).submit_sync()
    assert clocked.entered.wait(WAIT)

    clocked.settle(1.0)
    assert clocked.host.statistics().queued_records == 1  # fired, and queued behind Hold
    assert ticks.empty()

    clocked.latch.set()
    tick, busy_during_tick = ticks.get(timeout=WAIT)
    assert _fields(tick) == (1, 1, 0)
    assert busy_during_tick is False


def test_restarting_a_key_skips_its_stale_queued_tick(harness: HostHarness) -> None:
    ticks: queue.Queue[tuple[str, TimerTick]] = queue.Queue()

    def old(ctx: SpotContext, tick: TimerTick) -> None:
        ticks.put(("old", tick))

    def new(ctx: SpotContext, tick: TimerTick) -> None:
        ticks.put(("new", tick))

    clocked = Clocked(harness, old, on_hold=lambda ctx: ctx.timers.start("t", 1.0, new))
    clocked.host.send_to_spot("room", Hold()).submit_sync()
    assert clocked.entered.wait(WAIT)
    clocked.settle(1.0)
    assert clocked.host.statistics().queued_records == 1  # the old timer's tick

    clocked.latch.set()  # Hold restarts "t" at t=1, ahead of the queued old tick
    clocked.sync()
    assert ticks.empty()

    clocked.clock.advance(1.0)
    label, tick = ticks.get(timeout=WAIT)
    assert label == "new"
    assert _fields(tick) == (1, 1, 0)


def test_cancelling_a_key_stops_its_queued_and_future_ticks(harness: HostHarness) -> None:
    ticks: queue.Queue[TimerTick] = queue.Queue()
    clocked = Clocked(
        harness, lambda ctx, tick: ticks.put(tick), on_hold=lambda ctx: ctx.timers.cancel("t")
    )
    clocked.host.send_to_spot("room", Hold()).submit_sync()
    assert clocked.entered.wait(WAIT)
    clocked.settle(1.0)
    assert clocked.host.statistics().queued_records == 1

    clocked.latch.set()
    clocked.sync()
    clocked.settle(5.0)
    clocked.sync()

    assert ticks.empty()
    assert clocked.hold_results == [True]
    assert clocked.host.request_to_spot("room", CancelTimer(), reply=bool).submit_sync() is False


def test_cancelling_a_running_tick_lets_it_finish_and_arms_no_next_tick(
    harness: HostHarness,
) -> None:
    latch = harness.latch()
    entered = threading.Event()
    finished = threading.Event()
    another_tick = threading.Event()
    ticks: list[TimerTick] = []

    def on_tick(ctx: SpotContext, tick: TimerTick) -> None:
        ticks.append(tick)
        if tick.delivery_index > 1:
            another_tick.set()
            return
        entered.set()
        latch.wait(WAIT)
        finished.set()

    # PerActor: the timer has a gate of its own, so the Spot can cancel it mid-tick.
    clocked = Clocked(harness, on_tick, mode=SpotMode.PER_ACTOR)
    clocked.clock.advance(1.0)
    assert entered.wait(WAIT)

    cancel = clocked.host.request_to_spot("room", CancelTimer(), reply=bool)
    assert cancel.submit_sync() is True
    latch.set()
    assert finished.wait(WAIT)

    clocked.settle(5.0)
    assert not another_tick.wait(NEGATIVE_WAIT)
    assert [_fields(t) for t in ticks] == [(1, 1, 0)]


def test_a_key_never_overlaps_itself_and_arms_its_next_tick_only_when_done(
    harness: HostHarness,
) -> None:
    latch = harness.latch()
    entered = threading.Event()
    ticks: queue.Queue[TimerTick] = queue.Queue()

    def on_tick(ctx: SpotContext, tick: TimerTick) -> None:
        if tick.delivery_index == 1:
            entered.set()
            latch.wait(WAIT)
        ticks.put(tick)

    clocked = Clocked(harness, on_tick)
    clocked.clock.advance(1.0)
    assert entered.wait(WAIT)

    clocked.settle(3.0)  # t=4: ticks 2, 3 and 4 fell due while tick 1 runs
    assert clocked.host.statistics().queued_records == 0

    latch.set()
    assert _fields(ticks.get(timeout=WAIT)) == (1, 1, 0)
    clocked.sync()
    clocked.clock.advance(1.0)  # t=5
    assert _fields(ticks.get(timeout=WAIT)) == (2, 5, 3)


def _overrunning(
    clock: ManualClock, overrun: float
) -> tuple[TickCallback, "queue.Queue[TimerTick]"]:
    """A tick callback whose first tick takes `overrun` seconds of `clock` time."""
    ticks: queue.Queue[TimerTick] = queue.Queue()

    def on_tick(ctx: SpotContext, tick: TimerTick) -> None:
        if tick.delivery_index == 1:
            clock.advance(overrun)
        ticks.put(tick)

    return on_tick, ticks


def test_on_time_ticks_have_contiguous_indexes_and_skip_nothing(harness: HostHarness) -> None:
    ticks: queue.Queue[TimerTick] = queue.Queue()
    clocked = Clocked(harness, lambda ctx, tick: ticks.put(tick))

    seen = []
    for _ in range(3):
        clocked.clock.advance(1.0)
        seen.append(_fields(ticks.get(timeout=WAIT)))
        clocked.sync()  # re-armed before the clock moves again

    assert seen == [(1, 1, 0), (2, 2, 0), (3, 3, 0)]


def test_skip_late_ticks_delivers_the_next_future_tick_and_counts_the_skipped(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    on_tick, ticks = _overrunning(clock, 2.5)
    clocked = Clocked(harness, on_tick, OverrunPolicy.SKIP_LATE_TICKS, clock=clock)

    clocked.clock.advance(1.0)  # tick 1 runs until t=3.5
    assert _fields(ticks.get(timeout=WAIT)) == (1, 1, 0)
    clocked.flush()
    assert ticks.empty()  # the late ticks 2 and 3 are not delivered

    clocked.clock.advance(0.5)  # t=4
    assert _fields(ticks.get(timeout=WAIT)) == (2, 4, 2)


def test_catch_up_bounded_delivers_the_newest_late_tick_at_once_by_default(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    on_tick, ticks = _overrunning(clock, 2.5)
    clocked = Clocked(harness, on_tick, OverrunPolicy.CATCH_UP_BOUNDED, clock=clock)

    clocked.clock.advance(1.0)  # tick 1 runs until t=3.5; ticks 2 and 3 are late
    assert _fields(ticks.get(timeout=WAIT)) == (1, 1, 0)
    # Tick 3 is delivered without the clock moving; tick 2 is skipped.
    assert _fields(ticks.get(timeout=WAIT)) == (2, 3, 1)
    clocked.flush()
    assert ticks.empty()  # one catch-up tick, no more

    clocked.clock.advance(0.5)  # t=4: back on the grid
    assert _fields(ticks.get(timeout=WAIT)) == (3, 4, 0)


def test_catch_up_bounded_delivers_up_to_max_catch_up_late_ticks_back_to_back(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    on_tick, ticks = _overrunning(clock, 3.5)
    clocked = Clocked(harness, on_tick, OverrunPolicy.CATCH_UP_BOUNDED, max_catch_up=2, clock=clock)

    clocked.clock.advance(1.0)  # tick 1 runs until t=4.5; ticks 2, 3 and 4 are late
    assert _fields(ticks.get(timeout=WAIT)) == (1, 1, 0)
    clocked.flush()  # every catch-up tick runs; the clock stays short of t=5

    caught_up = [_fields(ticks.get_nowait()) for _ in range(ticks.qsize())]
    assert caught_up == [(2, 3, 1), (3, 4, 0)]  # the newest two; tick 2 skipped

    clocked.clock.advance(0.5)  # t=5: back on the grid
    assert _fields(ticks.get(timeout=WAIT)) == (4, 5, 0)


def test_delay_next_tick_comes_one_interval_after_the_late_tick_finished(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    on_tick, ticks = _overrunning(clock, 2.5)
    clocked = Clocked(harness, on_tick, OverrunPolicy.DELAY_NEXT_TICK, clock=clock)

    clocked.clock.advance(1.0)  # tick 1 runs until t=3.5
    assert _fields(ticks.get(timeout=WAIT)) == (1, 1, 0)
    clocked.sync()
    clocked.settle(0.9)  # t=4.4: a grid tick (t=4) would have fired by now
    clocked.sync()
    assert ticks.empty()

    clocked.clock.advance(0.1)  # t=4.5: one interval after tick 1 finished
    assert _fields(ticks.get(timeout=WAIT)) == (2, 2, 0)
