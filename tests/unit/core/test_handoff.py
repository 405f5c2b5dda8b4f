"""`_core/handoff.py`: a wake made on a thread that defers its wakes waits for that
thread's next sleep; everywhere else it is made at once.

Each test runs the deferring side on a thread of its own (a thread defers only after it
called `sleeping()`, and keeps doing so until it ends), and every wait is bounded and
asserted, so a wake that never comes fails instead of hanging.
"""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable

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
    woken: list[int] = []

    def body() -> None:
        handoff.sleeping()  # from now on this thread defers
        locks = [_locked() for _ in range(3)]
        waiters = []
        for i, lock in enumerate(locks):

            def wait(i: int = i, lock: _thread.LockType = lock) -> None:
                assert lock.acquire(True, WAIT)
                woken.append(i)

            waiter = threading.Thread(target=wait)
            waiter.start()
            waiters.append(waiter)
        for lock in locks:
            handoff.wake(lock)
        assert all(lock.locked() for lock in locks), "a deferred wake was made early"
        assert woken == []
        handoff.sleeping()  # about to sleep: every kept wake is made
        for waiter in waiters:
            waiter.join(WAIT)
        assert sorted(woken) == [0, 1, 2]

    _on_a_thread(body)


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
