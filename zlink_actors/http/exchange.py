"""One request on aiohttp: attempts with their timeouts, retry, redirects, the body limit.

Everything here runs on the client's loop. Errors leave as the framework's kinds
(design/http.md "Errors"): a transport failure or a body cut short is
`UnavailableError`, an attempt past its timeout `DeadlineExceededError`, a body over the
limit `CapacityExceededError`, a bad redirect or a malformed response `ProtocolError`.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from .._core.errors import (
    CapacityExceededError,
    DeadlineExceededError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
)
from .config import HttpClientConfig
from .cookies import CookieJar
from .response import HttpResponse

__all__ = ["REDIRECTS", "Prepared", "WriteWatch", "backoff", "perform", "trace_config"]

#: The statuses `follow_redirects` follows.
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_BODY_HEADERS = ("content-type", "content-length", "content-encoding", "transfer-encoding")
_DECODED = frozenset({"gzip", "x-gzip", "deflate"})
_CHUNK = 2**16


@dataclass(slots=True)
class Prepared:
    """A request as the terminator built it: nothing here is checked again."""

    method: str
    url: URL
    headers: list[tuple[str, str]]
    body: bytes | None
    timeout: float


class WriteWatch:
    """For `send()`: calls `on_written` once the request's headers and body were handed
    to the connection (aiohttp's request tracing reports each piece)."""

    __slots__ = ("expected", "headers_sent", "on_written", "sent", "written")

    def __init__(self, expected: int, on_written: Callable[[], None]) -> None:
        self.expected = expected
        self.sent = 0
        self.headers_sent = False
        self.written = False
        self.on_written = on_written

    def begin(self) -> None:
        """A new attempt: what an earlier one wrote counts for nothing."""
        self.sent = 0
        self.headers_sent = False

    def _check(self) -> None:
        if not self.written and self.headers_sent and self.sent >= self.expected:
            self.written = True
            # Reported here, where `written` is set: from now on the request is not
            # retried, so nothing after this (a write or the response failing) may
            # settle the request with an error first (docs/http.md: once written,
            # nothing the response does is reported).
            self.on_written()


async def _on_headers(
    session: aiohttp.ClientSession,
    ctx: object,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    watch = getattr(ctx, "trace_request_ctx", None)
    if isinstance(watch, WriteWatch):
        watch.headers_sent = True
        watch._check()


async def _on_chunk(
    session: aiohttp.ClientSession,
    ctx: object,
    params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    watch = getattr(ctx, "trace_request_ctx", None)
    if isinstance(watch, WriteWatch):
        watch.sent += len(params.chunk)
        watch._check()


def trace_config() -> aiohttp.TraceConfig:
    """The tracing `send()` needs to learn when its request was written."""
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_on_headers)
    trace.on_request_chunk_sent.append(_on_chunk)
    return trace


def backoff(attempt: int) -> float:
    """Full jitter: a delay in [0, min(1 s, 50 ms * 2**attempt)] after attempt `attempt`
    (0 for the first) failed."""
    return random.uniform(0.0, min(1.0, 0.05 * 2**attempt))


async def perform(
    session: aiohttp.ClientSession,
    config: HttpClientConfig,
    jar: CookieJar | None,
    req: Prepared,
    watch: WriteWatch | None,
) -> HttpResponse:
    """Run `req` with its retries and redirects; the last response."""
    method, url, headers, body = req.method, req.url, req.headers, req.body
    hops = 0
    while True:
        resp = await _attempts(session, config, jar, method, url, headers, body, req, watch)
        # A one-way request (`watch`) has completed once written: it follows no redirect
        # (that would send its request again, unasked and unreported).
        if watch is not None or not config.follow_redirects or resp.status not in REDIRECTS:
            return resp
        if hops == config.follow_redirects:
            raise ProtocolError(
                f"{req.method} {req.url}: more than {hops} redirect(s); the hop to "
                f"{resp.headers.get('Location')!r} was not followed"
            )
        target = _location(url, resp)
        if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
            # RFC 9110 §15.4: these become a GET without the body.
            method = "HEAD" if method == "HEAD" else "GET"
            body = None
            headers = [h for h in headers if h[0].lower() not in _BODY_HEADERS]
        if target.origin() != url.origin():
            headers = [h for h in headers if h[0].lower() != "authorization"]
        url = target
        hops += 1


def _location(url: URL, resp: HttpResponse) -> URL:
    location = resp.headers.get("Location")
    if not location:
        raise ProtocolError(f"a {resp.status} redirect from {url} has no Location")
    try:
        target = url.join(URL(location))
    except ValueError as exc:
        raise ProtocolError(f"a redirect from {url} has an invalid Location: {exc}") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise ProtocolError(f"a redirect from {url} has an invalid Location {location!r}")
    return target


async def _attempts(
    session: aiohttp.ClientSession,
    config: HttpClientConfig,
    jar: CookieJar | None,
    method: str,
    url: URL,
    headers: list[tuple[str, str]],
    body: bytes | None,
    req: Prepared,
    watch: WriteWatch | None,
) -> HttpResponse:
    attempt = 0
    while True:
        try:
            return await _attempt(session, config, jar, method, url, headers, body, req, watch)
        except (UnavailableError, DeadlineExceededError):
            # Only transport failures and timeouts are retried, never a status; a
            # one-way request already written is never sent again.
            if attempt >= config.retry or (watch is not None and watch.written):
                raise
        await asyncio.sleep(backoff(attempt))
        attempt += 1


async def _attempt(
    session: aiohttp.ClientSession,
    config: HttpClientConfig,
    jar: CookieJar | None,
    method: str,
    url: URL,
    headers: list[tuple[str, str]],
    body: bytes | None,
    req: Prepared,
    watch: WriteWatch | None,
) -> HttpResponse:
    if watch is not None:
        watch.begin()
    sent: CIMultiDict[str] | None = CIMultiDict(headers) if headers else None
    host = url.host or ""
    if jar is not None:
        cookie = jar.header(host)
        if cookie is not None:
            if sent is None:
                sent = CIMultiDict()
            # The request's own Cookie header(s) first, then the jar's: one header
            # (RFC 6265 §5.4), the user's cookies kept.
            sent["Cookie"] = "; ".join([*sent.getall("Cookie", []), cookie])
    try:
        async with asyncio.timeout(req.timeout):
            async with session.request(
                method,
                url,
                headers=sent,
                data=body,
                allow_redirects=False,
                trace_request_ctx=watch,
            ) as resp:
                if watch is None:
                    content = await _read_body(resp, config, method)
                else:
                    content = await _discard_body(resp)
                if jar is not None:
                    jar.store(host, resp.headers.getall("Set-Cookie", []))
                return HttpResponse(resp.status, resp.headers, content, str(resp.url))
    except TimeoutError:
        raise DeadlineExceededError(
            f"{method} {url}: no complete response within {req.timeout} s"
        ) from None
    except aiohttp.InvalidURL as exc:
        raise ProtocolError(f"{method} {url}: the URL is invalid: {exc}") from None
    except aiohttp.ClientResponseError as exc:
        raise ProtocolError(f"{method} {url}: malformed response: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UnavailableError(
            f"{method} {url}: {type(exc).__name__}: {exc}", reason=UnavailableReason.UNREACHABLE
        ) from None


async def _read_body(resp: aiohttp.ClientResponse, config: HttpClientConfig, method: str) -> bytes:
    """The body, never holding more than the limit plus one chunk (design/http.md)."""
    limit = config.max_response_body_size
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    decoder = None
    if config.compression and encoding in _DECODED:
        # 32 + MAX_WBITS: a gzip or a zlib header, found from the data.
        decoder = zlib.decompressobj(32 + zlib.MAX_WBITS)
    elif method != "HEAD" and resp.content_length is not None and resp.content_length > limit:
        raise _too_large(resp, limit)
    parts: list[bytes] = []
    total = 0
    received = False

    def add(data: bytes) -> None:
        nonlocal total
        total += len(data)
        if total > limit:
            raise _too_large(resp, limit)
        parts.append(data)

    try:
        async for chunk in resp.content.iter_chunked(_CHUNK):
            if decoder is None:
                add(chunk)
                continue
            received = received or bool(chunk)
            # Never decompress more than one byte past what is left of the limit.
            add(decoder.decompress(chunk, limit - total + 1))
            while decoder.unconsumed_tail:
                add(decoder.decompress(decoder.unconsumed_tail, limit - total + 1))
        if decoder is not None:
            add(decoder.flush())
            # A stream cut short (or missing its trailer) decodes without a zlib.error:
            # only `eof` tells it from a whole one. An empty body (HEAD, 204, 304) is
            # no stream at all.
            if received and not decoder.eof:
                raise zlib.error("the compressed stream ends before its end")
    except zlib.error as exc:
        raise ProtocolError(f"the {encoding} body of {resp.url} does not decode: {exc}") from None
    return b"".join(parts)


async def _discard_body(resp: aiohttp.ClientResponse) -> bytes:
    """A one-way request's body: read to its end and dropped, never held, so the
    connection returns to the pool (bounded by the attempt's timeout, not by the
    body limit, which is about what a caller receives)."""
    async for _ in resp.content.iter_chunked(_CHUNK):
        pass
    return b""


def _too_large(resp: aiohttp.ClientResponse, limit: int) -> CapacityExceededError:
    return CapacityExceededError(
        f"the response body of {resp.url} is over max_response_body_size ({limit} bytes)"
    )
