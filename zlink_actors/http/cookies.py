"""The cookie jar of one client (`cookies=True`): by exact host, at most 128 per host.

Cookies are kept by the exact host that set them (IP-address hosts such as 127.0.0.1
included; a `Domain` attribute never widens them to other hosts) and sent back to that
host only. `Max-Age=0` or an `Expires` in the past removes a cookie. A host's 129th
cookie evicts its oldest. Path, Secure and expiry times in the future are not tracked:
the jar lives as long as the client.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime
from http.cookies import CookieError, SimpleCookie

__all__ = ["MAX_PER_HOST", "CookieJar"]

#: Cookies kept per host; a new one past this evicts the oldest.
MAX_PER_HOST = 128


def _expired(morsel_expires: str, max_age: str) -> bool:
    if max_age:
        try:
            return int(max_age) <= 0
        except ValueError:
            return False
    if morsel_expires:
        try:
            return parsedate_to_datetime(morsel_expires).timestamp() <= time.time()
        except (TypeError, ValueError):
            return False
    return False


class CookieJar:
    """Cookies by host. Used on the client's loop thread only, so it takes no lock."""

    __slots__ = ("_hosts",)

    def __init__(self) -> None:
        self._hosts: dict[str, dict[str, str]] = {}

    def store(self, host: str, set_cookie_headers: list[str]) -> None:
        """Keep the cookies of `Set-Cookie` headers a response from `host` carried."""
        jar = self._hosts.get(host)
        for header in set_cookie_headers:
            parsed = SimpleCookie()
            try:
                parsed.load(header)
            except CookieError:
                continue  # a malformed Set-Cookie is ignored, as browsers do
            for name, morsel in parsed.items():
                if jar is None:
                    jar = self._hosts.setdefault(host, {})
                jar.pop(name, None)
                if _expired(morsel["expires"], morsel["max-age"]):
                    continue
                jar[name] = morsel.value
                if len(jar) > MAX_PER_HOST:
                    del jar[next(iter(jar))]

    def header(self, host: str) -> str | None:
        """The `Cookie` header for a request to `host`, or None."""
        jar = self._hosts.get(host)
        if not jar:
            return None
        return "; ".join(f"{k}={v}" for k, v in jar.items())

    def count(self, host: str) -> int:
        """Cookies kept for `host`."""
        return len(self._hosts.get(host, ()))
