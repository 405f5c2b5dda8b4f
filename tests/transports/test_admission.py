"""The `admitted` future of a parked message (issue 26 item 8): a `Future[None]` that
behaves as one (callbacks once, blocking waits with timeouts, `concurrent.futures.wait`)
and costs about 120 bytes where a `concurrent.futures.Future` costs about 1.6 KiB."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import tracemalloc
from concurrent.futures import Future
from typing import cast

import pytest

import transports as t
from transports._admission import Admission, Parked
from transports._wire import Kind

from .helpers import WAIT


def test_callbacks_run_once_in_order_before_and_after_it_is_done() -> None:
    admission = Admission()
    seen: list[tuple[str, Future[None]]] = []
    admission.add_done_callback(lambda f: seen.append(("first", f)))
    admission.add_done_callback(lambda f: seen.append(("second", f)))
    assert admission.running()
    assert not admission.done()
    assert not admission.cancel()
    admission.set_result(None)
    admission.add_done_callback(lambda f: seen.append(("late", f)))  # runs at once
    assert seen == [("first", admission), ("second", admission), ("late", admission)]
    assert admission.done()
    assert not admission.running()
    assert not admission.cancelled()
    assert admission.result() is None
    assert admission.exception() is None
    with pytest.raises(cf.InvalidStateError):
        admission.set_exception(t.PeerLost("too late"))


def test_a_failed_admission_raises_its_error_and_a_failing_callback_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = Admission()
    admission.add_done_callback(lambda f: 1 / 0)
    seen: list[BaseException | None] = []
    admission.add_done_callback(lambda f: seen.append(f.exception()))
    lost = t.PeerLost("gone")
    admission.set_exception(lost)
    assert seen == [lost]  # the failing callback did not stop the next one
    assert "exception calling callback" in caplog.text
    with pytest.raises(t.PeerLost):
        admission.result()
    assert admission.exception() is lost


def test_a_blocked_waiter_is_woken_and_a_timeout_is_a_timeout() -> None:
    admission = Admission()
    with pytest.raises(TimeoutError):
        admission.result(0.01)
    with pytest.raises(TimeoutError):
        admission.exception(0)
    started = threading.Event()
    got: list[BaseException | None] = []

    def wait() -> None:
        started.set()
        got.append(admission.exception(WAIT))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert started.wait(WAIT)
    admission.set_exception(t.Closed("closed"))
    waiter.join(WAIT)
    assert not waiter.is_alive()
    assert isinstance(got[0], t.Closed)


def test_concurrent_futures_wait_and_as_completed_take_admissions() -> None:
    first, second, third = Admission(), Admission(), Admission()
    done, pending = cf.wait([first, second], timeout=0)
    assert (done, pending) == (set(), {first, second})
    finisher = threading.Timer(0.05, second.set_result, (None,))
    finisher.start()
    try:
        done, pending = cf.wait([first, second], timeout=WAIT, return_when=cf.FIRST_COMPLETED)
    finally:
        finisher.join()
    assert (done, pending) == ({second}, {first})
    first.set_exception(t.PeerLost("x"))
    third.set_result(None)
    assert set(cf.as_completed([first, second, third], timeout=WAIT)) == {first, second, third}


def test_a_parked_record_is_its_own_future_and_small() -> None:
    count = 2000
    keep: list[Parked] = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            keep.append(Parked(Kind.MESSAGE, 0, (b"e", b"p"), 256 + i))
        each = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert keep[0].future is keep[0]
    assert isinstance(keep[0], Future)
    # A concurrent.futures.Future alone is about 1.6 KiB.
    assert each < 256, each


def _straddled() -> tuple[Admission, Future[None], Admission]:
    """An admission, a plain future and an admission, in the order of their ids (made
    interleaved: the allocator decides where each lands)."""
    made: list[Future[None]] = []
    for _ in range(200):
        made += [Admission(), Future()]
    made.sort(key=id)
    admitted = [i for i, future in enumerate(made) if isinstance(future, Admission)]
    first, last = admitted[0], admitted[-1]
    for middle in made[first + 1 : last]:
        if not isinstance(middle, Admission):
            return cast(Admission, made[first]), middle, cast(Admission, made[last])
    raise AssertionError("no plain future between two admissions by id")


def test_waits_that_mix_admissions_and_other_futures_in_either_order_never_deadlock() -> None:
    # concurrent.futures.wait() takes each future's condition in the order of their ids:
    # two waits, one on (admission, future) and one on (future, admission) with the
    # other admission on the other side of the future's id, once deadlocked when every
    # admission's condition shared one lock.
    below, other, above = _straddled()
    rounds = 2000
    ran = [0, 0]

    def wait(fs: list[Future[None]], slot: int) -> None:
        for _ in range(rounds):
            cf.wait(fs, timeout=0)
            ran[slot] += 1

    threads = [
        threading.Thread(target=wait, args=([below, other], 0), daemon=True),
        threading.Thread(target=wait, args=([other, above], 1), daemon=True),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert ran == [rounds, rounds]  # (a deadlock left both short, their threads blocked)


def _one_race() -> None:
    """Six threads block on four admissions (result, as_completed, wait) while this one
    finishes them; each sees each outcome once."""
    admissions = [Admission() for _ in range(4)]
    go = threading.Barrier(7)
    seen: list[object] = []

    def block(admission: Admission) -> None:
        go.wait(WAIT)
        seen.append(admission.exception(WAIT))

    def completed() -> None:
        go.wait(WAIT)
        seen.append(len(list(cf.as_completed(admissions, timeout=WAIT))))

    def waited() -> None:
        go.wait(WAIT)
        done, _ = cf.wait(admissions, timeout=WAIT)
        seen.append(len(done))

    threads = [threading.Thread(target=block, args=(a,)) for a in admissions]
    threads += [threading.Thread(target=completed), threading.Thread(target=waited)]
    for thread in threads:
        thread.start()
    go.wait(WAIT)
    lost = t.PeerLost("gone")
    admissions[0].set_result(None)
    admissions[1].set_exception(lost)
    admissions[2].set_result(None)
    admissions[3].set_result(None)
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads)
    assert sorted(map(repr, seen)) == sorted(map(repr, [None, lost, None, None, 4, 4]))


def test_many_threads_waiting_in_result_as_completed_and_wait_all_see_it_once() -> None:
    for _ in range(50):  # the finish races the waiters' installation each round
        _one_race()
