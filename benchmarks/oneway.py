"""Scenario 1: one-way throughput from an application thread to one Spot."""

from __future__ import annotations

import threading
import time

import pykka

import zlink_actors as z

from ._harness import Metric, Metrics, Scenario
from ._payloads import Counter, Msg, PeerCounter


def zlink_case(n: int) -> Metrics:
    done = threading.Event()
    Counter.target, Counter.done = n, done
    with z.Host(spots=[Counter]) as host:
        host.spots.get_or_create("counter", Counter).submit_sync()
        msg = Msg(1)
        send = host.send_to_spot
        start = time.perf_counter()
        for _ in range(n):
            send("counter", msg).submit()
        if not done.wait(120):
            raise RuntimeError("the Spot did not see every message")
        elapsed = time.perf_counter() - start
    return {"messages/s": n / elapsed}


def peer_case(n: int) -> Metrics:
    done = threading.Event()
    ref = PeerCounter.start(n, done)
    msg = Msg(1)
    try:
        start = time.perf_counter()
        for _ in range(n):
            ref.tell(msg)
        if not done.wait(120):
            raise RuntimeError("the actor did not see every message")
        elapsed = time.perf_counter() - start
    finally:
        ref.stop()
        pykka.ActorRegistry.stop_all()
    return {"messages/s": n / elapsed}


def scenario(quick: bool) -> Scenario:
    n = 20_000 if quick else 200_000
    return Scenario(
        title=f"1. one-way throughput ({n:,} sends, default lane 1,024 items)",
        zlink=lambda: zlink_case(n),
        peer=lambda: peer_case(n),
        peer_name="pykka ThreadingActor.tell (unbounded inbox)",
        metrics=[Metric("messages/s", "/s", higher_is_better=True, target=2.0)],
        notes=["most zlink sends wait for lane space and are admitted later (FIFO)"],
    )
