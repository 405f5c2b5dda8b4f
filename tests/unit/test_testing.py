"""The public test kit `zlink_actors.testing` (docs/testing.md): each helper keeps the
promise its docstring makes."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

import zlink_actors
from zlink_actors import (
    CloseReason,
    DeadlineExceededError,
    Host,
    HostState,
    InvalidOperationError,
    ManualClock,
    ShutdownOutcome,
    Spot,
    SpotContext,
    TimerTick,
    completion_dispatcher,
    handler,
)
from zlink_actors import testing as kit
from zlink_actors.testing import (
    WAIT,
    DispatcherBlocker,
    HeldJob,
    HostHarness,
    advance_and_settle,
    finishes,
    wait_until,
)

PACKAGE = Path(zlink_actors.__file__).parent


class Hold(msgspec.Struct, frozen=True):
    pass


class Start(msgspec.Struct, frozen=True):
    interval: float


class Count(msgspec.Struct, frozen=True):
    pass


# -- the module --------------------------------------------------------------------------


def test_all_is_sorted_and_every_name_is_bound() -> None:
    assert kit.__all__ == sorted(kit.__all__)
    assert [name for name in kit.__all__ if not hasattr(kit, name)] == []


def test_every_public_class_and_function_of_the_kit_is_exported() -> None:
    public = {
        name
        for name, obj in vars(kit).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "") == kit.__name__
    }

    assert public - set(kit.__all__) == set()


def test_manual_clock_is_the_frameworks_own() -> None:
    assert kit.ManualClock is zlink_actors.ManualClock


def test_wait_is_a_positive_number_of_seconds() -> None:
    assert isinstance(WAIT, float)
    assert WAIT > 0


def test_no_module_of_the_framework_imports_the_kit() -> None:
    importers = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "testing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
                module = node.module or ""
                if (
                    module.endswith("testing")
                    or (node.level > 0 and not module and "testing" in names)
                    or (module == "zlink_actors" and "testing" in names)
                ):
                    importers.append(path.name)
            elif isinstance(node, ast.Import) and any(
                alias.name == "zlink_actors.testing" for alias in node.names
            ):
                importers.append(path.name)

    assert importers == []


def test_importing_the_framework_leaves_the_kit_unloaded() -> None:
    code = "import sys, zlink_actors; print('zlink_actors.testing' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- wait_until ----------------------------------------------------------------------------


def test_wait_until_returns_true_at_once_when_the_predicate_already_holds() -> None:
    calls: list[int] = []

    assert wait_until(lambda: calls.append(1) is None)
    assert calls == [1]


def test_wait_until_polls_until_the_predicate_holds() -> None:
    calls: list[int] = []

    assert wait_until(lambda: calls.append(1) or len(calls) == 5)
    assert len(calls) == 5


def test_wait_until_gives_up_with_false_at_its_bound_when_the_predicate_never_holds() -> None:
    start = time.monotonic()

    assert wait_until(lambda: False, within=0.05) is False
    elapsed = time.monotonic() - start
    assert 0.05 <= elapsed < WAIT


# -- finishes ----------------------------------------------------------------------------


def test_finishes_runs_the_function_on_another_thread_and_reports_that_it_returned() -> None:
    threads: list[threading.Thread] = []

    assert finishes(lambda: threads.append(threading.current_thread()))
    assert len(threads) == 1
    assert threads[0] is not threading.current_thread()


def test_finishes_returns_false_when_the_function_is_still_running_at_its_bound() -> None:
    stuck = threading.Event()
    try:
        start = time.monotonic()
        assert finishes(lambda: stuck.wait(WAIT), within=0.05) is False
        assert time.monotonic() - start < WAIT
    finally:
        stuck.set()


def test_finishes_reraises_what_the_function_raised_on_the_calling_thread() -> None:
    def fail() -> None:
        raise LookupError("from the helper thread")

    with pytest.raises(LookupError, match="from the helper thread"):
        finishes(fail)


# -- HeldJob -----------------------------------------------------------------------------


def test_a_held_job_reports_its_start_and_returns_its_value_only_once_released() -> None:
    job = HeldJob("done")
    returned: list[str] = []
    caller = threading.Thread(target=lambda: returned.append(job(1, two=2)))

    assert not job.started.is_set()
    caller.start()
    assert job.started.wait(WAIT)
    assert not job.released
    assert returned == []  # it is held: it cannot have returned yet
    job.release()
    caller.join(WAIT)

    assert not caller.is_alive()
    assert returned == ["done"]
    assert job.released
    assert job() == "done"  # once released, later calls return at once


def test_a_held_job_returns_none_unless_given_a_value() -> None:
    job = HeldJob()
    job.release()

    assert job() is None


def test_a_held_job_never_released_gives_up_after_its_limit() -> None:
    job = HeldJob(limit=0.01)

    with pytest.raises(TimeoutError, match="never released"):
        job()
    assert job.started.is_set()


def test_a_held_job_holds_a_cpu_worker_call_until_released() -> None:
    with HostHarness(cpu_workers=1) as harness:
        host = harness.host()
        job = harness.job(42)
        call = host.run_cpu_worker(job).submit()
        assert job.started.wait(WAIT)
        assert not call.done()
        job.release()

        assert call.result(WAIT) == 42


# -- DispatcherBlocker -------------------------------------------------------------------


def test_while_the_dispatcher_is_held_done_callbacks_wait_in_its_queue() -> None:
    called = threading.Event()
    source: zlink_actors.CompletionSource[int] = zlink_actors.CompletionSource()

    with DispatcherBlocker():
        source.completion.add_done_callback(lambda _: called.set())
        source.set_result(1)
        assert source.completion.done()
        assert not called.is_set()  # queued behind the holding callback
        assert completion_dispatcher().statistics().queued >= 1

    assert called.wait(WAIT)


def test_release_lets_the_dispatcher_run_before_the_block_ends() -> None:
    called = threading.Event()
    source: zlink_actors.CompletionSource[int] = zlink_actors.CompletionSource()

    with DispatcherBlocker() as blocker:
        source.completion.add_done_callback(lambda _: called.set())
        source.set_result(1)
        blocker.release()
        assert called.wait(WAIT)


# -- HostHarness -------------------------------------------------------------------------


def test_host_options_are_the_keyword_options_of_host() -> None:
    parameters = set(inspect.signature(Host).parameters)

    assert set(kit.HostOptions.__optional_keys__) == parameters


def test_the_harness_starts_hosts_with_its_defaults_unless_overridden() -> None:
    shared, own = ManualClock(), ManualClock()
    with HostHarness(clock=shared) as harness:
        first = harness.host()
        second = harness.host(clock=own)

        assert first.state is HostState.SERVING
        assert second.state is HostState.SERVING
        advance_and_settle(first, shared, 0)  # runs on the default clock
        advance_and_settle(second, own, 0)  # runs on its own
        with pytest.raises(ValueError, match="clock"):
            advance_and_settle(second, shared, 0)

    assert first.state is HostState.STOPPED
    assert second.state is HostState.STOPPED


def test_close_releases_held_work_before_it_shuts_the_hosts_down() -> None:
    harness = HostHarness(app_threads=2, cpu_workers=1)
    latch = harness.latch()
    job = harness.job()
    seen_at_shutdown: list[tuple[bool, bool]] = []
    entered = threading.Event()

    class Held(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            entered.set()
            assert latch.wait(WAIT)

    class Witness(Spot):
        def on_closing(self, ctx: SpotContext, reason: CloseReason) -> None:
            seen_at_shutdown.append((latch.is_set(), job.released))

    host = harness.host(spots=[Held, Witness])
    host.spots.get_or_create("held", Held).submit_sync()
    host.spots.get_or_create("witness", Witness).submit_sync()
    host.send_to_spot("held", Hold()).submit_sync()
    worker = host.run_cpu_worker(job).submit()
    assert entered.wait(WAIT)
    assert job.started.wait(WAIT)

    harness.close()  # raises unless the Host stopped cleanly

    assert host.state is HostState.STOPPED
    assert seen_at_shutdown == [(True, True)]
    assert worker.result(WAIT) is None


def test_close_leaves_a_host_the_test_shut_down_itself_alone() -> None:
    harness = HostHarness()
    host = harness.host()
    result = host.shutdown(WAIT)

    harness.close()

    assert result.outcome is ShutdownOutcome.STOPPED
    assert host.state is HostState.STOPPED


def test_close_fails_when_a_host_does_not_stop_cleanly_and_still_stops_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kit, "WAIT", 0.05)  # the shutdown deadline close() grants
    stuck = threading.Event()  # not the harness's: close() cannot release it
    harness = HostHarness(cpu_workers=1)
    try:
        jammed = harness.host()
        other = harness.host()
        running = threading.Event()

        def work() -> None:
            running.set()
            stuck.wait(WAIT)

        jammed.run_cpu_worker(work).submit()
        assert running.wait(WAIT)

        with pytest.raises(AssertionError, match="did not stop cleanly") as failed:
            harness.close()

        assert "force_stopped" in str(failed.value).lower()
        assert jammed.state is HostState.STOPPED
        assert other.state is HostState.STOPPED
    finally:
        stuck.set()


def test_close_is_idempotent() -> None:
    harness = HostHarness()
    host = harness.host()

    harness.close()
    harness.close()

    assert host.state is HostState.STOPPED


# -- advance_and_settle ------------------------------------------------------------------


class Ticker(Spot):
    def __init__(self) -> None:
        super().__init__()
        self.ticks = 0

    @handler
    def start(self, ctx: SpotContext, msg: Start) -> None:
        ctx.timers.start("tick", msg.interval, self.tick)

    @handler
    def count(self, ctx: SpotContext, msg: Count) -> int:
        return self.ticks

    def tick(self, ctx: SpotContext, tick: TimerTick) -> None:
        self.ticks += 1


def test_advance_and_settle_moves_the_clock_by_the_seconds_given() -> None:
    clock = ManualClock(10.0)
    with HostHarness(clock=clock) as harness:
        advance_and_settle(harness.host(), clock, 2.5)

    assert clock.monotonic() == 12.5


def test_a_spot_timer_due_at_the_new_time_has_queued_its_tick_when_it_returns() -> None:
    clock = ManualClock()
    with HostHarness(clock=clock) as harness:
        host = harness.host(spots=[Ticker])
        host.spots.get_or_create("t", Ticker).submit_sync()
        host.request_to_spot("t", Start(1.0)).submit_sync()

        # Each request is queued behind any tick the timer fired before it.
        advance_and_settle(host, clock, 0.5)  # t=0.5
        assert host.request_to_spot("t", Count(), reply=int).submit_sync() == 0
        advance_and_settle(host, clock, 0.5)  # t=1
        assert host.request_to_spot("t", Count(), reply=int).submit_sync() == 1
        advance_and_settle(host, clock, 1.0)  # t=2
        assert host.request_to_spot("t", Count(), reply=int).submit_sync() == 2


def test_deadlines_due_at_the_new_time_have_completed_their_calls_when_it_returns() -> None:
    clock = ManualClock()
    entered = threading.Event()
    with HostHarness(clock=clock, cpu_workers=1) as harness:
        latch = harness.latch()

        class Desk(Spot):
            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> None:
                entered.set()
                assert latch.wait(WAIT)

        host = harness.host(spots=[Desk, Ticker])
        host.spots.get_or_create("desk", Desk).submit_sync()
        host.spots.get_or_create("t", Ticker).submit_sync()
        host.request_to_spot("t", Start(2.0)).submit_sync()  # a heap entry due with them
        job = harness.job()
        worker = host.run_cpu_worker(job).timeout(2.0).submit()
        request = host.request_to_spot("desk", Hold()).timeout(2.0).submit()
        assert entered.wait(WAIT)
        assert job.started.wait(WAIT)

        advance_and_settle(host, clock, 1.0)
        assert not worker.done()
        assert not request.done()
        advance_and_settle(host, clock, 1.0)

        # No wait: both completed before advance_and_settle returned.
        assert worker.done()
        assert request.done()
        assert isinstance(worker.exception(0), DeadlineExceededError)
        assert isinstance(request.exception(0), DeadlineExceededError)


def test_advance_and_settle_refuses_a_host_on_another_clock_without_moving_time() -> None:
    clock = ManualClock()
    with HostHarness() as harness:
        host = harness.host()  # the real clock

        with pytest.raises(ValueError, match="clock"):
            advance_and_settle(host, clock, 1.0)

    assert clock.monotonic() == 0.0


def test_advance_and_settle_refuses_a_stopped_host() -> None:
    clock = ManualClock()
    with HostHarness(clock=clock) as harness:
        host = harness.host()
    assert host.state is HostState.STOPPED

    with pytest.raises(InvalidOperationError):
        advance_and_settle(host, clock, 1.0)
