"""`HttpClient`: one named client, its aiohttp session and the requests in flight.

The session (one connection pool with keep-alive) is made on the scheduler's loop by the
first request and closed by `close()`. Each request is an `_Exchange`: one task on the
loop and one `Completion` cell, for which the response, the caller's cancellation and
shutdown race; the first wins and the others change nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, TypeVar, overload

import aiohttp
import msgspec
from yarl import URL

from .._core.cancellation import CancellationRegistration, CancellationToken
from .._core.completion import Cell, Completion
from .._core.errors import (
    CancelledError,
    ProtocolError,
    ZlinkError,
    internal_failure,
    shutting_down,
)
from .call import HttpCall, Mode, check_path, check_url_text
from .config import HttpClientConfig
from .cookies import CookieJar
from .exchange import Prepared, WriteWatch, perform, trace_config
from .response import HttpResponse, HttpStatusError
from .scheduler import CompletionScheduler

__all__ = ["HttpClient"]

T = TypeVar("T")
log = logging.getLogger("zlink_actors")
#: Paths whose URL a client keeps parsed.
_URL_CACHE = 256


class _Exchange:
    """One request in flight."""

    __slots__ = ("cell", "client", "decoder", "mode", "registration", "req", "task")

    def __init__(
        self,
        client: HttpClient,
        req: Prepared,
        decoder: msgspec.json.Decoder[Any] | None,
        mode: int,
    ) -> None:
        self.client = client
        self.req = req
        self.decoder = decoder
        self.mode = mode
        self.cell: Cell[Any] = Cell()
        self.task: asyncio.Task[Any] | None = None
        self.registration: CancellationRegistration | None = None

    def finish(self, value: object, exc: BaseException | None) -> bool:
        if not self.client._scheduler.resume(self.cell, value, exc):
            return False
        reg = self.registration
        if reg is not None:
            reg.unregister()
        return True

    def cancel(self) -> bool:
        """The caller's cancellation (its token, or `Completion.cancel()`): ends the wait
        with `CancelledError` and aborts the request (its connection is closed)."""
        if not self.finish(None, CancelledError()):
            return False
        self.client._scheduler.call_soon(self.abort)
        return True

    def abort(self) -> None:
        # On the loop. A task not started yet sees its cell settled and sends nothing.
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def run(self) -> None:
        client = self.client
        try:
            if self.cell.done():
                return  # cancelled (or shut down) before it started: nothing is sent
            refused = client._scheduler.admission()
            if refused is not None:
                # The scheduler began to stop after this was handed to it (a
                # LoopScheduler lets such a task start only to end it): nothing is sent.
                self.finish(None, refused)
                return
            self.task = asyncio.current_task()
            watch = None
            if self.mode == Mode.WRITTEN:
                body = self.req.body
                watch = WriteWatch(0 if body is None else len(body), self._written)
            response = await perform(
                client._open_session(watch is not None),
                client.config,
                client._jar,
                self.req,
                watch,
            )
            if self.mode == Mode.WRITTEN:
                self.finish(None, None)  # written, and the response was drained
            else:
                self.finish(*_result(response, self.decoder))
        except asyncio.CancelledError:
            # Aborted by a cancel or by close() (which settled the cell first), or the
            # loop is stopping: then this is the request's one terminal.
            self.finish(None, shutting_down("the request finished"))
        except ZlinkError as exc:
            if not self.finish(None, exc) and self.mode == Mode.WRITTEN:
                log.debug("one-way HTTP request: the response failed: %s", exc)
        except Exception as exc:
            self.finish(None, internal_failure("the HTTP request", exc))
        except BaseException:
            # KeyboardInterrupt, SystemExit, GeneratorExit: not the request's failure, and
            # they must propagate; the request still ends once.
            self.finish(None, shutting_down("the request finished"))
            raise
        finally:
            client._ended(self)

    def _written(self) -> None:
        self.finish(None, None)


def _result(
    response: HttpResponse, decoder: msgspec.json.Decoder[Any] | None
) -> tuple[object, BaseException | None]:
    if decoder is None:
        return response, None
    if response.status >= 400:
        return None, HttpStatusError(
            f"{response.url} answered {response.status}", response.status, response
        )
    try:
        return decoder.decode(response.content), None
    except msgspec.DecodeError as exc:
        return None, _decode_error(response, exc)


def _decode_error(response: HttpResponse, exc: Exception) -> ZlinkError:
    return ProtocolError(
        f"the body of {response.url} (status {response.status}) does not decode: {exc}"
    )


class HttpClient:
    """A named HTTP client: `ctx.http(name)` in handlers, `host.http(name)` elsewhere.

    Made by the Host from `Host(http_clients=...)` (or, without a Host, by the client's
    own tests with a `LoopScheduler`); a client is never built inside a handler.
    """

    def __init__(self, name: str, config: HttpClientConfig, scheduler: CompletionScheduler) -> None:
        self.name = name
        self._config = config
        self._scheduler = scheduler
        self._jar = CookieJar() if config.cookies else None
        self._urls: dict[str, URL] = {}
        self._connector: aiohttp.TCPConnector | None = None
        self._session: aiohttp.ClientSession | None = None
        self._traced: aiohttp.ClientSession | None = None
        self._lock = threading.Lock()
        self._inflight: set[_Exchange] = set()
        self._closed = False
        #: A request was handed to the loop: there may be a session to close.
        self._used = False

    @property
    def config(self) -> HttpClientConfig:
        """This client's settings."""
        return self._config

    # -- verbs -------------------------------------------------------------------------

    @overload
    def get(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def get(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def get(self, path: str, reply: object) -> HttpCall[Any]: ...
    def get(self, path: str, reply: object = None) -> HttpCall[Any]:
        """A GET of `path` (appended to the base URL); `reply=T` decodes the JSON body.

        Raises:
            TypeError: `path` is not a str, or msgspec cannot decode into `reply`.
            ValueError: `path` does not start with `/`.
        """
        return self._call("GET", path, reply)

    @overload
    def post(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def post(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def post(self, path: str, reply: object) -> HttpCall[Any]: ...
    def post(self, path: str, reply: object = None) -> HttpCall[Any]:
        """A POST; arguments and errors as `get`."""
        return self._call("POST", path, reply)

    @overload
    def put(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def put(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def put(self, path: str, reply: object) -> HttpCall[Any]: ...
    def put(self, path: str, reply: object = None) -> HttpCall[Any]:
        """A PUT; arguments and errors as `get`."""
        return self._call("PUT", path, reply)

    @overload
    def delete(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def delete(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def delete(self, path: str, reply: object) -> HttpCall[Any]: ...
    def delete(self, path: str, reply: object = None) -> HttpCall[Any]:
        """A DELETE; arguments and errors as `get`."""
        return self._call("DELETE", path, reply)

    @overload
    def patch(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def patch(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def patch(self, path: str, reply: object) -> HttpCall[Any]: ...
    def patch(self, path: str, reply: object = None) -> HttpCall[Any]:
        """A PATCH; arguments and errors as `get`."""
        return self._call("PATCH", path, reply)

    @overload
    def head(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def head(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def head(self, path: str, reply: object) -> HttpCall[Any]: ...
    def head(self, path: str, reply: object = None) -> HttpCall[Any]:
        """A HEAD; arguments and errors as `get`."""
        return self._call("HEAD", path, reply)

    @overload
    def options(self, path: str) -> HttpCall[HttpResponse]: ...
    @overload
    def options(self, path: str, reply: type[T]) -> HttpCall[T]: ...
    @overload
    def options(self, path: str, reply: object) -> HttpCall[Any]: ...
    def options(self, path: str, reply: object = None) -> HttpCall[Any]:
        """An OPTIONS; arguments and errors as `get`."""
        return self._call("OPTIONS", path, reply)

    def _call(self, method: str, path: str, reply: object) -> HttpCall[Any]:
        path = check_path(path)
        decoder = None
        if reply is not None:
            try:
                decoder = msgspec.json.Decoder(reply)
            except TypeError as exc:
                raise TypeError(f"reply={reply!r} is not a type msgspec decodes: {exc}") from None
        return HttpCall(self, method, path, decoder)

    # -- for the builders --------------------------------------------------------------

    def url_for(self, path: str) -> URL:
        """The URL of `path` under the base URL (cached: parsing is most of a builder's
        cost, and a client calls few distinct paths).

        Raises:
            ValueError: the path cannot be part of a URL (see `check_url_text`).
        """
        url = self._urls.get(path)
        if url is None:
            check_url_text(path, "path")
            url = URL(self._config.base_url + path)
            if len(self._urls) >= _URL_CACHE:
                self._urls.clear()
            self._urls[path] = url
        return url

    def admission(self) -> BaseException | None:
        """None if a request may start now; else the error it completes with."""
        refused = self._scheduler.admission()
        if refused is None and self._closed:
            refused = shutting_down()
        return refused

    def start(
        self,
        req: Prepared,
        decoder: msgspec.json.Decoder[Any] | None,
        mode: int,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """Start one request (the builder checked it); its caller's handle."""
        ex = _Exchange(self, req, decoder, mode)
        with self._lock:
            closed = self._closed
            if not closed:
                self._inflight.add(ex)
                self._used = True
        if closed:
            ex.finish(None, shutting_down())
            return Completion(ex.cell)
        try:
            if cancel is not None:
                reg = cancel._register_internal(ex.cancel)
                ex.registration = reg
                if ex.cell.done():
                    reg.unregister()  # settled before the registration was stored
            if not self._scheduler.execute(ex.run):
                ex.finish(None, shutting_down())
                self._ended(ex)
        except BaseException as exc:
            # Nobody gets this request's handle: end it (a task that starts anyway sees
            # its cell settled and sends nothing) and let the error out.
            ex.finish(None, internal_failure("starting the HTTP request", exc))
            self._ended(ex)
            raise
        return Completion(ex.cell, ex.cancel)

    # -- the session -------------------------------------------------------------------

    def _open_session(self, traced: bool) -> aiohttp.ClientSession:
        """The session for a request (on the loop thread only: no lock needed).

        One connector is the client's one connection pool. Two sessions share it: the
        traced one serves `send()`, which must learn when its request was written;
        the other serves every other request without the cost of aiohttp's tracing.
        """
        session = self._traced if traced else self._session
        if session is None:
            config = self._config
            if self._connector is None:
                self._connector = aiohttp.TCPConnector(limit=100)
            session = aiohttp.ClientSession(
                connector=self._connector,
                connector_owner=False,  # closed by close(), after both sessions
                cookie_jar=aiohttp.DummyCookieJar(),  # cookies are the client's own jar
                auto_decompress=False,  # decoded here, so the limit holds after it
                timeout=aiohttp.ClientTimeout(total=None),  # per attempt, in exchange.py
                headers={"Accept-Encoding": "gzip, deflate" if config.compression else "identity"},
                trace_configs=[trace_config()] if traced else None,
            )
            # aiohttp repeats an idempotent request once, silently, when a kept-alive
            # connection fails; `retry=n` must mean at most n + 1 attempts (aiohttp's own
            # test client turns it off the same way).
            session._retry_connection = False
            if traced:
                self._traced = session
            else:
                self._session = session
        return session

    def _ended(self, ex: _Exchange) -> None:
        with self._lock:
            self._inflight.discard(ex)

    def close(self, timeout: float = 5.0) -> bool:
        """End every request in flight with `ShuttingDownError` and close the session's
        connections; later requests complete with `ShuttingDownError`. Idempotent.
        Returns False if the session did not close within `timeout` seconds."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
            inflight = list(self._inflight)
            used = self._used
        for ex in inflight:
            ex.finish(None, shutting_down("the request finished"))
        if not used:
            return True
        done = threading.Event()

        async def close_session() -> None:
            try:
                for ex in inflight:
                    ex.abort()
                for session in (self._session, self._traced):
                    if session is not None:
                        await session.close()
                connector, self._connector = self._connector, None
                self._session = self._traced = None
                if connector is not None:
                    await connector.close()
            finally:
                done.set()

        if not self._scheduler.execute(close_session):
            return False
        return done.wait(timeout)

    def __repr__(self) -> str:
        return f"<HttpClient {self.name!r} {self._config.base_url}>"
