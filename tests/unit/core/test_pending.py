"""`OperationId`, `ReplyRouteId`, `PendingTable`, the `Cell` they complete, and
`DeadlineScan`, the Host's default request deadline.

SC §10: OperationId is two u64 words, never both zero, compared on all 128 bits;
ReplyRouteId is a non-zero u64; the pending entry is registered before submit and every
terminal path (reply, timeout, cancel, shutdown) races for one atomic removal, so the caller
is completed exactly once.

Requests on the Host's default deadline share one timer, the `DeadlineScan`. Its tests use
real `Request` objects on a bare `PendingTable` and a `TimerService` on a `ManualClock`;
nothing else of a Host is involved. Waits for the timer thread are bounded: `probe`
returns once the thread has run everything due at the current time.

Code that runs inside a result's critical section (a finalizer, a signal handler) can
settle another request on the same table: the lock the results share is reentrant.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap
import threading
from collections.abc import Callable

import pytest
from _support import probe, register

from zlink_actors import (
    CancellationSource,
    CancelledError,
    Completion,
    DeadlineExceededError,
    ManualClock,
    OperationId,
    ReplyRouteId,
    ShuttingDownError,
    completion_dispatcher,
)
from zlink_actors._core.clock import TimerHandle, TimerService
from zlink_actors._core.completion import Cell
from zlink_actors._core.pending import DeadlineScan, PendingCell, PendingTable, Request, settle
from zlink_actors.testing import WAIT, finishes

U64_MAX = (1 << 64) - 1


# -- OperationId -----------------------------------------------------------------------


@pytest.mark.parametrize(("high", "low"), [(0, 1), (1, 0), (U64_MAX, U64_MAX), (7, 9)])
def test_operation_id_keeps_both_words(high: int, low: int) -> None:
    operation = OperationId(high, low)

    assert (operation.high, operation.low) == (high, low)
    assert int(operation) == (high << 64) | low


def test_operation_id_is_never_all_zero() -> None:
    with pytest.raises(ValueError, match="zero"):
        OperationId(0, 0)


@pytest.mark.parametrize(("high", "low"), [(-1, 1), (1, -1), (1 << 64, 1), (1, 1 << 64)])
def test_operation_id_words_must_be_unsigned_64_bit(high: int, low: int) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        OperationId(high, low)


@pytest.mark.parametrize(("high", "low"), [(1.0, 1), (1, "1"), (True, 1), (1, None)])
def test_operation_id_words_must_be_ints(high: object, low: object) -> None:
    with pytest.raises(TypeError):
        OperationId(high, low)  # type: ignore[arg-type]


def test_operation_ids_compare_and_hash_on_all_128_bits() -> None:
    same_low = [OperationId(high, 5) for high in (1, 2, 3)]
    same_high = [OperationId(1, low) for low in (5, 6)]

    assert OperationId(1, 5) == OperationId(1, 5)
    assert hash(OperationId(1, 5)) == hash(OperationId(1, 5))
    assert len(set(same_low)) == 3
    assert len(set(same_high)) == 2
    table = {operation: index for index, operation in enumerate(same_low)}
    assert table[OperationId(2, 5)] == 1
    assert OperationId(1, 5) != (1, 5)
    assert OperationId(0, 1) != OperationId(1, 0)


def test_operation_id_is_immutable() -> None:
    operation = OperationId(1, 2)

    with pytest.raises(AttributeError):
        operation.low = 3  # type: ignore[misc]
    assert operation.low == 2


def test_new_operation_ids_are_unique_and_never_zero() -> None:
    operations = [OperationId.new() for _ in range(1000)]

    assert len(set(operations)) == 1000
    assert all(int(operation) != 0 for operation in operations)


# -- ReplyRouteId ----------------------------------------------------------------------


def test_reply_route_id_is_a_non_zero_u64_int() -> None:
    route = ReplyRouteId(U64_MAX)

    assert isinstance(route, int)
    assert route == U64_MAX
    assert ReplyRouteId(1) == 1


@pytest.mark.parametrize("value", [0, -1, 1 << 64])
def test_reply_route_id_rejects_zero_and_out_of_range_values(value: int) -> None:
    with pytest.raises(ValueError, match=r"zero|64-bit"):
        ReplyRouteId(value)


@pytest.mark.parametrize("value", [1.0, "1", True, None])
def test_reply_route_id_rejects_non_ints(value: object) -> None:
    with pytest.raises(TypeError):
        ReplyRouteId(value)  # type: ignore[arg-type]


# -- Cell -----------------------------------------------------------------------------


def test_cell_first_try_set_wins_and_every_handle_sees_it() -> None:
    cell: Cell[str] = Cell()
    before = cell.handle()

    assert cell.try_set("first", None) is True
    assert cell.try_set("second", None) is False
    assert cell.try_set(None, ValueError("late")) is False
    assert before.result() == "first"
    assert cell.handle().result() == "first"


def test_cell_handles_are_distinct_objects() -> None:
    cell: Cell[int] = Cell()

    assert cell.handle() is not cell.handle()


# -- PendingTable ----------------------------------------------------------------------


def _entry() -> PendingCell:
    return PendingCell(threading.RLock())


def test_registered_entries_get_distinct_operation_ids() -> None:
    table = PendingTable()
    first, second = _entry(), _entry()
    register(table, first)
    register(table, second)

    assert isinstance(first.operation_id, OperationId)
    assert first.operation_id != second.operation_id


def test_register_gives_each_entry_a_distinct_non_zero_route() -> None:
    table = PendingTable()
    entries = [_entry() for _ in range(100)]

    routes = [register(table, entry) for entry in entries]

    assert len(set(routes)) == 100
    # Plain ints in process (no subclass instance per call); each one is a valid wire id.
    assert all(type(route) is int and ReplyRouteId(route) == route for route in routes)
    assert [entry.route_id for entry in entries] == routes
    assert len(table) == 100
    assert all(route in table for route in routes)


def test_pop_returns_the_entry_once() -> None:
    table = PendingTable()
    entry = _entry()
    route = register(table, entry)

    assert table.pop(route) is entry
    assert table.pop(route) is None
    assert route not in table


def test_finish_completes_the_caller_once_and_later_paths_lose() -> None:
    table = PendingTable()
    entry = _entry()
    route = register(table, entry)
    handle = entry.handle()

    assert table.finish(route, "reply") is True
    assert table.finish(route, exc=DeadlineExceededError("late")) is False
    assert table.finish(route, exc=CancelledError()) is False

    assert handle.result() == "reply"


def test_finish_of_an_unknown_route_loses() -> None:
    assert PendingTable().finish(ReplyRouteId(12345), "reply") is False


def test_finish_disarms_the_deadline_unregisters_cancellation_then_cancels_the_source() -> None:
    table = PendingTable()
    entry = _entry()
    route = register(table, entry)
    timer_fired: list[int] = []
    entry.deadline = TimerHandle(10.0, lambda: timer_fired.append(1))  # type: ignore[assignment]
    source = CancellationSource()
    hooked: list[int] = []
    entry.registration = source.token._register_internal(lambda: hooked.append(1))
    observed = entry.source = CancellationSource()
    order: list[object] = []
    observed.token._register_internal(lambda: order.append(entry.done()))

    assert table.finish(route, exc=DeadlineExceededError("late"))
    source.cancel()

    assert not entry.deadline.active  # type: ignore[attr-defined]
    assert hooked == []
    assert order == [True]  # the source is cancelled after the caller was completed


def test_a_call_that_ends_with_its_result_leaves_its_source_alone() -> None:
    table = PendingTable()
    entry = _entry()
    route = register(table, entry)
    observed = entry.source = CancellationSource()

    assert table.finish(route, "reply")

    assert not observed.token.cancelled
    assert entry.handle().result() == "reply"


def test_pop_all_removes_every_entry_and_the_caller_settles_each() -> None:
    table = PendingTable()
    entries = [_entry() for _ in range(5)]
    routes = [register(table, entry) for entry in entries]

    popped = table.pop_all()
    for entry in popped:
        settle(entry, exc=ShuttingDownError("stopping"))

    assert set(map(id, popped)) == set(map(id, entries))
    assert len(table) == 0
    assert table.pop_all() == []
    assert all(table.finish(route, "late") is False for route in routes)
    assert all(isinstance(e.handle().exception(), ShuttingDownError) for e in entries)


def test_wait_empty_returns_true_at_once_for_an_empty_table() -> None:
    assert PendingTable().wait_empty(0) is True


def test_wait_empty_returns_false_when_the_timeout_passes_first() -> None:
    table = PendingTable()
    register(table, _entry())

    assert table.wait_empty(0.01) is False


def test_wait_empty_wakes_when_the_last_entry_is_finished() -> None:
    table = PendingTable()
    routes = [register(table, _entry()) for _ in range(3)]
    waiting = threading.Event()
    results: list[bool] = []

    def waiter() -> None:
        waiting.set()
        results.append(table.wait_empty(WAIT))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(WAIT)
    for route in routes:
        table.finish(route, "reply")
    thread.join(WAIT)

    assert results == [True]


def test_wait_empty_wakes_when_pop_all_empties_the_table() -> None:
    table = PendingTable()
    register(table, _entry())
    waiting = threading.Event()
    returned = threading.Event()

    def waiter() -> None:
        waiting.set()
        table.wait_empty(WAIT)
        returned.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(WAIT)
    table.pop_all()
    try:
        assert returned.wait(1.0), "wait_empty() was not woken by pop_all()"
    finally:
        thread.join(WAIT + 1)
    assert len(table) == 0


# -- the terminal race (SC §17 "exactly once", digest §9 stress test) -----------------


class _Racer:
    """One terminal path, run by its own thread for every iteration of the race."""

    def __init__(self, name: str, act: Callable[[PendingTable, ReplyRouteId], bool]) -> None:
        self.name = name
        self.act = act


def _reply(table: PendingTable, route: ReplyRouteId) -> bool:
    return table.finish(route, "reply")


def _timeout(table: PendingTable, route: ReplyRouteId) -> bool:
    return table.finish(route, exc=DeadlineExceededError("timeout"))


def _cancel(table: PendingTable, route: ReplyRouteId) -> bool:
    return table.finish(route, exc=CancelledError())


def _shutdown(table: PendingTable, route: ReplyRouteId) -> bool:
    forced = table.pop_all()
    for entry in forced:
        settle(entry, exc=ShuttingDownError("shutdown"))
    return bool(forced)


RACERS = [
    _Racer("reply", _reply),
    _Racer("timeout", _timeout),
    _Racer("cancel", _cancel),
    _Racer("shutdown", _shutdown),
]


def _outcome(handle: Completion[str]) -> str:
    if handle.cancelled():
        return "cancel"
    error = handle.exception()
    if error is None:
        assert handle.result() == "reply"
        return "reply"
    return {DeadlineExceededError: "timeout", ShuttingDownError: "shutdown"}[type(error)]


@pytest.mark.stress
def test_reply_timeout_cancel_and_shutdown_racing_complete_the_caller_exactly_once() -> None:
    iterations = 2000
    parties = len(RACERS) + 1
    start = threading.Barrier(parties, timeout=WAIT)
    end = threading.Barrier(parties, timeout=WAIT)
    current: list[tuple[PendingTable, ReplyRouteId]] = []
    wins: list[list[str]] = [[] for _ in range(iterations)]
    lock = threading.Lock()

    def run(racer: _Racer) -> None:
        for index in range(iterations):
            start.wait()
            table, route = current[index]
            if racer.act(table, route):
                with lock:
                    wins[index].append(racer.name)
            end.wait()

    threads = [threading.Thread(target=run, args=(racer,)) for racer in RACERS]
    for thread in threads:
        thread.start()

    callbacks = [0] * iterations
    handles: list[Completion[str]] = []
    for index in range(iterations):
        table = PendingTable()
        entry = _entry()
        route = register(table, entry)
        handle = entry.handle()
        handle.add_done_callback(lambda _, i=index: callbacks.__setitem__(i, callbacks[i] + 1))
        handles.append(handle)
        current.append((table, route))
        start.wait()
        end.wait()
        assert len(wins[index]) == 1, wins[index]
        assert len(table) == 0
        # Anything arriving after the winner is dropped.
        assert table.finish(route, "very late") is False

    for thread in threads:
        thread.join(WAIT)
    assert completion_dispatcher().drain(WAIT)

    tally: dict[str, int] = {}
    for index, handle in enumerate(handles):
        assert callbacks[index] == 1
        winner = _outcome(handle)
        assert winner == wins[index][0]
        tally[winner] = tally.get(winner, 0) + 1
    assert sum(tally.values()) == iterations


# -- requests on the Host's default deadline: one timer for all ------------------------


def _request(table: PendingTable, expires: float | None) -> Request:
    req = Request(None, None, None, None, None, table)  # type: ignore[arg-type]
    register(table, req, expires)
    return req


def _submit(table: PendingTable, scan: DeadlineScan, expires: float) -> Request:
    """What `RequestCall` does for a request on the default deadline."""
    req = _request(table, expires)
    if scan.at == math.inf:  # read after the entry is in the table
        scan.arm(expires)
    return req


def _timed_out(req: Request) -> bool:
    return req.done() and isinstance(req._exc, DeadlineExceededError)


# -- PendingTable.expire_due -----------------------------------------------------------


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
    entry = _entry()
    register(table, entry)

    assert table.expire_due(100.0) is None

    assert not own.done()
    assert not entry.done()
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


# -- DeadlineScan ----------------------------------------------------------------------


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


# -- code run inside a result's critical section ---------------------------------------


def test_code_run_inside_a_results_critical_section_can_settle_another_request() -> None:
    # A finalizer run by the collector while a result is being published, or a signal
    # handler, runs on the thread that holds the lock the results share.
    table = PendingTable()
    held = _request(table, None)
    other = _request(table, None)

    def nested() -> None:
        with held._lock:
            assert other.cancel() is True

    assert finishes(nested)
    assert other.done()
    assert not held.done()


# -- written-out copies ----------------------------------------------------------------


def _statements(fn: Callable[..., object]) -> list[str]:
    """The statements of `fn`'s body, as source, without its docstring."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [ast.unparse(statement) for statement in body]


def _stale(
    source: Callable[..., object], copy: Callable[..., object], renames: dict[str, str]
) -> list[str]:
    """What `copy` must open with to be a current copy of `source`'s body (`renames`:
    the source's names as the copy spells them), when it does not; [] when it does."""
    wanted = _statements(source)
    for name, spelled in renames.items():
        wanted = [re.sub(rf"\b{name}\b", spelled, line) for line in wanted]
    return [] if _statements(copy)[: len(wanted)] == wanted else wanted


def test_written_out_copies_match_their_source() -> None:
    # docs/performance.md "What may be written out": a body copied onto a hot path to
    # save a frame opens its copy exactly as the source reads, so that no change of the
    # source can leave the copy behind.
    assert _stale(PendingCell.__init__, Request.__init__, {"lock": "table.cell_lock"}) == []


def test_a_stale_copy_is_refused() -> None:
    class _Stale(PendingCell):
        __slots__ = ()

        def __init__(self, table: PendingTable) -> None:
            self._lock = table.cell_lock
            self._state = 0
            self._value = None
            self._exc = None
            self._listeners = None
            self.expires = None
            self.deadline = None
            self.registration = None
            self.waiter = None  # `source` forgotten

    assert _stale(PendingCell.__init__, _Stale.__init__, {"lock": "table.cell_lock"}) != []
