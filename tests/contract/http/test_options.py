"""Client options (issue 14 item 5; design/http.md "Rules"): redirects, retry, default
headers, compression and cookies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

from zlink_actors import (
    DeadlineExceededError,
    Host,
    HttpClientConfig,
    ProtocolError,
    UnavailableError,
)
from zlink_actors.http.cookies import MAX_PER_HOST
from zlink_actors.http.exchange import backoff

from ._server import LocalService


def _header(seen: dict[str, Any], name: str) -> list[str]:
    return [v for k, v in seen["headers"] if k.lower() == name.lower()]


def _to(url: str) -> str:
    return quote(url, safe="")


# -- redirects -------------------------------------------------------------------------


def test_redirects_are_off_by_default_and_a_3xx_is_the_response(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    resp = client.get(f"/redirect/302?to={_to('/echo')}").submit_sync()
    assert resp.status == 302
    assert resp.headers["Location"] == "/echo"
    assert service.hits["/echo"] == 0


@pytest.mark.parametrize(
    ("code", "method"), [(303, "POST"), (303, "PUT"), (301, "POST"), (302, "POST")]
)
def test_303_and_post_on_301_or_302_become_a_get_without_the_body(
    make_host: Callable[..., Host], service: LocalService, code: int, method: str
) -> None:
    client = make_host(service.url, follow_redirects=1).http("svc")
    call = getattr(client, method.lower())(f"/redirect/{code}?to={_to('/echo')}")
    resp = call.json({"a": 1}).submit_sync()
    seen = resp.json()
    assert (resp.status, seen["method"], seen["body"]) == (200, "GET", "")
    assert _header(seen, "Content-Type") == []


@pytest.mark.parametrize("code", [307, 308])
def test_307_and_308_keep_the_method_and_the_body(
    make_host: Callable[..., Host], service: LocalService, code: int
) -> None:
    client = make_host(service.url, follow_redirects=1).http("svc")
    resp = client.post(f"/redirect/{code}?to={_to('/echo')}").json({"a": 1}).submit_sync()
    seen = resp.json()
    assert (seen["method"], seen["body"]) == ("POST", '{"a":1}')


def test_a_cross_origin_hop_drops_authorization_and_a_same_origin_one_keeps_it(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(
        service.url, follow_redirects=2, default_headers={"Authorization": "Bearer t"}
    ).http("svc")
    same = client.get(f"/redirect/302?to={_to('/echo')}").submit_sync().json()
    assert _header(same, "Authorization") == ["Bearer t"]
    other = client.get(f"/redirect/302?to={_to(service.url2 + '/echo')}").submit_sync().json()
    assert other["port"] == service.port2
    assert _header(other, "Authorization") == []
    # Back to the first origin after a cross-origin hop: it stays dropped.
    back = f"{service.url2}/redirect/302?to={_to(service.url + '/echo')}"
    again = client.get(f"/redirect/307?to={_to(back)}").submit_sync().json()
    assert again["port"] == service.port
    assert _header(again, "Authorization") == []


def test_n_hops_are_followed_and_hop_n_plus_one_is_protocol_error_and_not_requested(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, follow_redirects=2).http("svc")
    two = f"/redirect/302?to={_to('/redirect/302?to=' + _to('/echo'))}"
    assert client.get(two).submit_sync().json()["method"] == "GET"
    assert service.hits["/echo"] == 1
    three = f"/redirect/302?to={_to('/redirect/302?to=' + _to('/redirect/302?to=/echo'))}"
    with pytest.raises(ProtocolError):
        client.get(three).submit_sync()
    assert service.hits["/echo"] == 1  # the third hop's target was never requested


def test_a_redirect_without_a_location_or_to_another_scheme_is_protocol_error(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, follow_redirects=3).http("svc")
    with pytest.raises(ProtocolError):
        client.get(f"/redirect/302?to={_to('ftp://127.0.0.1/x')}").submit_sync()


# -- retry -----------------------------------------------------------------------------


@pytest.mark.parametrize("retry", [0, 1, 3])
def test_retry_makes_exactly_at_most_n_plus_one_attempts_after_transport_failures(
    make_host: Callable[..., Host], service: LocalService, retry: int
) -> None:
    service.raw_mode = "reset"
    client = make_host(service.raw_url, retry=retry).http("svc")
    with pytest.raises(UnavailableError):
        client.get("/x").submit_sync()
    assert service.raw_requests == retry + 1


def test_without_retry_a_failing_kept_alive_connection_is_not_silently_repeated(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    # A reset on a connection aiohttp would have reused: still one attempt with retry=0.
    service.raw_mode = "reset"
    client = make_host(service.raw_url).http("svc")
    for expected in (1, 2):
        with pytest.raises(UnavailableError):
            client.get("/x").submit_sync()
        assert service.raw_requests == expected


def test_retry_repeats_after_a_timeout_each_attempt_with_its_own_timeout(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, retry=2, timeout=0.1).http("svc")
    with pytest.raises(DeadlineExceededError):
        client.get("/slow?d=1").submit_sync()
    assert service.hits["/slow"] == 3


@pytest.mark.parametrize("code", [500, 503, 404])
def test_retry_never_repeats_after_a_status(
    make_host: Callable[..., Host], service: LocalService, code: int
) -> None:
    client = make_host(service.url, retry=3).http("svc")
    assert client.get(f"/status/{code}").submit_sync().status == code
    assert service.hits[f"/status/{code}"] == 1


def test_backoff_is_full_jitter_capped_at_one_second() -> None:
    for attempt, cap in ((0, 0.05), (1, 0.1), (4, 0.8), (5, 1.0), (30, 1.0)):
        delays = [backoff(attempt) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # spread over the range, not a fixed delay


# -- headers and compression -----------------------------------------------------------


def test_default_headers_go_on_every_request_and_request_headers_add_to_them(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, default_headers={"X-App": "weather"}).http("svc")
    assert _header(client.get("/echo").submit_sync().json(), "X-App") == ["weather"]
    seen = client.get("/echo").header("X-App", "more").submit_sync().json()
    assert _header(seen, "X-App") == ["weather", "more"]


def test_without_compression_the_client_asks_for_identity(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    assert _header(client.get("/echo").submit_sync().json(), "Accept-Encoding") == ["identity"]


def test_with_compression_the_client_asks_for_gzip_and_deflate_and_decodes(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, compression=True).http("svc")
    seen = client.get("/echo").submit_sync().json()
    assert _header(seen, "Accept-Encoding") == ["gzip, deflate"]
    resp = client.get("/gzip?n=5000").submit_sync()
    assert resp.content == b"z" * 5000
    assert resp.headers["Content-Encoding"] == "gzip"


@pytest.mark.parametrize("cut", [1, 8, 12, 30])
def test_a_truncated_compressed_body_is_protocol_error_not_a_short_body(
    make_host: Callable[..., Host], service: LocalService, cut: int
) -> None:
    client = make_host(service.url, compression=True).http("svc")
    with pytest.raises(ProtocolError, match="does not decode"):
        client.get(f"/gzip?n=10000&cut={cut}").submit_sync()


# -- cookies ---------------------------------------------------------------------------


def test_cookies_are_off_by_default(make_host: Callable[..., Host], service: LocalService) -> None:
    client = make_host(service.url).http("svc")
    client.get("/set-cookies?n=2").submit_sync()
    assert client.get("/set-cookies").submit_sync().json() == {"cookie": None}


def test_the_jar_keeps_cookies_by_exact_host_ip_hosts_included(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(
        clients={
            "ip": _config(service.url, cookies=True, follow_redirects=1),
            "name": _config(f"http://localhost:{service.port}", cookies=True),
        }
    )
    ip = host.http("ip")
    ip.get("/set-cookies?n=2").submit_sync()
    assert ip.get("/set-cookies").submit_sync().json() == {"cookie": "c0=0; c1=1"}
    # Another port of the same host is the same host (cookies ignore ports, RFC 6265).
    hop = ip.get(f"/redirect/307?to={_to(service.url2 + '/set-cookies')}").submit_sync()
    assert hop.url.startswith(service.url2)
    assert hop.json() == {"cookie": "c0=0; c1=1"}
    # A different host name for the same address gets none of them.
    assert host.http("name").get("/set-cookies").submit_sync().json() == {"cookie": None}


def test_the_jars_cookies_are_added_to_a_requests_own_cookie_header(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, cookies=True).http("svc")
    client.get("/set-cookies?n=1").submit_sync()
    resp = client.get("/set-cookies").header("Cookie", "mine=1").submit_sync()
    assert resp.json() == {"cookie": "mine=1; c0=0"}
    # Without a cookie in the jar, the request's own header goes as it is.
    other = make_host(service.url, cookies=True).http("svc")
    assert other.get("/set-cookies").header("Cookie", "mine=1").submit_sync().json() == {
        "cookie": "mine=1"
    }


def test_the_jar_keeps_at_most_128_cookies_per_host(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url, cookies=True).http("svc")
    # Three responses of 50 (aiohttp refuses a response of more than 128 headers).
    for first in (0, 50, 100):
        client.get(f"/set-cookies?from={first}&n=50").submit_sync()
    sent = client.get("/set-cookies").submit_sync().json()["cookie"]
    names = [pair.split("=")[0] for pair in sent.split("; ")]
    assert len(names) == MAX_PER_HOST == 128
    assert names[0] == "c22"  # the 22 oldest were evicted
    assert names[-1] == "c149"


def _config(url: str, **options: Any) -> HttpClientConfig:
    return HttpClientConfig(url, **options)
