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

__all__ = ["Clock", "Deadline", "ManualClock", "SystemClock", "TimerHandle", "TimerService"]

log = logging.getLogger("zlink_actors")


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
        """Move time forward and let every timer service fire what became due."""
        if not seconds >= 0:
            raise ValueError("a clock only moves forward")
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
        """A deadline `seconds` from now; `None` means never."""
        if seconds is None:
            return cls(math.inf, clock)
        return cls(clock.monotonic() + seconds, clock)

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

    @property
    def active(self) -> bool:
        """True while the callback is still to run."""
        return self.fn is not None


class TimerService:
    """One thread for every deadline and timer of a Host. Started lazily.

    Two structures feed it. `call_at` uses a heap. `call_after` uses a FIFO per distinct
    delay (up to `MAX_FIFOS` of them): calls with the same delay are due in submission
    order, so appending is O(1) and takes no lock; that is the path of every request
    deadline. Cancelling only clears the handle; the thread drops it when it reaches it.
    """

    MAX_FIFOS = 16

    def __init__(self, clock: Clock, name: str = "zlink-timer") -> None:
        self.clock = clock
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._fifos: dict[float, deque[TimerHandle]] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False
        clock._subscribe(self._kick)

    def call_at(self, when: float, fn: Callable[[], object]) -> TimerHandle:
        """Run `fn()` on the timer thread once the clock reaches `when`."""
        handle = TimerHandle(when, fn)
        if when == math.inf:
            return handle
        with self._cond:
            if self._stopped:
                handle.fn = None
                return handle
            heapq.heappush(self._heap, (when, next(self._seq), handle))
            if self._thread is None:
                self._start()
            elif self._heap[0][2] is handle:
                self._cond.notify()
        return handle

    def call_after(self, delay: float, fn: Callable[[], object]) -> TimerHandle:
        """Run `fn()` on the timer thread `delay` seconds from now."""
        fifo = self._fifos.get(delay)
        if fifo is None or self._thread is None:
            with self._cond:
                fifo = self._fifos.get(delay)
                if fifo is None:
                    if len(self._fifos) >= self.MAX_FIFOS:
                        return self.call_at(self.clock.monotonic() + delay, fn)
                    fifo = self._fifos[delay] = deque()
                    self._cond.notify()
                if self._thread is None and not self._stopped:
                    self._start()
        # Read the clock after the FIFO exists: the thread's wake-up rule relies on it.
        handle = TimerHandle(self.clock.monotonic() + delay, fn)
        if self._stopped:
            handle.fn = None
        else:
            fifo.append(handle)
        return handle

    def pending(self) -> int:
        """Scheduled callbacks not yet fired or cancelled."""
        with self._cond:
            live = sum(1 for _, _, h in self._heap if h.fn is not None)
            return live + sum(1 for f in self._fifos.values() for h in f if h.fn is not None)

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

    def _collect(self, now: float, due: list[TimerHandle]) -> float:
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
        return target

    def _run(self) -> None:
        clock = self.clock
        while True:
            due: list[TimerHandle] = []
            with self._cond:
                while not self._stopped:
                    now = clock.monotonic()
                    target = self._collect(now, due)
                    if due:
                        break
                    if target == math.inf:
                        self._cond.wait()
                    else:
                        self._cond.wait(clock._wait_timeout(target - now))
                if self._stopped:
                    return
            for handle in due:
                fn = handle.fn
                if fn is None:
                    continue
                handle.fn = None
                try:
                    fn()
                except Exception:
                    log.exception("timer callback %r raised", fn)
