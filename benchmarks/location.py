"""Scenario 7: the Redis Location Store beside raw redis-py `EVALSHA` doing the same work
on the same server, on the same event loop, in the same run; and, separately, the extra
cost of calling the store from an application thread through the Host's I/O executor.

A redis-server of the benchmark's own is started on a free loopback port (no
persistence) and stopped at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

import zlink_actors as z
from zlink_actors.location import IfMissing, Put, RedisLocationStore, scripts

from ._harness import Metric, Metrics, Scenario

CONCURRENCY = 32
PREFIX = "bench"

_server: dict[str, Any] = {}


def _url() -> str:
    if "url" not in _server:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("benchmark 6 needs redis-server on the PATH (see README)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        atexit.register(lambda: (proc.terminate(), proc.wait(10)))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        _server["url"] = f"redis://127.0.0.1:{port}/0"
    return str(_server["url"])


def _keys_and_args() -> tuple[list[bytes], list[Any], list[bytes], list[Any]]:
    """The exact EVALSHA arguments the store sends for a read of `k0` and for the 4-key
    write (IfMissing on a key never written, Put of 4 keys of 100 bytes)."""
    data = f"{PREFIX}:zla1:k:".encode()
    read_keys = [data + b"k0"]
    write_keys = [f"{PREFIX}:zla1:i".encode(), data + b"never"]
    args: list[Any] = [1, str(len(data)).encode(), b"m", b""]
    for i in range(4):
        write_keys.append(data + f"k{i}".encode())
        args += [b"p", b"x" * 100, z.location.spi.new_version().encode(), b""]
    return read_keys, [], write_keys, args


async def _measure(n: int, op: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(sequential latency in us, throughput with CONCURRENCY callers per second)."""
    start = time.perf_counter()
    for _ in range(n):
        await op()
    latency = (time.perf_counter() - start) / n * 1e6

    async def worker(count: int) -> None:
        for _ in range(count):
            await op()

    start = time.perf_counter()
    await asyncio.gather(*(worker(n // CONCURRENCY) for _ in range(CONCURRENCY)))
    rate = (n // CONCURRENCY) * CONCURRENCY / (time.perf_counter() - start)
    return latency, rate


def zlink_case(n: int) -> Metrics:
    store = RedisLocationStore(_url(), key_prefix=PREFIX)
    puts = [Put(f"k{i}", b"x" * 100) for i in range(4)]
    never = [IfMissing("never")]

    async def go() -> Metrics:
        await store.write([], puts)
        read_lat, read_rate = await _measure(n, lambda: store.read("k0"))
        write_lat, write_rate = await _measure(n, lambda: store.write(never, puts))
        return {
            "read latency": read_lat,
            "read throughput": read_rate,
            "write4 latency": write_lat,
            "write4 throughput": write_rate,
        }

    try:
        return asyncio.run(go())
    finally:
        store.close()


def peer_case(n: int) -> Metrics:
    read_keys, read_args, write_keys, write_args = _keys_and_args()
    read_sha, write_sha = scripts.sha1(scripts.READ), scripts.sha1(scripts.WRITE)

    async def go() -> Metrics:
        client = aioredis.Redis.from_url(_url(), max_connections=CONCURRENCY * 2)
        try:
            await client.script_load(scripts.READ)
            await client.script_load(scripts.WRITE)
            read_lat, read_rate = await _measure(
                n, lambda: client.evalsha(read_sha, len(read_keys), *read_keys, *read_args)
            )
            write_lat, write_rate = await _measure(
                n, lambda: client.evalsha(write_sha, len(write_keys), *write_keys, *write_args)
            )
        finally:
            await client.aclose()
        return {
            "read latency": read_lat,
            "read throughput": read_rate,
            "write4 latency": write_lat,
            "write4 throughput": write_rate,
        }

    return asyncio.run(go())


def app_thread_case(n: int) -> dict[str, float]:
    """Sequential reads from an application thread through `run_io_worker`, beside the
    same reads awaited directly on a loop."""
    store = RedisLocationStore(_url(), key_prefix=PREFIX)
    try:

        async def read(_token: z.CancellationToken) -> object:
            return await store.read("k0")

        with z.Host() as host:
            host.run_io_worker(read).submit_sync()
            start = time.perf_counter()
            for _ in range(n):
                host.run_io_worker(read).submit_sync()
            through_host = (time.perf_counter() - start) / n * 1e6

        async def direct() -> float:
            start = time.perf_counter()
            for _ in range(n):
                await store.read("k0")
            return (time.perf_counter() - start) / n * 1e6

        return {"via executor": through_host, "direct": asyncio.run(direct())}
    finally:
        store.close()


def scenario(quick: bool) -> Scenario:
    n = 640 if quick else 6_400
    metrics = [
        Metric("read latency", "us", higher_is_better=False, target=1.2),
        Metric("read throughput", "/s", higher_is_better=True, target=0.8),
        Metric("write4 latency", "us", higher_is_better=False, target=1.2),
        Metric("write4 throughput", "/s", higher_is_better=True, target=0.8),
    ]
    scenario = Scenario(
        title=f"7. Redis Location Store ({n:,} ops sequential, then {CONCURRENCY} concurrent)",
        zlink=lambda: zlink_case(n),
        peer=lambda: peer_case(n),
        peer_name="redis-py asyncio EVALSHA of the same scripts, same server and loop",
        metrics=metrics,
    )
    scenario.notes.append(
        "the store runs on the caller's loop with a pool per loop (docs/location.md §8)"
    )
    return scenario


def app_thread_note(quick: bool) -> str:
    n = 300 if quick else 3_000
    runs = [app_thread_case(n) for _ in range(3 if quick else 5)]
    via = statistics.median(r["via executor"] for r in runs)
    direct = statistics.median(r["direct"] for r in runs)
    return (
        f"7b. read from an application thread via host.run_io_worker(...).submit_sync(): "
        f"{via:,.1f} us vs {direct:,.1f} us awaited on a loop, medians of {len(runs)} "
        f"alternating runs (+{via - direct:,.1f} us per call)"
    )
