"""Scenario 4: handler-to-handler requests, 64 Spot pairs, awaited with submit() or yield_()."""

from __future__ import annotations

import time

import msgspec
import pykka

import zlink_actors as z

from ._harness import Metric, Metrics, Scenario
from ._payloads import Msg

PAIRS = 64


class Go(msgspec.Struct, frozen=True):
    peer: str
    rounds: int
    use_yield: bool


class Caller(z.Spot):
    @z.handler
    async def go(self, ctx: z.SpotContext, msg: Go) -> int:
        total = 0
        for i in range(msg.rounds):
            call = ctx.request_to_spot(msg.peer, Msg(i), reply=int)
            total += await (call.yield_() if msg.use_yield else call.submit())
        return total


class Callee(z.Spot):
    @z.handler
    def on_msg(self, ctx: z.SpotContext, msg: Msg) -> int:
        return msg.n


def zlink_case(rounds: int, use_yield: bool) -> Metrics:
    with z.Host(spots=[Caller, Callee]) as host:
        for i in range(PAIRS):
            host.spots.get_or_create(f"a{i}", Caller).submit_sync()
            host.spots.get_or_create(f"b{i}", Callee).submit_sync()
        start = time.perf_counter()
        calls = [
            host.request_to_spot(f"a{i}", Go(f"b{i}", rounds, use_yield)).timeout(600).submit()
            for i in range(PAIRS)
        ]
        for call in calls:
            call.result()
        elapsed = time.perf_counter() - start
    n = PAIRS * rounds
    return {"requests/s": n / elapsed, "per request": elapsed / n * 1e6}


class PeerCallee(pykka.ThreadingActor):  # type: ignore[misc]
    def on_receive(self, message: object) -> object:
        assert isinstance(message, Msg)
        return message.n


class PeerCaller(pykka.ThreadingActor):  # type: ignore[misc]
    def on_receive(self, message: object) -> object:
        peer, rounds = message  # type: ignore[misc]
        return sum(peer.ask(Msg(i)) for i in range(rounds))


def peer_case(rounds: int) -> Metrics:
    pairs = [(PeerCaller.start(), PeerCallee.start()) for _ in range(PAIRS)]
    try:
        start = time.perf_counter()
        futures = [a.ask((b, rounds), block=False) for a, b in pairs]
        for future in futures:
            future.get(timeout=600)
        elapsed = time.perf_counter() - start
    finally:
        pykka.ActorRegistry.stop_all()
    n = PAIRS * rounds
    return {"requests/s": n / elapsed, "per request": elapsed / n * 1e6}


def scenarios(quick: bool) -> list[Scenario]:
    rounds = 100 if quick else 1_000
    metrics = [
        Metric("requests/s", "/s", higher_is_better=True),
        Metric("per request", "us", higher_is_better=False),
    ]
    return [
        Scenario(
            title=f"4a. handler-to-handler, await submit() ({PAIRS} pairs x {rounds:,})",
            zlink=lambda: zlink_case(rounds, use_yield=False),
            peer=lambda: peer_case(rounds),
            peer_name="pykka actors, A blocks on B.ask() (a thread per actor)",
            metrics=metrics,
        ),
        Scenario(
            title=f"4b. handler-to-handler, await yield_() ({PAIRS} pairs x {rounds:,})",
            zlink=lambda: zlink_case(rounds, use_yield=True),
            peer=None,
            peer_name="none (shows the extra cost of releasing and re-taking the gate)",
            metrics=metrics,
        ),
    ]
