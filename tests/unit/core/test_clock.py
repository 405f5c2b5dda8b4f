"""Clocks, deadlines and the timer service, driven by a `ManualClock`.

Digest §3 / SC §9: one deadline heap per Host serves request timeouts, worker deadlines and
timers; the clock is injectable. No test here sleeps for timing: time moves only by
`ManualClock.advance`, and a "probe" timer due *now* shows the timer thread has handled
everything due so far.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator

import pytest
from _support import probe

from zlink_actors import Clock, Deadline, ManualClock, SystemClock
from zlink_actors._core.clock import TimerService
from zlink_actors.testing import WAIT, wait_until


class Recorder:
    """A timer callback that records the clock time it ran at."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.fired_at: list[float] = []
        self.threads: list[int] = []
        self.fired = threading.Event()

    def __call__(self) -> None:
        self.fired_at.append(self._clock.monotonic())
        self.threads.append(threading.get_ident())
        self.fired.set()


# -- ManualClock, SystemClock, Deadline -----------------------------------------------


def test_manual_clock_starts_where_told_and_moves_only_when_advanced() -> None:
    clock = ManualClock(start=12.5)

    assert clock.monotonic() == 12.5
    assert clock.monotonic() == 12.5
    clock.advance(0.5)
    clock.advance(0)
    assert clock.monotonic() == 13.0


@pytest.mark.parametrize(("seconds", "message"), [(-0.001, ">= 0"), (math.nan, "NaN")])
def test_manual_clock_never_moves_backwards(seconds: float, message: str) -> None:
    clock = ManualClock(start=1.0)

    with pytest.raises(ValueError, match=message):
        clock.advance(seconds)
    assert clock.monotonic() == 1.0


def test_clocks_share_the_clock_interface() -> None:
    assert isinstance(ManualClock(), Clock)
    assert isinstance(SystemClock(), Clock)


def test_system_clock_never_goes_back() -> None:
    clock = SystemClock()
    readings = [clock.monotonic() for _ in range(1000)]

    assert readings == sorted(readings)


def test_deadline_counts_down_on_its_clock(clock: ManualClock) -> None:
    deadline = Deadline.after(2.0, clock)

    assert deadline.finite
    assert deadline.remaining() == 2.0
    assert not deadline.expired()
    clock.advance(1.5)
    assert deadline.remaining() == 0.5
    assert not deadline.expired()
    clock.advance(0.5)
    assert deadline.expired()
    clock.advance(10)
    assert deadline.remaining() == 0.0


def test_deadline_without_seconds_never_expires(clock: ManualClock) -> None:
    deadline = Deadline.after(None, clock)

    clock.advance(1e9)
    assert not deadline.finite
    assert deadline.remaining() == math.inf
    assert not deadline.expired()


def test_deadline_is_absolute_on_the_clock(clock: ManualClock) -> None:
    clock.advance(100.0)

    assert Deadline.after(5.0, clock).at == 105.0


# -- firing ----------------------------------------------------------------------------


def test_timer_fires_once_the_clock_reaches_its_time(
    service: TimerService, clock: ManualClock
) -> None:
    recorder = Recorder(clock)
    handle = service.call_at(5.0, recorder)

    clock.advance(5.0)

    assert recorder.fired.wait(WAIT)
    assert recorder.fired_at == [5.0]
    assert not handle.active


def test_timer_never_fires_before_its_time(service: TimerService, clock: ManualClock) -> None:
    recorder = Recorder(clock)
    handle = service.call_at(5.0, recorder)

    clock.advance(4.5)
    probe(service, clock)
    assert recorder.fired_at == []
    assert handle.active
    assert service.pending() == 1

    clock.advance(0.5)
    assert recorder.fired.wait(WAIT)
    assert recorder.fired_at == [5.0]


def test_call_after_is_relative_to_the_clocks_current_time(
    service: TimerService, clock: ManualClock
) -> None:
    clock.advance(100.0)
    recorder = Recorder(clock)

    handle = service.call_after(5.0, recorder)
    assert handle.when == 105.0
    clock.advance(4.0)
    probe(service, clock)
    assert recorder.fired_at == []
    clock.advance(1.0)

    assert recorder.fired.wait(WAIT)
    assert recorder.fired_at == [105.0]


def test_timer_already_due_fires_without_the_clock_moving(
    service: TimerService, clock: ManualClock
) -> None:
    clock.advance(10.0)
    recorder = Recorder(clock)

    service.call_at(3.0, recorder)

    assert recorder.fired.wait(WAIT)
    assert recorder.fired_at == [10.0]


def test_due_timers_fire_in_time_order_and_ties_in_scheduling_order(
    service: TimerService, clock: ManualClock
) -> None:
    fired: list[str] = []
    schedule = [(3.0, "c"), (1.0, "a1"), (2.0, "b"), (1.0, "a2"), (3.0, "d")]
    for when, name in schedule:
        service.call_at(when, lambda n=name: fired.append(n))

    clock.advance(3.0)
    probe(service, clock)

    assert fired == ["a1", "a2", "b", "c", "d"]


def test_advancing_in_steps_fires_each_timer_once_in_order(
    service: TimerService, clock: ManualClock
) -> None:
    fired: list[int] = []
    for when in range(100, 0, -1):
        service.call_at(when / 10, lambda w=when: fired.append(w))

    for _ in range(25):
        clock.advance(0.4)
        probe(service, clock)
        assert fired == sorted(fired)
        assert all(w / 10 <= clock.monotonic() for w in fired)

    assert fired == list(range(1, 101))
    assert service.pending() == 0


def test_timer_callbacks_run_on_one_timer_thread(service: TimerService, clock: ManualClock) -> None:
    recorder = Recorder(clock)
    for when in (1.0, 2.0, 3.0):
        service.call_at(when, recorder)

    for _ in range(3):
        clock.advance(1.0)
        probe(service, clock)

    assert len(recorder.threads) == 3
    assert len(set(recorder.threads)) == 1
    assert recorder.threads[0] != threading.get_ident()


def test_timer_callback_may_schedule_another_timer(
    service: TimerService, clock: ManualClock
) -> None:
    second = Recorder(clock)

    def first() -> None:
        service.call_at(clock.monotonic(), second)

    service.call_at(1.0, first)
    clock.advance(1.0)

    assert second.fired.wait(WAIT)
    assert second.fired_at == [1.0]


def test_one_clock_drives_several_timer_services(clock: ManualClock) -> None:
    services = [TimerService(clock, name=f"test-timer-{i}") for i in range(3)]
    recorders = [Recorder(clock) for _ in services]
    try:
        for timers, recorder in zip(services, recorders, strict=True):
            timers.call_at(2.0, recorder)
        clock.advance(2.0)

        for recorder in recorders:
            assert recorder.fired.wait(WAIT)
            assert recorder.fired_at == [2.0]
    finally:
        for timers in services:
            assert timers.stop(WAIT)


# -- cancelling and stopping -----------------------------------------------------------


def test_cancelled_timer_never_fires(service: TimerService, clock: ManualClock) -> None:
    recorder = Recorder(clock)
    handle = service.call_at(1.0, recorder)

    handle.cancel()
    assert not handle.active
    clock.advance(2.0)
    probe(service, clock)

    assert recorder.fired_at == []
    assert service.pending() == 0


def test_cancelling_one_timer_leaves_the_others(service: TimerService, clock: ManualClock) -> None:
    fired: list[str] = []
    keep = service.call_at(1.0, lambda: fired.append("kept"))
    drop = service.call_at(1.0, lambda: fired.append("dropped"))

    drop.cancel()
    clock.advance(1.0)
    probe(service, clock)

    assert fired == ["kept"]
    assert not keep.active


def test_cancel_after_firing_is_a_no_op(service: TimerService, clock: ManualClock) -> None:
    recorder = Recorder(clock)
    handle = service.call_at(1.0, recorder)
    clock.advance(1.0)
    assert recorder.fired.wait(WAIT)

    handle.cancel()
    handle.cancel()

    assert recorder.fired_at == [1.0]
    assert not handle.active


def test_raising_timer_callback_is_logged_and_later_timers_still_fire(
    service: TimerService, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    error = RuntimeError("timer failure")

    def raising() -> None:
        raise error

    after = Recorder(clock)
    service.call_at(1.0, raising)
    service.call_at(1.0, after)

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        clock.advance(1.0)
        assert after.fired.wait(WAIT)

    assert any(
        r.name == "zlink_actors" and r.exc_info and r.exc_info[1] is error for r in caplog.records
    )


def test_stop_discards_timers_not_yet_due_and_ends_the_thread(clock: ManualClock) -> None:
    timers = TimerService(clock, name="test-timer-stop")
    started = Recorder(clock)
    timers.call_at(0.0, started)  # starts the timer thread
    assert started.fired.wait(WAIT)
    later = Recorder(clock)
    timers.call_at(10.0, later)

    assert timers.stop(WAIT) is True
    clock.advance(10.0)

    # The thread has ended, so nothing can fire any more.
    assert later.fired_at == []
    assert timers.pending() == 0


def test_call_at_after_stop_schedules_nothing(clock: ManualClock) -> None:
    timers = TimerService(clock, name="test-timer-stopped")
    assert timers.stop(WAIT)
    recorder = Recorder(clock)

    handle = timers.call_at(0.0, recorder)

    assert not handle.active
    assert timers.pending() == 0
    assert recorder.fired_at == []


def test_stop_of_a_service_that_never_started_returns_true(clock: ManualClock) -> None:
    assert TimerService(clock, name="test-timer-idle").stop(WAIT) is True


def test_many_timers_each_fire_exactly_once_at_or_after_their_time(
    service: TimerService, clock: ManualClock
) -> None:
    count = 1000
    fired: dict[int, list[float]] = {index: [] for index in range(count)}
    for index in range(count):
        when = (index * 7919 % count) / 100  # a scrambled order over 0..9.99 s
        service.call_at(when, lambda i=index, w=when: fired[i].append(clock.monotonic() - w))

    clock.advance(5.0)
    probe(service, clock)
    clock.advance(5.0)
    probe(service, clock)

    assert all(len(lateness) == 1 for lateness in fired.values())
    assert all(lateness[0] >= 0 for lateness in fired.values())


# -- real time: cancelled deadlines are swept, long deadlines are safe --------------------


@pytest.fixture
def real_service() -> Iterator[TimerService]:
    timers = TimerService(SystemClock(), name="test-real-timer")
    timers.SWEEP_SECONDS = 0.01  # type: ignore[misc]
    yield timers
    assert timers.stop(WAIT)


def _queued(service: TimerService, delay: float) -> int:
    fifo = service._fifos.get(delay)
    return 0 if fifo is None else len(fifo)


def test_cancelled_deadlines_are_dropped_long_before_they_are_due(
    real_service: TimerService,
) -> None:
    # The request-deadline pattern: a long delay, almost always cancelled by the reply.
    first = real_service.call_after(60.0, lambda: None)
    looked = threading.Event()
    real_service.call_at(time.monotonic(), looked.set)
    assert looked.wait(WAIT)  # the thread has seen `first` live, due in a minute
    handles = [real_service.call_after(60.0, lambda: None) for _ in range(500)]
    for handle in [first, *handles]:
        handle.cancel()

    assert wait_until(lambda: _queued(real_service, 60.0) == 0)
    assert real_service.pending() == 0


def test_a_quiet_timer_thread_is_woken_to_sweep_new_deadlines(
    real_service: TimerService,
) -> None:
    first = real_service.call_after(60.0, lambda: None)
    first.cancel()
    # Every FIFO is empty now: the thread may sleep for a whole delay (60 s) unless the
    # next append wakes it.
    assert wait_until(lambda: _queued(real_service, 60.0) == 0 and real_service._quiet)

    handles = [real_service.call_after(60.0, lambda: None) for _ in range(100)]
    for handle in handles:
        handle.cancel()

    assert wait_until(lambda: _queued(real_service, 60.0) == 0, within=2.0)


def test_a_live_deadline_behind_cancelled_ones_still_fires_on_time(
    real_service: TimerService,
) -> None:
    fired = threading.Event()
    for _ in range(100):
        real_service.call_after(0.05, lambda: None).cancel()
    started = time.monotonic()
    real_service.call_after(0.05, fired.set)

    assert fired.wait(WAIT)
    assert time.monotonic() - started >= 0.05
    assert wait_until(lambda: _queued(real_service, 0.05) == 0)


def test_a_deadline_beyond_the_longest_wait_does_not_stop_the_timer_thread(
    real_service: TimerService,
) -> None:
    looked = threading.Event()
    real_service.call_at(time.monotonic() + 1e10, lambda: None)  # beyond TIMEOUT_MAX
    real_service.call_at(time.monotonic(), looked.set)
    assert looked.wait(WAIT)  # the thread's next sleep is computed from that deadline

    fired = threading.Event()
    real_service.call_at(time.monotonic() + 0.01, fired.set)
    assert fired.wait(WAIT)


def test_more_distinct_delays_than_fifos_fall_back_to_the_heap(
    service: TimerService, clock: ManualClock
) -> None:
    # Found by review: the 17th distinct delay re-took the service's own lock and hung.
    recorders = []
    for i in range(TimerService.MAX_FIFOS + 4):
        recorder = Recorder(clock)
        service.call_after(1.0 + i, recorder)
        recorders.append(recorder)
    clock.advance(1.0 + TimerService.MAX_FIFOS + 4)
    for recorder in recorders:
        assert recorder.fired.wait(WAIT)
