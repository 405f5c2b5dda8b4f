"""Spot and Actor timers (digest §3): ticks are records under the owner's gate.

A tick is a record on the owner's application lane (a PerActor Spot gives each of its
own timers a gate of its own). One key never overlaps itself: the next tick is armed only
when the previous one has finished. Restarting a key bumps its generation, so ticks of
the old timer that are still queued are skipped; cancelling stops ticks not yet started
and never interrupts one that is running. All timers share the Host's one timer heap.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .._core.clock import TimerHandle
from .._core.gate import Gate
from .._core.mailbox import Mailbox
from .._core.record import Tick
from .._core.state import HostState
from .._core.validation import MIN_INTERVAL, check_seconds
from .kernel import Runtime
from .objects import ObjectKind
from .registry import Activation

__all__ = ["OverrunPolicy", "TimerSet", "TimerTick", "timers_for"]

log = logging.getLogger("zlink_actors")


class OverrunPolicy(enum.Enum):
    """What a timer does with ticks that fell due while the previous one still ran."""

    #: Skip the late ticks; the next tick is the next one still in the future.
    SKIP_LATE_TICKS = "skip_late_ticks"
    #: Deliver the most recent `max_catch_up` late ticks back to back (1 by default);
    #: skip any older ones.
    CATCH_UP_BOUNDED = "catch_up_bounded"
    #: Never skip: the next tick comes one interval after the previous one finished.
    DELAY_NEXT_TICK = "delay_next_tick"


@dataclass(frozen=True, slots=True)
class TimerTick:
    """What one tick tells its callback.

    Attributes:
        key: the timer's key.
        delivery_index: 1, 2, 3, ... with no gaps.
        scheduled_index: which multiple of the interval this tick stands for; never
            decreases.
        skipped_ticks: scheduled ticks skipped since the previous delivered one.
    """

    key: Hashable
    delivery_index: int
    scheduled_index: int
    skipped_ticks: int


class _Timer:
    __slots__ = (
        "box",
        "callback",
        "cancelled",
        "delivered",
        "handle",
        "interval",
        "key",
        "max_catch_up",
        "origin",
        "owner",
        "policy",
        "scheduled",
    )

    def __init__(
        self,
        owner: TimerSet,
        key: Hashable,
        interval: float,
        callback: Callable[..., Any],
        policy: OverrunPolicy,
        max_catch_up: int,
        box: Mailbox,
    ) -> None:
        self.owner = owner
        self.key = key
        self.interval = interval
        self.callback = callback
        self.policy = policy
        self.max_catch_up = max_catch_up
        self.box = box
        self.origin = owner.runtime.clock.monotonic()
        self.scheduled = 0
        self.delivered = 0
        self.cancelled = False
        self.handle: TimerHandle | None = None

    def arm(self, index: int) -> None:
        when = self.origin + index * self.interval
        self.handle = self.owner.runtime.timers.call_at(when, lambda: self.fire(index))

    def fire(self, index: int) -> None:
        runtime = self.owner.runtime
        if self.cancelled or runtime.state is not HostState.SERVING:
            return
        if runtime.fenced:
            # The owner lease lapsed (docs/mesh.md "Owner leases"): no tick is admitted;
            # the next one is armed, and the skipped ones are counted when one runs.
            self.arm(index + 1)
            return
        tick = TimerTick(self.key, self.delivered + 1, index, index - self.scheduled - 1)
        self.scheduled = index
        self.delivered += 1
        if not runtime.pool.force(self.box, Tick(self, tick)):
            self.cancelled = True

    def tick_done(self, value: object, exc: BaseException | None) -> None:
        """Post-turn work of a tick: log a failure, arm the next tick by policy."""
        if exc is not None:
            self.owner.runtime.engine.handler_failures += 1
            log.error("timer %r callback raised", self.key, exc_info=exc)
        if self.cancelled:
            return
        now = self.owner.runtime.clock.monotonic()
        last = self.scheduled
        due = math.floor((now - self.origin) / self.interval)
        if self.policy is OverrunPolicy.DELAY_NEXT_TICK:
            self.origin = now - last * self.interval
            nxt = last + 1
        elif due <= last:
            nxt = last + 1
        elif self.policy is OverrunPolicy.CATCH_UP_BOUNDED:
            # Late: the newest `max_catch_up` missed ticks are due now, older ones skipped.
            nxt = max(last + 1, due - self.max_catch_up + 1)
        else:
            nxt = due + 1
        self.arm(nxt)

    def stop(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()


class TimerSet:
    """The timers of one Spot or Actor: `ctx.timers`. Created by the runtime."""

    def __init__(self, runtime: Runtime, act: Activation) -> None:
        self.runtime = runtime
        self._act = act
        self._lock = threading.Lock()
        self._timers: dict[Hashable, _Timer] = {}
        self._gates: dict[Hashable, Mailbox] = {}

    def start(
        self,
        key: Hashable,
        interval: float,
        callback: Callable[..., Any],
        policy: OverrunPolicy = OverrunPolicy.SKIP_LATE_TICKS,
        *,
        max_catch_up: int = 1,
    ) -> None:
        """Start (or restart) timer `key`: `callback(ctx, tick)` every `interval` seconds.

        The first tick is one interval from now. `callback` may be `async def`.
        Restarting a key bumps its generation: queued ticks of the old one are skipped.

        Args:
            key: any hashable value naming the timer.
            interval: seconds, from 0.001 (1 ms) to `threading.TIMEOUT_MAX`.
            callback: `callback(ctx, tick)`, plain or `async def`.
            policy: what to do with ticks that fell due while the previous one ran.
            max_catch_up: for `CATCH_UP_BOUNDED`, the late ticks delivered back to back.

        Raises:
            TypeError, ValueError: bad `interval`, `callback`, `policy` or `max_catch_up`
                (nothing was started or stopped).
        """
        seconds = check_seconds("interval", interval, minimum=MIN_INTERVAL, inclusive=True)
        if not callable(callback):
            raise TypeError("callback must be callable")
        if not isinstance(policy, OverrunPolicy):
            raise TypeError(f"policy must be an OverrunPolicy, got {policy!r}")
        if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int):
            raise TypeError("max_catch_up must be an int")
        if max_catch_up < 1:
            raise ValueError("max_catch_up must be >= 1")
        hash(key)
        timer = _Timer(self, key, seconds, callback, policy, max_catch_up, self._box_for(key))
        with self._lock:
            old = self._timers.get(key)
            self._timers[key] = timer
        if old is not None:
            old.stop()
        timer.arm(1)

    def cancel(self, key: Hashable) -> bool:
        """Stop timer `key`; ticks not yet started never run. True if it was running."""
        with self._lock:
            timer = self._timers.pop(key, None)
        if timer is None:
            return False
        timer.stop()
        return True

    def keys(self) -> list[Hashable]:
        """The keys of the running timers."""
        with self._lock:
            return list(self._timers)

    def own_boxes(self) -> list[Mailbox]:
        """Mailboxes of timers that have gates of their own."""
        with self._lock:
            return list(self._gates.values())

    def cancel_all(self) -> None:
        with self._lock:
            timers = list(self._timers.values())
            self._timers.clear()
        for timer in timers:
            timer.stop()

    def _box_for(self, key: Hashable) -> Mailbox:
        act = self._act
        if act.kind is not ObjectKind.SPOT or act.box.gate.spotwide:
            return act.box
        # PerActor Spot: each of its own timers gets a gate of its own.
        with self._lock:
            box = self._gates.get(key)
            if box is None:
                box = self._gates[key] = Mailbox(act, Gate())
            return box


def timers_for(runtime: Runtime, act: Activation) -> TimerSet:
    """The timer set of `act` (`ctx.timers`), created on first use."""
    timers = act.timers
    if timers is None:
        with _made_lock:
            timers = act.timers
            if timers is None:
                timers = act.timers = TimerSet(runtime, act)
    assert isinstance(timers, TimerSet)
    return timers


#: Serialises the first use of `ctx.timers` (rare: once per object that uses timers).
_made_lock = threading.Lock()
