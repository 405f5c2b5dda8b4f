"""What the unit tests of the timer service and its users share beyond the public kit
(`zlink_actors.testing`): a probe of the service itself, and a pending entry registered
on a bare table."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from zlink_actors._core.pending import PendingCell, PendingTable, begin
from zlink_actors._core.state import HostState
from zlink_actors.testing import WAIT

if TYPE_CHECKING:
    from zlink_actors import ManualClock
    from zlink_actors._core.clock import TimerService


def probe(service: TimerService, clock: ManualClock) -> None:
    """Return once the timer thread has run everything due at the clock's current time."""
    reached = threading.Event()
    service.call_at(clock.monotonic(), reached.set)
    assert reached.wait(WAIT), "the timer thread did not reach the current time"


class _Unarmed:
    at = -math.inf


class BareHost:
    """A Host as `pending.begin` reads it, around a bare table: serving, with a scan that
    `begin` never arms (its `at` is never `math.inf`); the tests arm scans by hand."""

    state = HostState.SERVING
    default_request_timeout = 30.0

    def __init__(self, table: PendingTable) -> None:
        self.pending = table
        self.deadlines = _Unarmed()


def register(table: PendingTable, entry: PendingCell, expires: float | None = None) -> int:
    """Register `entry` through `begin`, with nothing to submit; `expires` set: on the
    default deadline, due then (else no deadline). Returns its route id."""
    host = BareHost(table)
    if expires is None:
        assert begin(host, entry, None, math.inf, None)  # type: ignore[arg-type]
    else:
        assert begin(host, entry, host.default_request_timeout, expires, None)  # type: ignore[arg-type]
    return entry.route_id
