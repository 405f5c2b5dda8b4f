"""The pending protocol, written once (`_core/pending.py`): `begin`, `block`,
`result_or_cancel` and the one settle of `PendingCell`.

Every call with a result runs these: a local request (`RequestCall._admit`,
`_request_sync`), a remote one (`mesh/outbound.py` `request_to`, `request_sync`), a request
another node sent (`deliver_request`), workers, creates and closes (`Runtime.begin`). The
tests drive them on a real `PendingTable`, `DeadlineScan` and `TimerService` on a
`ManualClock`; the Host is what `begin` reads of one (`_Host`). An interrupt is a real
SIGINT delivered to the main thread while it blocks (`CtrlC`).
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _support import probe

from tests.contract._support import CtrlC, blocked_in_a_wait
from zlink_actors import (
    CancellationSource,
    CancelledError,
    Completion,
    DeadlineExceededError,
    ManualClock,
    NotFoundError,
    ShuttingDownError,
)
from zlink_actors._core.clock import TimerService
from zlink_actors._core.pending import (
    DeadlineScan,
    PendingCell,
    PendingTable,
    ServedRequest,
    SyncRequest,
    begin,
    block,
    result_or_cancel,
    turn_cancellation,
)
from zlink_actors._core.pool import ADMITTED, CLOSED
from zlink_actors._core.state import HostState
from zlink_actors.testing import WAIT, wait_until

#: The Host's default request timeout in these tests.
DEFAULT = 30.0


class _Host:
    """What `begin` reads of a Host (`PendingHost`), with real parts."""

    def __init__(self, timers: TimerService) -> None:
        self.state = HostState.SERVING
        self.pending = PendingTable()
        self.deadlines = DeadlineScan(self.pending, timers)
        self.timers = timers
        self.default_request_timeout = DEFAULT


@pytest.fixture
def host(service: TimerService) -> _Host:
    return _Host(service)


def _entry(host: _Host) -> PendingCell:
    return PendingCell(host.pending.cell_lock)


def _error(entry: PendingCell) -> BaseException | None:
    assert entry.done()
    return entry.outcome()[1]


class _Submit:
    """A submit step that records what it saw of the entry and returns `status`."""

    def __init__(self, host: _Host, entry: PendingCell, status: int | None = ADMITTED) -> None:
        self.host = host
        self.entry = entry
        self.status = status
        self.seen: list[tuple[bool, object]] = []

    def __call__(self, *args: object) -> int | None:
        self.seen.append((self.entry.route_id in self.host.pending, self.entry.deadline))
        return self.status


def _refused(status: int) -> BaseException:
    return NotFoundError(f"refused with status {status}")


# -- begin -------------------------------------------------------------------------------


def test_begin_registers_the_entry_before_it_submits(host: _Host, clock: ManualClock) -> None:
    entry = _entry(host)
    submit = _Submit(host, entry)

    assert begin(host, entry, DEFAULT, clock.monotonic() + DEFAULT, None, submit, (), _refused)

    assert submit.seen == [(True, None)]
    assert entry.route_id in host.pending
    assert not entry.done()


def test_a_sealed_host_ends_the_entry_shutting_down_and_submits_nothing(
    host: _Host, service: TimerService
) -> None:
    host.state = HostState.DRAINING
    entry = _entry(host)
    submit = _Submit(host, entry)

    assert not begin(host, entry, 5.0, 5.0, None, submit, (), _refused)

    assert submit.seen == []
    assert isinstance(_error(entry), ShuttingDownError)
    assert len(host.pending) == 0
    assert service.pending() == 0  # no deadline armed for it


def test_a_refused_submit_ends_the_entry_with_the_refusal(host: _Host) -> None:
    entry = _entry(host)
    submit = _Submit(host, entry, CLOSED)

    assert not begin(host, entry, 5.0, 5.0, None, submit, (), _refused)

    error = _error(entry)
    assert isinstance(error, NotFoundError)
    assert str(error) == f"refused with status {CLOSED}"
    assert entry.deadline is None
    assert len(host.pending) == 0


def test_the_default_timeout_joins_the_deadline_scan(
    host: _Host, clock: ManualClock, service: TimerService
) -> None:
    due = clock.monotonic() + DEFAULT
    entries = [_entry(host) for _ in range(3)]
    for entry in entries:
        assert begin(host, entry, DEFAULT, due, None)

    assert all(entry.expires == due and entry.deadline is None for entry in entries)
    assert host.deadlines.at == due
    assert service.pending() == 1  # one scan for all three

    clock.advance(DEFAULT)
    assert all(isinstance(Completion(e).exception(WAIT), DeadlineExceededError) for e in entries)
    probe(service, clock)
    assert len(host.pending) == 0


def test_another_timeout_gets_a_deadline_of_its_own_armed_after_the_submit(
    host: _Host, clock: ManualClock
) -> None:
    entry = _entry(host)
    submit = _Submit(host, entry)

    assert begin(host, entry, 2.0, clock.monotonic() + 2.0, None, submit, (), _refused)

    assert submit.seen == [(True, None)]  # no deadline yet while it was submitted
    assert entry.expires is None
    assert entry.deadline is not None
    assert host.deadlines.at == math.inf
    clock.advance(2.0)
    assert isinstance(Completion(entry).exception(WAIT), DeadlineExceededError)


def test_a_result_that_won_during_the_submit_leaves_no_deadline_armed(host: _Host) -> None:
    entry = _entry(host)

    def answered(*args: object) -> int:
        host.pending.finish(entry.route_id, "pong")
        return ADMITTED

    assert begin(host, entry, 2.0, 2.0, None, answered, ())

    assert Completion(entry).result() == "pong"
    assert entry.deadline is not None
    assert entry.deadline.fn is None  # disarmed at once: it holds nothing


def test_the_callers_cancellation_races_for_the_entry(host: _Host) -> None:
    source = CancellationSource()
    entry = _entry(host)
    assert begin(host, entry, 5.0, 5.0, source.token)

    source.cancel()

    assert isinstance(_error(entry), CancelledError)
    assert len(host.pending) == 0


def test_a_settled_entry_drops_its_cancellation_hook(host: _Host) -> None:
    source = CancellationSource()
    entry = _entry(host)
    assert begin(host, entry, 5.0, 5.0, source.token)

    assert host.pending.finish(entry.route_id, "pong")
    source.cancel()

    assert entry.outcome() == ("pong", None)


def test_an_interrupt_inside_the_submit_ends_the_entry_cancelled(host: _Host) -> None:
    entry = _entry(host)

    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        begin(host, entry, 5.0, 5.0, None, interrupted, ())

    assert isinstance(_error(entry), CancelledError)
    assert len(host.pending) == 0


# -- the one settle ------------------------------------------------------------------------


def test_settle_runs_on_settled_after_the_result_is_published(host: _Host) -> None:
    req = ServedRequest(None, None, None, None, None, host.pending)  # type: ignore[arg-type]
    seen: list[tuple[object, BaseException | None, bool]] = []
    req.on_settled = lambda value, exc: seen.append((value, exc, req.done()))
    assert begin(host, req, 5.0, 5.0, None)

    assert host.pending.finish(req.route_id, "pong")

    assert seen == [("pong", None, True)]


def test_a_handlers_cancellation_is_cancelled_when_its_request_fails(host: _Host) -> None:
    answered = ServedRequest(None, None, None, None, None, host.pending)  # type: ignore[arg-type]
    failed = ServedRequest(None, None, None, None, None, host.pending)  # type: ignore[arg-type]
    for req in (answered, failed):
        req.on_settled = lambda value, exc: None
        assert begin(host, req, 5.0, 5.0, None)
    tokens = [turn_cancellation(answered), turn_cancellation(failed)]

    host.pending.finish(answered.route_id, "pong")
    host.pending.finish(failed.route_id, exc=DeadlineExceededError("late"))

    assert [token.cancelled for token in tokens] == [False, True]


def test_a_cancellation_asked_for_after_the_request_failed_is_cancelled(host: _Host) -> None:
    req = SyncRequest(None, None, None, None, None, host.pending)  # type: ignore[arg-type]
    assert begin(host, req, None, math.inf, None)
    host.pending.finish(req.route_id, exc=CancelledError())

    assert turn_cancellation(req).cancelled


# -- block ---------------------------------------------------------------------------------


def _answer_from_another_thread(host: _Host, entry: PendingCell, value: object) -> Any:
    def submit(*args: object) -> None:
        threading.Thread(target=host.pending.finish, args=(entry.route_id, value)).start()

    return submit


def test_block_returns_the_value_of_the_path_that_won(host: _Host) -> None:
    entry = _entry(host)

    assert block(host, entry, WAIT, _answer_from_another_thread(host, entry, "pong"), ()) == "pong"
    assert len(host.pending) == 0


def test_block_raises_the_calls_error(host: _Host) -> None:
    entry = _entry(host)
    submit = _Submit(host, entry, CLOSED)

    with pytest.raises(NotFoundError):
        block(host, entry, WAIT, submit, (), _refused)


def test_block_keeps_the_deadline_in_its_own_wait(host: _Host, service: TimerService) -> None:
    entry = _entry(host)
    submit = _Submit(host, entry)

    with pytest.raises(DeadlineExceededError):
        block(host, entry, 0.05, submit, (), _refused)

    assert submit.seen == [(True, None)]
    assert service.pending() == 0  # neither a scan nor a timer entry
    assert len(host.pending) == 0


def test_block_on_a_sealed_host_raises_shutting_down_and_submits_nothing(host: _Host) -> None:
    host.state = HostState.DRAINING
    entry = _entry(host)
    submit = _Submit(host, entry)

    with pytest.raises(ShuttingDownError):
        block(host, entry, WAIT, submit, (), _refused)
    assert submit.seen == []


# -- an interrupt while blocked ------------------------------------------------------------


@pytest.fixture
def ctrl_c(default_sigint: None) -> Iterator[CtrlC]:
    """A real SIGINT for the main thread, sent by `_interrupt_when`."""
    ctrl_c = CtrlC()
    previous = signal.signal(signal.SIGINT, ctrl_c.handle)
    try:
        yield ctrl_c
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_when_blocked(ctrl_c: CtrlC) -> tuple[threading.Thread, threading.Event]:
    """Send Ctrl-C to the main thread once it blocks in a wait after it set the event
    returned (right before the call under test: not in `Thread.start()`'s own wait)."""
    main = threading.main_thread().ident
    assert main is not None
    calling = threading.Event()
    blocked = blocked_in_a_wait(main)

    def interrupt() -> None:
        if wait_until(lambda: calling.is_set() and blocked()):
            ctrl_c.send(main)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread, calling


def _after(calling: threading.Event, call: Callable[[], object]) -> object:
    """Set `calling`, then make the call under test."""
    calling.set()
    return call()


def test_an_interrupt_while_blocked_ends_the_call_cancelled(host: _Host, ctrl_c: CtrlC) -> None:
    entry = _entry(host)
    submit = _Submit(host, entry)
    interrupter, calling = _interrupt_when_blocked(ctrl_c)

    with pytest.raises(KeyboardInterrupt):
        _after(calling, lambda: block(host, entry, WAIT, submit, (), _refused))
    interrupter.join(WAIT)

    assert ctrl_c.raised.is_set()
    assert isinstance(_error(entry), CancelledError)
    assert len(host.pending) == 0


def test_result_or_cancel_ends_an_interrupted_call_cancelled(host: _Host, ctrl_c: CtrlC) -> None:
    entry = _entry(host)
    assert begin(host, entry, DEFAULT, DEFAULT, None)
    interrupter, calling = _interrupt_when_blocked(ctrl_c)

    with pytest.raises(KeyboardInterrupt):
        _after(calling, lambda: result_or_cancel(Completion(entry, entry)))
    interrupter.join(WAIT)

    assert isinstance(_error(entry), CancelledError)
    assert len(host.pending) == 0


def test_result_or_cancel_leaves_a_call_that_refuses_cancellation(
    host: _Host, ctrl_c: CtrlC
) -> None:
    entry = _entry(host)
    assert begin(host, entry, None, math.inf, None)
    interrupter, calling = _interrupt_when_blocked(ctrl_c)

    with pytest.raises(KeyboardInterrupt):
        _after(calling, lambda: result_or_cancel(Completion(entry, lambda: False)))
    interrupter.join(WAIT)

    assert not entry.done()
    assert host.pending.finish(entry.route_id, "later")


def test_result_or_cancel_passes_the_calls_own_error_through(host: _Host) -> None:
    entry = _entry(host)
    assert begin(host, entry, None, math.inf, None)
    host.pending.finish(entry.route_id, exc=NotFoundError("gone"))

    with pytest.raises(NotFoundError):
        result_or_cancel(Completion(entry, entry))
