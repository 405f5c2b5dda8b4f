"""Operation identity and the pending-operation table (SC §9-10).

Every call with a terminal result gets a 128-bit `OperationId` (never all-zero) and a
non-zero 64-bit `ReplyRouteId`. Its pending entry is registered *before* anything is
submitted, so a reply can never arrive ahead of its entry. Every completion path (reply,
remote error, timeout, cancel, shutdown, disconnect) races for one atomic removal from the
table; the path that removes the entry completes the caller once, and the losers do
nothing at all.
"""

from __future__ import annotations

import _thread
import itertools
import math
import secrets
import threading
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from .cancellation import CancellationRegistration, CancellationSource, CancellationToken
from .clock import Clock, Deadline, TimerHandle, TimerService
from .completion import DONE, PENDING, Cell, CellLock, Completion, deliver
from .errors import (
    CancelledError,
    DeadlineExceededError,
    ProtocolError,
    ZlinkError,
    internal_failure,
    shutting_down,
)
from .handoff import wake
from .pool import ADMITTED
from .record import K_REQUEST, Handler, Record
from .state import HostState
from .validation import reply_mismatch

__all__ = [
    "DeadlineScan",
    "FailureCount",
    "OPERATION_HIGH_BYTES",
    "OperationId",
    "PendingCell",
    "PendingHost",
    "PendingTable",
    "ReplyRouteId",
    "Request",
    "ServedRequest",
    "SyncRequest",
    "begin",
    "block",
    "next_route_id",
    "operation_bytes",
    "result_or_cancel",
    "settle",
    "turn_cancellation",
    "turn_deadline",
]

T = TypeVar("T")
_SERVING: Final = HostState.SERVING

_U64: Final = (1 << 64) - 1


class FailureCount(Protocol):
    """Where a request counts a handler that raised (the engine's registry)."""

    handler_failures: int


def _check_u64(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _U64:
        raise ValueError(f"{name} must be an unsigned 64-bit value, got {value}")
    return value


class OperationId:
    """A 128-bit operation identity: two unsigned 64-bit words, never both zero.

    Equality and hashing use all 128 bits. Created by the runtime; the constructor is
    public so the wire can rebuild one.
    """

    __slots__ = ("high", "low")

    high: int
    low: int

    def __init__(self, high: int, low: int) -> None:
        _check_u64("high", high)
        _check_u64("low", low)
        if high == 0 and low == 0:
            raise ValueError("an OperationId is never all-zero")
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "low", low)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("OperationId is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OperationId):
            return NotImplemented
        return self.high == other.high and self.low == other.low

    def __hash__(self) -> int:
        return hash((self.high, self.low))

    def __int__(self) -> int:
        return (self.high << 64) | self.low

    def __repr__(self) -> str:
        return f"OperationId(high={self.high:#018x}, low={self.low:#018x})"

    @classmethod
    def new(cls) -> OperationId:
        """A fresh id: a per-process random high word and a counter low word."""
        return cls(_PROCESS_HIGH, next(_low_counter))


class ReplyRouteId(int):
    """A non-zero unsigned 64-bit id linking a terminal reply to its pending entry."""

    __slots__ = ()

    def __new__(cls, value: int) -> ReplyRouteId:
        _check_u64("ReplyRouteId", value)
        if value == 0:
            raise ValueError("a ReplyRouteId is never zero")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"ReplyRouteId({int(self)})"


_PROCESS_HIGH: Final = secrets.randbits(63) | 1
_HIGH_BYTES: Final = _PROCESS_HIGH.to_bytes(8, "big")
_low_counter = itertools.count(1)
#: The next route id (what `begin` gives an entry), without a frame.
next_route_id: Final = _low_counter.__next__
#: The high word of every `OperationId` this process makes, as bytes (`operation_bytes`).
OPERATION_HIGH_BYTES: Final = _HIGH_BYTES


def operation_bytes(route: int) -> bytes:
    """The 16 bytes of the `OperationId` of the entry registered under `route` (what
    `PendingCell.operation_id` would make), without making the object."""
    return _HIGH_BYTES + route.to_bytes(8, "big")


class PendingCell(Cell[Any]):
    """A result cell that is its own pending entry: the one base of every entry that
    settles (a request, a remote request, a worker's or a create's wait, a close).

    Its maker sets what is its own, then `begin` (or `block`) registers it and arms its
    deadline. Every terminal path (reply, error, deadline, cancellation, shutdown) races
    for its one removal from the table; the winner calls `settle`, once, outside the
    table's lock (SC §11). Its deadline and its cancellation hook are then dropped, the
    caller's result is published, `source` (the cancellation a handler or worker
    observes) is cancelled if the call failed, and `on_settled` runs.
    """

    __slots__ = ("deadline", "expires", "registration", "route_id", "source", "table", "waiter")

    #: Called `(value, exc)` by the winner right after the caller's result is published:
    #: a served request's reply (`ServedRequest`), a remote request's clean-up. None: none.
    on_settled: Callable[[object, BaseException | None], None] | None = None

    route_id: int
    table: PendingTable
    #: When the Host's default deadline passes (`DeadlineScan`); None: none, or
    #: `deadline` keeps it.
    expires: float | None
    deadline: _Deadline | None
    registration: CancellationRegistration | None
    #: Cancelled if the call ends without its result (`turn_cancellation`, a worker's
    #: token); made by whoever needs it.
    source: CancellationSource | None
    #: Set: the call's only observer is a thread blocked on it (`block`): no handle, no
    #: listener; the winner stores the outcome and releases it.
    waiter: _thread.LockType | None

    def __init__(self, lock: CellLock) -> None:
        """A pending cell guarded by `lock` (a pending table's `cell_lock`: no lock
        object per call), not registered yet (`begin`)."""
        # Written out in `Request.__init__`; keep in step: the test that refuses a stale
        # copy is tests/unit/core/test_pending.py `test_written_out_copies_match_their_source`.
        self._lock = lock
        self._state = PENDING
        self._value = None
        self._exc = None
        self._listeners = None
        self.expires = None
        self.deadline = None
        self.registration = None
        self.source = None
        self.waiter = None

    @property
    def operation_id(self) -> OperationId:
        """The registered call's identity, derived from the process word and its route
        id (an in-process call pays for no 128-bit object unless something asks)."""
        return OperationId(_PROCESS_HIGH, self.route_id)

    def settle(self, value: object, exc: BaseException | None) -> None:
        """Complete the caller; only the winner of the table removal calls this."""
        deadline = self.deadline
        if deadline is not None:
            deadline.fn = None  # disarmed: what stays in the timer FIFO holds nothing
        registration = self.registration
        if registration is not None:
            registration.unregister()
        waiter = self.waiter
        if waiter is None:
            with self._lock:  # pending: only the winner settles
                if self._listeners is None:
                    # `_publish` with nothing to notify: a reply that comes before anyone
                    # waits, and a served request's (its only observer is the mesh).
                    self._value = value
                    self._exc = exc
                    self._state = DONE
                    notify = None
                else:
                    notify = self._publish(value, exc)
            if notify is not None:
                deliver(notify)
        else:  # no handle and no listener: its blocked caller reads these (`block`)
            self._value = value
            self._exc = exc
            self._state = DONE
            wake(waiter)  # on the I/O thread: as it goes to sleep (`handoff`)
        if exc is not None:
            source = self.source  # read after the outcome is stored (`turn_cancellation`)
            if source is not None:
                source.cancel()
        on_settled = self.on_settled
        if on_settled is not None:
            on_settled(value, exc)

    def cancel(self) -> bool:
        """Cancellation path (caller's token or `Completion.cancel()`): races the other
        terminals through the pending table; True if it won."""
        return self.table.finish(self.route_id, exc=CancelledError())

    #: An entry is its own `Completion`'s canceller (no bound method per call).
    __call__ = cancel

    def expire(self) -> None:
        """Deadline path (`arm`): the call's deadline passed."""
        self.table.finish(
            self.route_id, exc=DeadlineExceededError("no result within the call's deadline")
        )

    def arm(self, timers: TimerService, timeout: float) -> None:
        """Give the registered entry a deadline of its own, `timeout` seconds from now;
        disarmed at once if another path already won."""
        deadline = self.deadline = _Deadline()
        deadline.fn = self
        timers.schedule_after(timeout, deadline)
        if self.route_id not in self.table._entries:
            deadline.fn = None


class PendingHost(Protocol):
    """What the pending protocol reads of a Host (the engine's `Runtime`)."""

    state: HostState
    pending: PendingTable
    deadlines: DeadlineScan
    timers: TimerService
    default_request_timeout: float


def begin(
    host: PendingHost,
    entry: PendingCell,
    timeout: float | None,
    due: float,
    cancel: CancellationToken | None,
    submit: Callable[..., int | None] | None = None,
    args: tuple[Any, ...] = (),
    refused: Callable[[int], BaseException] | None = None,
) -> bool:
    """The pending protocol of one call, the only copy: register `entry` before anything
    is submitted (SC §10); end it with `ShuttingDownError` if shutdown sealed admission
    meanwhile; hook the caller's `cancel`; `submit(*args)` (a pool status other than
    `ADMITTED` ends it with `refused(status)`; None: submitted); then its deadline,
    `due` (Host clock) after `timeout` seconds: on the Host's default timeout the one
    deadline scan keeps it (`DeadlineScan`: no timer entry each), else a timer entry
    of its own (None: no deadline). An interrupt (KeyboardInterrupt) before the caller
    holds its result ends it as cancelled: nobody could observe it.

    False if shutdown or the submit refused it (it is then already ended). Every ending
    is the entry's: its caller observes `entry` (a `Completion` of it, or `block`)."""
    table = host.pending
    scanned = timeout == host.default_request_timeout
    if scanned:
        entry.expires = due  # set before the entry is visible to a scan
    entry.table = table
    entry.route_id = route = next_route_id()
    try:
        table._entries[route] = entry
        if scanned and host.deadlines.at == math.inf:
            host.deadlines.arm(due)  # read after registering: the scan's invariant
        if host.state is not _SERVING:
            table.finish(route, exc=shutting_down())
            return False
        if cancel is not None:
            entry.registration = cancel._register_internal(entry.cancel)
        if submit is not None:
            status = submit(*args)
            if status is not None and status != ADMITTED:
                assert refused is not None
                table.finish(route, exc=refused(status))
                return False
        if not scanned and timeout is not None:
            # After the submit: the thread it woke runs meanwhile; a reply that already
            # won leaves nothing to arm.
            entry.arm(host.timers, timeout)
    except BaseException:
        table.finish(route, exc=CancelledError())
        raise
    return True


#: Seconds between two looks at a result a late winner is storing (`block`).
_STORE_WAIT: Final = 0.001


def block(
    host: PendingHost,
    entry: PendingCell,
    timeout: float,
    submit: Callable[..., int | None],
    args: tuple[Any, ...],
    refused: Callable[[int], BaseException] | None = None,
) -> Any:
    """`begin` for a caller that blocks for the result (`submit_sync()` on the real clock,
    `timeout` at most `threading.TIMEOUT_MAX`): no handle, no deadline entry; the caller
    keeps the deadline in its own timed wait and races for the terminal like any other
    path when it passes. Returns the value or raises the call's error. An interrupt
    while it waits ends the call as cancelled and propagates."""
    entry.waiter = waiter = _thread.allocate_lock()
    waiter.acquire()
    try:
        begin(host, entry, None, math.inf, None, submit, args, refused)
        if not waiter.acquire(True, timeout):
            late = DeadlineExceededError("no result within the call's deadline")
            host.pending.finish(entry.route_id, exc=late)
            # The winner stores the outcome, then releases the waiter: at once, or (the
            # I/O thread) as it goes to sleep. Read the outcome as soon as it is stored:
            # that thread may be waiting for a lock this caller holds.
            while entry._state is not DONE and not waiter.acquire(True, _STORE_WAIT):
                pass
    except BaseException:
        # Interrupted (KeyboardInterrupt): nobody is left to observe the result (an
        # entry interrupted before `begin` registered it has no route id yet).
        route = getattr(entry, "route_id", None)
        if route is not None:
            host.pending.finish(route, exc=CancelledError())
        raise
    exc = entry._exc
    if exc is not None:
        raise exc
    return entry._value


def result_or_cancel(done: Completion[T]) -> T:
    """`done.result()` for a caller blocked in `submit_sync()` on a handle: an interrupt
    while it waits ends the call as cancelled (nobody is left to observe it; a call that
    refuses cancellation goes on) and propagates."""
    try:
        return done.result()
    except BaseException:
        if not done.done():
            done.cancel()
        raise


def _reply(
    table: PendingTable,
    route: int,
    engine: FailureCount,
    expected: type | None,
    value: object,
    exc: BaseException | None,
) -> None:
    """Finish the request behind `route` with the handler's outcome (a late one finds no
    entry and is dropped). Every handler that raised counts as a handler failure, a
    `ZlinkError` too (which reaches the caller as it is); a wrong reply does not."""
    if exc is None:
        if expected is None or isinstance(value, expected):
            table.finish(route, value)
            return
        exc = ProtocolError(reply_mismatch(expected, value))
    else:
        engine.handler_failures += 1
        if not isinstance(exc, ZlinkError):
            exc = internal_failure("the handler", exc)
    table.finish(route, exc=exc)


class _SelfReplying(Record, PendingCell):
    """A request record (`K_REQUEST`) that is also its own pending entry and result cell;
    the classes give the slots. `handler` runs it, and `reply` delivers the handler's
    outcome to the one winner of the table removal."""

    __slots__ = ()

    kind = K_REQUEST
    payload: object
    metadata: dict[str, object] | None
    handler: Handler
    reserved: bool
    engine: FailureCount
    reply_type: type | None

    def reply(self, value: object, exc: BaseException | None) -> None:
        table, route = self.table, self.route_id
        expected = self.reply_type
        if exc is None and (expected is None or isinstance(value, expected)):
            # The common reply, with `PendingTable.finish` unrolled.
            if table._entries.pop(route, None) is not None:
                self.settle(value, None)
                if table._watching:
                    table.check_empty()
            return
        _reply(table, route, self.engine, expected, value, exc)

    def drop(self, exc: BaseException) -> None:
        """End a request whose handler never ran (its target closed first): the caller
        hears `exc`; no handler failed."""
        self.table.finish(self.route_id, exc=exc)


class _Deadline:
    """An entry's deadline in a timer FIFO (`PendingCell.arm`). Kept apart from the entry
    and small: a disarmed one may wait in the FIFO behind a live deadline, and then it
    must not keep the entry, its payload or its reply alive."""

    __slots__ = ("fn", "when")

    # No `__init__`: `PendingCell.arm` fills the two slots (a Python frame less on every
    # request with a timer entry; the timer service sets `when`).
    fn: PendingCell | None
    when: float

    def fire(self) -> None:
        entry = self.fn
        if entry is not None:
            self.fn = None
            entry.expire()


class Request(_SelfReplying):
    """A request in one object: its queued record, its pending entry and its result cell
    (observed through `Completion`s). Made by its call, then `begin` registers it."""

    __slots__ = ("due", "engine", "handler", "metadata", "payload", "reply_type", "reserved")

    def __init__(
        self,
        payload: object,
        metadata: dict[str, object] | None,
        handler: Handler,
        engine: FailureCount,
        reply_type: type | None,
        table: PendingTable,
        due: float = math.inf,
    ) -> None:
        # `PendingCell.__init__`, written out: a frame less on every request (`lock` is
        # `table.cell_lock`); keep in step: tests/unit/core/test_pending.py
        # `test_written_out_copies_match_their_source` refuses a stale copy.
        self._lock = table.cell_lock
        self._state = PENDING
        self._value = None
        self._exc = None
        self._listeners = None
        self.expires = None
        self.deadline = None
        self.registration = None
        self.source = None
        self.waiter = None
        # The request's own.
        #: When the call's deadline passes, whichever timer keeps it (`ctx.deadline`).
        self.due = due
        self.payload = payload
        self.metadata = metadata
        self.handler = handler
        self.reserved = False
        self.engine = engine
        self.reply_type = reply_type


class ServedRequest(Request):
    """A request another node sent: `on_settled(value, exc)` runs on the settling thread,
    right after the request is settled, so the reply leaves without a dispatcher hop."""

    __slots__ = ("on_settled",)

    on_settled: Callable[[object, BaseException | None], None]


class SyncRequest(Request):
    """A request whose only observer is an application thread blocked in `submit_sync()`
    (`block`): no handle, no callback, and no timer (the caller keeps the deadline in its
    own timed wait); `due` is that wait's end on the real clock."""

    __slots__ = ()


#: What a pending table holds.
Pending = PendingCell


class PendingTable:
    """Calls in flight of one source lifecycle, keyed by `ReplyRouteId`.

    Registration and removal are single dict operations, atomic in CPython (and
    internally locked in free-threaded builds): the removal is the race point.
    """

    def __init__(self) -> None:
        self._entries: dict[int, Pending] = {}
        #: The result-cell lock of every `Request` in this table: no lock object per
        #: request. Safe to share between threads, since a cell never takes another lock
        #: while it holds its own. Reentrant, because code can run on a thread that holds
        #: it and settle or cancel another request: a garbage-collector finalizer (a cell
        #: allocates under it) or a signal handler.
        self.cell_lock = threading.RLock()
        self._lock = threading.Lock()
        self._emptied = threading.Condition(self._lock)
        self._watching = False

    def pop(self, route: int) -> Pending | None:
        """The one race point: the caller that gets the entry owns the terminal."""
        entry = self._entries.pop(route, None)
        if self._watching:
            self.check_empty()
        return entry

    def check_empty(self) -> None:
        """Wake `wait_empty` if nothing is pending (after a removal while it watches)."""
        if not self._entries:
            with self._lock:
                self._emptied.notify_all()

    def finish(self, route: int, value: object = None, exc: BaseException | None = None) -> bool:
        """Complete the call behind `route` if this path wins; False if it lost."""
        entry = self._entries.pop(route, None)  # `pop`, written out: every call ends here
        if self._watching:
            self.check_empty()
        if entry is None:
            return False
        entry.settle(value, exc)
        return True

    def expire_due(self, now: float) -> float | None:
        """Complete with `DeadlineExceededError` the entries on the default deadline that
        are due at `now` (see `DeadlineScan`); return the deadline of the oldest one still
        pending, or None if none is.

        They are in registration order and share one timeout, so the first that is not
        due ends the scan; entries with deadlines of their own are skipped.
        """
        entries = self._entries
        # Copied in C, so other threads' registrations and removals cannot interleave.
        head = list(itertools.islice(entries.values(), _SCAN_CHUNK))
        found = self._expire_in(head, now)
        if found is None and len(head) == _SCAN_CHUNK:
            # Many entries with deadlines of their own in front (rare): look at them all.
            found = self._expire_in(list(entries.values()), now)
        return found

    def _expire_in(self, entries: list[Pending], now: float) -> float | None:
        """Expire what is due among `entries`; the deadline of the first one on the
        default deadline that is not due, or None if every entry was seen."""
        for entry in entries:
            expires = entry.expires
            if expires is None:
                continue
            if expires > now:
                return expires
            entry.expire()  # (a close's wait decides for itself: `_CloseWait`)
        return None

    def pop_all(self) -> list[Pending]:
        """Remove every entry (shutdown); the caller completes each one."""
        entries = []
        for route in list(self._entries):
            entry = self.pop(route)
            if entry is not None:
                entries.append(entry)
        return entries

    def wait_empty(self, timeout: float) -> bool:
        """Wait until no call is pending; False if `timeout` passed first."""
        with self._lock:
            self._watching = True
            try:
                return self._emptied.wait_for(lambda: not self._entries, timeout)
            finally:
                self._watching = False

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, route: object) -> bool:
        return route in self._entries


#: Entries `expire_due` looks at before it copies the whole table.
_SCAN_CHUNK: Final = 64


class DeadlineScan:
    """The deadline of every request on the Host's default timeout, without a timer entry
    each.

    Those requests are registered in the pending table in the order of their deadlines
    (one timeout, a clock that only moves forward), so one timer suffices: it is due when
    the oldest of them is, expires what is due, and moves on to the next oldest
    (`PendingTable.expire_due`). A request answered in time costs the timer nothing.

    Invariant: while such a request is pending, a scan is scheduled at or before its
    deadline. A request checks `at` after its entry is in the table; a scan resets `at`
    before it reads the table; so either the scan sees the entry or the request arms.
    """

    __slots__ = ("_handle", "_lock", "_table", "_timers", "at")

    def __init__(self, table: PendingTable, timers: TimerService) -> None:
        self._table = table
        self._timers = timers
        # Reentrant: a signal handler or finalizer that submits a request may run while
        # this thread is inside `arm`.
        self._lock = threading.RLock()
        self._handle: TimerHandle | None = None
        #: When the next scan runs; `math.inf` when none is scheduled.
        self.at = math.inf

    def arm(self, when: float) -> None:
        """Make sure a scan runs by `when`."""
        with self._lock:
            if when >= self.at:
                return
            # In this order so that an interrupt between any two steps leaves at worst
            # one scan too many, never `at` naming a scan that was not scheduled.
            handle = self._timers.call_at(when, self._scan)
            earlier, self._handle = self._handle, handle
            self.at = when
            if earlier is not None:
                earlier.cancel()

    def _scan(self) -> None:
        # On the timer thread. The handle that fired has no `fn` any more; if `_handle`
        # is another, live one (an earlier scan armed while this one was firing), that
        # one stays the scheduled scan, so that no scan runs unaccounted for.
        with self._lock:
            current = self._handle
            if current is None or current.fn is None:
                self.at = math.inf
                self._handle = None
        following = self._table.expire_due(self._timers.clock.monotonic())
        if following is not None:
            self.arm(following)


def settle(entry: Pending, value: object = None, exc: BaseException | None = None) -> None:
    """Complete an entry already removed from its table (by `pop` or `pop_all`)."""
    entry.settle(value, exc)


#: The token of turns no caller can cancel (one-way messages, timers, callbacks).
_NEVER_CANCELLED = CancellationSource().token


def turn_deadline(rec: Record | None, clock: Clock) -> Deadline:
    """The deadline of the call a turn handles: its request's; one that never passes for
    a one-way message and for turns that are not calls."""
    if isinstance(rec, Request):
        return Deadline(rec.due, clock)
    return Deadline(math.inf, clock)


def turn_cancellation(rec: Record | None) -> CancellationToken:
    """A token cancelled once the request a turn handles ended without its reply (its
    caller cancelled, its deadline passed, or shutdown ended it); never cancelled for
    other turns. Made on first use, so a handler that never asks pays nothing."""
    if not isinstance(rec, Request):
        return _NEVER_CANCELLED
    source = rec.source
    if source is None:
        source = rec.source = CancellationSource()
        if rec._state is DONE and rec._exc is not None:
            # Settled before `source` was visible to it (`PendingCell.settle`).
            source.cancel()
    return source.token
