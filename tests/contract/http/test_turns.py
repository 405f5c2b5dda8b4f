"""Terminators and the turn rules (issue 14 item 3; seed HX §5): `submit()` keeps the
gate, `yield_()` releases it where eligible, `submit_sync()` is for application threads,
`send()` is one-way, done-callbacks run as turns of their owner, and `cancel=`."""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    CancellationSource,
    CancelledError,
    ChannelContext,
    ChannelHandler,
    Completion,
    Host,
    HttpResponse,
    InstanceSpot,
    InvalidOperationError,
    Spot,
    SpotContext,
    SpotMode,
    UnavailableError,
    handler,
)
from zlink_actors.testing import WAIT, wait_until

from ._server import LocalService, closed_port

NEGATIVE_WAIT = 0.2


class Fetch(msgspec.Struct, frozen=True):
    path: str
    how: str = "submit"


class Ping(msgspec.Struct, frozen=True):
    n: int


class Forecast(msgspec.Struct, frozen=True):
    city: str
    celsius: float


class Caller(Spot):
    """Fetches a path with the terminator named in the message; logs its turns."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    @handler
    async def fetch(self, ctx: SpotContext, msg: Fetch) -> int:
        self.log.append("fetch-start")
        call = ctx.http("svc").get(msg.path)
        if msg.how == "yield":
            resp = await call.yield_()
        else:
            resp = await call.submit()
        self.log.append("fetch-end")
        return resp.status

    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        self.log.append(f"ping-{msg.n}")
        return msg.n


def test_twenty_requests_from_twenty_spots_are_in_flight_at_once(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url, host_options={"spots": [Caller], "app_threads": 2})
    for i in range(21):
        host.spots.get_or_create(f"s{i}", Caller).submit_sync()
    calls = [
        host.request_to_spot(f"s{i}", Fetch("/hold"), reply=int).timeout(30).submit()
        for i in range(20)
    ]
    # All twenty wait in the server at once, with only two pool threads: no pool thread
    # waits on the network, so a twenty-first Spot still answers meanwhile.
    assert service.wait_held(20)
    assert host.request_to_spot("s20", Ping(7), reply=int).submit_sync() == 7
    assert host.statistics().pool.busy_threads == 0
    service.release()
    assert [c.result(WAIT) for c in calls] == [200] * 20
    assert service.max_in_flight == 20


def test_twenty_slow_requests_are_in_flight_at_once(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url, host_options={"spots": [Caller], "app_threads": 2})
    for i in range(20):
        host.spots.get_or_create(f"s{i}", Caller).submit_sync()
    # Warm the pool's connections first, so the figure measures the requests only.
    assert host.request_to_spot("s0", Fetch("/slow?d=0"), reply=int).submit_sync() == 200
    calls = [
        host.request_to_spot(f"s{i}", Fetch("/slow?d=0.2"), reply=int).submit() for i in range(20)
    ]
    assert [c.result(WAIT) for c in calls] == [200] * 20
    # The server saw all twenty at once: no turn held a pool thread while it waited (a
    # wall-clock bound would say the same, and fail on a loaded machine).
    assert service.max_in_flight == 20


def test_awaiting_submit_keeps_the_gate_until_the_response(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url, host_options={"spots": [Caller], "app_threads": 2})
    host.spots.get_or_create("room", Caller).submit_sync()
    fetch = host.request_to_spot("room", Fetch("/hold"), reply=int).timeout(30).submit()
    assert service.wait_held(1)
    ping = host.request_to_spot("room", Ping(1), reply=int).submit()
    assert not ping.wait(NEGATIVE_WAIT)  # the gate is kept: the ping waits
    service.release()
    assert fetch.result(WAIT) == 200
    assert ping.result(WAIT) == 1
    spot = host.request_to_spot("room", Ping(2), reply=int).submit_sync()
    assert spot == 2


def test_yield_releases_the_gate_and_the_second_message_runs_meanwhile(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    logs: dict[str, list[str]] = {}

    class Logged(Caller):
        def __init__(self) -> None:
            super().__init__()
            logs["room"] = self.log

    host = make_host(service.url, host_options={"spots": [Logged], "app_threads": 2})
    host.spots.get_or_create("room", Logged).submit_sync()
    fetch = host.request_to_spot("room", Fetch("/hold", "yield"), reply=int).timeout(30).submit()
    assert service.wait_held(1)
    # The gate is released while the request waits: the ping runs and answers now.
    assert host.request_to_spot("room", Ping(1), reply=int).submit_sync() == 1
    assert not fetch.done()
    service.release()
    assert fetch.result(WAIT) == 200
    assert logs["room"] == ["fetch-start", "ping-1", "fetch-end"]


class TryYield(msgspec.Struct, frozen=True):
    how: str


def _attempt(ctx: SpotContext | ActorContext | ChannelContext, how: str) -> str:
    call = ctx.http("svc").get("/echo")
    try:
        if how == "yield":
            call.yield_()
        else:
            call.submit_sync()
    except InvalidOperationError:
        return "refused"
    return "accepted"


class PerActorCaller(Spot):
    mode = SpotMode.PER_ACTOR

    @handler
    async def try_it(self, ctx: SpotContext, msg: TryYield) -> str:
        return _attempt(ctx, msg.how)


class SpotWideCaller(Spot):
    @handler
    async def try_it(self, ctx: SpotContext, msg: TryYield) -> str:
        return _attempt(ctx, msg.how)


class EntryActor(Actor):
    @handler
    async def try_it(self, ctx: ActorContext, msg: TryYield) -> str:
        return _attempt(ctx, msg.how)


class ChannelCaller(ChannelHandler):
    @handler
    async def try_it(self, ctx: ChannelContext, msg: TryYield) -> str:
        return _attempt(ctx, msg.how)


@pytest.mark.parametrize(
    ("caller", "how"),
    [
        ("per_actor_spot", "yield"),
        ("entry_actor", "yield"),
        ("channel_handler", "yield"),
        ("spotwide_spot", "sync"),
        ("channel_handler", "sync"),
    ],
)
def test_ineligible_yield_and_submit_sync_in_a_handler_raise_before_anything_is_sent(
    make_host: Callable[..., Host], service: LocalService, caller: str, how: str
) -> None:
    host = make_host(
        service.url,
        host_options={
            "spots": [PerActorCaller, SpotWideCaller],
            "actors": [EntryActor],
            "channels": {"chan": ChannelCaller},
        },
    )
    if caller == "per_actor_spot":
        host.spots.get_or_create("c", PerActorCaller).submit_sync()
        request = host.request_to_spot("c", TryYield(how), reply=str)
    elif caller == "spotwide_spot":
        host.spots.get_or_create("c", SpotWideCaller).submit_sync()
        request = host.request_to_spot("c", TryYield(how), reply=str)
    elif caller == "entry_actor":
        host.actors.get_or_create("c", EntryActor).submit_sync()
        request = host.request_to_actor("c", TryYield(how), reply=str)
    else:
        request = host.request_to_channel("chan", TryYield(how), reply=str)
    assert request.submit_sync() == "refused"
    # Nothing reached the server: a request sent now is its first.
    assert host.http("svc").get("/echo").submit_sync().status == 200
    assert service.hits["/echo"] == 1


def test_yield_from_an_application_thread_raises_before_anything_is_sent(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    with pytest.raises(InvalidOperationError):
        host.http("svc").get("/echo").yield_()
    assert host.http("svc").get("/echo").submit_sync().status == 200
    assert service.hits["/echo"] == 1


def test_a_builder_is_single_use(make_host: Callable[..., Host], service: LocalService) -> None:
    host = make_host(service.url)
    call = host.http("svc").get("/echo")
    assert call.submit().result(WAIT).status == 200
    for terminator in (call.submit, call.submit_sync, call.send):
        with pytest.raises(InvalidOperationError):
            terminator()
    with pytest.raises(InvalidOperationError):
        call.header("A", "b")
    assert service.hits["/echo"] == 1


class Watch(msgspec.Struct, frozen=True):
    path: str


def test_a_done_callback_registered_in_a_turn_runs_as_a_new_turn_of_that_owner(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    heard = threading.Event()
    blocking = threading.Event()
    unblock = threading.Event()
    log: list[object] = []

    class Watcher(Spot):
        @handler
        def watch(self, ctx: SpotContext, msg: Watch) -> None:
            completion = ctx.http("svc").get(msg.path).submit()

            def on_done(c: Completion[HttpResponse]) -> None:
                log.append(("callback", c.result().status))
                heard.set()

            completion.add_done_callback(on_done)

        @handler
        def block(self, ctx: SpotContext, msg: Ping) -> None:
            log.append("block-start")
            blocking.set()
            assert unblock.wait(WAIT)
            log.append("block-end")

    host = make_host(service.url, host_options={"spots": [Watcher], "app_threads": 2})
    host.spots.get_or_create("w", Watcher).submit_sync()
    host.request_to_spot("w", Watch("/hold")).submit_sync()
    assert service.wait_held(1)
    host.send_to_spot("w", Ping(1)).submit_sync()
    assert blocking.wait(WAIT)
    service.release()
    # The response is in, but the callback is a turn of the Spot: it waits for the gate.
    assert not heard.wait(NEGATIVE_WAIT)
    unblock.set()
    assert heard.wait(WAIT)
    assert log == ["block-start", "block-end", ("callback", 200)]


def test_send_completes_once_written_and_the_server_gets_it(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    done = host.http("svc").post("/echo").json({"a": 1}).send()
    assert done.result(WAIT) is None
    assert wait_until(lambda: service.hits["/echo"] == 1)
    assert wait_until(lambda: len(service.seen) == 1)
    assert service.seen[0]["body"] == '{"a":1}'
    # The response was drained: the connection went back to the pool and serves again.
    assert host.http("svc").get("/echo").submit_sync().status == 200


def test_send_completes_before_the_response(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    done = host.http("svc").get("/hold").send()
    assert done.result(WAIT) is None
    assert service.wait_held(1)  # the response has not come yet
    service.release()


def test_send_to_a_port_nobody_listens_on_is_unavailable(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(UnavailableError):
        host.http("svc").get("/x").send().result(WAIT)


def test_a_pre_cancelled_token_sends_nothing(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    source = CancellationSource()
    source.cancel()
    client = host.http("svc")
    assert client.get("/echo").submit(source.token).cancelled()
    assert client.get("/echo").send(source.token).cancelled()
    with pytest.raises(CancelledError):
        client.get("/echo").submit_sync(source.token)
    assert client.get("/echo").submit_sync().status == 200
    assert service.hits["/echo"] == 1


@pytest.mark.parametrize("how", ["token", "handle"])
def test_a_later_cancel_aborts_the_request_and_the_server_sees_the_close(
    make_host: Callable[..., Host], service: LocalService, how: str
) -> None:
    service.raw_mode = "hold"
    host = make_host(service.raw_url)
    source = CancellationSource()
    completion = host.http("svc").get("/hold").submit(source.token)
    assert wait_until(lambda: service.raw_requests == 1)
    if how == "token":
        source.cancel()
    else:
        assert completion.cancel()
    with pytest.raises(CancelledError):
        completion.result(WAIT)
    assert service.raw_closed.wait(WAIT)


def test_a_cancel_ends_a_yield_in_a_handler_with_cancelled_error(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    service.raw_mode = "hold"
    source = CancellationSource()

    class Waiter(Spot):
        @handler
        async def fetch(self, ctx: SpotContext, msg: Fetch) -> str:
            try:
                await ctx.http("svc").get(msg.path).yield_(source.token)
            except CancelledError:
                return "cancelled"
            return "answered"

    host = make_host(service.raw_url, host_options={"spots": [Waiter]})
    host.spots.get_or_create("w", Waiter).submit_sync()
    reply = host.request_to_spot("w", Fetch("/hold"), reply=str).timeout(30).submit()
    assert wait_until(lambda: service.raw_requests == 1)
    source.cancel()
    assert reply.result(WAIT) == "cancelled"
    assert service.raw_closed.wait(WAIT)


def test_one_way_and_response_requests_share_the_clients_one_pool(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    host = make_host(service.url)
    client = host.http("svc")
    assert client.get("/peer").send().result(WAIT) is None
    # The one-way request's task drains the response, then ends.
    assert wait_until(lambda: host.statistics().io.tasks == 0)
    # Its connection went back to the pool: the next request reuses it.
    assert client.get("/peer").submit_sync().status == 200
    assert len(service.peers) == 2
    assert len(set(service.peers)) == 1


@pytest.mark.parametrize("code", [302, 307])
def test_a_one_way_request_follows_no_redirect_after_it_completed(
    make_host: Callable[..., Host], service: LocalService, code: int
) -> None:
    host = make_host(service.url, follow_redirects=3)
    call = host.http("svc").post(f"/redirect/{code}?to=/echo").json({"a": 1})
    assert call.send().result(WAIT) is None
    assert wait_until(lambda: host.statistics().io.tasks == 0)
    assert service.hits[f"/redirect/{code}"] == 1
    assert service.hits["/echo"] == 0


def test_a_one_way_request_discards_its_body_whatever_its_size(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    # A body far over the limit is read and dropped, not buffered up to the limit (and
    # then failed, which closed the connection): the connection goes back to the pool.
    host = make_host(service.url, max_response_body_size=1000)
    client = host.http("svc")
    assert client.get("/stream?n=400000").send().result(WAIT) is None
    assert wait_until(lambda: host.statistics().io.tasks == 0)
    assert client.get("/peer").submit_sync().status == 200
    assert len(service.peers) == 2
    assert len(set(service.peers)) == 1


def test_yield_releases_the_gate_of_an_instance_spot_too(
    make_host: Callable[..., Host], service: LocalService
) -> None:
    hits: list[int] = []

    class Match(InstanceSpot):
        @handler
        async def fetch(self, ctx: SpotContext, msg: Fetch) -> str:
            resp = await ctx.http("svc").get(msg.path).yield_()
            return f"{resp.status} after {len(hits)} pings"

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> int:
            hits.append(msg.n)
            return len(hits)

    host = make_host(service.url, host_options={"spots": [Match]})
    parked = host.request_to_spot("m", Fetch("/hold")).activate().timeout(30).submit()
    assert service.wait_held(1)
    assert host.request_to_spot("m", Ping(1), reply=int).submit_sync() == 1
    service.release()
    assert parked.result(WAIT) == "200 after 1 pings"
