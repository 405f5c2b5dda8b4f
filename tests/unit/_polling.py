"""A bounded poll for the unit tests that watch a background thread's state change."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def eventually(predicate: Callable[[], bool], within: float = 5.0) -> bool:
    """Poll `predicate` until it holds or `within` seconds pass (callers assert the
    result: a bounded wait, not a sleep used as synchronisation)."""
    pause = threading.Event()
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= end:
            return False
        pause.wait(0.002)
    return True
