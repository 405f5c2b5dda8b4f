"""Responses and errors (issue 14 item 4; design/http.md "Result" and "Errors")."""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec
import pytest

from zlink_actors import (
    CapacityExceededError,
    Completion,
    DeadlineExceededError,
    ErrorKind,
    Host,
    HttpClientConfig,
    HttpResponse,
    HttpStatusError,
    InternalFailureError,
    ProtocolError,
    ShuttingDownError,
    Spot,
    SpotContext,
    UnavailableError,
    UnavailableReason,
    handler,
)
from zlink_actors.testing import WAIT, wait_until

from ._server import LocalService, closed_port


class Forecast(msgspec.Struct, frozen=True):
    city: str
    celsius: float


@pytest.mark.parametrize("code", [200, 204, 301, 404, 500, 503])
def test_without_reply_every_status_is_a_response(
    make_host: Callable[..., Host], service: LocalService, code: int
) -> None:
    resp = make_host(service.url).http("svc").get(f"/status/{code}").submit_sync()
    assert isinstance(resp, HttpResponse)
    assert resp.status == code
    assert resp.headers["x-tag"] == "a"
    assert resp.headers.getall("X-TAG") == ["a"]
    assert resp.headers.get("missing") is None
    if code != 204:
        assert resp.json() == {"status": code}
        assert resp.json(dict[str, int]) == {"status": code}
        assert resp.text() == '{"status": ' + str(code) + "}"


def test_text_uses_the_charset_of_the_content_type_else_utf8(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    plain = client.get("/text").query("t", "caf\u00e9").submit_sync()
    assert plain.headers["Content-Type"] == "text/plain"
    assert plain.text() == "caf\u00e9"  # no charset: UTF-8
    latin = client.get("/text").query("t", "caf\u00e9").query("cs", "latin-1").submit_sync()
    assert latin.content == b"caf\xe9"
    assert latin.text() == "caf\u00e9"  # the charset of the Content-Type
    with pytest.raises(ProtocolError):
        latin.text("utf-8")


def test_with_reply_the_body_is_decoded_into_the_type(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    assert client.get("/forecast", reply=Forecast).query("city", "Rome").submit_sync() == (
        Forecast("Rome", 21.5)
    )
    assert client.get("/forecast", reply=dict[str, object]).submit_sync()["city"] == "Oslo"


@pytest.mark.parametrize("code", [400, 404, 500])
def test_with_reply_a_status_of_400_or_more_is_http_status_error(
    make_host: Callable[..., Host], service: LocalService, code: int
) -> None:
    client = make_host(service.url).http("svc")
    with pytest.raises(HttpStatusError) as caught:
        client.get(f"/status/{code}", reply=dict[str, int]).submit_sync()
    assert isinstance(caught.value, InternalFailureError)
    assert caught.value.kind is ErrorKind.INTERNAL_FAILURE
    assert caught.value.status == code
    assert caught.value.response.status == code


def test_with_reply_a_body_that_does_not_decode_is_protocol_error(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    with pytest.raises(ProtocolError):
        client.get("/text", reply=Forecast).submit_sync()
    with pytest.raises(ProtocolError):
        client.get("/forecast", reply=list[int]).submit_sync()
    with pytest.raises(ProtocolError):
        client.get("/text").submit_sync().json()


def test_a_refused_connection_is_unavailable(make_host: Callable[..., Host]) -> None:
    client = make_host(f"http://127.0.0.1:{closed_port()}").http("svc")
    with pytest.raises(UnavailableError) as caught:
        client.get("/x").submit_sync()
    assert caught.value.reason is UnavailableReason.UNREACHABLE


def test_a_connection_closed_without_a_response_is_unavailable(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    service.raw_mode = "reset"
    with pytest.raises(UnavailableError) as caught:
        make_host(service.raw_url).http("svc").get("/x").submit_sync()
    assert caught.value.reason is UnavailableReason.UNREACHABLE


def test_a_body_cut_short_after_the_status_is_unavailable(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    service.raw_mode = "cut"
    with pytest.raises(UnavailableError) as caught:
        make_host(service.raw_url).http("svc").get("/x").submit_sync()
    assert caught.value.reason is UnavailableReason.UNREACHABLE


def test_an_attempt_past_its_timeout_is_deadline_exceeded(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, timeout=0.1).http("svc")
    with pytest.raises(DeadlineExceededError):
        client.get("/slow?d=2").submit_sync()
    with pytest.raises(DeadlineExceededError):
        client.get("/slow?d=2").timeout(0.05).submit_sync()
    # The request's own timeout replaces the client's.
    assert client.get("/slow?d=0.2").timeout(3.0).submit_sync().status == 200


@pytest.mark.parametrize("path", ["/bytes?n={n}", "/stream?n={n}"])
def test_a_body_of_exactly_the_limit_passes_and_one_byte_more_is_capacity_exceeded(
    make_host: Callable[..., Host], service: LocalService, path: str
) -> None:
    limit = 2**16 if "stream" in path else 1000
    client = make_host(service.url, max_response_body_size=limit).http("svc")
    assert len(client.get(path.format(n=limit)).submit_sync().content) == limit
    service.streamed = 0
    over = limit + 1 if "bytes" in path else limit * 2
    with pytest.raises(CapacityExceededError):
        client.get(path.format(n=over)).submit_sync()


def test_an_oversize_stream_is_refused_without_reading_it_all(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, max_response_body_size=2**20).http("svc")
    with pytest.raises(CapacityExceededError):
        client.get(f"/stream?n={2**30}").timeout(30).submit_sync()
    # The connection was dropped at the limit: the server stopped far short of 1 GiB.
    assert service.streamed < 64 * 2**20


def test_a_compressed_body_that_expands_past_the_limit_is_capacity_exceeded(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, max_response_body_size=10_000, compression=True).http("svc")
    resp = client.get("/gzip?n=10000").submit_sync()
    assert resp.content == b"z" * 10_000
    with pytest.raises(CapacityExceededError):
        # About 50 KiB on the wire, 50 MiB decompressed: never decompressed whole.
        client.get(f"/gzip?n={50 * 2**20}").timeout(30).submit_sync()


def test_a_redirect_with_an_invalid_location_is_protocol_error(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    service.raw_mode = "bad-location"
    with pytest.raises(ProtocolError):
        make_host(service.raw_url, follow_redirects=2).http("svc").get("/x").submit_sync()


def test_a_request_after_shutdown_is_shutting_down(service: LocalService) -> None:
    host = Host(http_clients={"svc": HttpClientConfig(service.url)}).start()
    client = host.http("svc")
    host.shutdown(WAIT)
    with pytest.raises(ShuttingDownError):
        client.get("/echo").submit_sync()
    assert client.get("/echo").submit().exception(WAIT).__class__ is ShuttingDownError
    assert service.hits["/echo"] == 0


class Fetch(msgspec.Struct, frozen=True):
    path: str


def test_shutdown_ends_each_request_in_flight_once_with_shutting_down(
    service: LocalService,
) -> None:
    ended: list[str] = []
    lock = threading.Lock()

    class Caller(Spot):
        @handler
        async def fetch(self, ctx: SpotContext, msg: Fetch) -> str:
            try:
                await ctx.http("svc").get(msg.path).submit()
            except ShuttingDownError:
                with lock:
                    ended.append(ctx.spot_id)
                return "shut down"
            return "answered"

    host = Host(spots=[Caller], http_clients={"svc": HttpClientConfig(service.url)}).start()
    try:
        for i in range(5):
            host.spots.get_or_create(f"s{i}", Caller).submit_sync()
        replies = [
            host.request_to_spot(f"s{i}", Fetch("/hold"), reply=str).timeout(30).submit()
            for i in range(5)
        ]
        direct = host.http("svc").get("/hold").submit()
        outcomes: list[Completion[HttpResponse]] = []
        direct.add_done_callback(outcomes.append)
        assert service.wait_held(6)
    finally:
        result = host.shutdown(WAIT)
    assert result.outcome.value == "stopped"
    assert [r.result(WAIT) for r in replies] == ["shut down"] * 5
    assert sorted(ended) == [f"s{i}" for i in range(5)]
    assert isinstance(direct.exception(WAIT), ShuttingDownError)
    assert wait_until(lambda: len(outcomes) == 1)
    # The server saw its six connections close.
    assert wait_until(lambda: service.in_flight == 0)
