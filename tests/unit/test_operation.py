"""`OperationId`, `ReplyRouteId`, `PendingTable` and the `_Cell` they complete.

SC §10: OperationId is two u64 words, never both zero, compared on all 128 bits;
ReplyRouteId is a non-zero u64; the pending entry is registered before submit and every
terminal path (reply, timeout, cancel, shutdown) races for one atomic removal, so the caller
is completed exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    Completion,
    DeadlineExceededError,
    OperationId,
    ReplyRouteId,
    ShuttingDownError,
    completion_dispatcher,
)
from zlink_actors._completion import _Cell
from zlink_actors._operation import PendingEntry, PendingTable, settle
from zlink_actors._timer import TimerHandle
from zlink_actors.testing import WAIT

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


# -- _Cell -----------------------------------------------------------------------------


def test_cell_first_try_set_wins_and_every_handle_sees_it() -> None:
    cell: _Cell[str] = _Cell()
    before = cell.handle()

    assert cell.try_set("first", None) is True
    assert cell.try_set("second", None) is False
    assert cell.try_set(None, ValueError("late")) is False
    assert before.result() == "first"
    assert cell.handle().result() == "first"


def test_cell_handles_are_distinct_objects() -> None:
    cell: _Cell[int] = _Cell()

    assert cell.handle() is not cell.handle()


# -- PendingTable ----------------------------------------------------------------------


def _entry() -> PendingEntry:
    return PendingEntry(_Cell())


def test_pending_entry_gets_a_fresh_operation_id() -> None:
    first, second = _entry(), _entry()

    assert isinstance(first.operation_id, OperationId)
    assert first.operation_id != second.operation_id


def test_register_gives_each_entry_a_distinct_non_zero_route() -> None:
    table = PendingTable()
    entries = [_entry() for _ in range(100)]

    routes = [table.register(entry) for entry in entries]

    assert len(set(routes)) == 100
    # Plain ints in process (no subclass instance per call); each one is a valid wire id.
    assert all(type(route) is int and ReplyRouteId(route) == route for route in routes)
    assert [entry.route_id for entry in entries] == routes
    assert len(table) == 100
    assert all(route in table for route in routes)


def test_pop_returns_the_entry_once() -> None:
    table = PendingTable()
    entry = _entry()
    route = table.register(entry)

    assert table.pop(route) is entry
    assert table.pop(route) is None
    assert route not in table


def test_finish_completes_the_caller_once_and_later_paths_lose() -> None:
    table = PendingTable()
    entry = _entry()
    route = table.register(entry)
    handle = entry.cell.handle()

    assert table.finish(route, "reply") is True
    assert table.finish(route, exc=DeadlineExceededError("late")) is False
    assert table.finish(route, exc=CancelledError()) is False

    assert handle.result() == "reply"


def test_finish_of_an_unknown_route_loses() -> None:
    assert PendingTable().finish(ReplyRouteId(12345), "reply") is False


def test_finish_cancels_the_timer_unregisters_cancellation_then_runs_on_finish() -> None:
    table = PendingTable()
    entry = _entry()
    route = table.register(entry)
    timer_fired: list[int] = []
    entry.timer = TimerHandle(10.0, lambda: timer_fired.append(1))
    source = CancellationSource()
    hooked: list[int] = []
    entry.registration = source.token._register_internal(lambda: hooked.append(1))
    order: list[object] = []
    entry.on_finish = lambda: order.append(entry.cell.done())

    assert table.finish(route, "reply")
    source.cancel()

    assert not entry.timer.active
    assert hooked == []
    assert order == [True]  # on_finish runs after the caller was completed


def test_pop_all_removes_every_entry_and_the_caller_settles_each() -> None:
    table = PendingTable()
    entries = [_entry() for _ in range(5)]
    routes = [table.register(entry) for entry in entries]

    popped = table.pop_all()
    for entry in popped:
        settle(entry, exc=ShuttingDownError("stopping"))

    assert set(map(id, popped)) == set(map(id, entries))
    assert len(table) == 0
    assert table.pop_all() == []
    assert all(table.finish(route, "late") is False for route in routes)
    assert all(isinstance(e.cell.handle().exception(), ShuttingDownError) for e in entries)


def test_wait_empty_returns_true_at_once_for_an_empty_table() -> None:
    assert PendingTable().wait_empty(0) is True


def test_wait_empty_returns_false_when_the_timeout_passes_first() -> None:
    table = PendingTable()
    table.register(_entry())

    assert table.wait_empty(0.01) is False


def test_wait_empty_wakes_when_the_last_entry_is_finished() -> None:
    table = PendingTable()
    routes = [table.register(_entry()) for _ in range(3)]
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
    table.register(_entry())
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
        route = table.register(entry)
        handle = entry.cell.handle()
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
