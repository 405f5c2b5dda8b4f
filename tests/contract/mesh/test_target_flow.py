"""One stuck object never makes the rest of its node unreachable (issue 26 item 3;
docs/mesh.md "Backpressure and inbound flow control", "One full target").

A Spot `stuck` whose handler blocks on a latch, and thousands of one-ways queued for it
from one front end A, on server S: S keeps its inbound permits for its other objects
(records for one target take at most `target_permits` of them), so requests from A and
from a front end B that never sent anything to `stuck` reach the idle Spot `idle` on S
within a bounded latency; a request to `stuck` fails fast with `UnavailableError` (its
queue is full); once the latch is released every one-way is handled exactly once, in
order.

Real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`) on tcp loopback;
every wait is bounded and asserted.
"""

from __future__ import annotations

import gc
import time
import tracemalloc

from zlink_actors import (
    Completion,
    DeadlineExceededError,
    Host,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.testing import WAIT, wait_until

from ._global import GlobalMesh, mesh_stats
from ._global_objects import Hold, Note, Ping, Room

#: The server's permits: fixed, so the test does not depend on the CPU count (the
#: default is 128 x CPUs). Before this change the server paused at 80% of them.
PERMITS = 256
#: One-ways queued for the stuck Spot: more than its application lane (1,024) holds, so
#: some wait for admission, and far more than the permits.
FLOOD = 3000
#: The latency every request to the idle Spot must keep (they timed out before).
BOUND = 1.0
#: A request's deadline in the probes (longer than BOUND: a late reply is measured).
DEADLINE = 3.0


def _latency(host: Host, spot_id: str, n: int) -> float:
    """Seconds one request to `spot_id` takes (DEADLINE when it timed out)."""
    start = time.monotonic()
    try:
        assert (
            host.request_to_spot(spot_id, Ping(n), reply=int).timeout(DEADLINE).submit_sync() == n
        )
    except DeadlineExceededError:
        return DEADLINE
    return time.monotonic() - start


def _queue_full(host: Host) -> UnavailableError | None:
    """The error of one request to `stuck` if it failed as a full queue, else None."""
    try:
        host.request_to_spot("stuck", Ping(-1), reply=int).timeout(0.3).submit_sync()
    except UnavailableError as exc:
        return exc
    except DeadlineExceededError:
        return None
    raise AssertionError("a request to the stuck Spot was answered")


def test_a_stuck_spot_and_its_queued_one_ways_leave_the_other_spots_of_its_node_reachable(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room], mesh={"inbound_permits": PERMITS})
    a = mesh.add()
    b = mesh.add()
    a.spots.get_or_create("stuck", Room).submit_sync()
    a.spots.get_or_create("idle", Room).submit_sync()
    log = mesh.journal
    for host in (a, b):  # both front ends know where the two Spots live
        assert _latency(host, "idle", 0) < DEADLINE

    a.send_to_spot("stuck", Hold("stuck")).submit_sync()
    assert log.event("entered").wait(WAIT)
    received = mesh_stats(server).frames_in
    sends: list[Completion[None]] = [
        a.send_to_spot("stuck", Note(i)).submit() for i in range(FLOOD)
    ]
    # Every one-way reaches S or waits at A, held back for the full target (before this
    # change S PAUSED at 80% of its permits and read no more, and they waited in A's
    # credit); the stuck Spot holds what S gives one target. How many are held back at A
    # depends on when S's FULL overtakes A's flood: under CPU load, some are.
    assert wait_until(
        lambda: mesh_stats(server).frames_in - received + mesh_stats(a).target_waits >= FLOOD,
        within=2 * WAIT,
    )
    assert mesh_stats(server).permits_in_use >= PERMITS // 8

    latencies = {"A": [_latency(a, "idle", i) for i in range(1, 21)]}
    latencies["B"] = [_latency(b, "idle", i) for i in range(21, 41)]
    print(f"idle Spot latency, s: {latencies}")
    assert max(latencies["A"]) < BOUND, latencies
    assert max(latencies["B"]) < BOUND, latencies
    stats = mesh_stats(server)
    assert not stats.paused
    # The stuck Spot holds its share of the permits and no more; what else is queued for
    # it was admitted without one.
    assert stats.target_permits == PERMITS // 8
    assert stats.full_targets == 1
    assert stats.permits_in_use <= stats.target_permits
    assert stats.unpermitted_records > 0

    # Once the stuck Spot's lane is full, a request to it fails at once.
    assert wait_until(lambda: _queue_full(b) is not None)
    start = time.monotonic()
    refused = _queue_full(b)
    assert refused is not None
    assert time.monotonic() - start < BOUND
    assert "queue" in str(refused)
    assert "full" in str(refused)
    assert refused.reason is UnavailableReason.QUEUE_FULL
    assert _latency(b, "idle", 41) < BOUND  # and the idle Spot still answers

    log.latch("stuck").set()
    assert log.wait_count("note", FLOOD, within=WAIT * 4)
    assert all(c.wait(WAIT) and c.exception() is None for c in sends)
    notes = [n for spot, n, _ in log.items("note") if spot == "stuck"]  # type: ignore[misc]
    assert notes == list(range(FLOOD))  # each once, in the order A sent them
    assert wait_until(lambda: mesh_stats(server).permits_in_use == 0)


#: A credit window the flood to the stuck Spot outgrows many times over (each one-way is
#: charged at least 256 bytes: 64 KiB is 256 of them).
SMALL_WINDOW = 64 * 1024


def test_one_ways_to_a_full_target_wait_at_their_sender_and_its_other_calls_keep_flowing(
    mesh: GlobalMesh,
) -> None:
    # S grants each sender a small credit window. Before per-target flow, what waited for
    # the stuck Spot's lane held A's credit until admitted: past 256 of them A's every
    # record to S (its requests to `idle` too) waited for credit behind them.
    server = mesh.add(
        spots=[Room], mesh={"inbound_permits": PERMITS, "credit_window": SMALL_WINDOW}
    )
    a = mesh.add()
    a.spots.get_or_create("stuck", Room).submit_sync()
    a.spots.get_or_create("idle", Room).submit_sync()
    log = mesh.journal
    assert _latency(a, "idle", 0) < DEADLINE

    a.send_to_spot("stuck", Hold("stuck")).submit_sync()
    assert log.event("entered").wait(WAIT)
    sends = [a.send_to_spot("stuck", Note(i)).submit() for i in range(FLOOD)]
    # S said FULL: the rest of the flood waits at A, never failing.
    assert wait_until(lambda: mesh_stats(a).target_waits > 0)
    assert not any(c.done() and c.exception() is not None for c in sends)

    latencies = [_latency(a, "idle", i) for i in range(1, 21)]
    print(f"idle Spot latency from the flooding sender, s: {latencies}")
    assert max(latencies) < BOUND, latencies
    # What S holds for the stuck Spot is its lane and at most two credit windows of A's
    # (what A had sent before FULL reached it): the rest waits at A.
    assert mesh_stats(a).target_waits >= FLOOD - 1024 - 2 * (SMALL_WINDOW // 256)

    log.latch("stuck").set()
    assert log.wait_count("note", FLOOD, within=WAIT * 4)
    assert all(c.wait(WAIT) and c.exception() is None for c in sends)
    notes = [n for spot, n, _ in log.items("note") if spot == "stuck"]  # type: ignore[misc]
    assert notes == list(range(FLOOD))  # each once, in the order A sent them
    assert wait_until(lambda: mesh_stats(a).target_waits == 0)
    assert _latency(a, "stuck", 1) < BOUND  # the Spot is free again
    assert wait_until(lambda: mesh_stats(server).permits_in_use == 0)


def test_one_ways_waiting_for_a_full_target_fail_when_its_node_is_lost(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(
        spots=[Room],
        cuttable=True,
        mesh={"inbound_permits": PERMITS, "credit_window": SMALL_WINDOW},
    )
    a = mesh.add()
    a.spots.get_or_create("stuck", Room).submit_sync()
    log = mesh.journal
    a.send_to_spot("stuck", Hold("stuck")).submit_sync()
    assert log.event("entered").wait(WAIT)
    sends = [a.send_to_spot("stuck", Note(i)).submit() for i in range(FLOOD)]
    assert wait_until(lambda: mesh_stats(a).target_waits > 0)

    mesh.kill(server)
    # Never sent, they end: UnavailableError (the peer is lost), none left waiting.
    assert all(c.wait(WAIT) for c in sends)
    failed = [c.exception() for c in sends if c.exception() is not None]
    assert failed
    assert all(isinstance(e, UnavailableError) for e in failed)
    assert all(e.reason is UnavailableReason.PEER_LOST for e in failed)  # type: ignore[union-attr]
    assert mesh_stats(a).target_waits == 0


def test_two_senders_flooding_one_full_target_each_get_every_one_way_handled_once_in_order(
    mesh: GlobalMesh,
) -> None:
    # Both told FULL, both sent OPEN as the stuck Spot drains (each OPEN's room, then
    # WAITING for more): every one-way of each is handled once, in its sender's order.
    server = mesh.add(
        spots=[Room], mesh={"inbound_permits": PERMITS, "credit_window": SMALL_WINDOW}
    )
    senders = [mesh.add(), mesh.add()]
    senders[0].spots.get_or_create("stuck", Room).submit_sync()
    senders[0].spots.get_or_create("idle", Room).submit_sync()
    log = mesh.journal
    for host in senders:
        assert _latency(host, "idle", 0) < DEADLINE
    senders[0].send_to_spot("stuck", Hold("stuck")).submit_sync()
    assert log.event("entered").wait(WAIT)
    each = FLOOD // 2
    firsts = [0, 100_000]
    sends = [
        host.send_to_spot("stuck", Note(first + i)).submit()
        for i in range(each)
        for host, first in zip(senders, firsts, strict=True)
    ]
    assert wait_until(lambda: all(mesh_stats(h).target_waits > 0 for h in senders))
    for host in senders:
        assert max(_latency(host, "idle", i) for i in range(1, 6)) < BOUND

    log.latch("stuck").set()
    assert log.wait_count("note", FLOOD, within=WAIT * 4)
    assert all(c.wait(WAIT) and c.exception() is None for c in sends)
    notes = [n for spot, n, _ in log.items("note") if spot == "stuck"]  # type: ignore[misc]
    assert len(notes) == FLOOD
    for first in firsts:
        assert [n for n in notes if first <= n < first + each] == list(range(first, first + each))
    assert wait_until(lambda: all(mesh_stats(h).target_waits == 0 for h in senders))
    assert wait_until(lambda: mesh_stats(server).permits_in_use == 0)


def test_a_one_way_waiting_for_a_full_target_costs_its_sender_under_half_a_kibibyte(
    mesh: GlobalMesh,
) -> None:
    # What it holds: its frames, a result cell (on the lock parked one-ways share) and
    # a pair in its target's queue; about 360 - 390 bytes (benchmarks/parked.py).
    mesh.add(spots=[Room], mesh={"inbound_permits": PERMITS, "credit_window": SMALL_WINDOW})
    a = mesh.add()
    a.spots.get_or_create("stuck", Room).submit_sync()
    log = mesh.journal
    a.send_to_spot("stuck", Hold("stuck")).submit_sync()
    assert log.event("entered").wait(WAIT)
    first = [a.send_to_spot("stuck", Note(i)).submit() for i in range(FLOOD)]
    assert wait_until(lambda: mesh_stats(a).target_waits > 0)
    waiting = mesh_stats(a).target_waits
    count = 10_000
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        later = [a.send_to_spot("stuck", Note(FLOOD + i)).submit() for i in range(count)]
        each = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert mesh_stats(a).target_waits == waiting + count  # every one waits at A
    assert each < 512, f"{each:.0f} bytes per waiting one-way"

    log.latch("stuck").set()
    assert log.wait_count("note", FLOOD + count, within=WAIT * 4)
    assert all(c.wait(WAIT) and c.exception() is None for c in [*first, *later])
