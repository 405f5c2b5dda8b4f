"""A real HTTP service on loopback for the HTTP client's tests: aiohttp's server, plus a
raw asyncio socket server for what a well-behaved server never does (reset a connection,
cut a body short, hold a request until the client goes away).

Both run on one asyncio loop in a thread of their own, started and stopped by the
fixtures (`conftest.py`). The handlers count what they saw, so tests assert what was
(or was not) sent.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
from collections import Counter
from typing import Any

from aiohttp import web

from zlink_actors.testing import WAIT

__all__ = ["LocalService", "closed_port"]


class LocalService:
    """An aiohttp app on two loopback ports (two origins) and a raw socket server."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.seen: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.streamed = 0
        self.peers: list[tuple[str, int]] = []
        self.transports: list[asyncio.BaseTransport] = []
        self.raw_closed = threading.Event()
        self.raw_requests = 0
        self.loop = asyncio.new_event_loop()
        self._release: asyncio.Event | None = None
        self._held = threading.Condition()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._raw: asyncio.Server | None = None
        self.port = self.port2 = self.raw_port = 0
        self.raw_mode = "reset"
        self._raw_tasks: set[asyncio.Task[Any]] = set()
        self._raw_writers: set[asyncio.StreamWriter] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(WAIT)

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(WAIT)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(WAIT)
            if not self._thread.is_alive():
                self.loop.close()

    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/echo", self.echo)
        app.router.add_get("/forecast", self.forecast)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/hold", self.hold)
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/text", self.text)
        app.router.add_get("/bytes", self.bytes_)
        app.router.add_get("/gzip", self.gzip_)
        app.router.add_get("/stream", self.stream)
        app.router.add_route("*", "/redirect/{code}", self.redirect)
        app.router.add_get("/set-cookies", self.set_cookies)
        app.router.add_get("/peer", self.peer)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        site2 = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site2.start()
        self.port = _port(site)
        self.port2 = _port(site2)
        self._raw = await asyncio.start_server(self.raw, "127.0.0.1", 0)
        self.raw_port = self._raw.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._release is not None
        self._release.set()
        if self._raw is not None:
            self._raw.close()
            for writer in list(self._raw_writers):
                writer.close()
            if self._raw_tasks:
                await asyncio.wait(list(self._raw_tasks), timeout=WAIT)
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url2(self) -> str:
        return f"http://127.0.0.1:{self.port2}"

    @property
    def raw_url(self) -> str:
        return f"http://127.0.0.1:{self.raw_port}"

    # -- held requests -----------------------------------------------------------------

    def wait_held(self, count: int, timeout: float = WAIT) -> bool:
        """Wait until `count` requests are held in `/hold` at once."""
        with self._held:
            return self._held.wait_for(lambda: self.in_flight >= count, timeout)

    def release(self) -> None:
        """Let every held request (and later ones) answer."""
        assert self._release is not None
        self.loop.call_soon_threadsafe(self._release.set)

    def _enter(self) -> None:
        with self._held:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._held.notify_all()

    def _leave(self) -> None:
        with self._held:
            self.in_flight -= 1

    # -- handlers ----------------------------------------------------------------------

    def _count(self, request: web.Request) -> None:
        self.hits[request.path] += 1

    async def echo(self, request: web.Request) -> web.Response:
        self._count(request)
        body = await request.read()
        seen = {
            "method": request.method,
            "path": request.path,
            "query": [[k, v] for k, v in request.query.items()],
            "headers": [[k, v] for k, v in request.headers.items()],
            "body": body.decode("latin-1"),
            "port": request.url.port,
        }
        self.seen.append(seen)
        return web.json_response(seen)

    async def forecast(self, request: web.Request) -> web.Response:
        self._count(request)
        city = request.query.get("city", "Oslo")
        return web.json_response({"city": city, "celsius": 21.5})

    async def slow(self, request: web.Request) -> web.Response:
        self._count(request)
        self._enter()
        try:
            await asyncio.sleep(float(request.query.get("d", "0.2")))
        finally:
            self._leave()
        return web.json_response({"slept": True})

    async def hold(self, request: web.Request) -> web.Response:
        self._count(request)
        assert self._release is not None
        self._enter()
        try:
            await asyncio.wait_for(self._release.wait(), 30)
        finally:
            self._leave()
        return web.json_response({"held": True})

    async def status(self, request: web.Request) -> web.Response:
        self._count(request)
        code = int(request.match_info["code"])
        return web.json_response({"status": code}, status=code, headers={"X-Tag": "a"})

    async def text(self, request: web.Request) -> web.Response:
        self._count(request)
        charset = request.query.get("cs")
        body = request.query.get("t", "not json").encode(charset or "utf-8")
        return web.Response(body=body, content_type="text/plain", charset=charset)

    async def bytes_(self, request: web.Request) -> web.Response:
        self._count(request)
        return web.Response(body=b"x" * int(request.query["n"]))

    async def gzip_(self, request: web.Request) -> web.Response:
        self._count(request)
        data = gzip.compress(b"z" * int(request.query["n"]))
        cut = int(request.query.get("cut", "0"))
        if cut:
            data = data[:-cut]  # a truncated stream: its end (and trailer) is missing
        return web.Response(body=data, headers={"Content-Encoding": "gzip"})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Chunked, no Content-Length: up to `n` bytes, 64 KiB at a time."""
        self._count(request)
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))
        resp = web.StreamResponse()
        await resp.prepare(request)
        total = int(request.query["n"])
        chunk = b"s" * 2**16
        try:
            while self.streamed < total:
                await resp.write(chunk)
                self.streamed += len(chunk)
        except (ConnectionError, RuntimeError):
            return resp
        await resp.write_eof()
        return resp

    async def redirect(self, request: web.Request) -> web.Response:
        self._count(request)
        await request.read()
        code = int(request.match_info["code"])
        return web.Response(status=code, headers={"Location": request.query["to"]})

    async def set_cookies(self, request: web.Request) -> web.Response:
        self._count(request)
        resp = web.json_response({"cookie": request.headers.get("Cookie")})
        first = int(request.query.get("from", "0"))
        for i in range(first, first + int(request.query.get("n", "0"))):
            resp.set_cookie(f"c{i}", str(i))
        return resp

    async def peer(self, request: web.Request) -> web.Response:
        self._count(request)
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))
        self.transports.append(request.transport)
        return web.json_response({"ok": True})

    # -- the raw server ----------------------------------------------------------------

    async def raw(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """`reset`: read a request, close without answering. `cut`: promise 100 bytes,
        send 10, close. `hold`: read a request, wait for the client to close."""
        task = asyncio.current_task()
        assert task is not None
        self._raw_tasks.add(task)
        self._raw_writers.add(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.raw_requests += 1
            if self.raw_mode == "cut":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"c" * 10)
                await writer.drain()
            elif self.raw_mode == "bad-location":
                writer.write(
                    b"HTTP/1.1 302 Found\r\nLocation: http://[::1\r\nContent-Length: 0\r\n\r\n"
                )
                await writer.drain()
                await reader.read()
            elif self.raw_mode == "hold":
                await reader.read()  # b"" once the client closed its end
                self.raw_closed.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._raw_writers.discard(writer)
            self._raw_tasks.discard(task)
            writer.close()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _port(site: web.TCPSite) -> int:
    server = site._server
    assert isinstance(server, asyncio.Server)
    port: int = server.sockets[0].getsockname()[1]
    return port


def as_json(data: bytes) -> Any:
    return json.loads(data)
