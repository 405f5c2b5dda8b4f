"""Bounded waits for the unit tests that watch a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zlink_actors import ManualClock
    from zlink_actors._timer import TimerService

#: Upper bound for every wait that is expected to succeed.
WAIT = 5.0


def eventually(predicate: Callable[[], bool], within: float = WAIT) -> bool:
    """Poll `predicate` until it holds or `within` seconds pass (callers assert the
    result: a bounded wait, not a sleep used as synchronisation)."""
    pause = threading.Event()
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= end:
            return False
        pause.wait(0.002)
    return True


def probe(service: TimerService, clock: ManualClock) -> None:
    """Return once the timer thread has run everything due at the clock's current time."""
    reached = threading.Event()
    service.call_at(clock.monotonic(), reached.set)
    assert reached.wait(WAIT), "the timer thread did not reach the current time"


def finishes(fn: Callable[[], object], within: float = WAIT) -> bool:
    """Run `fn` on a helper thread; False if it is still running after `within` seconds
    (a self-deadlock then fails the test instead of hanging the suite)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(within)
    return not thread.is_alive()
