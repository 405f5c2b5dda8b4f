"""Fixtures of the HTTP client's tests: a real local service and Hosts with clients.

Every server and Host a test starts is stopped at teardown, also when the test fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from zlink_actors import Host, HttpClientConfig

from ._server import LocalService


@pytest.fixture
def service() -> Iterator[LocalService]:
    svc = LocalService()
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def make_host() -> Iterator[Callable[..., Host]]:
    """`make_host(base_url, spots=..., **client_options)`: a started Host with one client
    named "svc" (more with `clients={name: config}`)."""
    hosts: list[Host] = []

    def make(
        base_url: str | None = None,
        *,
        clients: dict[str, HttpClientConfig] | None = None,
        host_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Host:
        configs = dict(clients or {})
        if base_url is not None:
            configs["svc"] = HttpClientConfig(base_url, **options)
        host = Host(http_clients=configs, **(host_options or {}))
        hosts.append(host)
        return host.start()

    try:
        yield make
    finally:
        for host in hosts:
            host.shutdown(5.0)
