"""Completion dispatcher contract.

SC §11: callbacks run on the process-shared dispatcher in a new turn, never on the
completing stack; posting never fails; one callback's exception never blocks the next;
shutdown drains the dispatcher. Digest §9 Tier 1, *Dispatcher*.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    Completion,
    CompletionSource,
    DispatcherStatistics,
    Host,
    ShutdownOutcome,
    ShutdownResult,
    completion_dispatcher,
)
from zlink_actors.testing import WAIT, DispatcherBlocker

Blocker = Callable[[], DispatcherBlocker]


def _drain() -> None:
    assert completion_dispatcher().drain(WAIT)


def test_done_callback_never_runs_on_the_completing_threads_stack(
    block_dispatcher: Blocker,
) -> None:
    source: CompletionSource[int] = CompletionSource()
    ran_on: list[int] = []
    source.completion.add_done_callback(lambda _: ran_on.append(threading.get_ident()))

    with block_dispatcher():
        assert source.set_result(1)
        # Held dispatcher: an inline call would already have happened.
        assert ran_on == []
    _drain()

    assert len(ran_on) == 1
    assert ran_on[0] != threading.get_ident()


def test_callback_added_after_completion_also_runs_on_the_dispatcher(
    block_dispatcher: Blocker,
) -> None:
    source: CompletionSource[int] = CompletionSource()
    source.set_result(1)
    ran_on: list[int] = []

    with block_dispatcher():
        source.completion.add_done_callback(lambda _: ran_on.append(threading.get_ident()))
        assert ran_on == []
    _drain()

    assert len(ran_on) == 1
    assert ran_on[0] != threading.get_ident()


def test_callbacks_run_on_the_same_shared_lane_for_every_completion() -> None:
    threads: set[int] = set()
    sources = [CompletionSource[int]() for _ in range(20)]
    for source in sources:
        source.completion.add_done_callback(lambda _: threads.add(threading.get_ident()))
    for index, source in enumerate(sources):
        source.set_result(index)
    _drain()

    assert len(threads) == 1
    assert threading.get_ident() not in threads


def test_callbacks_run_in_fifo_order_across_completions() -> None:
    sources = [CompletionSource[int]() for _ in range(100)]
    order: list[int] = []
    for source in sources:
        source.completion.add_done_callback(lambda c: order.append(c.result()))
    for index, source in enumerate(sources):
        source.set_result(index)
    _drain()

    assert order == list(range(100))


def test_raising_callback_is_logged_and_does_not_stop_later_callbacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source: CompletionSource[int] = CompletionSource()
    handle = source.completion
    error = RuntimeError("callback failure")
    later: list[int] = []

    def raising(_: Completion[int]) -> None:
        raise error

    handle.add_done_callback(raising)
    handle.add_done_callback(lambda c: later.append(c.result()))
    source.completion.add_done_callback(lambda c: later.append(c.result() + 1))

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        source.set_result(1)
        _drain()

    assert later == [1, 2]
    logged = [r for r in caplog.records if r.name == "zlink_actors" and r.exc_info]
    assert len(logged) == 1
    assert logged[0].levelno == logging.ERROR
    assert logged[0].exc_info is not None
    assert logged[0].exc_info[1] is error


def test_posting_never_fails_and_has_no_bound(block_dispatcher: Blocker) -> None:
    # The older 4,096 cap (digest conflict 5) must not apply: SC makes the lane unbounded.
    count = 5000
    ran: list[int] = []
    with block_dispatcher():
        for index in range(count):
            source: CompletionSource[int] = CompletionSource()
            source.completion.add_done_callback(lambda c: ran.append(c.result()))
            source.set_result(index)
        assert completion_dispatcher().statistics().queued == count
    _drain()

    assert ran == list(range(count))


def test_statistics_count_queued_and_executed_callbacks(block_dispatcher: Blocker) -> None:
    dispatcher = completion_dispatcher()
    _drain()
    before = dispatcher.statistics()
    assert isinstance(before, DispatcherStatistics)
    assert before.queued == 0

    with block_dispatcher() as blocker:
        sources = [CompletionSource[int]() for _ in range(3)]
        for source in sources:
            source.completion.add_done_callback(lambda _: None)
            source.set_result(0)
        held = dispatcher.statistics()
        blocker.release()
    _drain()
    after = dispatcher.statistics()

    assert held.queued == 3
    assert after.queued == 0
    # The blocking callback and the three queued ones ran; drain itself is not counted.
    assert after.executed - before.executed == 4


def test_statistics_is_a_frozen_snapshot() -> None:
    stats = completion_dispatcher().statistics()

    with pytest.raises(AttributeError):
        stats.queued = 1  # type: ignore[misc]


def test_drain_returns_false_when_the_timeout_passes_first(block_dispatcher: Blocker) -> None:
    with block_dispatcher():
        assert completion_dispatcher().drain(0.01) is False
    assert completion_dispatcher().drain(WAIT) is True


def test_drain_inside_a_callback_returns_false_instead_of_deadlocking() -> None:
    source: CompletionSource[None] = CompletionSource()
    results: list[bool] = []
    source.completion.add_done_callback(
        lambda _: results.append(completion_dispatcher().drain(WAIT))
    )
    source.set_result(None)
    _drain()

    assert results == [False]


def test_completion_inside_a_callback_queues_its_callbacks_behind_the_running_one() -> None:
    # A callback that completes another source does not run that source's callbacks on
    # its own stack: they are queued behind it (a new turn, SC §11).
    first: CompletionSource[None] = CompletionSource()
    second: CompletionSource[None] = CompletionSource()
    events: list[str] = []

    def complete_second(_: Completion[None]) -> None:
        second.set_result(None)
        events.append("first callback returned")

    second.completion.add_done_callback(lambda _: events.append("second callback"))
    first.completion.add_done_callback(complete_second)
    first.set_result(None)
    _drain()

    assert events == ["first callback returned", "second callback"]


def test_shutdown_drains_the_dispatcher_before_returning(block_dispatcher: Blocker) -> None:
    host = Host(cpu_workers=1).start()
    source: CompletionSource[None] = CompletionSource()
    ran = threading.Event()
    source.completion.add_done_callback(lambda _: ran.set())
    returned = threading.Event()
    results: list[ShutdownResult] = []

    def shut_down() -> None:
        results.append(host.shutdown(deadline=WAIT))
        returned.set()

    with block_dispatcher() as blocker:
        source.set_result(None)
        thread = threading.Thread(target=shut_down)
        thread.start()
        # The queued callback cannot run, so shutdown must still be draining.
        assert not returned.wait(0.2)
        assert not ran.is_set()
        blocker.release()
        assert returned.wait(WAIT)
    thread.join(WAIT)

    assert ran.is_set()
    assert results[0].outcome is ShutdownOutcome.STOPPED
