"""`_core/handoff.py`: a wake made on a thread that defers its wakes waits for that
thread's next sleep; everywhere else it is made at once.

Each test runs the deferring side on a thread of its own (a thread defers only after it
called `sleeping()`, and keeps doing so until it ends), and every wait is bounded and
asserted, so a wake that never comes fails instead of hanging.
"""

from __future__ import annotations

import _thread
import logging
import threading
from collections.abc import Callable

import pytest

from zlink_actors._core import handoff
from zlink_actors._core.completion import CompletionSource
from zlink_actors.testing import WAIT, wait_until


def _locked() -> _thread.LockType:
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


def _on_a_thread(body: Callable[[], None]) -> None:
    """Run `body` on a new thread; re-raise what it raised; bounded."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "the thread did not finish"
    if failure:
        raise failure[0]


def test_a_wake_on_a_thread_that_never_slept_is_made_at_once() -> None:
    def body() -> None:
        lock = _locked()
        handoff.wake(lock)
        assert not lock.locked()

    _on_a_thread(body)


def test_a_thread_that_declared_its_sleep_keeps_its_wakes_until_its_next_sleep() -> None:
    def body() -> None:
        handoff.sleeping()  # from now on this thread defers
        locks = [_locked() for _ in range(3)]
        for lock in locks:
            handoff.wake(lock)
        # Nobody waits on them: an early release would show here.
        assert all(lock.locked() for lock in locks), "a deferred wake was made early"
        handoff.sleeping()  # about to sleep: every kept wake is made
        assert not any(lock.locked() for lock in locks)

    _on_a_thread(body)


def test_a_kept_wake_reaches_the_thread_that_waits_on_it() -> None:
    woken = threading.Event()
    lock = _locked()

    def wait() -> None:
        if lock.acquire(True, WAIT):
            woken.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:

        def body() -> None:
            handoff.sleeping()
            handoff.wake(lock)
            handoff.sleeping()

        _on_a_thread(body)
        assert woken.wait(WAIT)
    finally:
        waiter.join(WAIT)
    assert not waiter.is_alive()


def test_a_wake_that_fails_is_logged_and_the_others_are_still_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def body() -> None:
        handoff.sleeping()
        first, last = _locked(), _locked()
        handoff.wake(first)
        handoff.wake(_thread.allocate_lock())  # not held: its release fails (a bug)
        handoff.wake(last)
        handoff.sleeping()
        assert not first.locked()
        assert not last.locked()
        again = _locked()
        handoff.wake(again)
        handoff.wake(_thread.allocate_lock())
        handoff.flush()
        assert not again.locked()

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        _on_a_thread(body)
    assert caplog.text.count("a deferred wake failed") == 2


def test_a_deferring_thread_makes_its_wakes_before_a_record_reaches_a_log_handler() -> None:
    """A handler may need a lock the woken thread holds while it waits (a caller blocked
    in `submit_sync()` inside that same handler): the filter runs before any handler."""
    lock = _locked()
    seen: list[bool] = []

    class Probe(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(lock.locked())

    probe = Probe()
    logger = logging.getLogger("zlink_actors")
    logger.addHandler(probe)
    try:

        def body() -> None:
            handoff.sleeping()
            handoff.wake(lock)
            assert lock.locked()
            logger.error("a record from a deferring thread")

        _on_a_thread(body)
    finally:
        logger.removeHandler(probe)
    assert seen == [False]


def test_wakes_of_one_thread_never_defer_another_threads_wakes() -> None:
    deferring = threading.Event()
    done = threading.Event()

    def body() -> None:
        handoff.sleeping()
        deferring.set()
        assert done.wait(WAIT)

    thread = threading.Thread(target=body)
    thread.start()
    try:
        assert deferring.wait(WAIT)
        lock = _locked()
        handoff.wake(lock)  # this thread never declared a sleep
        assert not lock.locked()
    finally:
        done.set()
        thread.join(WAIT)
    assert not thread.is_alive()


def test_flush_makes_the_kept_wakes_and_the_thread_keeps_deferring() -> None:
    def body() -> None:
        handoff.sleeping()
        first = _locked()
        handoff.wake(first)
        assert first.locked()
        handoff.flush()
        assert not first.locked()
        second = _locked()
        handoff.wake(second)
        assert second.locked(), "the thread stopped deferring after a flush"
        handoff.flush()
        assert not second.locked()

    _on_a_thread(body)


def test_a_deferring_thread_that_blocks_on_a_completion_makes_its_wakes_first() -> None:
    """The deferring thread settles a result another thread waits for, then blocks on a
    result only that thread can give: without the flush before the block, neither would
    ever run again."""
    asked: CompletionSource[int] = CompletionSource()
    answered: CompletionSource[int] = CompletionSource()

    def helper() -> None:
        answered.set_result(asked.completion.result(WAIT) + 1)

    other = threading.Thread(target=helper)
    other.start()
    try:
        # `helper` is blocked in `result()` (its handle listens), so the settle below
        # has a waiter to wake, and that wake is the one the deferring thread keeps.
        assert wait_until(lambda: asked._cell._listeners is not None)

        def body() -> None:
            handoff.sleeping()
            asked.set_result(41)  # wakes `helper`: kept, since this thread defers
            assert answered.completion.result(WAIT) == 42

        _on_a_thread(body)
    finally:
        other.join(WAIT)
    assert not other.is_alive()
