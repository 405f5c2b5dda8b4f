"""The Host's default request deadline: one timer for every request on it.

Requests here are real `Request` objects on a bare `PendingTable` and a `TimerService` on
a `ManualClock`; nothing else of a Host is involved. Waits for the timer thread are
bounded: `probe` returns once the thread has run everything due at the current time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest
from _support import probe

from zlink_actors import DeadlineExceededError, ManualClock
from zlink_actors._completion import Completion
from zlink_actors._operation import DeadlineScan, PendingEntry, PendingTable, Request
from zlink_actors._timer import TimerHandle, TimerService
from zlink_actors.testing import WAIT, finishes


def _request(table: PendingTable, expires: float | None) -> Request:
    return Request(None, None, None, None, None, table, expires)


def _submit(table: PendingTable, scan: DeadlineScan, expires: float) -> Request:
    """What `RequestCall` does for a request on the default deadline."""
    req = _request(table, expires)
    if scan.at == math.inf:  # read after the entry is in the table
        scan.arm(expires)
    return req


def _timed_out(req: Request) -> bool:
    return req.done() and isinstance(req._exc, DeadlineExceededError)


# -- PendingTable.expire_due -------------------------------------------------------------


def test_expire_due_expires_what_is_due_in_order_and_returns_the_next_deadline() -> None:
    table = PendingTable()
    due = [_request(table, 1.0), _request(table, 2.0)]
    later = _request(table, 3.5)

    assert table.expire_due(2.0) == 3.5

    assert all(_timed_out(req) for req in due)
    assert not later.done()
    assert len(table) == 1


def test_expire_due_returns_none_when_nothing_on_the_default_deadline_is_pending() -> None:
    table = PendingTable()
    own = _request(table, None)  # a request with a timeout of its own
    entry = PendingEntry(own)
    table.register(entry)

    assert table.expire_due(100.0) is None

    assert not own.done()
    assert len(table) == 2


def test_expire_due_looks_past_many_entries_with_deadlines_of_their_own() -> None:
    table = PendingTable()
    own = [_request(table, None) for _ in range(200)]
    defaulted = _request(table, 1.0)
    following = _request(table, 9.0)

    assert table.expire_due(1.0) == 9.0

    assert _timed_out(defaulted)
    assert not any(req.done() for req in own)
    assert not following.done()


def test_an_answered_request_is_gone_from_the_scan() -> None:
    table = PendingTable()
    answered = _request(table, 1.0)
    answered.reply("pong", None)

    assert table.expire_due(5.0) is None
    assert Completion(answered).result() == "pong"


# -- DeadlineScan ------------------------------------------------------------------------


def test_one_timer_expires_each_request_at_its_own_deadline(
    clock: ManualClock, service: TimerService
) -> None:
    table = PendingTable()
    scan = DeadlineScan(table, service)
    first = _submit(table, scan, 2.0)
    second = _submit(table, scan, 2.5)
    third = _submit(table, scan, 3.0)
    assert scan.at == 2.0
    assert service.pending() == 1  # one timer for all three

    clock.advance(2.0)
    assert isinstance(Completion(first).exception(WAIT), DeadlineExceededError)
    probe(service, clock)
    assert not second.done()
    assert not third.done()
    assert scan.at == 2.5

    clock.advance(0.5)
    assert isinstance(Completion(second).exception(WAIT), DeadlineExceededError)
    probe(service, clock)
    assert not third.done()

    clock.advance(0.5)
    assert isinstance(Completion(third).exception(WAIT), DeadlineExceededError)
    probe(service, clock)
    assert scan.at == math.inf
    assert service.pending() == 0


def test_answered_requests_leave_nothing_on_the_timer(
    clock: ManualClock, service: TimerService
) -> None:
    table = PendingTable()
    scan = DeadlineScan(table, service)
    for n in range(500):
        _submit(table, scan, 5.0).reply(n, None)
    assert len(table) == 0
    assert service.pending() == 1  # the scan armed by the first request, nothing per call

    clock.advance(5.0)
    probe(service, clock)

    assert scan.at == math.inf
    assert service.pending() == 0


def test_arm_keeps_the_earlier_scan_and_moves_a_later_one_forward(
    clock: ManualClock, service: TimerService
) -> None:
    scan = DeadlineScan(PendingTable(), service)

    scan.arm(4.0)
    scan.arm(6.0)
    assert scan.at == 4.0
    assert service.pending() == 1

    scan.arm(1.0)
    assert scan.at == 1.0
    assert service.pending() == 1  # the 4 s scan was cancelled


def test_a_request_registered_just_after_a_scan_read_the_table_still_expires(
    clock: ManualClock, service: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interleaving the invariant is about, made deterministic: a submitter runs
    # right after the scan has read the table, before the scan decides what comes next.
    table = PendingTable()
    scan = DeadlineScan(table, service)
    first = _submit(table, scan, 1.0)
    late: list[Request] = []
    read_table = table.expire_due

    def then_register(now: float) -> float | None:
        following = read_table(now)
        if not late:
            late.append(_submit(table, scan, now + 1.0))
        return following

    monkeypatch.setattr(table, "expire_due", then_register)
    clock.advance(1.0)
    assert isinstance(Completion(first).exception(WAIT), DeadlineExceededError)
    probe(service, clock)
    assert len(late) == 1
    assert not late[0].done()
    assert scan.at == 2.0

    clock.advance(1.0)
    assert isinstance(Completion(late[0]).exception(WAIT), DeadlineExceededError)


def test_requests_registering_while_scans_run_are_never_left_without_a_deadline(
    clock: ManualClock, service: TimerService
) -> None:
    # The invariant under races: submitters register and check `at` while the timer
    # thread scans, expires and re-arms. Every request must end timed out.
    table = PendingTable()
    scan = DeadlineScan(table, service)
    timeout = 1.0
    submitted: list[Request] = []
    lock = threading.Lock()
    start = threading.Barrier(3)

    def submitter() -> None:
        start.wait(WAIT)
        for _ in range(2000):
            req = _submit(table, scan, clock.monotonic() + timeout)
            with lock:
                submitted.append(req)

    threads = [threading.Thread(target=submitter) for _ in range(2)]
    for thread in threads:
        thread.start()
    start.wait(WAIT)
    while any(thread.is_alive() for thread in threads):
        clock.advance(0.25)  # scans keep firing while requests register
    for thread in threads:
        thread.join(WAIT)

    clock.advance(timeout)
    deadline_passed = [Completion(req).exception(WAIT) for req in submitted]

    assert len(submitted) == 4000
    assert all(isinstance(exc, DeadlineExceededError) for exc in deadline_passed)
    assert len(table) == 0


def test_an_interrupted_arm_leaves_arming_to_the_next_request(
    clock: ManualClock, service: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KeyboardInterrupt inside `submit()` may land while a request arms the scan: what
    # it leaves behind must never claim a scan that was not scheduled.
    table = PendingTable()
    scan = DeadlineScan(table, service)

    def interrupted(when: float, fn: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(service, "call_at", interrupted)
    with pytest.raises(KeyboardInterrupt):
        scan.arm(1.0)
    monkeypatch.undo()
    assert scan.at == math.inf

    req = _submit(table, scan, 1.0)
    clock.advance(1.0)
    assert isinstance(Completion(req).exception(WAIT), DeadlineExceededError)


def test_a_request_submitted_while_arm_runs_on_the_same_thread_arms_too(
    clock: ManualClock, service: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A signal handler that submits a request can land inside `arm`.
    table = PendingTable()
    scan = DeadlineScan(table, service)
    schedule = service.call_at
    nested: list[Request] = []
    landed: list[bool] = []

    def call_at(when: float, fn: Callable[[], object]) -> TimerHandle:
        if not landed:  # the "handler" runs once, inside the outer call
            landed.append(True)
            nested.append(_submit(table, scan, when + 0.5))
        return schedule(when, fn)

    monkeypatch.setattr(service, "call_at", call_at)
    outer: list[Request] = []
    assert finishes(lambda: outer.append(_submit(table, scan, 1.0)))
    monkeypatch.undo()
    assert scan.at == 1.0

    clock.advance(1.5)
    assert isinstance(Completion(outer[0]).exception(WAIT), DeadlineExceededError)
    assert isinstance(Completion(nested[0]).exception(WAIT), DeadlineExceededError)


def test_a_scan_armed_while_another_fires_stays_the_one_scheduled(
    clock: ManualClock, service: TimerService
) -> None:
    # The firing scan's handle has given up its `fn`; an earlier scan armed at that
    # moment replaces it. The firing one must not forget the new one (that would let
    # the next arm schedule a second scan, and the two would run side by side).
    scan = DeadlineScan(PendingTable(), service)
    scan.arm(1.0)
    firing = scan._handle
    assert firing is not None
    firing.fn = None  # what `TimerHandle.fire` does before it calls back
    scan.arm(0.5)
    armed = scan._handle

    scan._scan()  # the callback of the handle that fired

    assert scan._handle is armed
    assert scan.at == 0.5
    scan.arm(0.7)
    assert service.pending() == 1
