"""Scenario 3: pipelined requests, 64 in flight."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import pykka

import zlink_actors as z

from ._harness import Metric, Metrics, Scenario
from ._payloads import Counter, Msg, PeerCounter

WINDOW = 64


def zlink_case(n: int) -> Metrics:
    Counter.target, Counter.done = -1, None
    with z.Host(spots=[Counter]) as host:
        host.spots.get_or_create("counter", Counter).submit_sync()
        request = host.request_to_spot
        inflight: deque[z.Completion[Any]] = deque()
        start = time.perf_counter()
        for i in range(n):
            if len(inflight) == WINDOW:
                inflight.popleft().result()
            inflight.append(request("counter", Msg(i)).submit())
        while inflight:
            inflight.popleft().result()
        elapsed = time.perf_counter() - start
    return {"requests/s": n / elapsed}


def peer_case(n: int) -> Metrics:
    ref = PeerCounter.start(-1, threading.Event())
    try:
        inflight: deque[Any] = deque()
        start = time.perf_counter()
        for i in range(n):
            if len(inflight) == WINDOW:
                inflight.popleft().get()
            inflight.append(ref.ask(Msg(i), block=False))
        while inflight:
            inflight.popleft().get()
        elapsed = time.perf_counter() - start
    finally:
        ref.stop()
        pykka.ActorRegistry.stop_all()
    return {"requests/s": n / elapsed}


def scenario(quick: bool) -> Scenario:
    n = 5_000 if quick else 50_000
    return Scenario(
        title=f"3. pipelined requests ({n:,} total, {WINDOW} in flight)",
        zlink=lambda: zlink_case(n),
        peer=lambda: peer_case(n),
        peer_name=f"pykka ask(block=False) with {WINDOW} outstanding futures",
        metrics=[Metric("requests/s", "/s", higher_is_better=True, target=1.5)],
    )
