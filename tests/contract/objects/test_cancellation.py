"""Cancellation of object-model calls (CS §1-3, §6; digest §9 Tier 1 "Cancellation").

A token that is already cancelled completes a valid call as cancelled without admitting
anything. Cancelling an accepted one-way send changes nothing: it is still delivered.
Cancelling a request after admission ends only the caller's wait: the handler still runs.
"""

import threading
from collections.abc import Callable
from typing import Any

import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    CancellationSource,
    CancelledError,
    Completion,
    Created,
    Host,
    InstanceSpot,
    NotFoundError,
    Spot,
    SpotConfig,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hit, Hold, Marker, News, Ping, Probe


class Target:
    """A Spot "t" and an Actor "a" that count what reaches them."""

    def __init__(self, harness: HostHarness) -> None:
        self.hooked: list[str] = []
        self.handled: list[str] = []
        self.entered = threading.Event()
        self.finished = threading.Event()
        self.pinged = threading.Event()
        self.marked = threading.Event()
        self.latch = harness.latch()
        target = self

        class Counted(Spot):
            def configure(self, cfg: SpotConfig) -> None:
                cfg.subscribe("news", "all")

            def on_create(self, ctx: SpotContext, request: object) -> None:
                target.hooked.append(ctx.spot_id)

            @handler
            def hit(self, ctx: SpotContext, msg: Hit) -> None:
                target.handled.append(f"hit {msg.n}")

            @handler
            def ping(self, ctx: SpotContext, msg: Ping) -> int:
                target.handled.append(f"ping {msg.n}")
                target.pinged.set()
                return msg.n

            @handler
            def news(self, ctx: SpotContext, msg: News) -> None:
                target.handled.append(f"news {msg.text}")

            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> str:
                target.entered.set()
                assert target.latch.wait(WAIT)
                target.handled.append("hold")
                target.finished.set()
                return "held"

            @handler
            def probe(self, ctx: SpotContext, msg: Probe) -> list[str]:
                return list(target.handled)

        class Marked(Spot):
            def configure(self, cfg: SpotConfig) -> None:
                cfg.subscribe("marker", "all")

            @handler
            def marker(self, ctx: SpotContext, msg: Marker) -> None:
                target.marked.set()

        class Counter(Actor):
            def on_create(self, ctx: ActorContext, request: object) -> None:
                target.hooked.append(ctx.actor_id)

        class Cold(InstanceSpot):
            def __init__(self) -> None:
                super().__init__()
                target.hooked.append("instance")

            @handler
            def hit(self, ctx: SpotContext, msg: Hit) -> int:
                return msg.n

        self.spot_type = Counted
        self.actor_type = Counter
        # One publish slot: a later publish commits only after earlier ones delivered.
        self.host = harness.host(
            spots=[Counted, Marked, Cold], actors=[Counter], publish_concurrency=1
        )
        self.host.spots.get_or_create("t", Counted).submit_sync()
        self.host.spots.get_or_create("marked", Marked).submit_sync()
        self.hooked.clear()

    def handled_so_far(self) -> list[str]:
        """Everything "t" handled before now (a FIFO probe)."""
        result: list[str] = self.host.request_to_spot("t", Probe()).submit_sync()
        return result


def _pre_cancelled_call(target: Target, op: str) -> Callable[[Any], Completion[Any]]:
    host: Host = target.host
    calls: dict[str, Callable[[Any], Completion[Any]]] = {
        "send": lambda token: host.send_to_spot("t", Hit(1)).submit(cancel=token),
        "request": lambda token: host.request_to_spot("t", Ping(1)).submit(cancel=token),
        "send_activate": lambda token: (
            host.send_to_spot("new", Hit(1)).activate().submit(cancel=token)
        ),
        "request_activate": lambda token: (
            host.request_to_spot("new", Hit(1)).activate().submit(cancel=token)
        ),
        "publish": lambda token: host.publish("news", "all", News("x")).submit(cancel=token),
        "spot_create": lambda token: host.spots.get_or_create("new", target.spot_type).submit(
            cancel=token
        ),
        "actor_create": lambda token: host.actors.create("new", target.actor_type).submit(
            cancel=token
        ),
    }
    return calls[op]


@pytest.mark.parametrize(
    "op",
    [
        "send",
        "request",
        "send_activate",
        "request_activate",
        "publish",
        "spot_create",
        "actor_create",
    ],
)
def test_a_pre_cancelled_token_completes_the_call_cancelled_and_admits_nothing(
    harness: HostHarness, op: str
) -> None:
    target = Target(harness)
    host = target.host
    source = CancellationSource()
    source.cancel()

    completion = _pre_cancelled_call(target, op)(source.token)

    assert completion.done()
    assert completion.cancelled()
    with pytest.raises(CancelledError):
        completion.result(WAIT)
    # Nothing was admitted: no handler ran, no creation hook ran, no id was taken.
    if op == "publish":
        assert host.publish("marker", "all", Marker()).submit_sync() is None
        assert target.marked.wait(WAIT)
    assert target.handled_so_far() == []
    assert target.hooked == []
    if op in ("send_activate", "request_activate"):
        with pytest.raises(NotFoundError):  # no intent: an existing instance would answer
            host.request_to_spot("new", Hit(2)).submit_sync()
    if op == "spot_create":
        with pytest.raises(NotFoundError):
            host.request_to_spot("new", Probe()).submit_sync()
        assert type(host.spots.get_or_create("new", target.spot_type).submit_sync()) is Created
        assert target.hooked == ["new"]
    if op == "actor_create":
        assert type(host.actors.create("new", target.actor_type).submit_sync()) is Created
        assert target.hooked == ["new"]


@pytest.mark.parametrize("op", ["send", "request", "publish", "spot_create", "actor_create"])
def test_submit_sync_with_a_pre_cancelled_token_raises_cancelled_and_admits_nothing(
    harness: HostHarness, op: str
) -> None:
    target = Target(harness)
    host = target.host
    source = CancellationSource()
    source.cancel()
    builders: dict[str, Callable[[], Any]] = {
        "send": lambda: host.send_to_spot("t", Hit(1)),
        "request": lambda: host.request_to_spot("t", Ping(1)),
        "publish": lambda: host.publish("news", "all", News("x")),
        "spot_create": lambda: host.spots.get_or_create("new", target.spot_type),
        "actor_create": lambda: host.actors.create("new", target.actor_type),
    }

    with pytest.raises(CancelledError):
        builders[op]().submit_sync(cancel=source.token)

    if op == "publish":
        assert host.publish("marker", "all", Marker()).submit_sync() is None
        assert target.marked.wait(WAIT)
    assert target.handled_so_far() == []
    assert target.hooked == []


def test_cancelling_an_accepted_one_way_send_changes_nothing_and_it_is_still_delivered(
    harness: HostHarness,
) -> None:
    target = Target(harness)
    host = target.host
    held = host.request_to_spot("t", Hold()).submit()
    assert target.entered.wait(WAIT)
    source = CancellationSource()

    sent = host.send_to_spot("t", Hit(7)).submit(cancel=source.token)
    assert sent.result(WAIT) is None  # admitted behind the held handler
    source.cancel()
    assert sent.cancel() is False

    assert not sent.cancelled()
    assert sent.result(WAIT) is None
    target.latch.set()
    assert held.result(WAIT) == "held"
    assert target.handled_so_far() == ["hold", "hit 7"]


@pytest.mark.parametrize("how", ["completion", "token"])
@pytest.mark.parametrize("stage", ["queued", "running"])
def test_cancelling_a_request_after_admission_ends_only_the_callers_wait(
    harness: HostHarness, stage: str, how: str
) -> None:
    target = Target(harness)
    host = target.host
    source = CancellationSource()
    if stage == "running":
        request = host.request_to_spot("t", Hold()).submit(cancel=source.token)
        assert target.entered.wait(WAIT)
        ran = target.finished
    else:
        blocker = host.request_to_spot("t", Hold()).submit()
        assert target.entered.wait(WAIT)
        request = host.request_to_spot("t", Ping(5)).submit(cancel=source.token)
        ran = target.pinged
    assert not request.done()

    if how == "completion":
        assert request.cancel() is True
    else:
        source.cancel()

    assert request.cancelled()
    with pytest.raises(CancelledError):
        request.result(WAIT)
    assert not ran.is_set()
    target.latch.set()
    if stage == "queued":
        # Cancelled while queued: terminal before its turn, so its handler never runs.
        assert blocker.result(WAIT) == "held"
        assert host.request_to_spot("t", Ping(6)).submit_sync() == 6
        assert target.handled_so_far() == ["hold", "ping 6"]
    else:
        assert ran.wait(WAIT)  # the running handler finished; its late reply went nowhere
        assert target.handled_so_far() == ["hold"]
    with pytest.raises(CancelledError):
        request.result(WAIT)
