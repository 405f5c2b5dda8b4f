"""Message types and helpers shared by the engine contract tests.

Concurrency here is ordered by `threading.Event`, FIFO probes and the Host's own timer
heap, never by sleeping. `NEGATIVE_WAIT` is the one exception, and only for checks that
something does *not* happen: a correct engine passes them regardless of its value.
"""

import threading

import msgspec
import pytest

from zlink_actors import DeadlineExceededError, Host, ManualClock

__all__ = [
    "NEGATIVE_WAIT",
    "WAIT",
    "Boom",
    "Hit",
    "Hold",
    "HeldJob",
    "Note",
    "Ping",
    "Pong",
    "Probe",
    "flush_ticks",
    "settle_timer_heap",
]

#: Upper bound for every wait that is expected to succeed.
WAIT = 5.0
#: How long a test watches for something that must not happen.
NEGATIVE_WAIT = 0.2


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


class HeldJob:
    """A worker body that reports when it starts and returns `value` once released."""

    def __init__(self, value: object = None) -> None:
        self.value = value
        self.started = threading.Event()
        self._release = threading.Event()
        self.runs = 0

    def __call__(self, *args: object) -> object:
        self.runs += 1
        self.started.set()
        if not self._release.wait(30):
            raise TimeoutError("HeldJob was never released")
        return self.value

    def release(self) -> None:
        self._release.set()


def settle_timer_heap(host: Host, clock: ManualClock, seconds: float) -> None:
    """Advance `clock` by `seconds`; return once the Host's timer heap fired all now due.

    Request deadlines, worker deadlines and Spot timers share one heap, fired in deadline
    order. A held CPU job whose deadline is exactly the new time is the last entry due, so
    once its `DeadlineExceededError` is observed every earlier entry (a Spot timer that
    fell due, say) has fired too; a fired timer tick is then already queued.
    """
    job = HeldJob()
    call = host.run_cpu_worker(job).timeout(seconds).submit()
    try:
        clock.advance(seconds)
        with pytest.raises(DeadlineExceededError):
            call.result(WAIT)
    finally:
        job.release()


def flush_ticks(host: Host, clock: ManualClock, spot_id: str) -> None:
    """Let every due tick of SpotWide Spot `spot_id` run to completion, re-arming included.

    Each round fires what is due (moving the clock by 1 ms) and sends a `Probe` behind it
    (the Spot must answer `Probe`), so a tick re-armed at a time already passed also runs.
    """
    for _ in range(3):
        settle_timer_heap(host, clock, 0.001)
        host.request_to_spot(spot_id, Probe()).submit_sync()
