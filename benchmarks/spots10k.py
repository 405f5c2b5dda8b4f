"""Scenario 5: 10,000 Spots (create, one request each, close), each case in a fresh process.

RSS deltas are only honest in a fresh interpreter, so every repetition runs
`python -m benchmarks.spots10k CASE COUNT` and reads its JSON line.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pykka

import zlink_actors as z

from ._harness import Metric, Metrics, Scenario
from ._payloads import Msg


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class Room(z.Spot):
    @z.handler
    def on_msg(self, ctx: z.SpotContext, msg: Msg) -> int:
        return msg.n


class PeerRoom(pykka.ThreadingActor):  # type: ignore[misc]
    def on_receive(self, message: object) -> object:
        assert isinstance(message, Msg)
        return message.n


def _metrics(
    count: int,
    created: float,
    reached: float,
    closed: float,
    rss_delta: int,
    threads: int,
    threads0: int,
) -> dict[str, float]:
    return {
        "create": created,
        "reach all": reached,
        "close": closed,
        "KiB per object": rss_delta / count,
        "threads": float(threads),
        "threads added": float(threads - threads0),
    }


def _zlink(count: int) -> dict[str, float]:
    with z.Host(spots=[Room]) as host:
        host.spots.get_or_create("warm", Room).submit_sync()
        host.request_to_spot("warm", Msg(0)).submit_sync()
        gc.collect()
        rss0, threads0 = rss_kib(), threading.active_count()
        start = time.perf_counter()
        for i in range(count):
            host.spots.get_or_create(f"room-{i}", Room).submit_sync()
        created = time.perf_counter() - start
        gc.collect()
        rss1 = rss_kib()
        start = time.perf_counter()
        calls = [host.request_to_spot(f"room-{i}", Msg(i)).submit() for i in range(count)]
        for call in calls:
            call.result()
        reached = time.perf_counter() - start
        threads = threading.active_count()
        start = time.perf_counter()
        closes = [host.spots.close(f"room-{i}").submit() for i in range(count)]
        for close in closes:
            if close.result() is not True:
                raise RuntimeError("a Spot did not close")
        closed = time.perf_counter() - start
    return _metrics(count, created, reached, closed, rss1 - rss0, threads, threads0)


def _zlink_in_flight(count: int) -> dict[str, float]:
    """Create `count` Spots with every `get_or_create(...).submit()` in flight together,
    then wait for each result (a fresh process of its own, like the sequential create)."""
    with z.Host(spots=[Room]) as host:
        host.spots.get_or_create("warm", Room).submit_sync()
        host.request_to_spot("warm", Msg(0)).submit_sync()
        gc.collect()
        spots = host.spots
        start = time.perf_counter()
        calls = [spots.get_or_create(f"room-{i}", Room).submit() for i in range(count)]
        for call in calls:
            if not isinstance(call.result(), z.Created):
                raise RuntimeError("a Spot was not created")
        created = time.perf_counter() - start
    return {"create, in flight": created}


def _pykka(count: int) -> dict[str, float]:
    warm = PeerRoom.start()
    warm.ask(Msg(0))
    gc.collect()
    rss0, threads0 = rss_kib(), threading.active_count()
    start = time.perf_counter()
    refs = [PeerRoom.start() for _ in range(count)]
    created = time.perf_counter() - start
    gc.collect()
    rss1 = rss_kib()
    start = time.perf_counter()
    futures = [ref.ask(Msg(i), block=False) for i, ref in enumerate(refs)]
    for future in futures:
        future.get()
    reached = time.perf_counter() - start
    threads = threading.active_count()
    start = time.perf_counter()
    pykka.ActorRegistry.stop_all()
    closed = time.perf_counter() - start
    out = _metrics(count, created, reached, closed, rss1 - rss0, threads, threads0)
    # pykka has one way to make an actor, `start()`: the in-flight variant is judged
    # against the same 10,000 starts.
    out["create, in flight"] = created
    return out


def _in_subprocess(case: str, count: int) -> Metrics:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.spots10k", case, str(count)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {key: float(value) for key, value in result.items()}


def scenario(quick: bool) -> Scenario:
    count = 2_000 if quick else 10_000
    notes = [
        f"zlink: spots.close() for each Spot, {count:,} in flight; pykka: stop_all()",
        f"create, in flight: {count:,} get_or_create(...).submit() at once, in a fresh "
        "process of its own; pykka: the same start() figure as create",
    ]
    if quick:
        # pykka's cost per actor grows with the number of threads, so a ratio measured
        # on 2,000 says nothing about the 10,000-object targets: they are not judged.
        notes.append("quick run: the create and reach targets are for 10,000 Spots and not judged")
    return Scenario(
        title=f"5. {count:,} Spots: create, one request each, close (fresh process per run)",
        zlink=lambda: {
            **_in_subprocess("zlink", count),
            **_in_subprocess("zlink-flight", count),
        },
        peer=lambda: _in_subprocess("pykka", count),
        peer_name=f"{count:,} pykka ThreadingActors (start, ask each, stop)",
        metrics=[
            Metric("create", "s", higher_is_better=False, target=None if quick else 0.05),
            Metric(
                "create, in flight", "s", higher_is_better=False, target=None if quick else 0.05
            ),
            Metric("reach all", "s", higher_is_better=False, target=None if quick else 0.1),
            Metric("close", "s", higher_is_better=False),
            Metric("KiB per object", "KiB", higher_is_better=False, target=0.2),
            Metric("threads", "", higher_is_better=False),
            Metric("threads added", "", higher_is_better=False),
        ],
        notes=notes,
    )


if __name__ == "__main__":
    which, n = sys.argv[1], int(sys.argv[2])
    cases = {"zlink": _zlink, "zlink-flight": _zlink_in_flight, "pykka": _pykka}
    out = cases[which](n)
    print(json.dumps(out))
