"""`HttpClientConfig`: one named client's settings, checked when it is made.

Every bad value raises `ConfigurationError` from the constructor itself, so a Host with a
wrong client never starts (design/http.md: this wins over the digest's "ProtocolError for
bad options").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from yarl import URL

from .._core.errors import ConfigurationError
from .._core.validation import check_seconds

__all__ = ["HttpClientConfig", "check_header"]


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ConfigurationError(f"{name} must be >= 0, got {value}")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _base_url(value: object) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"base_url must be a str, got {type(value).__name__}")
    if not value.startswith(("http://", "https://")):
        raise ConfigurationError(f"base_url must start with http:// or https://, got {value!r}")
    try:
        url = URL(value)
    except ValueError as exc:
        raise ConfigurationError(f"base_url {value!r} is not a URL: {exc}") from None
    if not url.host:
        raise ConfigurationError(f"base_url {value!r} names no host")
    if url.query_string or url.fragment:
        raise ConfigurationError(f"base_url {value!r} may not carry a query or a fragment")
    return value.rstrip("/")


def check_header(name: object, value: object) -> tuple[str, str]:
    """A header (name, value) of str without line breaks.

    Raises:
        TypeError: either is not a str.
        ValueError: the name is empty, or either holds CR, LF or NUL.
    """
    if not isinstance(name, str) or not isinstance(value, str):
        raise TypeError(
            f"header names and values are str, got {type(name).__name__}, {type(value).__name__}"
        )
    if not name or any(c in name for c in "\r\n\0:") or any(c in value for c in "\r\n\0"):
        raise ValueError(f"header {name!r} has an empty name or a line break")
    return name, value


def _headers(value: object) -> Mapping[str, str]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"default_headers must be a mapping of str to str, got {type(value).__name__}"
        )
    try:
        return MappingProxyType(dict(check_header(k, v) for k, v in value.items()))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"default_headers: {exc}") from None


class HttpClientConfig:
    """The settings of one named HTTP client: `Host(http_clients={name: config})`.

    Args:
        base_url: `http://` or `https://` with a host; every request path is appended.
        timeout: seconds each attempt may take (connect, send, the whole response); a
            request's `.timeout()` replaces it.
        max_response_body_size: bytes a response body may have, after decompression; a
            body of exactly this size passes, one byte more is `CapacityExceededError`.
        follow_redirects: redirect hops followed (0: a 3xx is the response).
        retry: attempts repeated after a transport failure or a timeout (0: none).
        default_headers: headers sent on every request (a request's own come after).
        compression: ask for gzip/deflate and decode it (`False` asks for identity).
        cookies: keep cookies per exact host in a jar of this client.

    Raises:
        ConfigurationError: a value of the wrong type (a bool where a number is
            expected), out of range, or a base URL that is not http(s).
    """

    __slots__ = (
        "base_url",
        "compression",
        "cookies",
        "default_headers",
        "follow_redirects",
        "max_response_body_size",
        "retry",
        "timeout",
    )

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 3.0,
        max_response_body_size: int = 16 * 2**20,
        follow_redirects: int = 0,
        retry: int = 0,
        default_headers: Mapping[str, str] | None = None,
        compression: bool = False,
        cookies: bool = False,
    ) -> None:
        self.base_url: str = _base_url(base_url)
        try:
            self.timeout: float = check_seconds("timeout", timeout)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from None
        self.max_response_body_size: int = _count("max_response_body_size", max_response_body_size)
        self.follow_redirects: int = _count("follow_redirects", follow_redirects)
        self.retry: int = _count("retry", retry)
        self.default_headers: Mapping[str, str] = _headers(default_headers)
        self.compression: bool = _flag("compression", compression)
        self.cookies: bool = _flag("cookies", cookies)

    def __repr__(self) -> str:
        return (
            f"HttpClientConfig({self.base_url!r}, timeout={self.timeout}, "
            f"max_response_body_size={self.max_response_body_size}, "
            f"follow_redirects={self.follow_redirects}, retry={self.retry}, "
            f"compression={self.compression}, cookies={self.cookies})"
        )
