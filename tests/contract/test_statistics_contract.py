"""Every queue, lane and pool offers a frozen statistics snapshot (style guide, "Names").

`Host.statistics()` carries one for the CPU worker pool (`cpu`), the I/O executor (`io`),
the timer service (`timers`) and publish admission (`publisher`), beside the application
pool's and the dispatcher's. Each scenario fixes what the snapshot must show by holding
work on a `threading.Event` or a `CompletionSource`, never by sleeping; every bounded
wait asserts its result.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancellationToken,
    CompletionSource,
    CpuPoolStatistics,
    Host,
    HostStatistics,
    IoStatistics,
    ManualClock,
    PublisherStatistics,
    Spot,
    SpotConfig,
    SpotContext,
    TimerStatistics,
    TimerTick,
    handler,
)
from zlink_actors.testing import WAIT, HeldJob, wait_until

MakeHost = Callable[..., Host]


# -- shape -----------------------------------------------------------------------------


SNAPSHOTS = {
    "cpu": CpuPoolStatistics,
    "io": IoStatistics,
    "timers": TimerStatistics,
    "publisher": PublisherStatistics,
}


@pytest.mark.parametrize("field", sorted(SNAPSHOTS))
def test_each_host_statistics_part_is_a_frozen_slotted_dataclass(
    make_host: MakeHost, field: str
) -> None:
    stats = make_host().statistics()
    part = getattr(stats, field)

    assert type(part) is SNAPSHOTS[field]
    assert dataclasses.is_dataclass(part)
    assert not hasattr(part, "__dict__")  # slotted
    name = dataclasses.fields(part)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(part, name, 99)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(stats, field, part)


def test_the_new_host_statistics_fields_come_last_and_have_defaults() -> None:
    fields = dataclasses.fields(HostStatistics)
    assert [f.name for f in fields[-5:]] == ["cpu", "io", "timers", "publisher", "mesh"]
    for f in fields[-5:-1]:
        assert f.default is not dataclasses.MISSING
        assert all(getattr(f.default, g.name) == 0 for g in dataclasses.fields(f.default))
    # Without a mesh there is no mesh section.
    assert fields[-1].default is None


def test_a_fresh_host_reports_idle_pools_with_their_configured_sizes(
    make_host: MakeHost,
) -> None:
    stats = make_host(cpu_workers=3, publish_concurrency=7).statistics()

    assert stats.cpu == CpuPoolStatistics(threads=0, busy_threads=0, queued_jobs=0, max_threads=3)
    assert stats.io == IoStatistics(running=0, tasks=0, threads=0)  # started on first use
    assert stats.timers == TimerStatistics(pending=0, entries=0, delays=0, threads=0)
    assert stats.publisher == PublisherStatistics(running=0, waiting=0, concurrency=7)


# -- the CPU pool ----------------------------------------------------------------------


def test_a_cpu_job_held_on_an_event_is_busy_and_the_one_behind_it_is_queued(
    make_host: MakeHost, held: Callable[..., HeldJob[object]]
) -> None:
    host = make_host(cpu_workers=1)
    first, second = held("first"), held("second")
    running = host.run_cpu_worker(first).submit()
    assert first.started.wait(WAIT)

    busy = host.statistics().cpu
    assert busy == CpuPoolStatistics(threads=1, busy_threads=1, queued_jobs=0, max_threads=1)

    queued = host.run_cpu_worker(second).submit()
    behind = host.statistics().cpu
    assert behind == CpuPoolStatistics(threads=1, busy_threads=1, queued_jobs=1, max_threads=1)
    assert not second.started.is_set()

    first.release()
    second.release()
    assert running.result(WAIT) == "first"
    assert queued.result(WAIT) == "second"
    # The thread counts itself idle when it comes back for the next job.
    assert wait_until(lambda: host.statistics().cpu.busy_threads == 0)
    assert host.statistics().cpu.queued_jobs == 0


# -- the I/O executor ------------------------------------------------------------------


def test_an_io_worker_awaiting_a_completion_is_running_until_it_ends(
    make_host: MakeHost,
) -> None:
    host = make_host()
    gate: CompletionSource[str] = CompletionSource()
    started = threading.Event()

    async def wait_for_gate(token: CancellationToken) -> str:
        started.set()
        return await gate.completion

    call = host.run_io_worker(wait_for_gate).submit()
    assert started.wait(WAIT)

    assert host.statistics().io == IoStatistics(running=1, tasks=1, threads=1)

    gate.set_result("done")
    assert call.result(WAIT) == "done"
    assert wait_until(lambda: host.statistics().io.running == 0)
    assert host.statistics().io == IoStatistics(running=0, tasks=0, threads=1)


# -- the timer service -----------------------------------------------------------------


class Ticking(Spot):
    @handler
    def control(self, ctx: SpotContext, msg: str) -> bool:
        if msg == "start":
            ctx.timers.start("t", 1.0, self.tick)
            return True
        return ctx.timers.cancel("t")

    def tick(self, ctx: SpotContext, tick: TimerTick) -> None:
        pass


def test_a_started_timer_is_pending_and_a_cancelled_one_is_not(make_host: MakeHost) -> None:
    clock = ManualClock()
    host = make_host(spots=[Ticking], clock=clock)
    host.spots.get_or_create("t", Ticking).submit_sync()

    assert host.request_to_spot("t", "start").submit_sync() is True
    started = host.statistics().timers
    assert started.pending >= 1
    assert started.entries >= started.pending
    assert started.threads == 1

    assert host.request_to_spot("t", "stop").submit_sync() is True
    stopped = host.statistics().timers
    assert stopped.pending == started.pending - 1  # the timer, nothing else, went


def test_a_request_with_a_timeout_of_its_own_has_a_delay_fifo(make_host: MakeHost) -> None:
    clock = ManualClock()
    host = make_host(spots=[Ticking], clock=clock)
    host.spots.get_or_create("t", Ticking).submit_sync()

    assert host.request_to_spot("t", "stop").timeout(2.5).submit_sync() is False

    timers = host.statistics().timers
    assert timers.delays == 1  # one FIFO for the 2.5 s delay (its answered deadline is
    # dropped from it whenever the timer thread next looks)
    assert timers.entries >= timers.pending


# -- publish admission -----------------------------------------------------------------


class Hold:
    """Blocks the `Jammed` Spot's handler until released."""


class News:
    """A published payload."""


def test_a_publish_waiting_for_the_only_slot_is_counted_waiting(make_host: MakeHost) -> None:
    entered, release = threading.Event(), threading.Event()

    class Jammed(Spot):
        def configure(self, cfg: SpotConfig) -> None:
            cfg.subscribe("jam", "x")

        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            entered.set()
            assert release.wait(WAIT)

        @handler
        def news(self, ctx: SpotContext, msg: News) -> None:
            pass

    host = make_host(spots=[Jammed], publish_concurrency=1, application_lane_items=1)
    host.spots.get_or_create("jammed", Jammed).submit_sync()
    # The held handler fills the one-item lane: a delivery to it must wait for space.
    host.send_to_spot("jammed", Hold()).submit_sync()
    assert entered.wait(WAIT)
    try:
        assert host.publish("jam", "x", News()).submit().result(WAIT) is None  # committed
        waiting = host.publish("jam", "x", News()).submit()
        assert not waiting.done()

        stats = host.statistics()
        assert stats.publisher == PublisherStatistics(running=1, waiting=1, concurrency=1)
        # The committed publish delivers on the I/O loop (its task starts just after the
        # commit): a task, but no I/O worker.
        assert wait_until(lambda: host.statistics().io.tasks == 1)
        assert host.statistics().io.running == 0
    finally:
        release.set()
    assert waiting.result(WAIT) is None
    assert wait_until(lambda: host.statistics().publisher.running == 0)
    assert host.statistics().publisher == PublisherStatistics(running=0, waiting=0, concurrency=1)
