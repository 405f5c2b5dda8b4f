"""Scenario 10: global Spots across two Object Server node processes on one Redis
(issue 16). docs/performance.md has the current figures; docs/changelog-performance.md,
"Global objects (scenario 10)", how they were measured and what dominates.

The cluster, started once for the run and stopped at its end (also on failure;
`__main__` calls `CLUSTER.close()`): a redis-server of the benchmark's own on a free
loopback port (tests/contract/location/_redis_server.py finds and starts it), two Object
Server processes (`python -m benchmarks.global_objects serve objects URL PREFIX`: a Host
with `spots=[EchoSpot]`, scenario 9's `Echo` node handler, a `MeshConfig` and a
`RedisLocationStore`; started with scenario 9's `transports.server`), and, in this
process, the Object Client: a Host with `location=` and no Spot types.

- **10a** (reported, no peer): `count` Spots made with `spots.create(EchoSpot).submit()`,
  `WINDOW` in flight; the create rate and where they were placed; then one request to
  each, `WINDOW` in flight: the reach rate and the route-cache hit ratio (the first
  request to an id is a miss by design: a create does not fill the cache); then one more
  request to each (every route cached now), and a close of each (the Spots of one
  repetition do not pile up on the servers).
- **10b**: a request to one remote Spot, its route cached (warmed first), against a
  node-direct request (`request_to_node`) of the same payload to the node that owns it,
  from the same client Host, alternating (scenario 9's `transports._measure`: sequential
  round trips, then 64 in flight). The target: the Spot costs <= 1.15x node-direct.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import time
from typing import Any

import zlink_actors as z
from tests.contract.location._redis_server import RedisServer, redis_server_binary

from . import mesh, transports
from ._harness import Metric, Metrics, Scenario, in_flight
from ._payloads import Msg

MESH = "bench-global"
#: Creates, requests and closes in flight at once in 10a.
WINDOW = 256
#: Each call's bound (generous: a loaded machine).
WAIT = 60.0
#: How long a server may take to hold its owner lease, the client to see both servers.
START_WAIT = 30.0
#: How long an Object Server may take to shut down cleanly (`Host.shutdown(5)` inside;
#: its records are deleted and its lease released) before it is killed.
STOP_WAIT = 10.0


class EchoSpot(z.Spot):
    """The global Spot: the request's `Msg` is the reply (as scenario 9's `Echo`)."""

    @z.handler
    def echo(self, ctx: z.SpotContext, msg: Msg) -> Msg:
        return msg


def _mesh(host: z.Host) -> z.MeshStatistics:
    stats = host.statistics().mesh
    assert stats is not None
    return stats


def serve(mode: str, url: str, prefix: str) -> None:
    """An Object Server: prints `endpoint routing_id` once its owner lease admits work,
    serves until stdin closes."""
    if mode != "objects":
        raise SystemExit(f"unknown mode {mode!r}")
    store = z.RedisLocationStore(url, key_prefix=prefix)
    host = z.Host(spots=[EchoSpot], node_handler=mesh.Echo, mesh=z.MeshConfig(MESH), location=store)
    host.start()
    try:
        deadline = time.monotonic() + START_WAIT
        while not _mesh(host).lease_admitting:  # a create needs the owner lease
            if time.monotonic() > deadline:
                raise SystemExit("no owner lease within START_WAIT")
            time.sleep(0.01)
        print(host.node.endpoint, host.node.routing_id, flush=True)
        sys.stdin.read()
    finally:
        host.shutdown(5)
        store.close()


# -- the cluster -------------------------------------------------------------------------


class _Cluster:
    """Redis, the two Object Servers and the Object Client, started on first use and kept
    for every case of the run; `close()` stops all of it, in reverse order."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._client: z.Host | None = None
        self.servers: list[str] = []  # routing ids, in start order
        #: The Spot of 10b (its owner is `target_node`).
        self.target = "latency-target"
        self.target_node = ""

    def client(self) -> z.Host:
        if self._client is None:
            try:
                self._start()
            except BaseException:
                self.close()
                raise
        assert self._client is not None
        return self._client

    def _start(self) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise SystemExit("scenario 10 needs redis-server (see README: make test)")
        redis = RedisServer(binary)
        self._stack.callback(redis.stop)
        redis.start()
        prefix = f"bench10-{os.getpid()}"
        module = "benchmarks.global_objects"
        for _ in range(2):
            words = self._stack.enter_context(
                transports.server(
                    "objects", module=module, args=(redis.url, prefix), stop_wait=STOP_WAIT
                )
            )
            if len(words) != 2:
                raise RuntimeError(f"an Object Server did not start: {words!r}")
            self.servers.append(words[1])
        store = z.RedisLocationStore(redis.url, key_prefix=prefix)
        self._stack.callback(store.close)
        host = z.Host(mesh=z.MeshConfig(MESH), location=store, message_types=[Msg])
        self._stack.enter_context(host)
        host.wait_for_peers(2, timeout=START_WAIT)
        made = host.spots.get_or_create(self.target, EchoSpot).submit_sync()
        self.target_node = made.ref.routing_id
        self._client = host

    def close(self) -> None:
        self._client = None
        self.servers = []
        self._stack.close()


CLUSTER = _Cluster()


# -- the cases ---------------------------------------------------------------------------


def _cache(host: z.Host) -> tuple[int, int]:
    stats = _mesh(host)
    return stats.route_cache_hits, stats.route_cache_misses


def _hit_ratio(before: tuple[int, int], after: tuple[int, int]) -> float:
    hits, misses = after[0] - before[0], after[1] - before[1]
    return hits / (hits + misses) if hits + misses else float("nan")


def objects_case(count: int) -> Metrics:
    """10a: create `count` Spots, reach each twice, close each; `WINDOW` in flight."""
    host = CLUSTER.client()
    inflight: collections.deque[z.Completion[Any]] = collections.deque()
    results: list[object] = []

    def wait_one() -> None:
        results.append(inflight.popleft().result(WAIT))

    def create(i: int) -> None:
        inflight.append(host.spots.create(EchoSpot).submit())

    created = in_flight(count, WINDOW, create, wait_one)
    refs = []
    for made in results:
        if not isinstance(made, z.Created):
            raise RuntimeError(f"a create ended with {made!r}")
        refs.append(made.ref)
    placed = collections.Counter(ref.routing_id for ref in refs)
    ids = [ref.spot_id for ref in refs]

    def request(i: int) -> None:
        inflight.append(host.request_to_spot(ids[i], Msg(i), reply=Msg).submit())

    def reach() -> tuple[float, float]:
        """(seconds, route-cache hit ratio) of one request to each Spot."""
        results.clear()
        before = _cache(host)
        seconds = in_flight(count, WINDOW, request, wait_one)
        if results != [Msg(i) for i in range(count)]:
            raise RuntimeError("a request was not answered with its own Msg")
        return seconds, _hit_ratio(before, _cache(host))

    reached, first_ratio = reach()
    again, again_ratio = reach()

    def close(i: int) -> None:
        inflight.append(host.spots.close(ids[i]).submit())

    results.clear()
    closed = in_flight(count, WINDOW, close, wait_one)
    if not all(result is True for result in results):
        raise RuntimeError("a Spot did not close")
    return {
        "create": count / created,
        "placed on server 1": float(placed[CLUSTER.servers[0]]),
        "placed on server 2": float(placed[CLUSTER.servers[1]]),
        "reach": count / reached,
        "reach: route-cache hit ratio": first_ratio,
        "reach again": count / again,
        "again: route-cache hit ratio": again_ratio,
        "close": count / closed,
    }


def _latency_case(n: int, to_spot: bool) -> Metrics:
    host = CLUSTER.client()
    target, node = CLUSTER.target, CLUSTER.target_node
    inflight: collections.deque[z.Completion[Msg]] = collections.deque()

    def call(i: int) -> z.RequestCall[Msg]:
        if to_spot:
            return host.request_to_spot(target, Msg(i), reply=Msg)
        return host.request_to_node(MESH, node, Msg(i), reply=Msg)

    def round_trip(i: int) -> None:
        call(i).submit_sync()

    def send(i: int) -> None:
        inflight.append(call(i).submit())

    def wait_one() -> None:
        inflight.popleft().result(WAIT)

    before = _cache(host)
    out = transports._measure(n, send, wait_one, round_trip)  # warms with 200 first
    if to_spot:
        out["route-cache hit ratio"] = _hit_ratio(before, _cache(host))
    return out


# -- the lines ---------------------------------------------------------------------------


def scenarios(quick: bool) -> list[Scenario]:
    count, n = (1_000, 1_000) if quick else (10_000, 5_000)
    window = transports.WINDOW
    return [
        Scenario(
            title=(
                f"10a. {count:,} global Spots from an Object Client on two Object Server "
                f"processes, one Redis ({WINDOW} in flight): create, reach each twice, close"
            ),
            zlink=lambda: objects_case(count),
            peer=None,
            peer_name="none (rates and placement are reported; no target)",
            metrics=[
                Metric("create", "/s", higher_is_better=True),
                Metric("placed on server 1", "count", higher_is_better=False),
                Metric("placed on server 2", "count", higher_is_better=False),
                Metric("reach", "/s", higher_is_better=True),
                Metric("reach: route-cache hit ratio", "", higher_is_better=True),
                Metric("reach again", "/s", higher_is_better=True),
                Metric("again: route-cache hit ratio", "", higher_is_better=True),
                Metric("close", "/s", higher_is_better=True),
            ],
            notes=[
                "reach: a create placed on a server fills the client's route cache, so "
                "the first request to each id needs no store read once the owner's lease "
                "bound is known (the very first ones read it)",
                "reach again: a route lives route_cache_max_age (15 s) while its owner's "
                "lease bound holds; the client refreshes that bound in the background "
                "before it passes",
            ],
        ),
        Scenario(
            title=(
                f"10b. a request to a remote global Spot (route cached) vs node-direct to its "
                f"node ({n:,} sequential, then {n:,} with {window} in flight; ~64 B msgspec)"
            ),
            zlink=lambda: _latency_case(n, to_spot=True),
            peer=lambda: _latency_case(n, to_spot=False),
            peer_name="request_to_node(...) of the same Msg to the Spot's owner, same client Host",
            metrics=[
                Metric("round trip", "us", higher_is_better=False, target=1.15),
                Metric("pipelined 64", "/s", higher_is_better=True),
                Metric("route-cache hit ratio", "", higher_is_better=True),
            ],
        ),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(*sys.argv[2:5])
