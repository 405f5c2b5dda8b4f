"""`HttpCall`: the single-use request builder and its four terminators (HX §5).

The builder follows the rules of every other call (`_calls/call.py`): options are set
once (headers and query values append), one terminator finishes it, a usage error raises
where it is made and leaves the builder unused, and an operational failure completes the
returned `Completion` exceptionally. The turn rules are the framework's own:
`require_yield_turn` decides where `yield_()` may release a gate, `forbid_blocking`
refuses `submit_sync()` in a runtime context, and the `Completion` resumes an awaiting
turn as that owner's continuation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, Self, TypeVar
from urllib.parse import urlencode

import msgspec
from yarl import URL

from .._core import context as _context
from .._core.cancellation import CancellationToken, check_token
from .._core.completion import Completion, failed
from .._core.errors import CancelledError, InvalidOperationError, ProtocolError
from .._core.validation import add_metadata, check_seconds
from .._engine.driver import YieldAwaitable
from .._engine.turn import require_yield_turn
from .config import HttpClientConfig, check_header
from .exchange import Prepared

__all__ = ["METHODS", "HttpCall", "Mode", "Starter", "check_path", "check_url_text"]

T = TypeVar("T")

#: The verbs a client offers.
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")


class Mode:
    """What a terminator waits for."""

    RESPONSE = 0  # submit, submit_sync, yield_
    WRITTEN = 1  # send


class Starter(Protocol):
    """The client as its builders see it (`client.HttpClient`)."""

    @property
    def config(self) -> HttpClientConfig: ...

    def admission(self) -> BaseException | None: ...

    def url_for(self, path: str) -> URL: ...

    def start(
        self,
        req: Prepared,
        decoder: msgspec.json.Decoder[Any] | None,
        mode: int,
        cancel: CancellationToken | None,
    ) -> Completion[Any]: ...


def check_path(path: object) -> str:
    """A request path: a str starting with `/`.

    Raises:
        TypeError: not a str.
        ValueError: it does not start with `/`.
    """
    if not isinstance(path, str):
        raise TypeError(f"a request path is a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise ValueError(f"a request path starts with '/', got {path!r}")
    return path


def _query_value(name: object, value: object) -> tuple[str, str]:
    if not isinstance(name, str):
        raise TypeError(f"query names are str, got {type(name).__name__}")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"query values are str, int or float, got {type(value).__name__}")
    return name, str(value)


def check_url_text(text: str, what: str) -> None:
    """Text yarl would silently change (a control character, a lone surrogate) or that
    cannot be sent in a request line (a fragment) makes a URL that cannot be built."""
    text.encode("utf-8")  # UnicodeEncodeError (a ValueError) for a lone surrogate
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError(f"the {what} {text!r} holds a control character")
    if what == "path" and "#" in text:
        raise ValueError(f"the path {text!r} holds a fragment, which is never sent")


class HttpCall(Generic[T]):
    """One HTTP request to a named client. Created by the client's verbs
    (`ctx.http(name).get(...)`); not constructed by users."""

    __slots__ = (
        "_body",
        "_client",
        "_decoder",
        "_headers",
        "_metadata",
        "_method",
        "_path",
        "_query",
        "_sources",
        "_timeout",
        "_used",
    )

    def __init__(
        self,
        client: Starter,
        method: str,
        path: str,
        decoder: msgspec.json.Decoder[Any] | None,
    ) -> None:
        self._client = client
        self._method = method
        self._path = path
        self._decoder = decoder
        self._headers: list[tuple[str, str]] = []
        self._query: list[tuple[str, str]] = []
        self._timeout: float | None = None
        self._body: bytes | None = None
        self._sources = 0
        self._metadata: dict[str, object] | None = None
        self._used = False

    # -- options -----------------------------------------------------------------------

    def header(self, name: str, value: str) -> Self:
        """Add a request header (repeating a name adds another value).

        Raises:
            TypeError: `name` or `value` is not a str.
            ValueError: an empty name, or a line break in either.
            InvalidOperationError: the call was submitted.
        """
        self._check_open("header()")
        self._headers.append(check_header(name, value))
        return self

    def query(self, name: str, value: str | int | float) -> Self:
        """Append `name=value` to the query string (repeating a name adds a value).

        Raises:
            TypeError: `name` is not a str, or `value` not a str, int or float.
            InvalidOperationError: the call was submitted.
        """
        self._check_open("query()")
        self._query.append(_query_value(name, value))
        return self

    def timeout(self, seconds: float) -> Self:
        """Set the timeout of each attempt (the client's `timeout` otherwise).

        Per attempt, unlike the end-to-end budget of other calls: with `retry=n`, each of
        the up to n + 1 attempts (and each redirect hop) has this much time.

        Raises:
            InvalidOperationError: already set, or the call was submitted.
            TypeError, ValueError: as for every `timeout()` (docs/validation.md).
        """
        self._check_open("timeout()")
        if self._timeout is not None:
            raise InvalidOperationError("timeout() was already set on this call")
        self._timeout = check_seconds("timeout", seconds)
        return self

    def json(self, obj: object) -> Self:
        """Send `obj` encoded as JSON (msgspec), with `Content-Type: application/json`.

        Raises:
            TypeError: msgspec cannot encode `obj`.
            InvalidOperationError: the call was submitted.
        """
        self._check_open("json()")
        try:
            data = msgspec.json.encode(obj)
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(f"json() cannot encode {type(obj).__name__}: {exc}") from None
        return self._source(data, "application/json")

    def content(self, data: bytes, content_type: str) -> Self:
        """Send `data` as the body, with `content_type`.

        Raises:
            TypeError: `data` is not bytes, or `content_type` not a str.
            ValueError: a line break in `content_type`.
            InvalidOperationError: the call was submitted.
        """
        self._check_open("content()")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"content() takes bytes, got {type(data).__name__}")
        check_header("Content-Type", content_type)
        return self._source(bytes(data), content_type)

    def form(self, fields: Mapping[str, str | int | float]) -> Self:
        """Send `fields` URL-encoded (`application/x-www-form-urlencoded`).

        Raises:
            TypeError: not a mapping of str to str, int or float.
            InvalidOperationError: the call was submitted.
        """
        self._check_open("form()")
        if not isinstance(fields, Mapping):
            raise TypeError(f"form() takes a mapping, got {type(fields).__name__}")
        pairs = [_query_value(k, v) for k, v in fields.items()]
        return self._source(urlencode(pairs).encode(), "application/x-www-form-urlencoded")

    def metadata(self, key: str, value: object) -> Self:
        """Attach `key=value` to the call, as on every call (not sent over HTTP).

        Raises:
            InvalidOperationError: `key` was already set, or the call was submitted.
            TypeError: `key` is not a str.
        """
        self._check_open("metadata()")
        self._metadata = add_metadata(self._metadata, key, value)
        return self

    # -- terminators -------------------------------------------------------------------

    def submit(self, cancel: CancellationToken | None = None) -> Completion[T]:
        """Send the request; the `Completion` settles with the response.

        Completes when: the whole response was read (the decoded `reply=` type, else an
        `HttpResponse`), or the request failed.
        Turn: `await` keeps the gate: nothing else runs on this owner meanwhile.
        Raises: `InvalidOperationError` (a second terminator, a Host not started) and
        `ProtocolError` (two body sources, a URL that cannot be built) before anything
        is sent; operational failures (`UnavailableError`, `DeadlineExceededError`,
        `CapacityExceededError`, `HttpStatusError`, `ProtocolError`,
        `ShuttingDownError`, `CancelledError`) complete the `Completion` instead.
        """
        token = check_token(cancel)
        return self._start(Mode.RESPONSE, token)

    def submit_sync(self, cancel: CancellationToken | None = None) -> T:
        """Send the request and block this application thread for the response.

        Completes when: as `submit()`.
        Turn: application threads only; in any runtime context (a handler, a callback, a
        worker) `InvalidOperationError` before anything is sent.
        Raises: the request's error, as `submit()` completes with it.
        """
        token = check_token(cancel)
        _context.forbid_blocking("HttpCall.submit_sync()")
        completion: Completion[T] = self._start(Mode.RESPONSE, token)
        return completion.result()

    def yield_(self, cancel: CancellationToken | None = None) -> YieldAwaitable[T]:
        """Send the request; `await` the result releases the gate meanwhile.

        Completes when: as `submit()`.
        Turn: releases the gate: only in an `async def` turn of a SpotWide User Spot or an
        Instance Spot (a member Actor of one included), else `InvalidOperationError`
        before anything is sent. Other messages may run before the continuation:
        re-read state after it.
        Raises: as `submit()`.
        """
        token = check_token(cancel)
        require_yield_turn("HttpCall")
        completion: Completion[T] = self._start(Mode.RESPONSE, token)
        return YieldAwaitable(completion)

    def send(self, cancel: CancellationToken | None = None) -> Completion[None]:
        """Send the request one-way: the response is read and dropped in the background.

        Completes when: the request's headers and body were handed to the connection
        (`None`), or it could not be (`UnavailableError` for a connection that cannot be
        opened, `DeadlineExceededError`, ...). A `reply=` type is ignored.
        Turn: `await` keeps the gate.
        Raises: as `submit()`.
        """
        token = check_token(cancel)
        return self._start(Mode.WRITTEN, token)

    # -- internals ---------------------------------------------------------------------

    def _start(self, mode: int, cancel: CancellationToken | None) -> Completion[Any]:
        if self._used:
            raise InvalidOperationError("this call was already submitted; builders are single-use")
        req = self._prepare()
        client = self._client
        refused = client.admission()
        # Usage errors above leave the builder unused; from here on it is spent.
        self._used = True
        if refused is not None:
            return failed(refused)
        if cancel is not None and cancel.cancelled:
            # CS §2: a valid call with a cancelled token completes cancelled, unsent.
            return failed(CancelledError())
        return client.start(req, self._decoder, mode, cancel)

    def _prepare(self) -> Prepared:
        if self._sources > 1:
            raise ProtocolError(
                f"{self._method} {self._path}: {self._sources} body sources (json, content, "
                "form); a request has at most one. Nothing was sent"
            )
        client = self._client
        config = client.config
        try:
            for name, value in self._query:
                check_url_text(name, "query name")
                check_url_text(value, "query value")
            url = client.url_for(self._path)
            if self._query:
                url = url.extend_query(self._query)
        except (ValueError, TypeError) as exc:
            raise ProtocolError(
                f"{self._method} {self._path}: the URL cannot be built: {exc}"
            ) from None
        headers = [*config.default_headers.items(), *self._headers]
        timeout = config.timeout if self._timeout is None else self._timeout
        return Prepared(self._method, url, headers, self._body, timeout)

    def _source(self, data: bytes, content_type: str) -> Self:
        self._sources += 1
        if self._sources == 1:
            self._body = data
            self._headers.append(("Content-Type", content_type))
        return self

    def _check_open(self, what: str) -> None:
        if self._used:
            raise InvalidOperationError(f"{what} after the call was submitted")

    def __repr__(self) -> str:
        return f"<HttpCall {self._method} {self._path}>"
