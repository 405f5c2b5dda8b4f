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
from typing import Any, Final, Protocol

from .cancellation import CancellationRegistration, CancellationSource, CancellationToken
from .clock import Clock, Deadline, TimerHandle, TimerService
from .completion import DONE, PENDING, Cell, Completion, deliver
from .errors import (
    CancelledError,
    DeadlineExceededError,
    ProtocolError,
    ZlinkError,
    internal_failure,
)
from .handoff import wake
from .record import K_REQUEST, Handler, Record
from .validation import reply_mismatch

__all__ = [
    "CellEntry",
    "DeadlineScan",
    "FailureCount",
    "OPERATION_HIGH_BYTES",
    "OperationId",
    "PendingEntry",
    "PendingTable",
    "ReplyRouteId",
    "Request",
    "ScannedEntry",
    "ServedRequest",
    "SyncRequest",
    "next_route_id",
    "operation_bytes",
    "settle",
    "turn_cancellation",
    "turn_deadline",
]

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
#: The next route id (what `PendingTable.register` gives an entry), without a frame.
next_route_id: Final = _low_counter.__next__
#: The high word of every `OperationId` this process makes, as bytes (`operation_bytes`).
OPERATION_HIGH_BYTES: Final = _HIGH_BYTES


def operation_bytes(route: int) -> bytes:
    """The 16 bytes of the `OperationId` of the entry registered under `route` (what
    `PendingEntry.operation_id` would make), without making the object."""
    return _HIGH_BYTES + route.to_bytes(8, "big")


class PendingEntry:
    """One call waiting for its terminal. Owned by a `PendingTable`."""

    __slots__ = ("_operation_id", "cell", "on_finish", "registration", "route_id", "table", "timer")

    #: Not on the Host's default deadline (see `DeadlineScan`): its `timer` is its own.
    expires: float | None = None

    def __init__(self, cell: Cell[Any], operation_id: OperationId | None = None) -> None:
        self.cell = cell
        self._operation_id = operation_id
        self.route_id: int | None = None
        self.table: PendingTable | None = None
        self.timer: TimerHandle | None = None
        self.registration: CancellationRegistration | None = None
        #: Run by the winner after the caller is completed (releases reservations).
        self.on_finish: Callable[[], None] | None = None

    @property
    def operation_id(self) -> OperationId:
        """The operation's identity; derived from the process word and the route id, so
        that an in-process call pays for no 128-bit object unless something asks."""
        op = self._operation_id
        if op is None:
            route = self.route_id
            op = OperationId.new() if route is None else OperationId(_PROCESS_HIGH, route)
            self._operation_id = op
        return op

    def expire(self) -> None:
        """Timer path: the deadline passed."""
        table, route = self.table, self.route_id
        if table is not None and route is not None:
            table.finish(route, exc=DeadlineExceededError("no result within the call's deadline"))

    def cancel(self) -> bool:
        """Cancellation path (caller's token or `Completion.cancel()`); True if it won."""
        table, route = self.table, self.route_id
        return table is not None and route is not None and table.finish(route, exc=CancelledError())

    def settle(self, value: object, exc: BaseException | None) -> None:
        """Complete the caller; only the winner of the table removal calls this. Cleans
        up outside the table lock (SC §11), then completes the caller."""
        if self.timer is not None:
            self.timer.cancel()
        if self.registration is not None:
            self.registration.unregister()
        self.cell.try_set(value, exc)
        if self.on_finish is not None:
            self.on_finish()


class ScannedEntry(PendingEntry):
    """A pending entry on the Host's default timeout: `DeadlineScan` expires it, so it
    needs no timer entry of its own."""

    __slots__ = ("expires",)


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


def _register(
    req: Request | SyncRequest,
    payload: object,
    metadata: dict[str, object] | None,
    handler: Handler,
    engine: FailureCount,
    reply_type: type | None,
    table: PendingTable,
) -> None:
    """Fill a self-replying request's record and entry fields and register it (SC §10:
    before anything is submitted). Flat: this runs once per call."""
    req.payload = payload
    req.metadata = metadata
    req.handler = handler
    req.reserved = False
    req.engine = engine
    req.reply_type = reply_type
    req.table = table
    req.route_id = route = next(_low_counter)
    table._entries[route] = req


class _SelfReplying(Record):
    """A request record (`K_REQUEST`) that is also its own pending entry; the classes
    give the slots. `handler` runs it, and `reply` delivers the handler's outcome to the
    one winner of the table removal. Subclasses say how a winning outcome reaches the
    caller (`settle`)."""

    __slots__ = ()

    kind = K_REQUEST
    payload: object
    metadata: dict[str, object] | None
    handler: Handler
    reserved: bool
    engine: FailureCount
    reply_type: type | None
    route_id: int
    table: PendingTable
    expires: float | None

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

    def settle(self, value: object, exc: BaseException | None) -> None:
        raise NotImplementedError


class _Deadline:
    """A request's entry in a timer FIFO. Kept apart from the request and small: a
    disarmed one may wait in the FIFO behind a live deadline, and then it must not keep
    the request, its payload or its reply alive."""

    __slots__ = ("fn", "when")

    # No `__init__`: `Request.arm` fills the two slots (a Python frame less on every
    # request with a timer entry; the timer service sets `when`).
    fn: Request | None
    when: float

    def fire(self) -> None:
        req = self.fn
        if req is not None:
            self.fn = None
            late = DeadlineExceededError("no result within the call's deadline")
            req.table.finish(req.route_id, exc=late)


class Request(_SelfReplying, Cell[Any]):
    """An asynchronous request in one object: its queued record, its pending entry and
    its result cell (observed through `Completion`s); `deadline` is its timer entry.
    """

    __slots__ = (
        "deadline",
        "due",
        "engine",
        "expires",
        "handler",
        "metadata",
        "payload",
        "registration",
        "reply_type",
        "reserved",
        "route_id",
        "source",
        "table",
    )

    on_finish: Callable[[], None] | None = None

    def __init__(
        self,
        payload: object,
        metadata: dict[str, object] | None,
        handler: Handler,
        engine: FailureCount,
        reply_type: type | None,
        table: PendingTable,
        expires: float | None,
        due: float | None = None,
    ) -> None:
        # `Cell.__init__` and `_register`, written out: two frames less on every
        # request (the cell shares the table's lock; nothing is pending in it yet).
        self._lock = table.cell_lock
        self._state = PENDING
        self._value = None
        self._exc = None
        self._listeners = None
        self.registration: CancellationRegistration | None = None
        self.deadline: _Deadline | None = None
        #: When the Host's default deadline passes (`DeadlineScan`); None if the call
        #: set a timeout of its own (then `arm` gives it a timer entry).
        self.expires = expires
        #: When the call's deadline passes, whichever timer keeps it (`ctx.deadline`).
        self.due = due if due is not None else expires if expires is not None else math.inf
        #: Made when the handler first asks for `ctx.cancellation`.
        self.source: CancellationSource | None = None
        self.payload = payload
        self.metadata = metadata
        self.handler = handler
        self.reserved = False
        self.engine = engine
        self.reply_type = reply_type
        self.table = table
        # SC §10: registered before anything is submitted.
        self.route_id = route = next(_low_counter)
        table._entries[route] = self

    @property
    def cell(self) -> Request:
        return self

    def settle(self, value: object, exc: BaseException | None) -> None:
        deadline = self.deadline
        if deadline is not None:
            deadline.fn = None  # disarmed: what stays in the FIFO holds nothing
        if self.registration is not None:
            self.registration.unregister()
        with self._lock:
            notify = self._publish(value, exc)  # the cell is pending: only the winner settles
        if notify is not None:
            deliver(notify)

    def cancel(self) -> bool:
        """Cancellation path (caller's token or `Completion.cancel()`): races the other
        terminals through the pending table; True if it won."""
        return self.table.finish(self.route_id, exc=CancelledError())

    #: A request is its own `Completion`'s canceller (no bound method per call).
    __call__ = cancel

    def arm(self, timers: TimerService, timeout: float) -> None:
        """Arm the deadline (right after the request is queued); disarmed at once if a
        reply already won."""
        deadline = self.deadline = _Deadline()
        deadline.fn = self
        timers.schedule_after(timeout, deadline)
        if self.route_id not in self.table._entries:
            deadline.fn = None


class ServedRequest(Request):
    """A request another node sent: `on_settled(value, exc)` runs on the settling thread,
    right after the request is settled, so the reply leaves without a dispatcher hop."""

    __slots__ = ("on_settled",)

    on_settled: Callable[[object, BaseException | None], None]

    def settle(self, value: object, exc: BaseException | None) -> None:
        # `Request.settle`, written out (one frame less on every request served).
        deadline = self.deadline
        if deadline is not None:
            deadline.fn = None
        if self.registration is not None:
            self.registration.unregister()
        with self._lock:
            if self._listeners is None:
                # `_publish` with nothing to notify, written out: the common case (a
                # served request's only observers are the mesh's and `ctx.cancellation`).
                # Its twin: `mesh/calls.py` `_Outgoing.settle` (keep the two in step).
                self._value = value
                self._exc = exc
                self._state = DONE
                notify = None
            else:
                notify = self._publish(value, exc)
        if notify is not None:
            deliver(notify)
        self.on_settled(value, exc)


class SyncRequest(_SelfReplying):
    """A request whose only observer is an application thread blocked in `submit_sync()`:
    one object is its record, its pending entry and its result.

    The one winner of the table removal stores the outcome and releases `waiter`. Nothing
    else can observe the result (no handle, no callback), and the caller keeps the
    deadline in its own timed wait, so it needs no timer either.
    """

    __slots__ = (
        "due",
        "engine",
        "exc",
        "handler",
        "metadata",
        "payload",
        "reply_type",
        "reserved",
        "route_id",
        "source",
        "table",
        "value",
        "waiter",
    )

    registration: CancellationRegistration | None = None
    #: The blocked caller keeps the deadline in its own timed wait.
    expires: float | None = None

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
        self.value: object = None
        self.exc: BaseException | None = None
        #: When the caller's timed wait ends (`ctx.deadline`), on the real clock.
        self.due = due
        self.source: CancellationSource | None = None
        self.waiter = waiter = _thread.allocate_lock()
        waiter.acquire()
        _register(self, payload, metadata, handler, engine, reply_type, table)

    def settle(self, value: object, exc: BaseException | None) -> None:
        # Reached only by the winner of `PendingTable.pop`: no lock needed.
        self.value = value
        self.exc = exc
        wake(self.waiter)
        # Read after `exc` is set (see `turn_cancellation`).
        source = self.source
        if source is not None and exc is not None:
            source.cancel()


class CellEntry(Cell[Any]):
    """A result cell that is its own pending entry: one object where a `PendingEntry`
    and its `Cell` are two (the mesh's remote requests, `mesh/calls.py`). Its maker
    registers it (`next_route_id`, then `PendingTable._entries`); subclasses say what
    winning does (`settle`, called once, by the winner of the table removal)."""

    __slots__ = ("expires", "route_id", "table")

    expires: float | None
    route_id: int
    table: PendingTable

    def settle(self, value: object, exc: BaseException | None) -> None:
        raise NotImplementedError


#: What a pending table holds: a general entry, or a request or cell that is its own entry.
Pending = PendingEntry | _SelfReplying | CellEntry


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

    def register(self, entry: PendingEntry) -> int:
        """SC §10: register before submit. Returns the entry's route id."""
        # The counter is process-wide, so route ids also make unique OperationId words.
        # In process they stay plain ints (a `ReplyRouteId` is what goes on the wire).
        route = next(_low_counter)
        entry.route_id = route
        entry.table = self
        self._entries[route] = entry
        return route

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
            route = entry.route_id
            if route is not None:
                late = DeadlineExceededError("no result within the call's deadline")
                self.finish(route, exc=late)
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
    if isinstance(rec, (Request, SyncRequest)):
        return Deadline(rec.due, clock)
    return Deadline(math.inf, clock)


def turn_cancellation(rec: Record | None) -> CancellationToken:
    """A token cancelled once the request a turn handles ended without its reply (its
    caller cancelled, its deadline passed, or shutdown ended it); never cancelled for
    other turns. Made on first use, so a handler that never asks pays nothing."""
    if not isinstance(rec, (Request, SyncRequest)):
        return _NEVER_CANCELLED
    source = rec.source
    if source is None:
        source = rec.source = CancellationSource()
        if isinstance(rec, Request):
            Completion(rec)._add_inline(_cancel_on_failure(source))
        elif rec.route_id not in rec.table._entries and rec.exc is not None:
            # Settled before `source` was visible to it (`SyncRequest.settle`).
            source.cancel()
    return source.token


def _cancel_on_failure(source: CancellationSource) -> Callable[[Completion[Any]], None]:
    def check(done: Completion[Any]) -> None:
        if done._cell._exc is not None:
            source.cancel()

    return check
