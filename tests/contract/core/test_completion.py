"""`Completion` / `CompletionSource` contract.

SC §2 ("Application-completed results and bounded observation", stage isolation),
SC §11 (callbacks on a new turn), digest §4 (sync terminators) and digest §5 (stage isolation).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancelledError,
    Completion,
    CompletionSource,
    DeadlineExceededError,
    InvalidOperationError,
    completion_dispatcher,
)
from zlink_actors.testing import WAIT


def _drain() -> None:
    assert completion_dispatcher().drain(WAIT)


# -- first completion wins -------------------------------------------------------------


def test_first_set_result_wins_and_later_attempts_return_false() -> None:
    source: CompletionSource[str] = CompletionSource()

    assert source.set_result("first") is True
    assert source.set_result("second") is False
    assert source.set_exception(ValueError("late")) is False
    assert source.cancel() is False
    assert source.completion.result() == "first"


def test_first_set_exception_wins_and_later_attempts_return_false() -> None:
    source: CompletionSource[str] = CompletionSource()
    error = ValueError("first")

    assert source.set_exception(error) is True
    assert source.set_result("late") is False
    assert source.cancel() is False
    assert source.completion.exception() is error


def test_source_cancel_wins_and_every_handle_ends_cancelled() -> None:
    source: CompletionSource[str] = CompletionSource()
    handles = [source.completion for _ in range(3)]

    assert source.cancel() is True
    assert source.set_result("late") is False
    for handle in handles:
        assert handle.done()
        assert handle.cancelled()
        with pytest.raises(CancelledError):
            handle.result()


def _race_to_complete(source: CompletionSource[int], racers: int) -> list[int]:
    barrier = threading.Barrier(racers)
    wins: list[int] = []
    lock = threading.Lock()

    def attempt(index: int) -> None:
        barrier.wait(WAIT)
        if source.set_result(index):
            with lock:
                wins.append(index)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    return wins


def test_concurrent_completion_attempts_have_exactly_one_winner() -> None:
    for _ in range(200):
        source: CompletionSource[int] = CompletionSource()
        wins = _race_to_complete(source, racers=4)
        assert len(wins) == 1
        assert source.completion.result() == wins[0]


# -- every handle sees the same result -------------------------------------------------


def test_completion_returns_a_fresh_handle_on_each_access() -> None:
    source: CompletionSource[int] = CompletionSource()

    assert source.completion is not source.completion


def test_every_handle_observes_the_same_result_object() -> None:
    source: CompletionSource[object] = CompletionSource()
    early = source.completion
    value = object()
    source.set_result(value)
    late = source.completion

    assert early.result() is value
    assert late.result() is value


def test_every_handle_observes_the_same_exception_object() -> None:
    source: CompletionSource[int] = CompletionSource()
    early = source.completion
    error = KeyError("boom")
    source.set_exception(error)
    late = source.completion

    assert early.exception() is error
    assert late.exception() is error
    with pytest.raises(KeyError) as raised:
        late.result()
    assert raised.value is error


def test_exception_returns_none_for_a_successful_result() -> None:
    source: CompletionSource[int] = CompletionSource()
    source.set_result(3)

    assert source.completion.exception() is None


def test_set_exception_rejects_a_non_exception() -> None:
    source: CompletionSource[int] = CompletionSource()

    with pytest.raises(TypeError):
        source.set_exception("not an exception")  # type: ignore[arg-type]
    assert not source.done()


# -- handle cancellation is isolated (SC §2 stage isolation) ---------------------------


def test_cancelling_one_handle_ends_only_that_handles_wait() -> None:
    source: CompletionSource[str] = CompletionSource()
    cancelled = source.completion
    other = source.completion

    assert cancelled.cancel() is True

    assert cancelled.done()
    assert cancelled.cancelled()
    with pytest.raises(CancelledError):
        cancelled.result()
    assert not other.done()
    assert not source.done()
    # The shared result was untouched, so the source still completes it.
    assert source.set_result("value") is True
    assert other.result() == "value"
    assert not other.cancelled()
    with pytest.raises(CancelledError):
        cancelled.result()


def test_cancelling_a_handle_wakes_a_thread_blocked_on_that_handle() -> None:
    source: CompletionSource[str] = CompletionSource()
    handle = source.completion
    outcome: list[BaseException] = []
    waiting = threading.Event()

    def observe() -> None:
        waiting.set()
        try:
            handle.result(timeout=WAIT)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=observe)
    thread.start()
    assert waiting.wait(WAIT)
    assert handle.cancel() is True
    thread.join(WAIT)

    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], CancelledError)
    assert not source.done()


def test_cancelling_one_handle_does_not_wake_a_thread_blocked_on_another() -> None:
    source: CompletionSource[str] = CompletionSource()
    watched = source.completion
    results: list[str] = []
    waiting = threading.Event()

    def observe() -> None:
        waiting.set()
        results.append(watched.result(timeout=WAIT))

    thread = threading.Thread(target=observe)
    thread.start()
    assert waiting.wait(WAIT)
    assert source.completion.cancel() is True
    assert not watched.wait(0.05)

    source.set_result("value")
    thread.join(WAIT)
    assert results == ["value"]


def test_cancel_returns_false_once_the_result_is_settled() -> None:
    source: CompletionSource[str] = CompletionSource()
    handle = source.completion
    source.set_result("value")

    assert handle.cancel() is False
    assert not handle.cancelled()
    assert handle.result() == "value"


def test_cancelling_a_handle_on_a_finished_result_changes_no_other_handle() -> None:
    source: CompletionSource[str] = CompletionSource()
    source.set_result("value")
    first = source.completion
    second = source.completion

    assert first.cancel() is False
    assert second.cancel() is False

    for handle in (first, second, source.completion):
        assert not handle.cancelled()
        assert handle.result() == "value"


def test_cancelling_a_cancelled_handle_again_returns_false() -> None:
    handle = CompletionSource[int]().completion

    assert handle.cancel() is True
    assert handle.cancel() is False
    assert handle.cancelled()


def test_exception_on_a_cancelled_handle_raises_cancelled_error() -> None:
    handle = CompletionSource[int]().completion
    handle.cancel()

    with pytest.raises(CancelledError):
        handle.exception()


def test_awaitables_of_one_source_are_isolated_from_each_other() -> None:
    source: CompletionSource[str] = CompletionSource()
    first = source.completion
    second = source.completion

    async def main() -> tuple[BaseException | None, str]:
        async def await_first() -> BaseException | None:
            try:
                await first
            except CancelledError as exc:
                return exc
            return None

        first_task = asyncio.ensure_future(await_first())
        second_task = asyncio.ensure_future(second)
        await asyncio.sleep(0)  # both tasks are now suspended on their handle
        first.cancel()
        cancelled = await first_task
        assert not second_task.done()
        source.set_result("value")
        return cancelled, await second_task

    cancelled, value = asyncio.run(main())

    assert isinstance(cancelled, CancelledError)
    assert value == "value"


# -- observation with a time limit (SC §2) ---------------------------------------------


@pytest.mark.parametrize("observe", ["result", "exception"])
def test_observation_timeout_raises_builtin_timeout_error_not_deadline_exceeded(
    observe: str,
) -> None:
    handle = CompletionSource[int]().completion

    with pytest.raises(TimeoutError) as raised:
        getattr(handle, observe)(timeout=0.01)

    assert type(raised.value) is TimeoutError
    assert not isinstance(raised.value, DeadlineExceededError)


def test_observation_timeout_neither_completes_nor_cancels_the_result() -> None:
    source: CompletionSource[str] = CompletionSource()
    handle = source.completion

    with pytest.raises(TimeoutError):
        handle.result(timeout=0.01)

    assert not handle.done()
    assert not handle.cancelled()
    assert not source.done()
    assert source.set_result("late") is True
    assert handle.result(timeout=0) == "late"


def test_wait_returns_false_on_timeout_and_true_once_completed() -> None:
    source: CompletionSource[int] = CompletionSource()
    handle = source.completion

    assert handle.wait(timeout=0.01) is False
    assert not source.done()
    source.set_result(1)
    assert handle.wait(timeout=0) is True
    assert handle.wait() is True


def test_blocking_result_wakes_when_completed_from_another_thread() -> None:
    source: CompletionSource[str] = CompletionSource()
    handle = source.completion
    go = threading.Event()

    def complete() -> None:
        assert go.wait(WAIT)
        source.set_result("from another thread")

    thread = threading.Thread(target=complete)
    thread.start()
    go.set()
    assert handle.result(timeout=WAIT) == "from another thread"
    thread.join(WAIT)


def test_dropping_the_source_and_other_handles_completes_nothing() -> None:
    source: CompletionSource[str] = CompletionSource()
    kept = source.completion
    calls: list[object] = []
    with_callback = source.completion
    with_callback.add_done_callback(calls.append)
    waited_on = source.completion
    assert waited_on.wait(timeout=0.01) is False

    del with_callback, waited_on, source
    gc.collect()
    _drain()

    assert calls == []
    assert not kept.done()
    assert not kept.cancelled()
    assert kept.wait(timeout=0.01) is False


# -- awaiting --------------------------------------------------------------------------


def test_completion_completed_from_another_thread_can_be_awaited() -> None:
    source: CompletionSource[str] = CompletionSource()

    async def main() -> str:
        threading.Thread(target=source.set_result, args=("awaited",)).start()
        return await source.completion

    assert asyncio.run(main()) == "awaited"


def test_awaiting_a_failed_completion_raises_its_error() -> None:
    source: CompletionSource[int] = CompletionSource()
    error = LookupError("failed")
    source.set_exception(error)

    async def main() -> int:
        return await source.completion

    with pytest.raises(LookupError) as raised:
        asyncio.run(main())
    assert raised.value is error


# -- callbacks (SC §11) ----------------------------------------------------------------


def test_done_callback_receives_the_handle_it_was_added_to() -> None:
    source: CompletionSource[int] = CompletionSource()
    handle = source.completion
    seen: list[Completion[int]] = []
    handle.add_done_callback(seen.append)

    source.set_result(5)
    _drain()

    assert len(seen) == 1
    assert seen[0] is handle


def test_done_callback_runs_once_even_if_completion_is_attempted_again() -> None:
    source: CompletionSource[int] = CompletionSource()
    calls: list[int] = []
    source.completion.add_done_callback(lambda c: calls.append(c.result()))

    source.set_result(1)
    source.set_result(2)
    source.cancel()
    _drain()

    assert calls == [1]


def test_done_callback_on_a_cancelled_handle_runs_once() -> None:
    source: CompletionSource[int] = CompletionSource()
    handle = source.completion
    calls: list[bool] = []
    handle.add_done_callback(lambda c: calls.append(c.cancelled()))

    handle.cancel()
    source.set_result(1)
    _drain()

    assert calls == [True]


def test_add_done_callback_rejects_a_non_callable() -> None:
    with pytest.raises(TypeError):
        CompletionSource[int]().completion.add_done_callback(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("observe", ["result", "exception", "wait"])
def test_blocking_observation_of_unsettled_completion_in_a_callback_raises_invalid_operation(
    observe: str,
) -> None:
    trigger: CompletionSource[None] = CompletionSource()
    unsettled: CompletionSource[int] = CompletionSource()
    errors: list[BaseException] = []

    def callback(_: Completion[None]) -> None:
        try:
            getattr(unsettled.completion, observe)(timeout=WAIT)
        except BaseException as exc:
            errors.append(exc)

    trigger.completion.add_done_callback(callback)
    trigger.set_result(None)
    _drain()

    assert len(errors) == 1
    assert isinstance(errors[0], InvalidOperationError)
    assert "await" in str(errors[0])
    assert not unsettled.done()


def test_observing_a_settled_completion_inside_a_callback_is_allowed() -> None:
    trigger: CompletionSource[int] = CompletionSource()
    settled: CompletionSource[str] = CompletionSource()
    settled.set_result("settled")
    seen: list[object] = []

    def callback(own: Completion[int]) -> None:
        seen.append(own.result())
        seen.append(settled.completion.result())
        seen.append(settled.completion.wait(0))
        seen.append(settled.completion.exception())

    trigger.completion.add_done_callback(callback)
    trigger.set_result(7)
    _drain()

    assert seen == [7, "settled", True, None]


def test_blocking_observation_works_from_an_application_thread() -> None:
    source: CompletionSource[int] = CompletionSource()
    handle = source.completion
    results: list[object] = []

    def application_thread() -> None:
        results.append(handle.wait(WAIT))
        results.append(handle.result(WAIT))

    thread = threading.Thread(target=application_thread)
    thread.start()
    source.set_result(9)
    thread.join(WAIT)

    assert results == [True, 9]


def _callbacks_in_order(add: Callable[[Callable[[object], None]], None], count: int) -> list[int]:
    order: list[int] = []
    for index in range(count):
        add(lambda _, i=index: order.append(i))
    return order


def test_callbacks_of_one_handle_run_in_the_order_they_were_added() -> None:
    source: CompletionSource[int] = CompletionSource()
    handle = source.completion
    order = _callbacks_in_order(handle.add_done_callback, 50)

    source.set_result(0)
    _drain()

    assert order == list(range(50))


def test_callback_added_while_completion_is_being_published_runs_after_earlier_ones() -> None:
    # Regression: a callback added while the result is being published used to be posted
    # ahead of callbacks added earlier to the same handle.
    # Deterministic replay of the window: a listener ahead of `handle` in the cell's
    # listener list pauses the completing thread after the cell is DONE, before the
    # handle's own callbacks are posted.
    entered = threading.Event()
    resume = threading.Event()

    class PausingListener(Completion[int]):
        __slots__ = ()

        def _fire(self) -> None:
            entered.set()
            assert resume.wait(WAIT)
            super()._fire()

    source: CompletionSource[int] = CompletionSource()
    PausingListener(source._cell).add_done_callback(lambda _: None)
    handle = source.completion
    order: list[str] = []
    handle.add_done_callback(lambda _: order.append("added first"))

    completer = threading.Thread(target=source.set_result, args=(1,))
    completer.start()
    assert entered.wait(WAIT)
    handle.add_done_callback(lambda _: order.append("added second"))
    resume.set()
    completer.join(WAIT)
    _drain()

    assert order == ["added first", "added second"]
