"""Worker offload contract: `run_cpu_worker` and `run_io_worker`.

SC §3 (slot held only while the callable runs, full queue waits, deadline gives
DeadlineExceeded, failure gives InternalFailure, no second terminal after a late finish),
SC §2 (terminators, sync terminator only on application threads), design/architecture.md §6 (usage
errors raise from the terminator, operational failures complete the Completion), digest §9
Tier 1 *Workers*, *Requests* and *Progress*.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine

import pytest

from zlink_actors import (
    CancellationToken,
    Completion,
    CompletionSource,
    CpuWorkerCall,
    DeadlineExceededError,
    Host,
    InternalFailureError,
    InvalidOperationError,
    IoWorkerCall,
    ManualClock,
    ShuttingDownError,
    completion_dispatcher,
)
from zlink_actors.testing import WAIT, HeldJob, wait_until

Held = Callable[..., HeldJob[object]]
MakeHost = Callable[..., Host]


def _drain() -> None:
    assert completion_dispatcher().drain(WAIT)


class Counter:
    """Counts arrivals and signals when `target` is reached."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.reached = threading.Event()
        self._lock = threading.Lock()

    def arrive(self) -> None:
        with self._lock:
            self.count += 1
            if self.count >= self.target:
                self.reached.set()


# -- results ---------------------------------------------------------------------------


def test_cpu_worker_returns_the_callables_result(host: Host) -> None:
    assert host.run_cpu_worker(pow, 2, 10).submit().result(WAIT) == 1024
    assert host.run_cpu_worker(pow, 3, 2).submit_sync() == 9


def test_io_worker_returns_the_coroutines_result(host: Host) -> None:
    async def fetch(token: CancellationToken) -> str:
        await asyncio.sleep(0)
        return "fetched"

    assert host.run_io_worker(fetch).submit().result(WAIT) == "fetched"
    assert host.run_io_worker(fetch).submit_sync() == "fetched"


def test_builders_are_the_public_call_types(host: Host) -> None:
    async def noop(token: CancellationToken) -> None:
        return None

    assert isinstance(host.run_cpu_worker(int), CpuWorkerCall)
    assert isinstance(host.run_io_worker(noop), IoWorkerCall)


def test_io_worker_receives_a_cancellation_token(host: Host) -> None:
    async def inspect(token: CancellationToken) -> tuple[bool, bool]:
        return isinstance(token, CancellationToken), token.cancelled

    assert host.run_io_worker(inspect).submit_sync() == (True, False)


def test_io_worker_can_await_a_completion(host: Host) -> None:
    source: CompletionSource[str] = CompletionSource()

    async def relay(token: CancellationToken) -> str:
        return "relayed " + await source.completion

    completion = host.run_io_worker(relay).submit()
    assert not completion.wait(0.05)
    source.set_result("value")

    assert completion.result(WAIT) == "relayed value"


# -- slots: CPU slot held only while the callable runs ---------------------------------


def test_pending_io_calls_hold_no_cpu_slot_and_can_outnumber_cpu_workers(
    make_host: MakeHost,
) -> None:
    host = make_host(cpu_workers=2)
    gate: CompletionSource[None] = CompletionSource()
    arrived = Counter(50)

    async def wait_for_gate(token: CancellationToken) -> int:
        arrived.arrive()
        await gate.completion
        return 1

    calls = [host.run_io_worker(wait_for_gate).submit() for _ in range(50)]
    # All fifty are pending at once, far more than the two CPU workers.
    assert arrived.reached.wait(WAIT)
    # ...and the CPU pool is still free for CPU work meanwhile.
    assert host.run_cpu_worker(lambda: "cpu").submit().result(WAIT) == "cpu"
    assert not any(call.done() for call in calls)

    gate.set_result(None)
    assert sum(call.result(WAIT) for call in calls) == 50


def test_fifty_concurrent_io_sleeps_finish_in_about_one_sleep(make_host: MakeHost) -> None:
    host = make_host(cpu_workers=2)

    async def sleep(token: CancellationToken) -> None:
        await asyncio.sleep(0.2)

    started = time.monotonic()
    calls = [host.run_io_worker(sleep).submit() for _ in range(50)]
    for call in calls:
        assert call.wait(WAIT)
    elapsed = time.monotonic() - started

    assert all(call.exception() is None for call in calls)
    # Serialised would take 10 s, two at a time 5 s.
    assert elapsed < 1.5


def test_cpu_slot_is_released_when_the_callable_returns(make_host: MakeHost) -> None:
    host = make_host(cpu_workers=1)
    for index in range(20):
        assert host.run_cpu_worker(lambda i=index: i).submit().result(WAIT) == index


def test_full_cpu_pool_makes_a_job_wait_instead_of_failing(make_host: MakeHost, held: Held) -> None:
    host = make_host(cpu_workers=1)
    blocker = held("blocker")
    running = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)

    queued = host.run_cpu_worker(lambda: "queued").submit()
    assert not queued.wait(0.1)

    blocker.release()
    assert running.result(WAIT) == "blocker"
    assert queued.result(WAIT) == "queued"


def test_cpu_jobs_start_in_submission_order(make_host: MakeHost, held: Held) -> None:
    host = make_host(cpu_workers=1)
    blocker = held()
    host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    order: list[int] = []

    calls = [host.run_cpu_worker(order.append, index).submit() for index in range(30)]
    blocker.release()
    for call in calls:
        assert call.wait(WAIT)

    assert order == list(range(30))


def test_every_cpu_worker_runs_concurrently_up_to_the_pool_size(make_host: MakeHost) -> None:
    host = make_host(cpu_workers=3)
    barrier = threading.Barrier(3, timeout=WAIT)

    calls = [host.run_cpu_worker(barrier.wait).submit() for _ in range(3)]

    assert sorted(call.result(WAIT) for call in calls) == [0, 1, 2]


def test_two_jobs_submitted_together_run_concurrently_when_one_pool_thread_is_idle(
    make_host: MakeHost,
) -> None:
    # Regression: CpuPool.submit used to start no thread for a second job while an idle
    # thread was still waking for the first, although the pool was below cpu_workers.
    host = make_host(cpu_workers=2)
    host.run_cpu_worker(lambda: None).submit_sync()
    pool = host._runtime.cpu_pool
    # Internal probe: wait until the pool's one thread is parked idle.
    assert wait_until(lambda: pool._idle == 1), "the first pool thread never went idle"
    barrier = threading.Barrier(2, timeout=1.0)

    def meet() -> bool:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return False
        return True

    first = host.run_cpu_worker(meet).submit()
    second = host.run_cpu_worker(meet).submit()

    assert first.result(WAIT) is True
    assert second.result(WAIT) is True


# -- deadlines -------------------------------------------------------------------------


def test_deadline_while_waiting_for_a_cpu_slot_gives_deadline_exceeded_and_fn_never_runs(
    clocked_host: Host, manual_clock: ManualClock, held: Held
) -> None:
    blocker = held()
    running = clocked_host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    never = threading.Event()

    waiting = clocked_host.run_cpu_worker(never.set).timeout(1.0).submit()
    manual_clock.advance(1.0)

    assert waiting.wait(WAIT)
    assert isinstance(waiting.exception(), DeadlineExceededError)
    blocker.release()
    assert running.wait(WAIT)
    # The pool is FIFO with one thread: once this later job ran, the expired one had its
    # turn and was skipped.
    assert clocked_host.run_cpu_worker(lambda: "after").submit_sync() == "after"
    assert not never.is_set()


def test_timeout_does_not_fire_before_the_deadline(
    clocked_host: Host, manual_clock: ManualClock, held: Held
) -> None:
    blocker = held("value")
    completion = clocked_host.run_cpu_worker(blocker).timeout(2.0).submit()
    assert blocker.started.wait(WAIT)

    manual_clock.advance(1.999)
    assert not completion.wait(0.05)

    blocker.release()
    assert completion.result(WAIT) == "value"


def test_deadline_is_fixed_when_the_terminator_starts(
    clocked_host: Host, manual_clock: ManualClock, held: Held
) -> None:
    blocker = held("value")
    call = clocked_host.run_cpu_worker(blocker).timeout(1.0)
    manual_clock.advance(10.0)  # time passing before submit() is not charged

    completion = call.submit()
    assert blocker.started.wait(WAIT)
    assert not completion.wait(0.05)

    manual_clock.advance(1.0)
    assert completion.wait(WAIT)
    assert isinstance(completion.exception(), DeadlineExceededError)


def test_late_result_after_timeout_does_not_complete_twice(
    clocked_host: Host, manual_clock: ManualClock, held: Held
) -> None:
    blocker = held("late value")
    completion = clocked_host.run_cpu_worker(blocker).timeout(1.0).submit()
    assert blocker.started.wait(WAIT)
    callbacks: list[BaseException | None] = []
    completion.add_done_callback(lambda c: callbacks.append(c.exception()))

    manual_clock.advance(1.0)
    assert completion.wait(WAIT)
    blocker.release()
    # One pool thread: when the next job has run, the late finish was already attempted.
    clocked_host.run_cpu_worker(lambda: None).submit_sync()
    _drain()

    assert isinstance(completion.exception(), DeadlineExceededError)
    assert len(callbacks) == 1
    assert isinstance(callbacks[0], DeadlineExceededError)


def test_io_worker_late_result_after_timeout_does_not_complete_twice(
    clocked_host: Host, manual_clock: ManualClock
) -> None:
    gate: CompletionSource[None] = CompletionSource()
    started = threading.Event()
    finished = threading.Event()

    async def slow(token: CancellationToken) -> str:
        started.set()
        await gate.completion
        finished.set()
        return "late value"

    completion = clocked_host.run_io_worker(slow).timeout(1.0).submit()
    assert started.wait(WAIT)  # a deadline before the start would rightly skip the coroutine
    callbacks: list[BaseException | None] = []
    completion.add_done_callback(lambda c: callbacks.append(c.exception()))
    manual_clock.advance(1.0)
    assert completion.wait(WAIT)

    gate.set_result(None)
    assert finished.wait(WAIT)

    async def after(token: CancellationToken) -> None:
        return None

    # The I/O loop is FIFO: once this later call finished, the late one had returned.
    clocked_host.run_io_worker(after).submit_sync()
    _drain()
    assert isinstance(completion.exception(), DeadlineExceededError)
    assert len(callbacks) == 1


def test_io_worker_token_is_cancelled_when_the_deadline_passes(
    clocked_host: Host, manual_clock: ManualClock
) -> None:
    saw_cancellation = threading.Event()
    started = threading.Event()

    async def watch(token: CancellationToken) -> None:
        loop = asyncio.get_running_loop()
        cancelled = asyncio.Event()
        token.register(lambda: loop.call_soon_threadsafe(cancelled.set))
        started.set()
        await asyncio.wait_for(cancelled.wait(), WAIT)
        saw_cancellation.set()

    completion = clocked_host.run_io_worker(watch).timeout(1.0).submit()
    assert started.wait(WAIT)
    manual_clock.advance(1.0)

    assert completion.wait(WAIT)
    assert isinstance(completion.exception(), DeadlineExceededError)
    assert saw_cancellation.wait(WAIT)


def test_timeout_still_fires_while_every_cpu_worker_is_blocked(
    make_host: MakeHost, held: Held
) -> None:
    clock = ManualClock()
    host = make_host(cpu_workers=2, clock=clock)
    blockers = [held(), held()]
    for blocker in blockers:
        host.run_cpu_worker(blocker).submit()
        assert blocker.started.wait(WAIT)

    waiting = host.run_cpu_worker(lambda: None).timeout(0.5).submit()
    clock.advance(0.5)

    assert waiting.wait(WAIT)
    assert isinstance(waiting.exception(), DeadlineExceededError)


# -- failures --------------------------------------------------------------------------


def test_cpu_worker_that_raises_completes_with_internal_failure_caused_by_the_original(
    host: Host,
) -> None:
    original = ZeroDivisionError("division by zero")

    def fail() -> None:
        raise original

    completion = host.run_cpu_worker(fail).submit()
    error = completion.exception(WAIT)

    assert isinstance(error, InternalFailureError)
    assert error.__cause__ is original
    with pytest.raises(InternalFailureError):
        host.run_cpu_worker(fail).submit_sync()


def test_io_worker_that_raises_completes_with_internal_failure_caused_by_the_original(
    host: Host,
) -> None:
    original = ConnectionResetError("peer reset")

    async def fail(token: CancellationToken) -> None:
        raise original

    error = host.run_io_worker(fail).submit().exception(WAIT)

    assert isinstance(error, InternalFailureError)
    assert error.__cause__ is original


def test_io_worker_raising_asyncio_cancelled_error_while_serving_is_an_internal_failure(
    host: Host,
) -> None:
    # Regression: a coroutine that raised asyncio.CancelledError by itself used to be
    # reported as ShuttingDownError while the Host was serving.
    async def await_cancelled_future(token: CancellationToken) -> None:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    error = host.run_io_worker(await_cancelled_future).submit().exception(WAIT)

    assert not isinstance(error, ShuttingDownError), error
    assert isinstance(error, InternalFailureError)
    assert isinstance(error.__cause__, asyncio.CancelledError)


# -- terminators and usage errors ------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [("submit", "submit"), ("submit", "submit_sync"), ("submit_sync", "submit")],
)
def test_second_terminator_raises_invalid_operation(host: Host, first: str, second: str) -> None:
    runs: list[int] = []
    call = host.run_cpu_worker(runs.append, 1)
    result = getattr(call, first)()
    if isinstance(result, Completion):
        result.result(WAIT)

    with pytest.raises(InvalidOperationError):
        getattr(call, second)()
    # One more job through the pool (FIFO): a second admission would have run by now.
    host.run_cpu_worker(lambda: None).submit_sync()
    assert runs == [1]


def test_second_io_terminator_raises_invalid_operation(host: Host) -> None:
    async def noop(token: CancellationToken) -> None:
        return None

    call = host.run_io_worker(noop)
    call.submit_sync()

    with pytest.raises(InvalidOperationError):
        call.submit()


def test_timeout_after_the_terminator_or_set_twice_raises_invalid_operation(host: Host) -> None:
    once = host.run_cpu_worker(lambda: None).timeout(1.0)
    with pytest.raises(InvalidOperationError):
        once.timeout(2.0)

    submitted = host.run_cpu_worker(lambda: None)
    submitted.submit().result(WAIT)
    with pytest.raises(InvalidOperationError):
        submitted.timeout(1.0)


@pytest.mark.parametrize(
    ("seconds", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("1", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_timeout_rejects_values_that_are_not_positive_finite_seconds(
    host: Host, seconds: object, error: type[Exception]
) -> None:
    call = host.run_cpu_worker(lambda: None)

    with pytest.raises(error):
        call.timeout(seconds)  # type: ignore[arg-type]
    assert call.submit().result(WAIT) is None


def test_non_callable_worker_bodies_are_rejected(host: Host) -> None:
    with pytest.raises(TypeError):
        host.run_cpu_worker(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        host.run_io_worker("not callable")  # type: ignore[arg-type]


async def _fetch(token: CancellationToken) -> str:
    return "fetched"


async def _add(a: int, token: CancellationToken) -> int:
    return a + 1


def _returns_a_coroutine(token: CancellationToken) -> Coroutine[None, None, str]:
    return _fetch(token)  # an awaitable, but not a coroutine function


class _AsyncBody:
    async def __call__(self, token: CancellationToken) -> str:
        return "called"

    async def method(self, token: CancellationToken) -> str:
        return "method"


class _PlainBody:
    def __call__(self, *args: int) -> int:
        return sum(args)


@pytest.mark.parametrize(
    "body",
    [_fetch, functools.partial(_add, 1), _AsyncBody(), _AsyncBody().method],
    ids=["coroutine-function", "partial", "async-call", "async-method"],
)
def test_an_async_body_given_to_run_cpu_worker_is_a_type_error_that_names_run_io_worker(
    host: Host, body: Callable[..., object]
) -> None:
    with pytest.raises(TypeError, match="run_io_worker"):
        host.run_cpu_worker(body)


@pytest.mark.parametrize(
    "body",
    [_returns_a_coroutine, int, _PlainBody(), functools.partial(sum, [1])],
    ids=["function-returning-a-coroutine", "class", "plain-call", "plain-partial"],
)
def test_a_plain_body_given_to_run_io_worker_is_a_type_error_that_names_run_cpu_worker(
    host: Host, body: Callable[..., object]
) -> None:
    with pytest.raises(TypeError, match="run_cpu_worker"):
        host.run_io_worker(body)  # type: ignore[arg-type]


def test_run_io_worker_takes_a_partial_or_an_object_with_an_async_call(host: Host) -> None:
    assert host.run_io_worker(functools.partial(_add, 1)).submit_sync() == 2
    assert host.run_io_worker(_AsyncBody()).submit_sync() == "called"
    assert host.run_io_worker(_AsyncBody().method).submit_sync() == "method"


def test_run_cpu_worker_takes_a_class_a_partial_or_an_object_with_a_plain_call(
    host: Host,
) -> None:
    assert host.run_cpu_worker(int, "3").submit_sync() == 3
    assert host.run_cpu_worker(functools.partial(sum, [1, 2])).submit_sync() == 3
    assert host.run_cpu_worker(_PlainBody(), 4, 5).submit_sync() == 9


def test_bad_cancel_argument_raises_type_error_from_the_terminator(host: Host) -> None:
    call = host.run_cpu_worker(lambda: None)

    with pytest.raises(TypeError):
        call.submit(cancel="token")  # type: ignore[arg-type]


def test_operational_failures_complete_the_completion_instead_of_raising(host: Host) -> None:
    def fail() -> None:
        raise OSError("disk")

    completion = host.run_cpu_worker(fail).submit()  # does not raise

    assert isinstance(completion.exception(WAIT), InternalFailureError)


# -- runtime context: blocking is refused inside workers (SC §4 F2-a) ------------------


def _capture(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc


def test_submit_sync_inside_a_cpu_worker_raises_invalid_operation_and_submits_nothing(
    make_host: MakeHost,
) -> None:
    host = make_host(cpu_workers=1)
    inner_ran = threading.Event()

    def outer() -> object:
        return _capture(host.run_cpu_worker(inner_ran.set).submit_sync)

    error = host.run_cpu_worker(outer).submit().result(WAIT)

    assert isinstance(error, InvalidOperationError)
    assert "await" in str(error)
    host.run_cpu_worker(lambda: None).submit_sync()  # FIFO: an admitted inner job ran by now
    assert not inner_ran.is_set()


@pytest.mark.parametrize("observe", ["result", "exception", "wait"])
def test_blocking_observation_of_unsettled_completion_inside_a_cpu_worker_raises(
    host: Host, observe: str
) -> None:
    unsettled: CompletionSource[int] = CompletionSource()

    def body() -> object:
        return _capture(lambda: getattr(unsettled.completion, observe)(timeout=WAIT))

    error = host.run_cpu_worker(body).submit().result(WAIT)

    assert isinstance(error, InvalidOperationError)
    assert "await" in str(error)


@pytest.mark.parametrize("observe", ["result", "exception", "wait"])
def test_blocking_observation_of_unsettled_completion_inside_an_io_worker_raises(
    host: Host, observe: str
) -> None:
    unsettled: CompletionSource[int] = CompletionSource()

    async def body(token: CancellationToken) -> object:
        return _capture(lambda: getattr(unsettled.completion, observe)(timeout=WAIT))

    error = host.run_io_worker(body).submit().result(WAIT)

    assert isinstance(error, InvalidOperationError)
    assert "await" in str(error)


def test_submit_sync_inside_an_io_worker_raises_invalid_operation(host: Host) -> None:
    async def body(token: CancellationToken) -> object:
        return _capture(host.run_cpu_worker(lambda: None).submit_sync)

    error = host.run_io_worker(body).submit().result(WAIT)

    assert isinstance(error, InvalidOperationError)


def test_observing_a_settled_completion_inside_workers_is_allowed(host: Host) -> None:
    settled: CompletionSource[str] = CompletionSource()
    settled.set_result("settled")

    async def io_body(token: CancellationToken) -> tuple[object, ...]:
        handle = settled.completion
        return handle.result(), handle.wait(0), handle.exception()

    def cpu_body() -> tuple[object, ...]:
        handle = settled.completion
        return handle.result(), handle.wait(0), handle.exception()

    assert host.run_cpu_worker(cpu_body).submit_sync() == ("settled", True, None)
    assert host.run_io_worker(io_body).submit_sync() == ("settled", True, None)
