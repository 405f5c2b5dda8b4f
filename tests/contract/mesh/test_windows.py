"""The receiver's credit window bounds what a sender sends it (docs/mesh.md
"Backpressure and inbound flow control"): one-ways beyond it wait, then all arrive."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness


class Chunk(msgspec.Struct):
    n: int
    data: bytes


release = threading.Event()
seen: list[int] = []


class Slow(z.NodeHandler):
    @z.handler
    def chunk(self, ctx: z.NodeContext, msg: Chunk) -> None:
        release.wait(WAIT)
        seen.append(msg.n)


def _mesh(**options: object) -> z.MeshConfig:
    return z.MeshConfig("w", liveness_interval=0.2, liveness_timeout=1.5, **options)  # type: ignore[arg-type]


def _until(condition: Callable[[], bool]) -> None:
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, "the condition did not hold within WAIT"
        time.sleep(0.01)


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    release.clear()
    seen.clear()
    with HostHarness() as h:
        try:
            yield h
        finally:
            release.set()


def test_a_sender_keeps_to_the_window_the_receiver_grants(harness: HostHarness) -> None:
    # Its lane holds 2: with the handler held, what comes next waits for admission, and
    # its credit stays out.
    receiver = harness.host(
        node_handler=Slow, app_threads=1, application_lane_items=2, mesh=_mesh(credit_window=8192)
    )
    sender = harness.host(mesh=_mesh(peers=(receiver.node.endpoint,)))  # its own: 16 MiB
    sender.wait_for_peers(1, timeout=WAIT)
    rid = receiver.node.routing_id
    sends = [sender.send_to_node("w", rid, Chunk(i, bytes(1000))).submit() for i in range(40)]

    def mesh_stats() -> z.MeshStatistics:
        stats = sender.statistics().mesh
        assert stats is not None
        return stats

    _until(lambda: mesh_stats().parked_sends > 0)
    assert mesh_stats().credit_in_use <= 8192
    waiting = [s for s in sends if not s.done()]
    assert waiting  # beyond the window: they wait, they do not fail
    assert not waiting[0].cancel()  # a waiting one-way refuses cancellation
    release.set()
    for send in sends:
        assert send.result(WAIT) is None
    _until(lambda: len(seen) == 40)
    assert seen == list(range(40))  # once each, in submission order


class Budget(msgspec.Struct):
    pass


class Clock(z.ChannelHandler):
    """In a lane of its own: the request finds room once the pipe lets it through."""

    @z.handler
    def budget(self, ctx: z.ChannelContext, msg: Budget) -> float:
        return ctx.deadline.remaining()


def test_a_request_that_waited_for_credit_carries_the_budget_it_has_left(
    harness: HostHarness,
) -> None:
    receiver = harness.host(
        node_handler=Slow,
        channels={"clock": Clock},
        application_lane_items=2,
        # One inbound permit, which a queued chunk holds: the receiver reads no more and
        # is PAUSED, so the request waits at the sender (a full target alone would not
        # hold the sender's credit: test_target_flow.py).
        mesh=_mesh(credit_window=4096, inbound_permits=1, target_permits=1),
    )
    clock = z.ManualClock()
    sender = harness.host(clock=clock, mesh=_mesh(peers=(receiver.node.endpoint,)))
    sender.wait_for_peers(1, timeout=WAIT)
    rid = receiver.node.routing_id
    for i in range(8):  # the receiver's handler holds the first; the rest fill the window
        sender.send_to_node("w", rid, Chunk(i, bytes(1000))).submit()
    call = sender.request_to_channel("clock", Budget(), reply=float).timeout(3.0).submit()

    def parked() -> bool:
        stats = sender.statistics().mesh
        assert stats is not None
        return stats.parked_sends > 0

    _until(parked)
    clock.advance(1.5)  # half its budget goes by while it waits for credit
    release.set()
    left = call.result(WAIT)
    assert 1.0 < left <= 1.51, left  # what it had left when it was sent, not 3 s
