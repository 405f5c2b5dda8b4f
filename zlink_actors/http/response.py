"""`HttpResponse`, the raw result of a request without `reply=`, and `HttpStatusError`."""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec
from multidict import CIMultiDictProxy

from .._core.errors import InternalFailureError, ProtocolError

__all__ = ["HttpResponse", "HttpStatusError", "decode_reply"]

T = TypeVar("T")


class HttpStatusError(InternalFailureError):
    """A request with `reply=` got a status >= 400 (`.status`; `.response` holds it)."""

    def __init__(self, message: str, status: int, response: HttpResponse) -> None:
        super().__init__(message)
        self.status = status
        self.response = response


class HttpResponse:
    """A response as received: no status is a failure here.

    Created by the client; not constructed by users.

    Attributes:
        status: the HTTP status code.
        headers: case-insensitive, multi-valued (`[]`, `get`, `getall`).
        content: the body (decoded from gzip/deflate when the client asked for it).
        url: the URL that answered (the last hop after redirects).
    """

    __slots__ = ("content", "headers", "status", "url")

    def __init__(
        self, status: int, headers: CIMultiDictProxy[str], content: bytes, url: str
    ) -> None:
        self.status = status
        self.headers = headers
        self.content = content
        self.url = url

    def text(self, encoding: str | None = None) -> str:
        """The body as text: `encoding`, else the `charset` of Content-Type, else UTF-8.

        Raises:
            ProtocolError: the body does not decode with that encoding.
        """
        if encoding is None:
            encoding = _charset(self.headers.get("Content-Type", "")) or "utf-8"
        try:
            return self.content.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ProtocolError(f"the body of {self.url} is not {encoding} text: {exc}") from None

    @overload
    def json(self) -> Any: ...
    @overload
    def json(self, type: type[T]) -> T: ...
    @overload
    def json(self, type: object) -> Any: ...
    def json(self, type: object = None) -> Any:
        """The body decoded from JSON (into `type` when given, with msgspec).

        Raises:
            ProtocolError: the body is not JSON, or does not fit `type`.
        """
        return decode_reply(self, Any if type is None else type)

    def __repr__(self) -> str:
        return f"<HttpResponse {self.status} {len(self.content)} bytes from {self.url}>"


def _charset(content_type: str) -> str | None:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return None


def decode_reply(response: HttpResponse, reply: object) -> Any:
    """The body of `response` decoded into `reply` (msgspec JSON).

    Raises:
        ProtocolError: the body does not decode into `reply`.
    """
    try:
        return msgspec.json.decode(response.content, type=reply)
    except msgspec.DecodeError as exc:
        raise ProtocolError(
            f"the body of {response.url} (status {response.status}) does not decode "
            f"into {reply!r}: {exc}"
        ) from None
