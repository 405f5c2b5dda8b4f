"""Cancellation contract: `CancellationSource`, `CancellationToken` and `cancel=`.

CS §1 (cooperative; a completed result never changes), CS §2 (pre-cancelled call: validate
first, then complete cancelled without admission), CS §3 / §6 (cancellation, timeout,
shutdown and admission race for one terminal; if cancellation wins nothing starts),
SC §3 (no second terminal after a late finish), digest §9 Tier 1 *Cancellation*.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancellationRegistration,
    CancellationSource,
    CancellationToken,
    CancelledError,
    DeadlineExceededError,
    Host,
    InvalidOperationError,
    ManualClock,
    ShutdownOutcome,
    ShuttingDownError,
    completion_dispatcher,
)
from zlink_actors.testing import WAIT, DispatcherBlocker, HeldJob

Blocker = Callable[[], DispatcherBlocker]
Held = Callable[..., HeldJob[object]]
MakeHost = Callable[..., Host]


def _drain() -> None:
    assert completion_dispatcher().drain(WAIT)


def _cancelled_token() -> CancellationToken:
    source = CancellationSource()
    source.cancel()
    return source.token


# -- tokens and registrations ----------------------------------------------------------


def test_token_reports_cancellation_as_a_bool_property() -> None:
    source = CancellationSource()
    token = source.token

    assert token.cancelled is False
    assert source.cancelled is False
    source.cancel()
    assert token.cancelled is True
    assert source.cancelled is True
    assert source.token is token


def test_registered_callback_runs_once_on_the_dispatcher_not_the_cancelling_thread() -> None:
    source = CancellationSource()
    ran_on: list[int] = []
    registration = source.token.register(lambda: ran_on.append(threading.get_ident()))
    assert isinstance(registration, CancellationRegistration)

    source.cancel()
    source.cancel()
    _drain()

    assert len(ran_on) == 1
    assert ran_on[0] != threading.get_ident()


def test_callback_is_not_run_inline_by_cancel(block_dispatcher: Blocker) -> None:
    source = CancellationSource()
    ran = threading.Event()
    source.token.register(ran.set)

    with block_dispatcher():
        source.cancel()
        assert not ran.is_set()
    _drain()

    assert ran.is_set()


def test_callback_registered_after_cancellation_still_runs_once() -> None:
    token = _cancelled_token()
    calls: list[int] = []

    registration = token.register(lambda: calls.append(1))
    _drain()

    assert calls == [1]
    assert registration.unregister() is False


def test_unregister_before_cancellation_returns_true_and_the_callback_never_runs() -> None:
    source = CancellationSource()
    calls: list[int] = []
    registration = source.token.register(lambda: calls.append(1))

    assert registration.unregister() is True
    assert registration.unregister() is False
    source.cancel()
    _drain()

    assert calls == []


def test_unregister_after_the_callback_ran_returns_false() -> None:
    source = CancellationSource()
    ran = threading.Event()
    registration = source.token.register(ran.set)
    source.cancel()
    _drain()

    assert ran.is_set()
    assert registration.unregister() is False


def test_every_registration_runs_in_registration_order() -> None:
    source = CancellationSource()
    order: list[int] = []
    for index in range(10):
        source.token.register(lambda i=index: order.append(i))

    source.cancel()
    _drain()

    assert order == list(range(10))


def test_raising_registration_is_logged_and_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = CancellationSource()
    ran: list[str] = []

    def raising() -> None:
        raise RuntimeError("registration failure")

    source.token.register(raising)
    source.token.register(lambda: ran.append("after"))

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        source.cancel()
        _drain()

    assert ran == ["after"]
    assert any(
        r.name == "zlink_actors" and r.exc_info and isinstance(r.exc_info[1], RuntimeError)
        for r in caplog.records
    )


def test_register_rejects_a_non_callable() -> None:
    with pytest.raises(TypeError):
        CancellationSource().token.register(None)  # type: ignore[arg-type]


# -- pre-cancelled calls (CS §2) -------------------------------------------------------


def test_pre_cancelled_cpu_call_completes_cancelled_without_running_fn(
    make_host: MakeHost,
) -> None:
    host = make_host(cpu_workers=1)
    ran = threading.Event()

    completion = host.run_cpu_worker(ran.set).submit(cancel=_cancelled_token())

    assert completion.done()
    assert completion.cancelled()
    with pytest.raises(CancelledError):
        completion.result()
    host.run_cpu_worker(lambda: None).submit_sync()  # FIFO: an admitted job ran by now
    assert not ran.is_set()


def test_pre_cancelled_io_call_completes_cancelled_without_calling_async_fn(
    host: Host,
) -> None:
    called = threading.Event()

    async def async_fn(token: CancellationToken) -> object:
        called.set()
        return None

    completion = host.run_io_worker(async_fn).submit(cancel=_cancelled_token())

    assert completion.done()
    assert completion.cancelled()

    async def after(token: CancellationToken) -> None:
        return None

    host.run_io_worker(after).submit_sync()  # the loop is FIFO
    assert not called.is_set()


def test_pre_cancelled_submit_sync_raises_cancelled_error(host: Host) -> None:
    ran = threading.Event()

    with pytest.raises(CancelledError):
        host.run_cpu_worker(ran.set).submit_sync(cancel=_cancelled_token())
    host.run_cpu_worker(lambda: None).submit_sync()
    assert not ran.is_set()


def test_pre_cancelled_call_awaited_in_asyncio_raises_cancelled_error(host: Host) -> None:
    completion = host.run_cpu_worker(lambda: "never").submit(cancel=_cancelled_token())

    async def main() -> object:
        return await completion

    with pytest.raises(CancelledError):
        asyncio.run(main())


def test_pre_cancelled_call_still_validates_one_shot_state_first(host: Host) -> None:
    call = host.run_cpu_worker(lambda: None)
    call.submit().result(WAIT)

    with pytest.raises(InvalidOperationError):
        call.submit(cancel=_cancelled_token())
    with pytest.raises(InvalidOperationError):
        call.submit_sync(cancel=_cancelled_token())


def test_pre_cancelled_call_still_validates_its_arguments_and_host_first() -> None:
    host = Host(cpu_workers=1)  # never started

    with pytest.raises(InvalidOperationError):
        host.run_cpu_worker(lambda: None).submit(cancel=_cancelled_token())
    with pytest.raises(TypeError):
        host.run_cpu_worker(lambda: None).submit(cancel=True)  # type: ignore[arg-type]
    host.shutdown(deadline=WAIT)


# -- cancelling calls in flight --------------------------------------------------------


def test_cancelling_a_completed_call_changes_nothing(host: Host) -> None:
    source = CancellationSource()
    completion = host.run_cpu_worker(lambda: "done").submit(cancel=source.token)
    assert completion.result(WAIT) == "done"
    callbacks: list[object] = []
    completion.add_done_callback(lambda c: callbacks.append(c.result()))

    source.cancel()
    assert completion.cancel() is False
    _drain()

    assert not completion.cancelled()
    assert completion.result() == "done"
    assert callbacks == ["done"]


def test_cancelling_a_running_cpu_call_ends_the_wait_and_drops_the_late_result(
    make_host: MakeHost, held: Held
) -> None:
    host = make_host(cpu_workers=1)
    blocker = held("late")
    source = CancellationSource()
    completion = host.run_cpu_worker(blocker).submit(cancel=source.token)
    assert blocker.started.wait(WAIT)
    callbacks: list[bool] = []
    completion.add_done_callback(lambda c: callbacks.append(c.cancelled()))

    source.cancel()
    assert completion.wait(WAIT)
    assert completion.cancelled()

    blocker.release()
    host.run_cpu_worker(lambda: None).submit_sync()  # the late finish was attempted
    _drain()
    assert completion.cancelled()
    with pytest.raises(CancelledError):
        completion.result()
    assert callbacks == [True]


def test_cancelling_the_completion_handle_of_a_running_call_races_its_terminal(
    make_host: MakeHost, held: Held
) -> None:
    host = make_host(cpu_workers=1)
    blocker = held("late")
    completion = host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)

    assert completion.cancel() is True
    assert completion.cancelled()
    blocker.release()
    host.run_cpu_worker(lambda: None).submit_sync()

    with pytest.raises(CancelledError):
        completion.result()


def test_cancelling_a_queued_cpu_call_means_fn_never_runs(make_host: MakeHost, held: Held) -> None:
    host = make_host(cpu_workers=1)
    blocker = held()
    host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    source = CancellationSource()
    ran = threading.Event()
    queued = host.run_cpu_worker(ran.set).submit(cancel=source.token)

    source.cancel()
    assert queued.wait(WAIT)
    assert queued.cancelled()
    blocker.release()
    host.run_cpu_worker(lambda: None).submit_sync()

    assert not ran.is_set()


def test_one_token_cancels_every_call_it_was_given_and_no_other(
    make_host: MakeHost, held: Held
) -> None:
    host = make_host(cpu_workers=1)
    blocker = held()
    host.run_cpu_worker(blocker).submit()
    assert blocker.started.wait(WAIT)
    source = CancellationSource()
    tokened = [host.run_cpu_worker(lambda: "x").submit(cancel=source.token) for _ in range(3)]
    untouched = host.run_cpu_worker(lambda: "kept").submit()

    source.cancel()
    for completion in tokened:
        assert completion.wait(WAIT)
        assert completion.cancelled()
    blocker.release()

    assert untouched.result(WAIT) == "kept"


def test_cancelling_an_io_call_cancels_the_workers_token(host: Host) -> None:
    started = threading.Event()
    saw_cancellation = threading.Event()

    async def watch(token: CancellationToken) -> None:
        loop = asyncio.get_running_loop()
        cancelled = asyncio.Event()
        token.register(lambda: loop.call_soon_threadsafe(cancelled.set))
        started.set()
        await asyncio.wait_for(cancelled.wait(), WAIT)
        saw_cancellation.set()

    source = CancellationSource()
    completion = host.run_io_worker(watch).submit(cancel=source.token)
    assert started.wait(WAIT)
    source.cancel()

    assert completion.wait(WAIT)
    assert completion.cancelled()
    assert saw_cancellation.wait(WAIT)


def test_io_workers_token_stays_uncancelled_when_the_call_succeeds(host: Host) -> None:
    tokens: list[CancellationToken] = []

    async def keep(token: CancellationToken) -> str:
        tokens.append(token)
        return "ok"

    assert host.run_io_worker(keep).submit_sync() == "ok"
    _drain()

    assert tokens[0].cancelled is False


def test_deadline_after_cancellation_makes_no_second_terminal(
    make_host: MakeHost, held: Held
) -> None:
    clock = ManualClock()
    host = make_host(cpu_workers=1, clock=clock)
    blocker = held("late")
    source = CancellationSource()
    completion = host.run_cpu_worker(blocker).timeout(1.0).submit(cancel=source.token)
    assert blocker.started.wait(WAIT)
    callbacks: list[bool] = []
    completion.add_done_callback(lambda c: callbacks.append(c.cancelled()))

    source.cancel()
    clock.advance(5.0)
    blocker.release()
    host.run_cpu_worker(lambda: None).submit_sync()
    _drain()

    assert completion.cancelled()
    assert callbacks == [True]


# -- racing terminal paths through the public API --------------------------------------


def _race_one_worker_call() -> tuple[str, int, int]:
    """Release a worker's finish, its deadline, its cancellation and shutdown together.

    Returns the winning path, how many callbacks ran, and how many calls shutdown forced.
    """
    clock = ManualClock()
    host = Host(cpu_workers=1, clock=clock).start()
    barrier = threading.Barrier(4, timeout=WAIT)
    source = CancellationSource()

    def reply() -> str:
        barrier.wait()
        return "reply"

    completion = host.run_cpu_worker(reply).timeout(1.0).submit(cancel=source.token)
    callbacks: list[int] = []
    completion.add_done_callback(lambda _: callbacks.append(1))

    def release(action: Callable[[], object]) -> threading.Thread:
        def run() -> None:
            barrier.wait()
            action()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    racers = [release(lambda: clock.advance(1.0)), release(source.cancel)]
    barrier.wait()
    result = host.shutdown(deadline=1e-4)
    for racer in racers:
        racer.join(WAIT)
    assert completion.wait(WAIT)
    _drain()

    if completion.cancelled():
        winner = "cancel"
    else:
        error = completion.exception()
        if error is None:
            winner = "reply"
            assert completion.result() == "reply"
        elif isinstance(error, DeadlineExceededError):
            winner = "timeout"
        else:
            assert isinstance(error, ShuttingDownError), error
            winner = "shutdown"
    assert (winner == "shutdown") == (result.forced_operations == 1)
    if winner == "shutdown":
        assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    return winner, len(callbacks), result.forced_operations


@pytest.mark.stress
def test_reply_timeout_cancel_and_shutdown_racing_on_a_worker_call_complete_it_once() -> None:
    winners: dict[str, int] = {}
    for _ in range(300):
        winner, callbacks, forced = _race_one_worker_call()
        assert callbacks == 1
        assert forced in (0, 1)
        winners[winner] = winners.get(winner, 0) + 1

    assert sum(winners.values()) == 300
