"""Spots that call an HTTP service (docs/http.md): the sample starts the service itself.

- `Station` is a SpotWide Spot with a named HTTP client, `ctx.http("weather")`.
- `ask` awaits `submit()` with `reply=Forecast`: the body is decoded into the Struct, and
  the Spot's gate is kept while it waits, so a visit sent meanwhile runs after it.
- `refresh` awaits `yield_()`: the gate is released while it waits, a visit runs
  meanwhile, and the handler re-reads the Spot's state after it resumes.
- `slow` sets a per-attempt `timeout()`; the service takes longer, so the call ends with
  `DeadlineExceededError`.
- The main thread calls the same client with `host.http("weather")...submit_sync()`.

The service holds the answers the sample wants to interleave until the main thread lets
them go, so the transcript is the same on every run.
"""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
from aiohttp import web

import zlink_actors as z


class Forecast(msgspec.Struct, frozen=True):
    city: str
    celsius: float


class Ask(msgspec.Struct, frozen=True):
    city: str


class Refresh(msgspec.Struct, frozen=True):
    city: str


class Slow(msgspec.Struct, frozen=True):
    pass


class Visit(msgspec.Struct, frozen=True):
    who: str


class Log(msgspec.Struct, frozen=True):
    pass


class WeatherService:
    """A small aiohttp service on a loopback port, on a loop of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.requested = threading.Semaphore(0)  # one release per held request that came
        self.runner: web.AppRunner | None = None
        self.port = 0
        self._go: asyncio.Queue[None] | None = None

    def start(self) -> str:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        return f"http://127.0.0.1:{self.port}"

    def let_one_answer(self) -> None:
        """Let the oldest held request answer."""
        assert self._go is not None
        self.loop.call_soon_threadsafe(self._go.put_nowait, None)

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _start(self) -> None:
        self._go = asyncio.Queue()
        app = web.Application()
        app.router.add_get("/forecast", self.forecast)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def forecast(self, request: web.Request) -> web.Response:
        city = request.query["city"]
        if request.query.get("hold"):
            assert self._go is not None
            self.requested.release()
            await asyncio.wait_for(self._go.get(), 10)
        return web.json_response({"city": city, "celsius": {"Oslo": 4.5}.get(city, 21.0)})

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(2.0)
        return web.json_response({})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


class Station(z.Spot):
    def __init__(self) -> None:
        super().__init__()
        self.visitors: list[str] = []
        self.log: list[str] = []

    @z.handler
    async def ask(self, ctx: z.SpotContext, msg: Ask) -> str:
        self.log.append(f"ask {msg.city}: waiting, gate kept")
        forecast = await (
            ctx.http("weather")
            .get("/forecast", reply=Forecast)
            .query("city", msg.city)
            .query("hold", 1)
            .submit()
        )
        self.log.append(
            f"ask {msg.city}: {forecast.celsius} C, visitors seen: {len(self.visitors)}"
        )
        return f"{forecast.city}: {forecast.celsius} C"

    @z.handler
    async def refresh(self, ctx: z.SpotContext, msg: Refresh) -> str:
        before = len(self.visitors)
        self.log.append(f"refresh {msg.city}: waiting, gate released")
        resp = await (
            ctx.http("weather").get("/forecast").query("city", msg.city).query("hold", 1).yield_()
        )
        forecast = resp.json(Forecast)
        # Other messages ran while the gate was released: re-read the state.
        after = len(self.visitors)
        self.log.append(f"refresh {msg.city}: {forecast.celsius} C, visitors {before} -> {after}")
        return f"{forecast.city}: {forecast.celsius} C"

    @z.handler
    async def slow(self, ctx: z.SpotContext, msg: Slow) -> str:
        try:
            await ctx.http("weather").get("/slow").timeout(0.2).submit()
        except z.DeadlineExceededError:
            return "slow station: no answer within 0.2 s"
        return "slow station answered"

    @z.handler
    def visit(self, ctx: z.SpotContext, msg: Visit) -> None:
        self.visitors.append(msg.who)
        self.log.append(f"visit by {msg.who}")

    @z.handler
    def history(self, ctx: z.SpotContext, msg: Log) -> list[str]:
        return list(self.log)


def main() -> None:
    started = time.perf_counter()
    service = WeatherService()
    url = service.start()
    try:
        host = z.Host(
            spots=[Station],
            http_clients={"weather": z.HttpClientConfig(url, timeout=3.0)},
        )
        with host:
            print("health:", host.http("weather").get("/health").submit_sync().text())
            host.spots.get_or_create("station", Station).submit_sync()

            # await submit(): the visit waits for the gate until the forecast is in.
            asked = host.request_to_spot("station", Ask("Oslo"), reply=str).submit()
            if not service.requested.acquire(timeout=5):
                raise SystemExit("the forecast request never came")
            visit = host.request_to_spot("station", Visit("ana")).submit()
            service.let_one_answer()
            print(asked.result(5))
            visit.result(5)

            # yield_(): the visit runs while the refresh waits.
            refreshed = host.request_to_spot("station", Refresh("Rome"), reply=str).submit()
            if not service.requested.acquire(timeout=5):
                raise SystemExit("the refresh request never came")
            host.request_to_spot("station", Visit("bo")).submit_sync()
            service.let_one_answer()
            print(refreshed.result(5))

            print(host.request_to_spot("station", Slow(), reply=str).submit_sync())
            for line in host.request_to_spot("station", Log(), reply=list[str]).submit_sync():
                print(line)
        print(f"--- host {host.state.value} in {time.perf_counter() - started:.2f} s")
    finally:
        service.stop()


if __name__ == "__main__":
    main()
