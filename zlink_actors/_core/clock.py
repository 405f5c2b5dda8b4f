"""Clocks, deadlines and the timer service: one thread, one deadline heap per Host.

Request timeouts, worker deadlines and Spot timers all live on one heap (SC §9,
digest §3). The clock is injectable: `ManualClock` lets tests move time by hand, and the
timer thread then fires exactly what became due, with no real sleeping.

Timer callbacks are framework-internal (complete a pending entry, queue a record); they
run on the timer thread and must not block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .validation import check_optional_seconds, check_seconds

__all__ = [
    "Clock",
    "Deadline",
    "ManualClock",
    "SystemClock",
    "TimerHandle",
    "TimerService",
    "TimerStatistics",
]

log = logging.getLogger("zlink_actors")

#: The timer thread never sleeps longer than this at once (it recomputes when it wakes).
_LONGEST_WAIT = 3600.0


class Clock:
    """A monotonic clock in seconds. The base class reads `time.monotonic()`."""

    def monotonic(self) -> float:
        """The current time, in seconds, on a clock that never goes back."""
        return time.monotonic()

    def _wait_timeout(self, delay: float) -> float | None:
        """How long a timer thread may sleep before `delay` has passed on this clock."""
        return delay

    def _subscribe(self, kick: Callable[[], None]) -> None:
        """Be told when time moves other than by itself (manual clocks)."""


class SystemClock(Clock):
    """The real monotonic clock (the default)."""


class ManualClock(Clock):
    """A clock that moves only when told: `advance(seconds)`. For deterministic tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._kicks: list[weakref.WeakMethod[Callable[[], None]]] = []

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward and let every timer service fire what became due.

        Args:
            seconds: from 0 to `threading.TIMEOUT_MAX`; a clock only moves forward.

        Raises:
            TypeError: `seconds` is not a real number, or is a bool.
            ValueError: `seconds` is negative, NaN, infinite or too large (time does not
                move).
        """
        seconds = check_seconds("seconds", seconds, inclusive=True)
        with self._lock:
            self._now += seconds
            self._kicks = [ref for ref in self._kicks if ref() is not None]
            kicks = [ref() for ref in self._kicks]
        for kick in kicks:
            if kick is not None:
                kick()

    def _wait_timeout(self, delay: float) -> float | None:
        return None

    def _subscribe(self, kick: Callable[[], None]) -> None:
        # Timer services subscribe a bound method; a weak reference lets them be collected.
        with self._lock:
            self._kicks.append(weakref.WeakMethod(kick))


class Deadline:
    """An absolute time on a clock, fixed when a terminator starts; stages use `remaining()`."""

    __slots__ = ("at", "clock")

    def __init__(self, at: float, clock: Clock) -> None:
        self.at = at
        self.clock = clock

    @classmethod
    def after(cls, seconds: float | None, clock: Clock) -> Deadline:
        """A deadline `seconds` from now; `None` means never.

        Raises:
            TypeError, ValueError: `seconds` is neither None nor a number of seconds from
                0 to `threading.TIMEOUT_MAX` (docs/validation.md).
        """
        checked = check_optional_seconds("seconds", seconds)
        if checked is None:
            return cls(math.inf, clock)
        return cls(clock.monotonic() + checked, clock)

    def remaining(self) -> float:
        """Seconds left, never negative; `math.inf` for no deadline."""
        return max(0.0, self.at - self.clock.monotonic())

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self.clock.monotonic() >= self.at

    @property
    def finite(self) -> bool:
        """False for a deadline that never passes."""
        return self.at != math.inf

    def __repr__(self) -> str:
        return f"<Deadline remaining={self.remaining():.3f}s>"


class TimerHandle:
    """A scheduled callback on a `TimerService`; `cancel()` stops it if not yet fired."""

    __slots__ = ("fn", "when")

    def __init__(self, when: float, fn: Callable[[], object] | None) -> None:
        self.when = when
        self.fn = fn

    def cancel(self) -> None:
        """Drop the callback; a no-op once it fired."""
        self.fn = None

    def fire(self) -> None:
        """Run the callback once (the timer thread calls this when it is due)."""
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()

    @property
    def active(self) -> bool:
        """True while the callback is still to run."""
        return self.fn is not None


class Timed(Protocol):
    """What a delay FIFO holds: a `TimerHandle`, or an object that is its own handle (a
    pending request). `fn` is None once cancelled or fired; `fire()` runs it."""

    when: float
    fn: Any

    def fire(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TimerStatistics:
    """A snapshot of a Host's timer service (`HostStatistics.timers`).

    Attributes:
        pending: callbacks scheduled and not yet fired or cancelled: Spot and Actor
            timers, deadlines of requests and worker calls with a `timeout()` of their
            own and of create and close calls, and one scan entry for all the requests on
            the Host's default timeout together (`DeadlineScan`). Counted by a scan of
            `entries`.
        entries: entries the service holds, including cancelled ones not yet dropped
            (an answered request's deadline stays up to `SWEEP_SECONDS` in its FIFO).
        delays: distinct delays that have a FIFO of their own (at most `MAX_FIFOS`).
        threads: 1 while the timer thread is alive (it starts on first use), else 0.
    """

    pending: int
    entries: int
    delays: int
    threads: int


class TimerService:
    """One thread for every deadline and timer of a Host. Started lazily.

    Two structures feed it. `call_at` uses a heap. `call_after` / `schedule_after` use a
    FIFO per distinct delay (up to `MAX_FIFOS` of them): calls with the same delay are due
    in submission order, so appending is O(1) and takes no lock; that is the path of the
    deadline of a request with a `timeout()` of its own (requests on the Host's default
    share one heap entry: `DeadlineScan`). Cancelling only clears the handle; while a
    FIFO holds anything the thread drops cancelled handles from its front every
    `SWEEP_SECONDS`, so a steady stream of answered requests keeps about 50 ms of them,
    not a whole timeout's worth.
    """

    MAX_FIFOS = 16
    SWEEP_SECONDS = 0.05

    def __init__(self, clock: Clock, name: str = "zlink-timer") -> None:
        self.clock = clock
        #: The clock's reading, without a Python call for the real clock.
        self._now = time.monotonic if type(clock) is SystemClock else clock.monotonic
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Timed]] = []
        self._fifos: dict[float, deque[Timed]] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: Every delay FIFO was empty at the thread's last look.
        self._quiet = False
        clock._subscribe(self._kick)

    def call_at(self, when: float, fn: Callable[[], object]) -> TimerHandle:
        """Run `fn()` on the timer thread once the clock reaches `when`."""
        handle = TimerHandle(when, fn)
        if when != math.inf:
            self._push_heap(handle)
        return handle

    def _push_heap(self, handle: Timed) -> None:
        with self._cond:
            self._push_heap_locked(handle)

    def _push_heap_locked(self, handle: Timed) -> None:
        # Caller holds the condition's lock.
        if self._stopped:
            handle.fn = None
            return
        heapq.heappush(self._heap, (handle.when, next(self._seq), handle))
        if self._thread is None:
            self._start()
        elif self._heap[0][2] is handle:
            self._cond.notify()

    def call_after(self, delay: float, fn: Callable[[], object]) -> TimerHandle:
        """Run `fn()` on the timer thread `delay` seconds from now."""
        handle = TimerHandle(0.0, fn)
        self.schedule_after(delay, handle)
        return handle

    def schedule_after(self, delay: float, handle: Timed) -> None:
        """Call `handle.fire()` on the timer thread `delay` seconds from now, unless its
        `fn` is None by then. Sets `handle.when`."""
        fifo = self._fifos.get(delay)
        if fifo is None or self._thread is None:
            with self._cond:
                fifo = self._fifos.get(delay)
                if fifo is None:
                    if len(self._fifos) >= self.MAX_FIFOS:
                        handle.when = self.clock.monotonic() + delay
                        self._push_heap_locked(handle)
                        return
                    fifo = self._fifos[delay] = deque()
                    self._cond.notify()
                if self._thread is None and not self._stopped:
                    self._start()
        # Read the clock after the FIFO exists: the thread's wake-up rule relies on it.
        handle.when = self._now() + delay
        if self._stopped:
            handle.fn = None
        else:
            fifo.append(handle)
            if self._quiet:
                # Every FIFO was empty when the thread last looked: it may be asleep for
                # a whole delay. Wake it so that the sweep starts (once per quiet spell).
                self._quiet = False
                self._kick()

    def pending(self) -> int:
        """Scheduled callbacks not yet fired or cancelled."""
        return self.statistics().pending

    def statistics(self) -> TimerStatistics:
        """Pending callbacks and held entries now.

        O(entries), never on a hot path. The lock is held only to copy the heap and the
        FIFOs (in C, without running Python code: producers append to a FIFO without the
        lock, and a copy made under the GIL sees each FIFO whole); the count runs after.
        """
        with self._cond:
            heap = self._heap.copy()
            fifos = [fifo.copy() for fifo in self._fifos.values()]
            thread = self._thread
        entries = len(heap) + sum(len(fifo) for fifo in fifos)
        live = sum(1 for _, _, h in heap if h.fn is not None)
        live += sum(1 for fifo in fifos for h in fifo if h.fn is not None)
        return TimerStatistics(
            pending=live,
            entries=entries,
            delays=len(fifos),
            threads=1 if thread is not None and thread.is_alive() else 0,
        )

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread; callbacks not yet due never run. True if the thread ended."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            for fifo in self._fifos.values():
                fifo.clear()
            self._cond.notify()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _start(self) -> None:
        # Caller holds the condition's lock.
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _kick(self) -> None:
        with self._cond:
            self._cond.notify()

    def _collect(self, now: float, due: list[Timed]) -> float:
        """Move what is due into `due`; return when to look again. Lock held."""
        heap = self._heap
        target = math.inf
        while heap:
            when, _, handle = heap[0]
            if handle.fn is None or when <= now:
                heapq.heappop(heap)
                if handle.fn is not None:
                    due.append(handle)
                continue
            target = when
            break
        # Cleared below if a FIFO holds anything; while it stays set, the next append
        # wakes this thread (see `schedule_after`), which otherwise only sweeps on a timer.
        self._quiet = True
        for delay, fifo in self._fifos.items():
            # Only this thread pops; producers only append, in `when` order.
            while fifo:
                handle = fifo[0]
                if handle.fn is not None and handle.when > now:
                    target = min(target, handle.when)
                    break
                fifo.popleft()
                if handle.fn is not None:
                    due.append(handle)
            else:
                # Anything appended after `now` is due at `now + delay` at the earliest.
                target = min(target, now + delay)
            if fifo:
                # Come back soon to drop what gets cancelled meanwhile (most handles are:
                # an answered request disarms its deadline), so they do not pile up.
                self._quiet = False
                target = min(target, now + self.SWEEP_SECONDS)
        return target

    def _run(self) -> None:
        clock = self.clock
        while True:
            due: list[Timed] = []
            with self._cond:
                while not self._stopped:
                    now = clock.monotonic()
                    target = self._collect(now, due)
                    if due:
                        break
                    if target == math.inf:
                        self._cond.wait()
                    else:
                        wait = clock._wait_timeout(target - now)
                        # A deadline centuries away must not overflow the wait.
                        self._cond.wait(None if wait is None else min(wait, _LONGEST_WAIT))
                if self._stopped:
                    return
            for handle in due:
                if handle.fn is None:
                    continue
                try:
                    handle.fire()
                except Exception:
                    log.exception("timer callback of %r raised", handle)
