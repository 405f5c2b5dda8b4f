"""Scenario 9: RouteMesh node-direct request/reply between two node processes on tcp
loopback, side by side with scenario 8's raw pyzmq DEALER->ROUTER echo, with its
same-thread-shape floor (an I/O thread and a worker thread on each side), and with Ray
actor method calls, all carrying the same msgspec payload (`_payloads.Msg`, 63 - 66
bytes encoded). docs/performance.md has the current figures; docs/changelog-performance.md,
"RouteMesh node-direct (scenario 9)" and the sessions after it, where the time goes.

The serving node is a child process (`python -m benchmarks.mesh serve node`: a Host with
a `NodeHandler` that returns the `Msg` it gets), started once and kept for the run, as a
serving node is; each mesh case makes a fresh calling Host in the benchmark process,
exactly where scenario 8's raw and shape clients run, so the cases differ only in the
software between two processes on the same loopback. Each case does sequential round
trips (`submit_sync()`), then requests with 64 in flight (`submit()`, and `result()` of
the oldest); the raw and shape echoes carry the bytes `Msg` encodes to (their clients
neither encode nor decode, so they are floors in that too).

Ray is optional (`pip install -e '.[ray]'`; `make bench` installs it): its line runs
with a Ray instance of its own, started for it and shut down after it, so Ray's
background processes never load the other lines; when Ray is missing or cannot start,
one "skipped: <why>" line says so.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import time
from typing import Any

import msgspec

import zlink_actors as z

from . import transports
from ._harness import Metric, Metrics, Scenario, report, run
from ._payloads import Msg

MESH = "bench"
WINDOW = transports.WINDOW
#: The payload of the raw and shape echoes: the bytes every case's `Msg` encodes to.
PAYLOAD = msgspec.msgpack.encode(Msg(0))
#: Ray's 64 in flight: `ray.get` of a list of 64 calls, then the next 64.
RAY_BATCH = 64


class Echo(z.NodeHandler):
    """The serving node's handler: the request's `Msg` is the reply."""

    @z.handler
    def echo(self, ctx: z.NodeContext, msg: Msg) -> Msg:
        return msg


def serve(mode: str) -> None:
    """The serving node: prints `endpoint routing_id`, serves until stdin closes."""
    if mode != "node":
        raise SystemExit(f"unknown mode {mode!r}")
    host = z.Host(node_handler=Echo, mesh=z.MeshConfig(MESH))
    host.start()
    try:
        print(host.node.endpoint, host.node.routing_id, flush=True)
        sys.stdin.read()
    finally:
        host.shutdown(5)


# -- the cases ---------------------------------------------------------------------------


class _ServingNode:
    """The serving node process, started on first use and kept for every mesh case of
    the run (a serving node is long-lived; its start-up, about 2 s here, would otherwise
    be most of a quick run); `close()` stops it (`__main__` calls it)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._address: tuple[str, str] | None = None

    def address(self) -> tuple[str, str]:
        """(endpoint, routing id)."""
        if self._address is None:
            words = self._stack.enter_context(transports.server("node", module="benchmarks.mesh"))
            self._address = (words[0], words[1])
        return self._address

    def close(self) -> None:
        self._stack.close()
        self._address = None


SERVER = _ServingNode()


def mesh_case(n: int) -> Metrics:
    """A fresh calling Host (in this process) dials the serving node and measures."""
    endpoint, rid = SERVER.address()
    host = z.Host(mesh=z.MeshConfig(MESH, peers=(endpoint,)), message_types=[Msg])
    with host:
        host.wait_for_peers(1, timeout=30)
        request = host.request_to_node
        inflight: collections.deque[z.Completion[Msg]] = collections.deque()

        def round_trip(i: int) -> None:
            request(MESH, rid, Msg(i), reply=Msg).submit_sync()

        def send(i: int) -> None:
            inflight.append(request(MESH, rid, Msg(i), reply=Msg).submit())

        def wait_one() -> None:
            inflight.popleft().result(30)

        return transports._measure(n, send, wait_one, round_trip)


def raw_case(n: int) -> Metrics:
    return transports.raw_case(n, PAYLOAD)


def shape_case(n: int) -> Metrics:
    return transports.shape_case(n, PAYLOAD)


class _Ray:
    """The Ray instance of line 9c: `start()` brings it up with the echo actor, `stop()`
    shuts it down."""

    def __init__(self) -> None:
        self.ray: Any = None
        self.actor: Any = None

    def start(self) -> None:
        import ray  # noqa: PLC0415 (optional: the `ray` extra)

        # Ray's workers import `benchmarks` (Msg and the actor) from this checkout.
        root = transports.ROOT
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = root if not path else f"{root}{os.pathsep}{path}"
        ray.init(
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            num_cpus=1,  # one worker process is started up front, the actor takes it
        )
        self.ray = ray
        self.actor = ray.remote(RayEcho).remote()
        ray.get(self.actor.echo.remote(Msg(0)), timeout=120)

    def stop(self) -> None:
        if self.ray is not None:
            self.ray.shutdown()
            self.ray = self.actor = None


class RayEcho:
    """The Ray actor: the call's `Msg` is the result."""

    def echo(self, msg: Msg) -> Msg:
        return msg


def ray_case(ray: _Ray, n: int) -> Metrics:
    get, echo = ray.ray.get, ray.actor.echo.remote
    for i in range(200 if n > 500 else 50):  # warm, as the other cases
        get(echo(Msg(i)))
    start = time.perf_counter()
    for i in range(n):
        get(echo(Msg(i)))
    sequential = (time.perf_counter() - start) / n * 1e6
    batches = max(1, n // RAY_BATCH)
    start = time.perf_counter()
    for b in range(batches):
        get([echo(Msg(b * RAY_BATCH + i)) for i in range(RAY_BATCH)])
    rate = batches * RAY_BATCH / (time.perf_counter() - start)
    return {"round trip": sequential, "pipelined 64": rate}


# -- the lines ---------------------------------------------------------------------------


def _sizes(quick: bool) -> tuple[int, int]:
    """(round trips per mesh/raw/shape case, per Ray case)."""
    return (1_000, 300) if quick else (10_000, 2_000)


def scenarios(quick: bool) -> list[Scenario]:
    """Lines 9a and 9b: they share the mesh case (one mesh run per repetition, between a
    shape run and a raw run; see `_harness.run_shared`)."""
    n, _ = _sizes(quick)

    def mesh() -> Metrics:  # one callable for both lines: `run_shared` runs it once
        return mesh_case(n)

    where = f"({n:,} sequential, then {n:,} with {WINDOW} in flight; ~64 B msgspec, tcp)"
    return [
        Scenario(
            title=f"9a. RouteMesh request_to_node vs the same thread shape {where}",
            zlink=mesh,
            peer=lambda: shape_case(n),
            peer_name="pyzmq DEALER->ROUTER echo, an I/O thread + a worker thread each side",
            metrics=[
                Metric("round trip", "us", higher_is_better=False, target=1.3),
                Metric("pipelined 64", "/s", higher_is_better=True),
            ],
        ),
        Scenario(
            title=f"9b. RouteMesh request_to_node vs raw pyzmq {where}",
            zlink=mesh,
            peer=lambda: raw_case(n),
            peer_name="raw pyzmq DEALER->ROUTER echo, no extra threads (the physical floor)",
            metrics=[
                Metric("round trip", "us", higher_is_better=False),
                Metric("pipelined 64", "/s", higher_is_better=True, target=0.6),
            ],
        ),
    ]


def versus_ray(
    quick: bool, repetitions: int
) -> tuple[list[str], list[tuple[str, float, float | None, bool]]]:
    """Line 9c, mesh against Ray actor calls, alternating with a Ray instance up; or one
    "skipped" line when Ray is not installed or cannot start."""
    n, n_ray = _sizes(quick)
    title = (
        f"9c. RouteMesh request_to_node vs Ray actor calls (mesh {n:,}, Ray {n_ray:,} "
        f"sequential; then {WINDOW} in flight; ~64 B msgspec)"
    )
    ray = _Ray()
    try:
        try:
            ray.start()
        except Exception as exc:  # ImportError, or Ray's own failure to start
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            return [f"== {title}", f"   skipped: {why}"], []
        scenario = Scenario(
            title=title,
            zlink=lambda: mesh_case(n),
            peer=lambda: ray_case(ray, n_ray),
            peer_name=(
                f"Ray {ray.ray.__version__} actor: ray.get(actor.echo.remote(msg)) each; "
                f"then ray.get() of a list of {RAY_BATCH}"
            ),
            metrics=[
                # ">= 3x faster": zlink/Ray <= 0.33.
                Metric("round trip", "us", higher_is_better=False, target=0.33),
                Metric("pipelined 64", "/s", higher_is_better=True),
            ],
        )
        # No warm-up run: 9a and 9b warmed the mesh code in this process, `start()`
        # warmed the actor, and each case warms its connection.
        return report(run(scenario, repetitions, warmup=False))
    finally:
        ray.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
