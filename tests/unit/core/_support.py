"""What the unit tests of the timer service and its users share beyond the public kit
(`zlink_actors.testing`): a probe of the service itself."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from zlink_actors.testing import WAIT

if TYPE_CHECKING:
    from zlink_actors import ManualClock
    from zlink_actors._core.clock import TimerService


def probe(service: TimerService, clock: ManualClock) -> None:
    """Return once the timer thread has run everything due at the clock's current time."""
    reached = threading.Event()
    service.call_at(clock.monotonic(), reached.set)
    assert reached.wait(WAIT), "the timer thread did not reach the current time"
