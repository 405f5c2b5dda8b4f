"""Host lifecycle and shutdown contract.

Digest §6 "Host operations" (Shutdown: seal admission, finish accepted work by the deadline,
then give pending operations a shutdown result; outcome Stopped or ForceStopped), SC §11
(shutdown drains the dispatcher), SC §17 / CS §6 (shutdown is one of the racing terminals),
digest §9 Tier 1 *Progress* (with every worker blocked, Shutdown still completes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancellationSource,
    CancellationToken,
    Completion,
    CompletionSource,
    Host,
    HostState,
    InvalidOperationError,
    ShutdownOutcome,
    ShutdownResult,
    ShuttingDownError,
    completion_dispatcher,
)
from zlink_actors.testing import WAIT, DispatcherBlocker, HeldJob, wait_until

from .._support import ShutdownThread

Blocker = Callable[[], DispatcherBlocker]
Held = Callable[..., HeldJob[object]]


def _drain() -> None:
    assert completion_dispatcher().drain(WAIT)


def _wait_for_state(host: Host, state: HostState) -> None:
    # DRAINING is entered by the shutdown thread before it starts waiting; poll briefly.
    assert wait_until(lambda: host.state is state), f"host never reached {state}"


# -- lifecycle -------------------------------------------------------------------------


def test_host_starts_in_preparing_and_start_enters_serving() -> None:
    host = Host(cpu_workers=1)
    assert host.state is HostState.PREPARING

    assert host.start() is host
    assert host.state is HostState.SERVING
    assert host.shutdown(deadline=WAIT).outcome is ShutdownOutcome.STOPPED


def test_start_is_idempotent_while_serving(host: Host) -> None:
    host.start()
    host.start()

    assert host.state is HostState.SERVING
    assert host.run_cpu_worker(lambda: 1).submit_sync() == 1


@pytest.mark.parametrize("terminator", ["submit", "submit_sync"])
def test_calls_before_start_raise_invalid_operation(terminator: str) -> None:
    host = Host(cpu_workers=1)
    ran = threading.Event()

    async def io_body(token: CancellationToken) -> None:
        ran.set()

    with pytest.raises(InvalidOperationError):
        getattr(host.run_cpu_worker(ran.set), terminator)()
    with pytest.raises(InvalidOperationError):
        getattr(host.run_io_worker(io_body), terminator)()
    assert host.state is HostState.PREPARING
    host.start()
    host.shutdown(deadline=WAIT)
    assert not ran.is_set()


def test_host_as_a_context_manager_starts_and_stops() -> None:
    with Host(cpu_workers=1) as host:
        assert host.state is HostState.SERVING
        assert host.run_cpu_worker(lambda: "in context").submit_sync() == "in context"

    assert host.state is HostState.STOPPED


def test_host_context_manager_stops_the_host_when_the_body_raises() -> None:
    with pytest.raises(KeyError), Host(cpu_workers=1) as host:
        raise KeyError("body failed")

    assert host.state is HostState.STOPPED


def test_start_after_shutdown_raises_invalid_operation() -> None:
    host = Host(cpu_workers=1).start()
    host.shutdown(deadline=WAIT)

    with pytest.raises(InvalidOperationError):
        host.start()
    assert host.state is HostState.STOPPED


def test_shutdown_of_an_idle_host_is_stopped_with_nothing_forced() -> None:
    host = Host(cpu_workers=2).start()
    host.run_cpu_worker(lambda: None).submit_sync()

    result = host.shutdown(deadline=WAIT)

    assert result == ShutdownResult(
        outcome=ShutdownOutcome.STOPPED, forced_operations=0, abandoned_threads=0
    )
    assert host.state is HostState.STOPPED


def test_shutdown_is_idempotent_and_returns_the_same_result() -> None:
    host = Host(cpu_workers=1).start()

    first = host.shutdown(deadline=WAIT)
    second = host.shutdown(deadline=WAIT)

    assert second is first
    assert host.state is HostState.STOPPED


def test_concurrent_shutdown_calls_both_return_the_first_calls_result(held: Held) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held("accepted")
    running = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)

    first = ShutdownThread(host, deadline=WAIT)
    _wait_for_state(host, HostState.DRAINING)
    second = ShutdownThread(host, deadline=WAIT)
    assert not second.returned.wait(0.05)
    blocker.release()

    assert first.join() is second.join()
    assert running.result(WAIT) == "accepted"


@pytest.mark.parametrize(("deadline", "error"), [(-1.0, ValueError), ("soon", TypeError)])
def test_shutdown_rejects_an_invalid_deadline(
    host: Host, deadline: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        host.shutdown(deadline=deadline)  # type: ignore[arg-type]
    assert host.state is HostState.SERVING


def test_shutdown_inside_a_runtime_context_raises_invalid_operation(host: Host) -> None:
    def body() -> object:
        try:
            return host.shutdown(deadline=WAIT)
        except InvalidOperationError as exc:
            return exc

    error = host.run_cpu_worker(body).submit_sync()

    assert isinstance(error, InvalidOperationError)
    assert host.state is HostState.SERVING


# -- sealing admission -----------------------------------------------------------------


def test_calls_after_shutdown_complete_with_shutting_down_instead_of_raising() -> None:
    host = Host(cpu_workers=1).start()
    host.shutdown(deadline=WAIT)
    ran = threading.Event()

    async def io_body(token: CancellationToken) -> None:
        ran.set()

    cpu = host.run_cpu_worker(ran.set).submit()
    io = host.run_io_worker(io_body).submit()

    assert isinstance(cpu.exception(0), ShuttingDownError)
    assert isinstance(io.exception(0), ShuttingDownError)
    with pytest.raises(ShuttingDownError):
        host.run_cpu_worker(ran.set).submit_sync()
    assert not ran.is_set()


def test_shutdown_seals_admission_while_draining_and_accepted_work_still_finishes(
    held: Held,
) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held("accepted")
    accepted = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    late_ran = threading.Event()

    shutdown = ShutdownThread(host, deadline=WAIT)
    _wait_for_state(host, HostState.DRAINING)
    rejected = host.run_cpu_worker(late_ran.set).submit()
    assert isinstance(rejected.exception(0), ShuttingDownError)
    assert not shutdown.returned.is_set()
    blocker.release()
    result = shutdown.join()

    assert accepted.result(0) == "accepted"
    assert result.outcome is ShutdownOutcome.STOPPED
    assert result.forced_operations == 0
    assert not late_ran.is_set()
    assert host.state is HostState.STOPPED


def test_cpu_job_queued_before_shutdown_still_runs_during_the_drain(held: Held) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held("first")
    first = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    queued = host.run_cpu_worker(lambda: "queued").submit()

    shutdown = ShutdownThread(host, deadline=WAIT)
    _wait_for_state(host, HostState.DRAINING)
    blocker.release()
    result = shutdown.join()

    assert first.result(0) == "first"
    assert queued.result(0) == "queued"
    assert result.outcome is ShutdownOutcome.STOPPED


def test_io_call_accepted_before_shutdown_finishes_during_the_drain() -> None:
    host = Host(cpu_workers=1).start()
    gate: CompletionSource[None] = CompletionSource()
    started = threading.Event()

    async def body(token: CancellationToken) -> str:
        started.set()
        await gate.completion
        return "io done"

    accepted = host.run_io_worker(body).submit()
    assert started.wait(WAIT)
    shutdown = ShutdownThread(host, deadline=WAIT)
    _wait_for_state(host, HostState.DRAINING)
    assert not accepted.done()
    gate.set_result(None)
    result = shutdown.join()

    assert accepted.result(0) == "io done"
    assert result.outcome is ShutdownOutcome.STOPPED


# -- the deadline ----------------------------------------------------------------------


def test_call_pending_past_the_deadline_completes_once_with_shutting_down(held: Held) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held("late")
    stuck = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    callbacks: list[BaseException | None] = []
    stuck.add_done_callback(lambda c: callbacks.append(c.exception()))

    result = host.shutdown(deadline=0.1)
    blocker.release()
    _drain()

    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.forced_operations == 1
    assert isinstance(stuck.exception(0), ShuttingDownError)
    assert len(callbacks) == 1
    assert isinstance(callbacks[0], ShuttingDownError)


def test_thread_stuck_in_user_code_is_abandoned_and_shutdown_still_returns(held: Held) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held()
    threads: list[threading.Thread] = []

    def stuck() -> object:
        threads.append(threading.current_thread())
        return blocker()

    host.run_cpu_worker(stuck).submit()
    assert blocker.started.wait(WAIT)

    started = time.monotonic()
    result = host.shutdown(deadline=0.2)
    elapsed = time.monotonic() - started

    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.abandoned_threads >= 1
    assert elapsed < WAIT
    assert threads[0].is_alive()  # abandoned, not killed
    blocker.release()
    threads[0].join(WAIT)
    assert not threads[0].is_alive()


def test_shutdown_completes_while_every_cpu_worker_is_blocked(held: Held) -> None:
    host = Host(cpu_workers=2).start()
    blockers = [held(), held()]
    calls = [host.run_cpu_worker(blocker).submit() for blocker in blockers]
    for blocker in blockers:
        assert blocker.started.wait(WAIT)
    queued = host.run_cpu_worker(lambda: None).submit()

    result = host.shutdown(deadline=0.2)

    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.forced_operations == 3
    for completion in [*calls, queued]:
        assert isinstance(completion.exception(0), ShuttingDownError)


def test_io_call_pending_past_the_deadline_completes_with_shutting_down() -> None:
    host = Host(cpu_workers=1).start()
    started = threading.Event()
    never: CompletionSource[None] = CompletionSource()

    async def forever(token: CancellationToken) -> None:
        started.set()
        await never.completion

    pending = host.run_io_worker(forever).submit()
    assert started.wait(WAIT)
    result = host.shutdown(deadline=0.1)

    assert isinstance(pending.exception(0), ShuttingDownError)
    assert result.forced_operations == 1
    assert result.outcome is ShutdownOutcome.FORCE_STOPPED


def test_cancelled_call_is_not_forced_again_at_shutdown(held: Held) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held()
    source = CancellationSource()
    call = host.run_cpu_worker(blocker).submit(cancel=source.token)
    assert blocker.started.wait(WAIT)
    source.cancel()
    assert call.cancelled()

    result = host.shutdown(deadline=0.1)
    blocker.release()

    assert result.forced_operations == 0
    assert call.cancelled()


# -- draining and joining --------------------------------------------------------------


def test_shutdown_joins_the_worker_threads_it_started() -> None:
    host = Host(cpu_workers=2).start()
    seen: list[threading.Thread] = []

    async def io_body(token: CancellationToken) -> None:
        seen.append(threading.current_thread())

    barrier = threading.Barrier(2, timeout=WAIT)

    def cpu_body() -> None:
        seen.append(threading.current_thread())
        barrier.wait()

    cpu_calls = [host.run_cpu_worker(cpu_body).submit() for _ in range(2)]
    host.run_io_worker(io_body).submit_sync()
    for call in cpu_calls:
        call.result(WAIT)

    result = host.shutdown(deadline=WAIT)

    assert result.outcome is ShutdownOutcome.STOPPED
    assert result.abandoned_threads == 0
    assert len(seen) == 3
    assert not [thread for thread in seen if thread.is_alive()]


def test_callbacks_of_completed_calls_have_run_when_shutdown_returns(
    block_dispatcher: Blocker,
) -> None:
    host = Host(cpu_workers=1).start()
    done = host.run_cpu_worker(lambda: "value").submit()
    assert done.wait(WAIT)
    ran: list[object] = []

    with block_dispatcher() as blocker:
        done.add_done_callback(lambda c: ran.append(c.result()))
        shutdown = ShutdownThread(host, deadline=WAIT)
        assert not shutdown.returned.wait(0.1)
        assert ran == []
        blocker.release()
        result = shutdown.join()

    assert ran == ["value"]
    assert result.outcome is ShutdownOutcome.STOPPED


def test_forced_shutdown_runs_callbacks_of_forced_calls_before_returning(held: Held) -> None:
    # Regression: the dispatcher drain used to get only the time left before the deadline
    # (0 s after a forced wait), so callbacks of the forced calls ran after return.
    host = Host(cpu_workers=1).start()
    blocker = held()
    stuck = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    seen: list[BaseException | None] = []
    stuck.add_done_callback(lambda c: seen.append(c.exception()))
    busy: CompletionSource[None] = CompletionSource()
    busy.set_result(None)
    # Slow callback work already on the dispatcher when shutdown forces the call.
    busy.completion.add_done_callback(lambda _: time.sleep(0.1))

    result = host.shutdown(deadline=0.1)
    blocker.release()

    assert result.forced_operations == 1
    assert len(seen) == 1, "the forced call's callback had not run when shutdown returned"


def test_forced_shutdown_abandons_only_the_thread_stuck_in_user_code(held: Held) -> None:
    # Regression: idle pool, I/O and app threads used to be joined with 0 s after the
    # deadline and counted as abandoned.
    host = Host(cpu_workers=2).start()

    async def io_body(token: CancellationToken) -> None:
        return None

    host.run_io_worker(io_body).submit_sync()  # the I/O loop thread now exists
    blocker = held()
    host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)

    result = host.shutdown(deadline=0.1)
    blocker.release()

    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.abandoned_threads == 1


def test_call_admitted_while_shutdown_begins_is_still_completed(
    block_dispatcher: Blocker, held: Held
) -> None:
    # Regression: a call that passed the admission check before shutdown swept the pending
    # table, and registered after it, was queued, dropped by CpuPool.stop() and never
    # completed.
    # A token whose `cancelled` check pauses the call after the admission check and before
    # it registers, which is where the race with shutdown lies.
    admitted = threading.Event()
    resume = threading.Event()

    class PausingToken(CancellationToken):
        __slots__ = ()

        @property
        def cancelled(self) -> bool:
            admitted.set()
            resume.wait(WAIT)
            return False

    host = Host(cpu_workers=1).start()
    busy = held()
    busy_call = host.run_cpu_worker(busy).submit()
    assert busy.started.wait(WAIT)
    assert busy_call.cancel()  # its thread stays busy, no call is pending any more
    token = PausingToken(CancellationSource()._state)
    calls: list[Completion[str]] = []
    caller = threading.Thread(
        target=lambda: calls.append(host.run_cpu_worker(lambda: "a").submit(cancel=token))
    )
    caller.start()
    assert admitted.wait(WAIT)

    with block_dispatcher() as blocker:
        shutdown = ShutdownThread(host, deadline=0.2)
        # Shutdown found nothing pending and now waits for the dispatcher to drain.
        assert wait_until(lambda: completion_dispatcher().statistics().queued >= 1)
        resume.set()
        caller.join(WAIT)
        blocker.release()
        shutdown.join()
    busy.release()

    assert len(calls) == 1
    assert calls[0].wait(0.5), "a call admitted during shutdown never completed"
    assert isinstance(calls[0].exception(0), ShuttingDownError) or calls[0].result(0) == "a"


def test_completion_callbacks_added_before_a_forced_shutdown_each_run_once(
    held: Held,
) -> None:
    host = Host(cpu_workers=1).start()
    blocker = held("late")
    pool_threads: list[threading.Thread] = []

    def body() -> object:
        pool_threads.append(threading.current_thread())
        return blocker()

    calls = [host.run_cpu_worker(body).submit() for _ in range(3)]
    assert blocker.started.wait(WAIT)
    counts = [0, 0, 0]
    for index, call in enumerate(calls):
        call.add_done_callback(lambda _, i=index: counts.__setitem__(i, counts[i] + 1))

    host.shutdown(deadline=0.1)
    blocker.release()
    pool_threads[0].join(WAIT)  # the first call's late finish has been attempted
    _drain()

    assert counts == [1, 1, 1]
    assert all(isinstance(call.exception(0), ShuttingDownError) for call in calls)
