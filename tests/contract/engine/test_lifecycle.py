"""Host lifecycle (digest §9 Tier 1 "Host states and Shutdown"; design/architecture.md §3).

PREPARING -> SERVING -> DRAINING -> STOPPED. Once sealed, new calls (from application
threads or from handlers) complete with `ShuttingDownError`; accepted work still runs
until the deadline; every pending call completes exactly once. Owners cost no threads.
"""

import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancellationToken,
    Completion,
    Host,
    HostState,
    InvalidOperationError,
    ShutdownOutcome,
    ShutdownResult,
    ShuttingDownError,
    Spot,
    SpotContext,
    completion_dispatcher,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hit, Hold, Ping, Pong


class Room(Spot):
    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
        return Pong(msg.n)

    @handler
    def hit(self, ctx: SpotContext, msg: Hit) -> None:
        pass


class Draining:
    """A Host caught in DRAINING: a handler holds it there until `finish()`.

    Its lane holds one item, so a one-way send waits behind the blocked handler; that
    send ending with `ShuttingDownError` is the signal that the seal happened.
    """

    def __init__(self, harness: HostHarness) -> None:
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.after_seal: list[str] = []
        draining = self

        class Blocker(Spot):
            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> str:
                draining.entered.set()
                draining.latch.wait(WAIT)
                # Calls made by a handler after the seal.
                for name, call in [
                    ("send", ctx.send_to_spot("room", Hit())),
                    ("request", ctx.request_to_spot("room", Ping())),
                    ("cpu_worker", ctx.run_cpu_worker(int)),
                ]:
                    error = call.submit().exception()
                    draining.after_seal.append(f"{name}: {type(error).__name__}")
                return "finished"

            @handler
            def hit(self, ctx: SpotContext, msg: Hit) -> None:
                pass

        self.host = harness.host(spots=[Room, Blocker], application_lane_items=1)
        self.host.spots.get_or_create("room", Room).submit_sync()
        self.host.spots.get_or_create("blocker", Blocker).submit_sync()
        self.accepted = self.host.request_to_spot("blocker", Hold(), reply=str).submit()
        assert self.entered.wait(WAIT)
        waiting = self.host.send_to_spot("blocker", Hit()).submit()
        self.results: list[ShutdownResult] = []
        self.stopper = threading.Thread(
            target=lambda: self.results.append(self.host.shutdown(deadline=WAIT))
        )
        self.stopper.start()
        with pytest.raises(ShuttingDownError):
            waiting.result(WAIT)

    def finish(self) -> ShutdownResult:
        self.latch.set()
        self.stopper.join(WAIT * 2)
        assert not self.stopper.is_alive()
        return self.results[0]


def test_host_moves_from_preparing_to_serving_to_draining_to_stopped(
    harness: HostHarness,
) -> None:
    host = Host(spots=[Room])
    assert host.state is HostState.PREPARING
    host.start()
    assert host.state is HostState.SERVING
    assert host.shutdown(deadline=WAIT).outcome is ShutdownOutcome.STOPPED
    assert host.state is HostState.STOPPED

    draining = Draining(harness)
    assert draining.host.state is HostState.DRAINING
    with pytest.raises(ShuttingDownError):
        draining.host.request_to_spot("room", Ping()).submit_sync()
    result = draining.finish()
    assert draining.host.state is HostState.STOPPED
    assert result.outcome is ShutdownOutcome.STOPPED


def test_work_accepted_before_the_seal_still_runs_and_replies(harness: HostHarness) -> None:
    draining = Draining(harness)

    result = draining.finish()

    assert draining.accepted.result(WAIT) == "finished"
    assert result.forced_operations == 0


def test_handler_calls_after_the_seal_complete_with_shutting_down(harness: HostHarness) -> None:
    draining = Draining(harness)

    draining.finish()

    assert draining.after_seal == [
        "send: ShuttingDownError",
        "request: ShuttingDownError",
        "cpu_worker: ShuttingDownError",
    ]


def _calls(host: Host) -> dict[str, Callable[[], Completion[object]]]:
    async def io_work(token: CancellationToken) -> int:
        return 1

    return {
        "send": lambda: host.send_to_spot("room", Hit()).submit(),
        "request": lambda: host.request_to_spot("room", Ping()).submit(),
        "cpu_worker": lambda: host.run_cpu_worker(int).submit(),
        "io_worker": lambda: host.run_io_worker(io_work).submit(),
        "get_or_create": lambda: host.spots.get_or_create("other", Room).submit(),
    }


@pytest.mark.parametrize("call", ["send", "request", "cpu_worker", "io_worker", "get_or_create"])
def test_calls_after_shutdown_complete_with_shutting_down(harness: HostHarness, call: str) -> None:
    host = harness.host(spots=[Room])
    host.spots.get_or_create("room", Room).submit_sync()
    assert host.shutdown(deadline=WAIT).outcome is ShutdownOutcome.STOPPED

    completion = _calls(host)[call]()

    with pytest.raises(ShuttingDownError):
        completion.result(WAIT)


@pytest.mark.parametrize("call", ["send", "request", "cpu_worker", "io_worker", "get_or_create"])
def test_calls_before_start_raise_invalid_operation(call: str) -> None:
    host = Host(spots=[Room])

    with pytest.raises(InvalidOperationError):
        _calls(host)[call]()
    assert host.state is HostState.PREPARING


def test_start_after_shutdown_raises_invalid_operation(harness: HostHarness) -> None:
    host = harness.host(spots=[Room])
    host.shutdown(deadline=WAIT)

    with pytest.raises(InvalidOperationError):
        host.start()
    assert host.state is HostState.STOPPED


def test_shutdown_completes_a_pending_request_exactly_once(harness: HostHarness) -> None:
    latch = harness.latch()
    entered = threading.Event()
    exited = threading.Event()

    class Slow(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> str:
            entered.set()
            latch.wait(30)
            exited.set()
            return "late"

    host = harness.host(spots=[Slow])
    host.spots.get_or_create("slow", Slow).submit_sync()
    pending = host.request_to_spot("slow", Hold()).timeout(60).submit()
    callbacks: list[object] = []
    pending.add_done_callback(callbacks.append)
    assert entered.wait(WAIT)

    result = host.shutdown(deadline=0.3)

    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.forced_operations == 1
    with pytest.raises(ShuttingDownError):
        pending.result(WAIT)
    latch.set()
    assert exited.wait(WAIT)  # the late reply is produced and dropped
    assert completion_dispatcher().drain(WAIT)
    assert callbacks == [pending]
    with pytest.raises(ShuttingDownError):
        pending.result()


def test_shutdown_inside_a_handler_raises_invalid_operation(harness: HostHarness) -> None:
    class Stopper(Spot):
        @handler
        def stop(self, ctx: SpotContext, msg: Ping) -> str:
            try:
                host.shutdown(deadline=WAIT)
            except InvalidOperationError:
                return "refused"
            return "stopped"

    host = harness.host(spots=[Stopper])
    host.spots.get_or_create("stopper", Stopper).submit_sync()

    assert host.request_to_spot("stopper", Ping(), reply=str).submit_sync() == "refused"
    assert host.state is HostState.SERVING


def test_ten_thousand_idle_spots_add_no_thread(harness: HostHarness) -> None:
    host = harness.host(spots=[Room], app_threads=2)
    host.spots.get_or_create("warm-up", Room).submit_sync()
    assert host.request_to_spot("warm-up", Ping(1), reply=Pong).submit_sync() == Pong(1)
    threads_before = threading.active_count()

    for i in range(10_000):
        host.spots.get_or_create(f"spot-{i}", Room).submit_sync()
    assert host.request_to_spot("spot-9999", Ping(2), reply=Pong).submit_sync() == Pong(2)

    assert threading.active_count() == threads_before
    stats = host.statistics()
    assert stats.spots >= 10_001
    assert stats.pool.threads == 2
