"""The shared application pool: a ready set of gates and a fixed set of threads.

Pool threads take READY gates (`gate.py`) in turn and run the records of their mailboxes
(`mailbox.py`) through the record runner the Host gives `start()`. Rules kept here:
nothing runs inline when a queue is full; no queue-jumping; a record's post-turn work
(reply, reservation release) finishes before the gate is released; the enqueuing side is
the only one that takes the gate's lock to make work visible.
"""

from __future__ import annotations

import _thread
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, cast, overload

from .clock import SystemClock, TimerService
from .completion import Cell, CellLock, Notify, deliver
from .gate import IDLE, READY, RUNNING, SUSPENDED, Gate, wait_free
from .handoff import wake
from .mailbox import Mailbox, lock_box, trim
from .record import Message, Record

__all__ = [
    "ADMITTED",
    "CLOSED",
    "FULL",
    "SEALED",
    "AppPool",
    "PoolStatistics",
    "Runner",
]

log = logging.getLogger("zlink_actors")

#: A waiting send admitted under a gate lock: what to notify (its cell shares that lock
#: and was settled there) or its cell (settled after the lock is released).
_Admitted = Notify | Cell[None]

ADMITTED: Final = 0
FULL: Final = 1
CLOSED: Final = 2
SEALED: Final = 3

#: How long one owner may keep a pool thread, checked between records.
BATCH_SECONDS: Final = 0.010
#: A running pool thread that finished no record for this long counts as stalled.
STALL_SECONDS: Final = 0.002

#: Application records of one ready mailbox taken per gate-lock acquisition.
BATCH_RECORDS: Final = 32

# How a pool thread's batch on one gate ended.
_HANDED_OFF: Final = 0  # SUSPENDED by an await: the resume will push it again
_WENT_IDLE: Final = 1
_REQUEUE: Final = 2  # 10 ms used and work left: back of the ready set


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of the application pool.

    Attributes:
        threads: pool threads started.
        busy_threads: threads running a turn now.
        ready_gates: gates waiting for a thread.
        active_gates: gates not idle (ready, running or suspended in a turn).
        parked_continuations: coroutines waiting after `yield_()` (gate released).
        turns: records run since the pool started.
    """

    threads: int
    busy_threads: int
    ready_gates: int
    active_gates: int
    parked_continuations: int
    turns: int


class AppPool:
    """The shared application pool: a ready set of gates and a fixed set of threads.

    The records run through the `Runner` given to `start()`. A record whose
    handler has not reached its terminal completion when `run_record` returns (a
    coroutine parked by `await` or `yield_()`) has its `reserved` flag moved to that
    coroutine, which releases the slot with `release_reservation` when it ends.
    """

    def __init__(
        self, threads: int, name: str, lane_items: int, lifecycle_items: int = 128
    ) -> None:
        self.size = threads
        self.lane_items = lane_items
        self.lifecycle_items = lifecycle_items
        self._runner: Runner = _NO_RUNNER
        self._run_record = _NO_RUNNER.run_record
        self._name = name
        self._mutex = threading.Lock()
        self._quiet = threading.Condition(self._mutex)
        self._ready: deque[Gate[Mailbox]] = deque()
        self._idle: list[_Slot] = []
        #: Every pool thread's slot (see `_work`).
        self._slots: list[_Slot] = []
        self._threads: list[threading.Thread] = []
        self._busy = 0
        self._active = 0
        self._parked = 0
        self._turns = 0
        self._stopping = False
        self._draining = False
        self._check_armed = False
        #: When a pool thread last finished a record (read by the stall check).
        self._progress = time.monotonic()
        # Real time, whatever clock the Host runs on: a ManualClock must never be able to
        # stall the pool. Its thread starts when a check is first armed.
        self._watch = TimerService(SystemClock(), name=f"{name}-watch")
        #: Shutdown began: a one-way send may no longer start waiting.
        self.sealed = False
        #: Errors inside the runtime's own work around a record (logged, survived).
        self.internal_errors = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, runner: Runner) -> None:
        """Start the threads; they run every record through `runner`."""
        with self._mutex:
            if self._threads:
                return
            self._runner = runner
            self._run_record = runner.run_record
            for i in range(self.size):
                thread = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def wait_quiet(self, timeout: float) -> bool:
        """Wait until no gate is active and no continuation is parked."""
        with self._quiet:
            self._draining = True
            return self._quiet.wait_for(lambda: not self._active and not self._parked, timeout)

    def stop(self, timeout: float) -> int:
        """Stop the threads; returns how many are still inside user code (abandoned)."""
        with self._mutex:
            self._stopping = True
            self._ready.clear()
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for slot in idle:
            slot.wake.release()
        end = time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, end - time.monotonic()))
        self._watch.stop(max(0.0, end - time.monotonic()))
        return sum(1 for t in threads if t.is_alive())

    def statistics(self) -> PoolStatistics:
        with self._mutex:
            return PoolStatistics(
                threads=len(self._threads),
                busy_threads=self._busy,
                ready_gates=len(self._ready),
                active_gates=self._active,
                parked_continuations=self._parked,
                turns=self._turns,
            )

    # -- scheduling --------------------------------------------------------------------

    def push(self, gate: Gate[Mailbox]) -> None:
        """A gate became READY: put it at the back of the ready set.

        An idle thread is woken at once (from the transport's I/O thread: as that thread
        goes to sleep, `handoff`) only when no pool thread is running: otherwise the
        running one takes the gate when its batch ends. Python runs one thread at a time,
        and two pool threads running Python hand every lock back and forth across cores
        (measured: 4x slower handler-to-handler). If the running thread stalls instead (a
        handler blocked in I/O or a sleep), the stall check wakes another (`_stall_check`).
        """
        self._ready_append(gate, activate=True)

    def requeue(self, gate: Gate[Mailbox]) -> None:
        """A READY gate that was already active goes to the back of the ready set."""
        self._ready_append(gate, activate=False)

    def _ready_append(self, gate: Gate[Mailbox], activate: bool) -> None:
        arm = False
        if self._mutex.locked():
            wait_free(self._mutex)
        with self._mutex:
            if activate:
                self._active += 1
            if not self._idle:
                self._ready.append(gate)
                return
            if not self._busy:
                if not self._ready:
                    # Hand the gate straight to the idle thread (it is busy from now on).
                    slot = self._idle.pop()
                    slot.gate = gate
                    self._busy += 1
                else:
                    self._ready.append(gate)
                    slot = self._idle.pop()
            else:
                self._ready.append(gate)
                slot = None
                if not self._check_armed:
                    self._check_armed = arm = True
        if slot is not None:
            wake(slot.wake)
        elif arm:
            self._watch.call_after(STALL_SECONDS, self._stall_check)

    def _start_idle(self, gate: Gate[Mailbox], box: Mailbox, rec: Record) -> None:
        """Work arrived for an IDLE gate: with one acquisition of the pool mutex, either
        hand `rec` straight to an idle thread, if no pool thread is running (the gate
        becomes RUNNING and the record never enters a lane), or queue it and put the gate
        in the ready set. A thread is woken inside the critical section that chose it, so
        that nothing (not even an interrupt) can come between the choice and the wake (on
        the transport's I/O thread the wake waits for that thread's sleep: `handoff`).

        Caller holds `gate.lock`; the gate is IDLE, so every lane under it is empty and
        running `rec` first keeps FIFO order. `box` is not claimed.
        """
        arm = False
        if self._mutex.locked():
            wait_free(self._mutex)
        with self._mutex:
            self._active += 1
            idle = self._idle
            if idle and not self._busy and not self._ready and not self._stopping:
                slot = idle.pop()
                self._busy += 1
                gate.state = RUNNING
                slot.gate, slot.first_box, slot.first = gate, box, rec
                wake(slot.wake)
                return
            box.push(rec, False)  # the gate becomes READY
            self._ready.append(gate)
            if idle:
                if not self._busy:
                    wake(idle.pop().wake)  # woken with no gate: it takes the ready head
                elif not self._check_armed:
                    self._check_armed = arm = True
        if arm:
            self._watch.call_after(STALL_SECONDS, self._stall_check)

    def _stall_check(self) -> None:
        """On the watch timer, while work waits: wake an idle thread if no record finished
        for `STALL_SECONDS` (every running thread is stuck in a handler)."""
        slot = None
        if self._mutex.locked():
            wait_free(self._mutex)
        with self._mutex:
            self._check_armed = False
            if self._ready and self._idle:
                if time.monotonic() - self._progress >= STALL_SECONDS or not self._busy:
                    slot = self._idle.pop()
                else:
                    self._check_armed = True  # progress is being made: look again later
        if slot is not None:
            slot.wake.release()
        elif self._check_armed:
            self._watch.call_after(STALL_SECONDS, self._stall_check)

    def _note_quiet(self) -> None:
        # Caller holds the mutex. Only a draining Host waits for quiet.
        if self._draining and not self._active and not self._parked:
            self._quiet.notify_all()

    def park(self) -> None:
        """A continuation released its gate (`yield_()`) and waits for a result."""
        if self._mutex.locked():
            wait_free(self._mutex)
        with self._mutex:
            self._parked += 1

    def unpark(self) -> None:
        if self._mutex.locked():
            wait_free(self._mutex)
        with self._mutex:
            self._parked -= 1
            self._note_quiet()

    @overload
    def enqueue(
        self, box: Mailbox, rec: Record, wait: None = None, *, lifecycle: bool = False
    ) -> int: ...

    @overload
    def enqueue(
        self, box: Mailbox, rec: Message, wait: Callable[[CellLock], Cell[None]]
    ) -> Cell[None] | int: ...

    def enqueue(
        self,
        box: Mailbox,
        rec: Record,
        wait: Callable[[CellLock], Cell[None]] | None = None,
        *,
        lifecycle: bool = False,
    ) -> Cell[None] | int:
        """Admit a bounded application (or lifecycle) record: ADMITTED, else FULL or
        CLOSED. The one admission body: `send(box, rec, wait)` is this method.

        With `wait` (a one-way send), a record the full application lane cannot take
        waits FIFO behind the target's other waiters instead of being FULL: the result
        is then the caller's new result cell, made by `wait(gate lock)` under that lock,
        which the cell then shares (it gets `None` once a reservation frees a slot); or
        SEALED (shutdown began: a send may no longer start waiting, since the shutdown
        sweep of waiters may have passed).
        """
        # `lock_box`'s uncontended case first, without its frame (every request and
        # message admitted comes here); anything else takes `lock_box`.
        gate = box.gate
        if not gate.lock.acquire(False):
            gate = lock_box(box)
        elif box.gate is not gate:  # an Actor's mailbox changed gate meanwhile
            gate.lock.release()
            gate = lock_box(box)
        started = False
        try:
            if box.closed:
                return CLOSED
            if lifecycle:
                # Counted apart from the application lane: admitted even when that is full.
                if box.life is not None and len(box.life) >= self.lifecycle_items:
                    return FULL
            else:
                if box.closing:
                    return CLOSED
                if box.app_reserved >= self.lane_items or box.waiters:
                    if wait is None:
                        return FULL
                    return self._wait(gate, box, rec, wait)
                box.app_reserved += 1
                rec.reserved = True
                if gate.state == IDLE and not box.claimed:
                    started = True
                    self._start_idle(gate, box, rec)
            push = not started and box.push(rec, lifecycle)
        finally:
            gate.lock.release()
        if push:
            self.push(gate)
        return ADMITTED

    #: `send(box, rec, make_cell)`: admit a one-way record (ADMITTED), or park it FIFO
    #: behind the target's other waiters (the caller's new result cell); CLOSED; SEALED.
    #: The same method as `enqueue`, not a wrapper: no frame more on every one-way.
    send = enqueue

    def _wait(
        self,
        gate: Gate[Mailbox],
        box: Mailbox,
        rec: Record,
        make_cell: Callable[[CellLock], Cell[None]],
    ) -> Cell[None] | int:
        """Park a one-way record FIFO behind `box`'s other waiters (`enqueue` with
        `wait`, the lane full); SEALED once shutdown began. Caller holds `gate.lock`."""
        if self.sealed:
            return SEALED
        waiters = box.waiters
        if waiters is None:
            box.waiters = waiters = deque()
        cell = make_cell(gate.lock)
        waiters.append((cast(Message, rec), cell))
        return cell

    def force(
        self, box: Mailbox, rec: Record, *, reserve: bool = False, lifecycle: bool = False
    ) -> bool:
        """Append already-admitted work (resume, callback, tick, self-send; a leave notice
        to the lifecycle lane), ignoring the limit. Returns False if the mailbox is closed."""
        gate = lock_box(box)
        try:
            if box.closed:
                return False
            if reserve:
                box.app_reserved += 1
                rec.reserved = True
            push = box.push(rec, lifecycle)
        finally:
            gate.lock.release()
        if push:
            self.push(gate)
        return True

    def resume(self, gate: Gate[Mailbox]) -> None:
        """The result a SUSPENDED gate awaited has settled: run its continuation next."""
        if gate.lock.locked():
            wait_free(gate.lock)
        with gate.lock:
            gate.state = READY
        self.requeue(gate)

    def release_claim(self, box: Mailbox) -> None:
        """End a SpotWide member Actor's claim taken by `yield_()`."""
        gate = lock_box(box)
        try:
            box.claimed = False
            push = box.has_work() and gate.list_box(box)
        finally:
            gate.lock.release()
        if push:
            self.push(gate)

    def release_reservation(self, box: Mailbox) -> None:
        """A record's handler reached its terminal completion: free its slot and admit
        the oldest waiting send, if any."""
        admitted: list[_Admitted] = []
        gate = lock_box(box)
        try:
            box.app_reserved -= 1
            push = self._admit_waiters(box, admitted, gate.lock)
        finally:
            gate.lock.release()
        if push:
            self.push(gate)
        _settle_admitted(admitted)

    def claim(self, box: Mailbox) -> None:
        """Hold `box`'s queue claim: its records wait until `release_claim`."""
        gate = lock_box(box)
        try:
            box.claimed = True
        finally:
            gate.lock.release()

    def mark_closing(self, box: Mailbox) -> None:
        """close() was requested: refuse new application work, admit no more waiters."""
        gate = lock_box(box)
        try:
            box.closing = True
        finally:
            gate.lock.release()

    def unmark_closing(self, box: Mailbox, rec: Record | None) -> Callable[[], None]:
        """A close was withdrawn (`Closing`): take its record `rec` out of the lifecycle
        lane if it is still queued (else it runs and does nothing), admit application
        work again, and the sends that waited meanwhile as room allows. Returns what
        settles those sends, for the caller to run once it holds no lock."""
        admitted: list[_Admitted] = []
        gate = lock_box(box)
        try:
            life = box.life
            if rec is not None and life and rec in life:
                life.remove(rec)
                if not life and not box.app:
                    trim(box)  # a listed mailbox with nothing left is skipped when taken
            box.closing = False
            push = self._admit_waiters(box, admitted, gate.lock)
        finally:
            gate.lock.release()
        if push:
            self.push(gate)
        return lambda: _settle_admitted(admitted)

    def close_box(self, box: Mailbox) -> list[Record]:
        """Close `box` to new work and take out the records still queued in it."""
        gate = lock_box(box)
        try:
            box.closed = True
            records = [*(box.life or ()), *(box.app or ())]
            box.life = box.app = None
        finally:
            gate.lock.release()
        return records

    def move(self, box: Mailbox, gate: Gate[Mailbox]) -> None:
        """Put a claimed `box` under `gate` (a Join). The claim keeps it from running."""
        old = lock_box(box)
        try:
            assert box.claimed, "only a claimed mailbox can change gate"
            if box.listed:
                box.listed = False
                if old.ready_boxes is not None and box in old.ready_boxes:
                    old.ready_boxes.remove(box)
            box.gate = gate
        finally:
            old.lock.release()

    def seal(self) -> None:
        """Shutdown began: from now on no one-way send starts waiting (see `fail_waiters`)."""
        self.sealed = True

    def fail_waiters(self, box: Mailbox, exc: BaseException) -> int:
        """End every send waiting for `box` with `exc` (close, shutdown).

        A send whose result has no listener now (no callback, no blocked reader) is
        logged at debug level: its `submit()` returned long ago, and nothing else would
        tell that the message never arrived.
        """
        gate = lock_box(box)
        try:
            waiters, box.waiters = box.waiters, None
        finally:
            gate.lock.release()
        for rec, cell in waiters or ():
            with cell._lock:
                if cell._state:
                    continue
                notify = cell._publish(None, exc)
            if notify is not None and (notify[0] or notify[1]):
                deliver(notify)
            else:
                owner = box.owner
                log.debug(
                    "a one-way send of %s to %s %r ended with %s after submit() returned, "
                    "and nothing observes its Completion",
                    type(rec.payload).__qualname__,
                    owner.kind,
                    owner.id,
                    type(exc).__name__,
                )
        return len(waiters or ())

    def _admit_waiters(self, box: Mailbox, admitted: list[_Admitted], held: CellLock) -> bool:
        """Admit waiting sends FIFO into the room the lane has. Caller holds the gate
        lock, `held` (normally `box`'s; the gate `box` had when its records were taken,
        if a Join moved it since); afterwards it passes `admitted` to `_settle_admitted`.
        Returns True if `box`'s gate must be pushed to the pool."""
        waiters = box.waiters
        if not waiters or box.closing:
            return False
        room = min(len(waiters), self.lane_items - box.app_reserved)
        if room <= 0:
            return False
        # Move them in one go: FIFO, behind whatever the lane holds.
        app = box.app
        if app is None:
            box.app = app = []
        popleft = waiters.popleft
        for _ in range(room):
            rec, cell = popleft()
            rec.reserved = True
            app.append(rec)
            if cell._lock is held:
                # Its lock is the one held here: settle it now (see `Cell.__init__`).
                if not cell._state:
                    notify = cell._publish(None, None)
                    if notify is not None:
                        admitted.append(notify)
            else:
                admitted.append(cell)
        box.app_reserved += room
        if not waiters:
            box.waiters = None
        return box.gate.list_box(box)

    # -- the pool thread ---------------------------------------------------------------
    #
    # The hot path. A pool thread loops in `_work`: one critical section of the pool
    # mutex per batch (account for the batch just run, take the next ready gate), then
    # `_run_gate` on that gate. It first runs what was handed over with the gate, a
    # record or a suspended frame (`_run_opening`), then alternates two steps until the
    # gate has no work, 10 ms have passed or a turn handed off:
    #
    #   `_take_run`  one acquisition of the gate lock: settle the reservations of the
    #                records just run (admitting waiting sends), then take the next run
    #                of records (up to `BATCH_RECORDS` of one mailbox);
    #   `_run_batch` run them without the lock, checking between records whether the
    #                run must end early (another owner or lifecycle work waits, a claim
    #                or close arrived, 10 ms used); what it did not run goes back to the
    #                front of its lane.
    #
    # Everything a batch knows lives on the thread's `_Slot`, so that an error anywhere
    # in it, the opening included, can be recovered from (`_recover`) without losing a
    # record, running one twice or keeping a lane slot: a record counts as started (it
    # never runs again) before its turn begins.

    def _work(self) -> None:
        slot = _Slot()
        with self._mutex:
            self._slots.append(slot)
        ready = self._ready
        idle = self._idle
        mutex = self._mutex
        gate: Gate[Mailbox] | None = None
        ended = _HANDED_OFF
        arm = False
        while True:
            # One critical section a batch: account for the batch just run, take the next.
            if mutex.locked():
                wait_free(mutex)
            with mutex:
                if gate is not None:
                    self._busy -= 1
                    if ended == _WENT_IDLE:
                        self._active -= 1
                        self._note_quiet()
                    elif ended == _REQUEUE:
                        ready.append(gate)
                if self._stopping:
                    return
                if ready and (not self._busy or self._others_stalled(slot)):
                    gate = ready.popleft()
                    self._busy += 1
                else:
                    # Nothing to do, or another thread is running Python and not stuck:
                    # leave the work to it (one thread runs Python unless it stalls).
                    idle.append(slot)
                    gate = None
                    if ready and not self._check_armed:
                        self._check_armed = arm = True
            if gate is None:
                if arm:
                    arm = False
                    self._watch.call_after(STALL_SECONDS, self._stall_check)
                slot.wake.acquire()
                gate, slot.gate = slot.gate, None
                if gate is None:
                    continue
                ended = _HANDED_OFF
            try:
                ended = self._run_gate(gate, slot)
            except BaseException:  # pragma: no cover - the loop must survive anything
                log.exception("scheduler error")
                self.internal_errors += 1
                ended = self._recover(gate, None, [], None, 0)
            slot.since = 0.0

    def _others_stalled(self, mine: _Slot) -> bool:
        """True if another pool thread has been inside one record for `STALL_SECONDS`
        (blocked in a handler): then this one keeps running other work. Mutex held."""
        now = time.monotonic()
        for slot in self._slots:
            since = slot.since
            if slot is not mine and since and now - since >= STALL_SECONDS:
                return True
        return False

    def _run_gate(self, gate: Gate[Mailbox], slot: _Slot) -> int:
        """Run turns of `gate` until it has no work, 10 ms passed, or a turn handed off
        (see the comment above `_work`). A record handed over directly (`_start_idle`,
        in `slot.first`) or a suspended frame runs before anything else."""
        gate.run = None
        self._progress = now = time.monotonic()
        slot.begin(now)
        try:
            if slot.first is not None or gate.frame is not None:
                if self._run_opening(gate, slot):
                    self._turns += slot.turns
                    return _HANDED_OFF
            else:
                gate.state = RUNNING  # (under the lock of the first take below)
            while True:
                ended = self._take_run(gate, slot)
                if ended is None:
                    ended = self._run_batch(gate, slot)
                if ended is not None:
                    self._turns += slot.turns  # statistics only: a lost update is harmless
                    return ended
        except BaseException:  # pragma: no cover - planted faults only (see the tests)
            log.exception("scheduler error in a batch (the owner keeps serving)")
            self.internal_errors += 1
            box, batch, start = slot.box, slot.batch, slot.start
            if box is not None and batch is not None and start:
                # The record that was running when the fault came: it does not run again,
                # and its lane slot is released if it still holds one.
                last = batch[start - 1]
                if last.reserved:
                    last.reserved = False
                    self._put_back(gate, box, [], 1)
            rest = batch[start:] if batch is not None else []
            return self._recover(gate, box, rest, slot.done_box, slot.done)

    def _run_opening(self, gate: Gate[Mailbox], slot: _Slot) -> bool:
        """Run the record handed over with the gate, or resume its suspended frame; True
        if that turn handed off."""
        first, first_box = slot.first, slot.first_box
        if first is not None and first_box is not None:
            slot.first = slot.first_box = None
            # Kept as a run of one (started) until it has run: what `_run_gate`'s
            # recovery reads if a fault comes first.
            slot.box, slot.batch, slot.start = first_box, [first], 1
            slot.turns = 1
            slot.since = slot.now
            try:
                handed = self._run_record(first_box, first)
            except BaseException:
                handed = self._internal_error(gate, first_box, first)
            if handed:
                return True
            self._progress = slot.now = time.monotonic()
            if first.reserved:
                first.reserved = False
                slot.done = 1
                slot.done_box = first_box
            slot.box = slot.batch = None
            return False
        if gate.lock.locked():
            wait_free(gate.lock)
        with gate.lock:
            gate.state = RUNNING
            frame, gate.frame = gate.frame, None
        if frame is None:
            return False
        slot.turns += 1
        slot.since = slot.now
        try:
            handed = frame.resume()
        except BaseException:
            handed = self._internal_error(gate, None, None)
        if handed:
            return True
        self._progress = slot.now = time.monotonic()
        return False

    def _take_run(self, gate: Gate[Mailbox], slot: _Slot) -> int | None:
        """Under one acquisition of the gate lock: finish the post-turn accounting of the
        records just run, then take the next run into `slot`. Returns how the gate's
        batch ends if there is nothing to take (or 10 ms are used), else None."""
        admitted: list[_Admitted] | None = None
        moved = False
        requeue = False
        slot.box = slot.batch = None
        slot.start = 0
        done_box = slot.done_box
        taken = False
        if gate.lock.locked():
            wait_free(gate.lock)
        with gate.lock:
            if slot.done and done_box is not None:
                done_box.app_reserved -= slot.done
                slot.done = 0
                if done_box.waiters:
                    admitted = []
                    # True only if a Join moved the mailbox to a gate that is idle (this
                    # one is running): that gate needs a push.
                    moved = self._admit_waiters(done_box, admitted, gate.lock)
            boxes = gate.ready_boxes
            if boxes and slot.turns and time.monotonic() >= slot.deadline:
                # 10 ms used: back of the ready set, behind every other owner.
                gate.state = READY
                requeue = True
            else:
                taken = _take(boxes, slot)
                if not taken:
                    gate.state = IDLE
                    gate.ready_boxes = None
        if admitted:
            _settle_admitted(admitted)
        if moved and done_box is not None:
            self.push(done_box.gate)
        if not taken:
            return _REQUEUE if requeue else _WENT_IDLE
        slot.done_box = slot.box
        return None

    def _run_batch(self, gate: Gate[Mailbox], slot: _Slot) -> int | None:
        """Run the run `_take_run` took; _HANDED_OFF if a turn suspended, else None."""
        box, batch = slot.box, slot.batch
        assert box is not None
        assert batch is not None
        run_record = self._run_record
        monotonic = time.monotonic
        now, deadline = slot.now, slot.deadline
        handed = False
        stop = len(batch)
        gate.run = (box, batch)
        # Counted in locals (this loop runs once per record) and written back to the slot
        # however the loop ends, so that `_recover` sees them after a fault.
        turns, done, start = slot.turns, slot.done, 0
        try:
            for i, rec in enumerate(batch):
                # Checked between records: 10 ms, other owners or lifecycle work waiting,
                # or a claim taken by the previous turn end the run early. (Unlocked
                # reads: at worst one more record runs before the run ends.)
                others = gate.ready_boxes
                if i and (
                    box.life
                    or box.claimed
                    or box.closing
                    or box.closed
                    or now >= deadline
                    or (others and (len(others) > 1 or others[0] is not box))
                ):
                    stop = i
                    break
                turns += 1
                slot.since = now  # read by the stall check of other threads
                gate.pos = i
                start = i + 1  # started: a fault from here on never runs it again
                try:
                    handed = run_record(box, rec)
                except BaseException:
                    handed = self._internal_error(gate, box, rec)
                if handed:
                    # Handed off: the gate is SUSPENDED and no longer ours; the record's
                    # reservation went with its coroutine.
                    stop = i + 1
                    break
                self._progress = now = monotonic()  # read by the stall check
                if rec.reserved:
                    rec.reserved = False
                    done += 1
        finally:
            slot.turns, slot.done, slot.start, slot.now = turns, done, start, now
        gate.run = None  # (already None if a turn suspended and handed the rest back)
        if stop < len(batch) or handed:
            rest, slot.batch = batch[stop:], None  # from now on `_put_back` owns them
            done, slot.done = slot.done, 0  # a fault in `_put_back` must not release twice
            self._put_back(gate, box, rest, done)
        return _HANDED_OFF if handed else None

    def _internal_error(self, gate: Gate[Mailbox], box: Mailbox | None, rec: Record | None) -> bool:
        """A record's run raised past the runtime's own handling (a framework bug in its
        post-turn work): log and count it, end the record so that its caller hears of it
        (`fail_record`), and tell the batch loop whether the turn was handed off all the
        same (the gate SUSPENDED on a frame), so that the gate is never left held by a
        thread that stopped looking after it."""
        log.exception("internal error while running a record (the owner keeps serving)")
        self.internal_errors += 1
        if box is not None and rec is not None:
            try:
                self._runner.fail_record(box, rec)
            except BaseException:
                log.exception("ending a record after an internal error")
        return gate.state == SUSPENDED and gate.frame is not None

    def _recover(
        self,
        gate: Gate[Mailbox],
        box: Mailbox | None,
        rest: list[Record],
        done_box: Mailbox | None,
        done: int,
    ) -> int:
        """After an error in the batch loop itself: release the reservations of the
        records that ran, return the ones taken that did not (`rest`, of `box`) to the
        front of their lane, and leave `gate` in a state another pool thread can pick up
        (never RUNNING with nobody running it)."""
        gate.run = None
        if done and done_box is not None:
            self._put_back(gate, done_box, [], done)
        if rest and box is not None:
            self._put_back(gate, box, rest, 0)
        with gate.lock:
            if gate.state == SUSPENDED and gate.frame is not None:
                return _HANDED_OFF
            if gate.ready_boxes:
                gate.state = READY
                return _REQUEUE
            gate.state = IDLE
            gate.ready_boxes = None
            return _WENT_IDLE

    def hand_back(self, gate: Gate[Mailbox]) -> None:
        """A turn of `gate` suspends (`await`): return the records taken after it in the
        same run to the front of their lane now, before the gate can be resumed (by
        another thread, perhaps) and a record that arrived later could overtake them.
        Caller holds `gate.lock`, on the thread running the gate."""
        run = gate.run
        if run is None:
            return
        gate.run = None
        box, batch = run
        start = gate.pos + 1
        rest = batch[start:]
        if not rest or box.closed:
            return  # nothing to return, or `_put_back` drops them
        del batch[start:]
        app = box.app
        if app is None:
            box.app = app = []
        app[0:0] = rest
        gate.list_box(box)  # the gate is SUSPENDED: its resume finds the mailbox listed

    def _put_back(self, gate: Gate[Mailbox], box: Mailbox, rest: list[Record], done: int) -> None:
        """End a run early: release the reservations of the records that ran, and return
        the ones that did not to the front of their lane, in order."""
        admitted: list[_Admitted] = []
        dropped: list[Record] = []
        if gate.lock.locked():
            wait_free(gate.lock)
        with gate.lock:
            box.app_reserved -= done
            push = False
            if rest:
                if box.closed:
                    dropped = rest
                else:
                    app = box.app
                    if app is None:
                        box.app = app = []
                    app[0:0] = rest
                    push = gate.list_box(box)
            if box.waiters:
                push = self._admit_waiters(box, admitted, gate.lock) or push
        if push:
            self.push(gate)
        _settle_admitted(admitted)
        for rec in dropped:
            self._runner.drop_record(box, rec)


def _settle_admitted(admitted: list[_Admitted]) -> None:
    """After the gate lock is released: complete what `_admit_waiters` could not settle
    under it (cells with a lock of their own), and notify observers of the rest."""
    for item in admitted:
        if isinstance(item, Cell):
            item.try_set(None, None)
        else:
            deliver(item)


class Runner(Protocol):
    """What the pool runs records with (the engine's record runner)."""

    def run_record(self, box: Mailbox, rec: Record) -> bool:
        """Run one record under its gate; True if the turn was handed off (the gate is
        SUSPENDED and the pool thread must not touch it again)."""
        ...

    def fail_record(self, box: Mailbox, rec: Record) -> None:
        """The pool's own work around `rec` raised: end it so that its caller hears."""
        ...

    def drop_record(self, box: Mailbox, rec: Record) -> None:
        """`rec` was taken but its mailbox closed before it ran: end it unrun."""
        ...


class _NoRunner:
    """The runner of a pool that was never started (it runs nothing)."""

    def run_record(self, box: Mailbox, rec: Record) -> bool:
        raise AssertionError("the pool runs records only after start()")

    def fail_record(self, box: Mailbox, rec: Record) -> None:
        return None

    def drop_record(self, box: Mailbox, rec: Record) -> None:
        log.error("record dropped: its mailbox closed before it ran")


_NO_RUNNER: Final = _NoRunner()


class _Slot:
    """One pool thread: how it is woken and handed work, and what its batch knows."""

    __slots__ = (
        "batch",
        "box",
        "deadline",
        "done",
        "done_box",
        "first",
        "first_box",
        "gate",
        "now",
        "since",
        "start",
        "turns",
        "wake",
    )

    def __init__(self) -> None:
        self.wake = _thread.allocate_lock()
        self.wake.acquire()
        #: A gate (and maybe its first record) handed over to the sleeping thread.
        self.gate: Gate[Mailbox] | None = None
        self.first_box: Mailbox | None = None
        self.first: Record | None = None
        #: When the record running now started (the stall check); 0.0 between gates.
        self.since = 0.0
        self.begin(0.0)

    def begin(self, now: float) -> None:
        """A new batch on one gate starts at `now`."""
        self.now = now
        self.deadline = now + BATCH_SECONDS
        self.turns = 0
        #: Records of `done_box` that ended holding a reservation: released together.
        self.done = 0
        self.done_box: Mailbox | None = None
        #: The run taken (`batch`, of `box`) and the index of its first record not run.
        self.box: Mailbox | None = None
        self.batch: list[Record] | None = None
        self.start = 0


def _take(boxes: list[Mailbox] | None, slot: _Slot) -> bool:
    """Take the next run of a gate's ready mailboxes into `slot`, round-robin: one
    record, or, if one mailbox with only application records is all that is ready, up to
    `BATCH_RECORDS` of them (they count as running; the rest of the lane stays queued).
    False if nothing is runnable. Gate lock held.

    The run is in `slot` before any bookkeeping, so that a fault after the take loses
    no record (`_recover` puts it back)."""
    while boxes:
        box = boxes.pop(0)
        app, life = box.app, box.life
        if box.claimed:
            rec = None
        elif not boxes and not life and app:
            slot.box, slot.batch = box, app[:BATCH_RECORDS]
            del app[:BATCH_RECORDS]
            box.debt = 0
            rec = slot.batch[0]
        else:
            rec = box.take()
            if rec is not None:
                slot.box, slot.batch = box, [rec]
        if rec is not None and (box.app or box.life):
            boxes.append(box)
        else:
            box.listed = False
            trim(box)
        if rec is not None:
            return True
    return False
