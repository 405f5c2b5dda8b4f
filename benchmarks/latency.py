"""Scenario 2: sequential request latency from an application thread."""

from __future__ import annotations

import threading
import time

import pykka

import zlink_actors as z

from ._harness import Metric, Metrics, Scenario
from ._payloads import Counter, Msg, PeerCounter


def zlink_case(n: int) -> Metrics:
    Counter.target, Counter.done = -1, None
    with z.Host(spots=[Counter]) as host:
        host.spots.get_or_create("counter", Counter).submit_sync()
        request = host.request_to_spot
        start = time.perf_counter()
        for i in range(n):
            request("counter", Msg(i)).submit_sync()
        elapsed = time.perf_counter() - start
    return {"latency": elapsed / n * 1e6}


def peer_case(n: int) -> Metrics:
    ref = PeerCounter.start(-1, threading.Event())
    try:
        start = time.perf_counter()
        for i in range(n):
            ref.ask(Msg(i), block=False).get()
        elapsed = time.perf_counter() - start
    finally:
        ref.stop()
        pykka.ActorRegistry.stop_all()
    return {"latency": elapsed / n * 1e6}


def scenario(quick: bool) -> Scenario:
    n = 2_000 if quick else 20_000
    return Scenario(
        title=f"2. request latency, application thread ({n:,} sequential submit_sync)",
        zlink=lambda: zlink_case(n),
        peer=lambda: peer_case(n),
        peer_name="pykka ask(block=False).get()",
        metrics=[Metric("latency", "us", higher_is_better=False, target=0.8)],
    )
