"""The Host's side of the HTTP tier: its scheduler and its registry of named clients.

`_host.py` builds an `HttpClients` from `Host(http_clients=...)` and provides it under
the `HTTP_CLIENTS` service key, so `ctx.http(name)` reaches a client without the
contexts importing this package. The scheduler runs requests on the Host's I/O executor
and settles their completions there; the framework's `Completion` resumes each caller in
its own turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from .._core.completion import Cell
from .._core.errors import ConfigurationError, NotConfiguredError
from .._core.workers import IoExecutor
from .._engine.kernel import Runtime
from .client import HttpClient
from .config import HttpClientConfig

__all__ = ["HostScheduler", "HttpClients"]

T = TypeVar("T")
log = logging.getLogger("zlink_actors")


class HostScheduler:
    """The completion scheduler a Host injects: the I/O executor's loop, the Host's
    admission."""

    __slots__ = ("_io", "_lock", "_runtime", "_starts", "_woken")

    def __init__(self, runtime: Runtime, io: IoExecutor) -> None:
        self._runtime = runtime
        self._io = io
        #: Requests handed over and not yet started on the loop; one wake-up of the loop
        #: starts them all (each wake-up is a write to the loop's self-pipe, and a
        #: context switch under the GIL).
        self._starts: deque[Callable[[], Awaitable[None]]] = deque()
        self._lock = threading.Lock()
        self._woken = False

    def admission(self) -> BaseException | None:
        refused = self._runtime.admission_failure()  # raises before start()
        return None if refused is None else refused.exception()

    def execute(self, make: Callable[[], Awaitable[None]]) -> bool:
        with self._lock:
            self._starts.append(make)
            if self._woken:
                return True  # the wake-up already queued starts this one too
            self._woken = True
        if self._io.call_soon(self._start_all):
            return True
        with self._lock:
            self._woken = False
            self._starts.clear()
        return False

    def _start_all(self) -> None:
        # On the loop thread.
        with self._lock:
            self._woken = False
            starts = list(self._starts)
            self._starts.clear()
        create = self._io.create_task
        for make in starts:
            create(make)

    def call_soon(self, fn: Callable[[], object]) -> bool:
        return self._io.call_soon(fn)

    def resume(self, cell: Cell[T], value: T | None, exc: BaseException | None) -> bool:
        # The Completion posts an awaiting turn's continuation, and a done-callback added
        # in a turn, to that owner's gate; nothing to route here.
        return cell.try_set(value, exc)


class HttpClients:
    """The named clients of one Host (the `HTTP_CLIENTS` service)."""

    __slots__ = ("_clients",)

    def __init__(self, configs: Mapping[str, HttpClientConfig], scheduler: HostScheduler) -> None:
        """`configs` as `check` returned them."""
        self._clients = {name: HttpClient(name, c, scheduler) for name, c in configs.items()}

    @staticmethod
    def check(configs: object) -> dict[str, HttpClientConfig]:
        """`Host(http_clients=...)`, checked before anything is made.

        Raises:
            ConfigurationError: not a mapping of non-empty str to `HttpClientConfig`.
        """
        if configs is None:
            return {}
        if not isinstance(configs, Mapping):
            raise ConfigurationError(
                "http_clients must be a mapping of name -> HttpClientConfig, got "
                f"{type(configs).__name__}"
            )
        checked: dict[str, HttpClientConfig] = {}
        for name, config in configs.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"an HTTP client name is a non-empty str, got {name!r}")
            if not isinstance(config, HttpClientConfig):
                raise ConfigurationError(
                    f"http_clients[{name!r}] must be an HttpClientConfig, got "
                    f"{type(config).__name__}"
                )
            checked[name] = config
        return checked

    def client(self, name: str) -> HttpClient:
        """The client named `name`.

        Raises:
            NotConfiguredError: no client of that name was configured.
        """
        try:
            return self._clients[name]
        except (KeyError, TypeError):
            raise NotConfiguredError(
                f"no HTTP client named {name!r} is configured on this Host "
                f"(configured: {sorted(self._clients)})"
            ) from None

    def close(self, timeout: float) -> bool:
        """Close every client (see `HttpClient.close`) within `timeout` seconds for all
        of them together; False (and a warning logged) if one did not close."""
        end = time.monotonic() + timeout
        ok = True
        for client in self._clients.values():
            if not client.close(max(0.0, end - time.monotonic())):
                ok = False
                log.warning(
                    "HTTP client %r: its connections did not close within %.3g s",
                    client.name,
                    timeout,
                )
        return ok
