"""Reentrancy and sync terminators inside turns (digest §4 "Reentrancy", "Sync terminators").

No inline nesting: a turn-holding wait on yourself fails with `InvalidOperationError`
before submission; a one-way self-send is appended to the queue. Blocking terminators and
blocking observation of an unsettled `Completion` fail inside a handler and work from an
application thread.
"""

import threading
from collections.abc import Callable
from typing import Any

import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    ChannelContext,
    ChannelHandler,
    CompletionSource,
    InvalidOperationError,
    RequestCall,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hit, Note, Ping, Probe


class Counter:
    """Shared by a test's classes: what the handlers observed."""

    def __init__(self) -> None:
        self.hits = 0
        self.outcomes: list[str] = []


@pytest.mark.parametrize("kind", ["spot", "actor", "channel"])
def test_awaited_request_to_yourself_raises_invalid_operation_before_submission(
    harness: HostHarness, kind: str
) -> None:
    seen = Counter()

    def try_self_request(ctx: SpotContext | ActorContext | ChannelContext) -> str:
        if isinstance(ctx, SpotContext):
            builder = ctx.request_to_spot(ctx.spot_id, Hit())
        elif isinstance(ctx, ActorContext):
            builder = ctx.request_to_actor(ctx.actor_id, Hit())
        else:
            builder = ctx.request_to_channel(ctx.channel, Hit())
        try:
            builder.submit()
        except InvalidOperationError:
            return "refused"
        return "submitted"

    class SelfSpot(Spot):
        @handler
        async def start(self, ctx: SpotContext, msg: Ping) -> str:
            return try_self_request(ctx)

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            seen.hits += 1

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return seen.hits

    class SelfActor(Actor):
        @handler
        async def start(self, ctx: ActorContext, msg: Ping) -> str:
            return try_self_request(ctx)

        @handler
        def hit(self, ctx: ActorContext, msg: Hit) -> None:
            seen.hits += 1

        @handler
        def probe(self, ctx: ActorContext, msg: Probe) -> int:
            return seen.hits

    class SelfChannel(ChannelHandler):
        @handler
        async def start(self, ctx: ChannelContext, msg: Ping) -> str:
            return try_self_request(ctx)

        @handler
        def hit(self, ctx: ChannelContext, msg: Hit) -> None:
            seen.hits += 1

        @handler
        def probe(self, ctx: ChannelContext, msg: Probe) -> int:
            return seen.hits

    host = harness.host(spots=[SelfSpot], actors=[SelfActor], channels={"self": SelfChannel})
    request: Callable[..., RequestCall[Any]]
    if kind == "spot":
        host.spots.get_or_create("self", SelfSpot).submit_sync()
        request = host.request_to_spot
    elif kind == "actor":
        host.actors.get_or_create("self", SelfActor).submit_sync()
        request = host.request_to_actor
    else:
        request = host.request_to_channel

    assert request("self", Ping(), reply=str).submit_sync() == "refused"
    # FIFO probe: a Hit submitted by the handler would have been handled first.
    assert request("self", Probe(), reply=int).submit_sync() == 0


def test_request_to_your_own_spot_from_a_sync_handler_raises_invalid_operation(
    harness: HostHarness,
) -> None:
    seen = Counter()

    class Room(Spot):
        @handler
        def start(self, ctx: SpotContext, msg: Ping) -> str:
            try:
                ctx.request_to_spot(ctx.spot_id, Hit()).submit()
            except InvalidOperationError:
                return "refused"
            return "submitted"

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            seen.hits += 1

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return seen.hits

    host = harness.host(spots=[Room])
    host.spots.get_or_create("room", Room).submit_sync()

    assert host.request_to_spot("room", Ping(), reply=str).submit_sync() == "refused"
    assert host.request_to_spot("room", Probe(), reply=int).submit_sync() == 0


def test_self_send_is_admitted_at_once_and_handled_after_work_already_queued(
    harness: HostHarness,
) -> None:
    go = harness.latch()
    entered = threading.Event()
    finished = threading.Event()
    order: list[str] = []
    admitted: list[bool] = []

    class Room(Spot):
        @handler
        def start(self, ctx: SpotContext, msg: Ping) -> None:
            order.append("start")
            entered.set()
            go.wait(WAIT)
            sent = ctx.send_to_spot(ctx.spot_id, Note(2)).submit()
            admitted.append(sent.done() and sent.result() is None)
            order.append("start-end")
            finished.set()

        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            order.append(f"note{msg.n}")

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> list[str]:
            return list(order)

    host = harness.host(spots=[Room])
    host.spots.get_or_create("room", Room).submit_sync()
    host.send_to_spot("room", Ping()).submit_sync()
    assert entered.wait(WAIT)
    host.send_to_spot("room", Note(1)).submit_sync()
    go.set()
    assert finished.wait(WAIT)

    assert host.request_to_spot("room", Probe()).submit_sync() == [
        "start",
        "start-end",
        "note1",
        "note2",
    ]
    assert admitted == [True]


def test_submit_sync_inside_a_handler_raises_invalid_operation_and_submits_nothing(
    harness: HostHarness,
) -> None:
    seen = Counter()

    class Target(Spot):
        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            seen.hits += 1

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return seen.hits

    class Caller(Spot):
        @handler
        def start(self, ctx: SpotContext, msg: Ping) -> list[str]:
            outcomes = []
            for name, call in [
                ("send", ctx.send_to_spot("target", Hit())),
                ("request", ctx.request_to_spot("target", Hit())),
                ("cpu_worker", ctx.run_cpu_worker(int)),
            ]:
                try:
                    call.submit_sync()
                except InvalidOperationError:
                    outcomes.append(f"{name}: refused")
                else:
                    outcomes.append(f"{name}: returned")
            return outcomes

    host = harness.host(spots=[Target, Caller])
    host.spots.get_or_create("target", Target).submit_sync()
    host.spots.get_or_create("caller", Caller).submit_sync()

    assert host.request_to_spot("caller", Ping()).submit_sync() == [
        "send: refused",
        "request: refused",
        "cpu_worker: refused",
    ]
    # From the main thread the same terminator works (and nothing was sent before it).
    assert host.request_to_spot("target", Probe(), reply=int).submit_sync() == 0
    host.send_to_spot("target", Hit()).submit_sync()
    assert host.request_to_spot("target", Probe(), reply=int).submit_sync() == 1


def test_blocking_on_an_unsettled_completion_inside_a_handler_raises_invalid_operation(
    harness: HostHarness,
) -> None:
    unsettled: CompletionSource[int] = CompletionSource()
    settled: CompletionSource[int] = CompletionSource()
    settled.set_result(5)

    class Room(Spot):
        @handler
        def observe(self, ctx: SpotContext, msg: Ping) -> list[str]:
            outcomes = []
            for name, observe in [
                ("result", lambda: unsettled.completion.result(0.01)),
                ("wait", lambda: unsettled.completion.wait(0.01)),
                ("exception", lambda: unsettled.completion.exception(0.01)),
                ("settled result", lambda: settled.completion.result(0.01)),
            ]:
                try:
                    value = observe()
                except InvalidOperationError:
                    outcomes.append(f"{name}: refused")
                else:
                    outcomes.append(f"{name}: {value}")
            return outcomes

    host = harness.host(spots=[Room])
    host.spots.get_or_create("room", Room).submit_sync()

    assert host.request_to_spot("room", Ping()).submit_sync() == [
        "result: refused",
        "wait: refused",
        "exception: refused",
        "settled result: 5",
    ]
    assert not unsettled.done()
    # The same observations work from the main thread.
    assert unsettled.completion.wait(0.01) is False
    with pytest.raises(TimeoutError):
        unsettled.completion.result(0.01)
    unsettled.set_result(3)
    assert unsettled.completion.result(WAIT) == 3
