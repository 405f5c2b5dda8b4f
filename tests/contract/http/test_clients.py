"""Named clients (issue 14 item 1; design/http.md "Pinned names"): configured on the
Host, reached by name, one connection pool each, made lazily and closed at shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from zlink_actors import (
    ConfigurationError,
    Host,
    HttpClientConfig,
    HttpResponse,
    NotConfiguredError,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.http import LoopScheduler
from zlink_actors.http.hosted import HttpClients
from zlink_actors.testing import WAIT, wait_until

from ._server import LocalService


class Ask(msgspec.Struct, frozen=True):
    client: str


@pytest.mark.parametrize(
    ("args", "options"),
    [
        (("ftp://127.0.0.1",), {}),
        (("127.0.0.1:80",), {}),
        ((b"http://127.0.0.1",), {}),
        (("http://",), {}),
        (("http://127.0.0.1/?q=1",), {}),
        (("http://127.0.0.1",), {"timeout": 0}),
        (("http://127.0.0.1",), {"timeout": -1.0}),
        (("http://127.0.0.1",), {"timeout": float("nan")}),
        (("http://127.0.0.1",), {"timeout": True}),
        (("http://127.0.0.1",), {"timeout": "3"}),
        (("http://127.0.0.1",), {"max_response_body_size": -1}),
        (("http://127.0.0.1",), {"max_response_body_size": True}),
        (("http://127.0.0.1",), {"max_response_body_size": 1.5}),
        (("http://127.0.0.1",), {"follow_redirects": -1}),
        (("http://127.0.0.1",), {"follow_redirects": False}),
        (("http://127.0.0.1",), {"retry": -2}),
        (("http://127.0.0.1",), {"retry": True}),
        (("http://127.0.0.1",), {"default_headers": ["a"]}),
        (("http://127.0.0.1",), {"default_headers": {"A": 1}}),
        (("http://127.0.0.1",), {"default_headers": {"A": "x\r\nB: y"}}),
        (("http://127.0.0.1",), {"compression": 1}),
        (("http://127.0.0.1",), {"cookies": "yes"}),
    ],
)
def test_a_bad_client_option_raises_configuration_error_from_the_config(
    args: tuple[Any, ...], options: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError):
        HttpClientConfig(*args, **options)


def test_the_config_keeps_its_values_and_defaults() -> None:
    config = HttpClientConfig("http://127.0.0.1:8080/api/", default_headers={"X-A": "1"})
    assert config.base_url == "http://127.0.0.1:8080/api"
    assert (config.timeout, config.max_response_body_size) == (3.0, 16 * 2**20)
    assert (config.follow_redirects, config.retry) == (0, 0)
    assert (config.compression, config.cookies) == (False, False)
    assert dict(config.default_headers) == {"X-A": "1"}


@pytest.mark.parametrize("clients", [["svc"], {"svc": "http://x"}, {"": None}, {1: None}])
def test_bad_http_clients_on_the_host_raise_configuration_error(clients: Any) -> None:
    with pytest.raises(ConfigurationError):
        Host(http_clients=clients)


def test_an_unknown_client_name_raises_not_configured_from_http(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    outcome: list[str] = []

    class Caller(Spot):
        @handler
        def ask(self, ctx: SpotContext, msg: Ask) -> str:
            try:
                ctx.http(msg.client)
            except NotConfiguredError:
                return "not configured"
            return "found"

    host = make_host(service.url)
    with pytest.raises(NotConfiguredError):
        host.http("nope")
    bare = Host().start()
    try:
        with pytest.raises(NotConfiguredError):
            bare.http("svc")
    finally:
        bare.shutdown(WAIT)
    host2 = Host(spots=[Caller], http_clients={"svc": HttpClientConfig(service.url)}).start()
    try:
        host2.spots.get_or_create("c", Caller).submit_sync()
        outcome.append(host2.request_to_spot("c", Ask("nope"), reply=str).submit_sync())
        outcome.append(host2.request_to_spot("c", Ask("svc"), reply=str).submit_sync())
    finally:
        host2.shutdown(WAIT)
    assert outcome == ["not configured", "found"]


def test_a_name_returns_the_same_client_from_the_host_and_from_handlers(
    service: LocalService,
) -> None:
    seen: list[object] = []

    class Caller(Spot):
        @handler
        def ask(self, ctx: SpotContext, msg: Ask) -> None:
            seen.append(ctx.http(msg.client))

    host = Host(
        spots=[Caller],
        http_clients={"a": HttpClientConfig(service.url), "b": HttpClientConfig(service.url2)},
    ).start()
    try:
        host.spots.get_or_create("c", Caller).submit_sync()
        host.request_to_spot("c", Ask("a")).submit_sync()
        host.request_to_spot("c", Ask("b")).submit_sync()
        assert seen == [host.http("a"), host.http("b")]
        assert host.http("a") is host.http("a")
        assert host.http("a") is not host.http("b")
    finally:
        host.shutdown(WAIT)


def test_the_session_is_made_lazily_on_the_io_executor(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    assert host.statistics().io.threads == 0  # no loop started for an unused client
    resp = host.http("svc").get("/forecast").submit_sync()
    assert isinstance(resp, HttpResponse)
    assert resp.status == 200
    assert host.statistics().io.threads == 1


def test_one_pool_per_name_keeps_its_connection_alive_between_requests(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    for _ in range(3):
        assert host.http("svc").get("/peer").submit_sync().status == 200
    assert len(service.peers) == 3
    assert len(set(service.peers)) == 1  # one kept-alive connection served all three


def test_shutdown_closes_every_clients_connections(service: LocalService) -> None:
    host = Host(
        http_clients={"a": HttpClientConfig(service.url), "b": HttpClientConfig(service.url2)}
    ).start()
    try:
        assert host.http("a").get("/peer").submit_sync().status == 200
        assert host.http("b").get("/peer").submit_sync().status == 200
    finally:
        result = host.shutdown(WAIT)
    assert result.outcome.value == "stopped"
    assert host.statistics().io.threads == 0
    assert len(service.transports) == 2
    # The server sees both kept-alive connections end.
    assert wait_until(lambda: all(t.is_closing() for t in service.transports))


_loop_blocked = threading.Event()
_unblock_loop = threading.Event()


class _BlocksTheLoop(msgspec.Struct):
    """Decoded on the I/O executor's loop: holds that loop until the test lets go."""

    city: str

    def __post_init__(self) -> None:
        _loop_blocked.set()
        _unblock_loop.wait(30)


def test_the_clients_close_within_one_deadline_together_and_a_timeout_is_logged(
    service: LocalService, caplog: pytest.LogCaptureFixture
) -> None:
    # Three used clients whose sessions cannot close (their loop is held): the closes
    # share the timeout (Host.shutdown then gets what they left of its deadline).
    names = ("a", "b", "c")
    sched = LoopScheduler("test-http")
    clients = HttpClients(
        {n: HttpClientConfig(service.url) for n in names},
        sched,  # type: ignore[arg-type]  # a scheduler without a Host
    )
    _loop_blocked.clear()
    _unblock_loop.clear()
    try:
        for name in names:
            assert clients.client(name).get("/echo").submit_sync().status == 200
        clients.client("a").get("/forecast", reply=_BlocksTheLoop).submit()
        assert _loop_blocked.wait(WAIT)
        timeout = 0.5
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="zlink_actors"):
            assert not clients.close(timeout)
        took = time.monotonic() - started
    finally:
        _unblock_loop.set()
        # The held closes run once the loop is free; then the loop may stop.
        assert wait_until(lambda: not sched._tasks)
        assert sched.close(WAIT)
    # One close after another, each given the whole timeout, took 1.5 s.
    assert took < timeout + 0.4, took
    assert caplog.text.count("did not close") == 3
