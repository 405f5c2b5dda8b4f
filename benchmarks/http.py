"""Scenario 6: 1,000 GET requests, 50 in flight, against one local aiohttp server.

zlink-actors: 50 Spots, each awaiting `ctx.http("bench").get("/").submit()` 20 times in
a row. The peers make the same requests directly: with aiohttp on one asyncio loop (50
tasks), and with `requests` from a pool of 50 threads (a `requests.Session` each). The
server runs in a child process, so it does not share the clients' interpreter lock; it
is stopped at the end, also when a case fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import msgspec
import requests

import zlink_actors as z

from ._harness import Metric, Metrics, Scenario

IN_FLIGHT = 50

_SERVER = """
import sys
from aiohttp import web

async def hello(request):
    return web.Response(body=b'{"ok":true}', content_type="application/json")

app = web.Application()
app.router.add_get("/", hello)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


@contextlib.contextmanager
def local_server() -> Iterator[str]:
    """A child process serving `GET /` on a loopback port; killed on exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the benchmark server did not start") from None
                threading.Event().wait(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Fetch(msgspec.Struct, frozen=True):
    rounds: int


class Fetcher(z.Spot):
    @z.handler
    async def fetch(self, ctx: z.SpotContext, msg: Fetch) -> int:
        client = ctx.http("bench")
        ok = 0
        for _ in range(msg.rounds):
            resp = await client.get("/").submit()
            ok += resp.status == 200
        return ok


def _rate(n: int, elapsed: float) -> Metrics:
    return {"throughput": n / elapsed}


def zlink_case(url: str, n: int) -> Metrics:
    config = z.HttpClientConfig(url, timeout=10.0)
    with z.Host(spots=[Fetcher], http_clients={"bench": config}) as host:
        for i in range(IN_FLIGHT):
            host.spots.get_or_create(f"f{i}", Fetcher).submit_sync()
        # One warm request opens the loop and the session.
        host.http("bench").get("/").submit_sync()
        rounds = n // IN_FLIGHT
        start = time.perf_counter()
        calls = [
            host.request_to_spot(f"f{i}", Fetch(rounds), reply=int).timeout(60).submit()
            for i in range(IN_FLIGHT)
        ]
        ok = sum(c.result(60) for c in calls)
        elapsed = time.perf_counter() - start
    assert ok == rounds * IN_FLIGHT, ok
    return _rate(ok, elapsed)


def aiohttp_case(url: str, n: int) -> Metrics:
    async def run() -> tuple[int, float]:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/") as resp:
                await resp.read()
            rounds = n // IN_FLIGHT

            async def worker() -> int:
                ok = 0
                for _ in range(rounds):
                    async with session.get(url + "/") as resp:
                        await resp.read()
                        ok += resp.status == 200
                return ok

            start = time.perf_counter()
            done = await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
            return sum(done), time.perf_counter() - start

    ok, elapsed = asyncio.run(run())
    assert ok == n, ok
    return _rate(ok, elapsed)


def requests_case(url: str, n: int) -> Metrics:
    local = threading.local()
    sessions: list[requests.Session] = []
    lock = threading.Lock()

    def get(_: int) -> int:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
            with lock:
                sessions.append(session)
        return int(session.get(url + "/", timeout=10).status_code == 200)

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(get, range(IN_FLIGHT)))  # warm: one connection per thread
        start = time.perf_counter()
        ok = sum(pool.map(get, range(n)))
        elapsed = time.perf_counter() - start
    for session in sessions:
        session.close()
    assert ok == n, ok
    return _rate(ok, elapsed)


class _Server:
    """Starts the server on first use; `close()` stops it (`__main__` calls it)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._url: str | None = None

    def url(self) -> str:
        if self._url is None:
            self._url = self._stack.enter_context(local_server())
        return self._url

    def close(self) -> None:
        self._stack.close()
        self._url = None


SERVER = _Server()


def scenarios(quick: bool) -> list[Scenario]:
    n = 1_000
    notes = [f"{n:,} GET /, {IN_FLIGHT} in flight, server: aiohttp in a child process on loopback"]
    return [
        Scenario(
            title=f"6a. HTTP client: {n:,} GETs, {IN_FLIGHT} in flight, vs aiohttp direct",
            zlink=lambda: zlink_case(SERVER.url(), n),
            peer=lambda: aiohttp_case(SERVER.url(), n),
            peer_name="aiohttp ClientSession on one asyncio loop, 50 tasks",
            metrics=[Metric("throughput", "/s", higher_is_better=True, target=0.7)],
            notes=notes,
        ),
        Scenario(
            title=f"6b. HTTP client: {n:,} GETs, {IN_FLIGHT} in flight, vs requests",
            zlink=lambda: zlink_case(SERVER.url(), n),
            peer=lambda: requests_case(SERVER.url(), n),
            peer_name="requests.Session per thread, ThreadPoolExecutor(50)",
            metrics=[Metric("throughput", "/s", higher_is_better=True, target=1.0)],
        ),
    ]
