"""The request builder (issue 14 item 2; design/http.md "Pinned names"): seven verbs,
path, `reply=`, headers, query, timeout, one body source, metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from zlink_actors import Host, InvalidOperationError, ProtocolError
from zlink_actors.testing import WAIT

from ._server import LocalService


def _echo(resp: Any) -> dict[str, Any]:
    assert resp.status == 200
    data: dict[str, Any] = resp.json()
    return data


def _header(seen: dict[str, Any], name: str) -> list[str]:
    return [v for k, v in seen["headers"] if k.lower() == name.lower()]


@pytest.mark.parametrize("verb", ["get", "post", "put", "delete", "patch", "options"])
def test_each_verb_sends_its_method(
    make_host: Callable[..., Host], service: LocalService, verb: str
) -> None:
    host = make_host(service.url)
    seen = _echo(getattr(host.http("svc"), verb)("/echo").submit_sync())
    assert seen["method"] == verb.upper()


def test_head_gets_the_headers_and_no_body(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    resp = host.http("svc").head("/echo").submit_sync()
    assert resp.status == 200
    assert resp.content == b""
    assert service.hits["/echo"] == 1


@pytest.mark.parametrize(("path", "error"), [("echo", ValueError), (b"/echo", TypeError)])
def test_a_path_not_starting_with_a_slash_is_refused_by_the_verb(
    make_host: Callable[..., Host], service: LocalService, path: Any, error: type[Exception]
) -> None:
    host = make_host(service.url)
    with pytest.raises(error):
        host.http("svc").get(path)


def test_a_reply_type_msgspec_cannot_decode_is_refused_by_the_verb(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    with pytest.raises(TypeError):
        host.http("svc").get("/echo", reply=object())


def test_headers_and_query_values_repeat_and_append(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url + "/", default_headers={"X-Default": "d"})
    seen = _echo(
        host.http("svc")
        .get("/echo")
        .header("X-Tag", "a")
        .header("X-Tag", "b")
        .query("q", "1")
        .query("q", 2)
        .query("city", "Zürich & co")
        .submit_sync()
    )
    assert _header(seen, "X-Tag") == ["a", "b"]
    assert _header(seen, "X-Default") == ["d"]
    assert seen["query"] == [["q", "1"], ["q", "2"], ["city", "Zürich & co"]]
    assert seen["path"] == "/echo"


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [(1, "a", TypeError), ("A", 1, TypeError), ("", "a", ValueError), ("A", "x\nB: c", ValueError)],
)
def test_a_bad_header_is_refused_where_it_is_set(
    make_host: Callable[..., Host], service: LocalService, name: Any, value: Any, error: Any
) -> None:
    host = make_host(service.url)
    with pytest.raises(error):
        host.http("svc").get("/echo").header(name, value)


def test_a_bad_query_value_is_refused_where_it_is_set(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    call = make_host(service.url).http("svc").get("/echo")
    for name, value in ((1, "a"), ("a", None), ("a", True)):
        with pytest.raises(TypeError):
            call.query(name, value)


def test_timeout_is_set_once_and_checked(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    call = make_host(service.url).http("svc").get("/echo")
    with pytest.raises(ValueError, match="timeout"):
        call.timeout(0)
    with pytest.raises(TypeError):
        call.timeout(True)
    call.timeout(1.0)
    with pytest.raises(InvalidOperationError):
        call.timeout(2.0)


def test_metadata_is_set_once_per_key(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    call = make_host(service.url).http("svc").get("/echo").metadata("trace", "t1")
    with pytest.raises(InvalidOperationError):
        call.metadata("trace", "t2")
    with pytest.raises(TypeError):
        call.metadata(1, "x")  # type: ignore[arg-type]
    assert call.submit_sync().status == 200


def test_each_body_source_sends_its_body_and_content_type(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    seen = _echo(client.post("/echo").json({"a": [1, 2]}).submit_sync())
    assert (seen["body"], _header(seen, "Content-Type")) == ('{"a":[1,2]}', ["application/json"])
    seen = _echo(client.put("/echo").content(b"\x00raw", "application/octet-stream").submit_sync())
    assert seen["body"] == "\x00raw"
    assert _header(seen, "Content-Type") == ["application/octet-stream"]
    seen = _echo(client.patch("/echo").form({"a": "1 2", "b": 3}).submit_sync())
    assert seen["body"] == "a=1+2&b=3"
    assert _header(seen, "Content-Type") == ["application/x-www-form-urlencoded"]


def test_bad_body_arguments_are_refused_where_they_are_set(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    with pytest.raises(TypeError):
        client.post("/echo").json(object())
    with pytest.raises(TypeError):
        client.post("/echo").content("text", "text/plain")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.post("/echo").form([("a", "b")])  # type: ignore[arg-type]


def test_two_body_sources_raise_protocol_error_from_the_terminator_and_send_nothing(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    call = client.post("/echo").json({"a": 1}).content(b"x", "text/plain")
    for terminator in (call.submit, call.submit_sync, call.send):
        with pytest.raises(ProtocolError):
            terminator()
    assert client.get("/echo").submit_sync().status == 200
    assert service.hits["/echo"] == 1


def test_a_url_that_cannot_be_built_raises_protocol_error_and_sends_nothing(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    client = make_host(service.url).http("svc")
    for call in (
        client.get("/echo\n"),
        client.get("/echo#part"),
        client.get("/echo\udcff"),
        client.get("/echo").query("q", "\x00"),
        client.get("/echo").query("\udcff", "v"),
    ):
        with pytest.raises(ProtocolError):
            call.submit()
    assert client.get("/echo").submit().result(WAIT).status == 200
    assert service.hits["/echo"] == 1
