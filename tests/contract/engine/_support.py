"""Message types and helpers shared by the engine contract tests.

Concurrency here is ordered by `threading.Event`, FIFO probes and the Host's own timer
heap (`zlink_actors.testing`), never by sleeping. `NEGATIVE_WAIT` is the one exception,
and only for checks that something does *not* happen: a correct engine passes them
regardless of its value.
"""

import msgspec

from zlink_actors import Host, ManualClock
from zlink_actors.testing import advance_and_settle

from .._support import NEGATIVE_WAIT

__all__ = [
    "NEGATIVE_WAIT",
    "Boom",
    "Hit",
    "Hold",
    "Note",
    "Ping",
    "Pong",
    "Probe",
    "flush_ticks",
]


class Ping(msgspec.Struct, frozen=True):
    n: int = 0


class Pong(msgspec.Struct, frozen=True):
    n: int = 0


class Note(msgspec.Struct, frozen=True):
    n: int = 0


class Hit(msgspec.Struct, frozen=True):
    """A message whose only effect is to be counted by its target."""


class Hold(msgspec.Struct, frozen=True):
    """Asks a handler to block on the test's latch."""


class Probe(msgspec.Struct, frozen=True):
    """A FIFO marker: once its reply arrives, every record queued before it has run."""


class Boom(msgspec.Struct, frozen=True):
    """Asks a handler to raise."""


def flush_ticks(host: Host, clock: ManualClock, spot_id: str) -> None:
    """Let every due tick of SpotWide Spot `spot_id` run to completion, re-arming included.

    Each round fires what is due (moving the clock by 1 ms) and sends a `Probe` behind it
    (the Spot must answer `Probe`), so a tick re-armed at a time already passed also runs.
    """
    for _ in range(3):
        advance_and_settle(host, clock, 0.001)
        host.request_to_spot(spot_id, Probe()).submit_sync()
