"""Infrastructure progress with every handler blocked (digest §4 "Infrastructure
progress").

Timeouts and shutdown run on their own threads, not in pool slots: with every pool
thread stuck inside a handler, a request deadline still fires and shutdown still returns.
"""

import threading
import time
from collections.abc import Iterator

import pytest

from zlink_actors import (
    Completion,
    DeadlineExceededError,
    Host,
    ShutdownOutcome,
    ShuttingDownError,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hold, Ping, Pong

POOL_THREADS = 2


class Stuck:
    """A Host whose whole application pool is blocked inside handlers."""

    def __init__(self, harness: HostHarness) -> None:
        self.latch = harness.latch()
        self.entered = threading.Semaphore(0)
        self.exited = threading.Semaphore(0)
        stuck = self

        class Room(Spot):
            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> str:
                stuck.entered.release()
                try:
                    stuck.latch.wait(30)
                finally:
                    stuck.exited.release()
                return "late"

            @handler
            def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
                return Pong(msg.n)

        self.host = harness.host(spots=[Room], app_threads=POOL_THREADS)
        self.held: list[Completion[object]] = []
        for i in range(POOL_THREADS + 1):
            self.host.spots.get_or_create(f"room{i}", Room).submit_sync()
        for i in range(POOL_THREADS):
            self.held.append(self.host.request_to_spot(f"room{i}", Hold()).timeout(60).submit())
        for _ in range(POOL_THREADS):
            assert self.entered.acquire(timeout=WAIT)

    def release(self) -> None:
        """Unblock the handlers and wait until each has left user code."""
        self.latch.set()
        for _ in range(POOL_THREADS):
            assert self.exited.acquire(timeout=WAIT)


@pytest.fixture
def stuck(harness: HostHarness) -> Iterator[Stuck]:
    stuck = Stuck(harness)
    try:
        yield stuck
    finally:
        stuck.release()


def test_request_timeout_fires_while_every_pool_thread_is_blocked(stuck: Stuck) -> None:
    host: Host = stuck.host
    request = host.request_to_spot(f"room{POOL_THREADS}", Ping(1)).timeout(0.2).submit()

    with pytest.raises(DeadlineExceededError):
        request.result(WAIT)
    assert host.statistics().pool.busy_threads == POOL_THREADS


def test_shutdown_force_stops_promptly_while_every_pool_thread_is_blocked(
    stuck: Stuck,
) -> None:
    host: Host = stuck.host
    started = time.monotonic()

    result = host.shutdown(deadline=0.5)

    assert time.monotonic() - started < WAIT
    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.forced_operations == POOL_THREADS
    assert result.abandoned_threads == POOL_THREADS
    for request in stuck.held:
        with pytest.raises(ShuttingDownError):
            request.result(WAIT)
