"""An idle owner stays small (issue 3: "well under 2 KiB each", lanes allocated lazily)."""

from __future__ import annotations

import gc
import threading
import tracemalloc

import msgspec

import zlink_actors as z


class Ping(msgspec.Struct, frozen=True):
    n: int


class Room(z.Spot):
    @z.handler
    def ping(self, ctx: z.SpotContext, msg: Ping) -> int:
        return msg.n


COUNT = 2_000
BUDGET = 2048  # bytes of Python heap per idle Spot


def test_idle_spots_cost_well_under_two_kib_each_and_no_thread() -> None:
    with z.Host(spots=[Room]) as host:
        host.spots.get_or_create("warm", Room).submit_sync()
        assert host.request_to_spot("warm", Ping(1)).submit_sync() == 1
        threads = threading.active_count()
        gc.collect()
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for i in range(COUNT):
                host.spots.get_or_create(f"room-{i}", Room).submit_sync()
            gc.collect()
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        per_spot = (after - before) / COUNT
        assert per_spot < BUDGET / 2, f"{per_spot:.0f} B per idle Spot"
        assert threading.active_count() == threads


def test_a_spot_gives_its_lanes_back_once_they_drain() -> None:
    with z.Host(spots=[Room]) as host:
        host.spots.get_or_create("r", Room).submit_sync()
        assert host.request_to_spot("r", Ping(2)).submit_sync() == 2
        box = host._runtime.engine.spots["r"].box
        assert box.app is None
        assert box.life is None
        assert box.waiters is None
