"""The remote SPI (`_engine/remote.py`): a call that finds no local target asks the Host's
routes, after the same admission and cancellation checks as a local call, and a Host
without a mesh (`LOCAL_ONLY`) keeps `NotFoundError`.

The routes here are the test's own implementation of the framework's protocol (what the
RouteMesh tier will plug in), not a stand-in for any library.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    Completion,
    CompletionSource,
    NotFoundError,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors._engine.objects import ObjectKind
from zlink_actors._engine.remote import LOCAL_ONLY
from zlink_actors.testing import WAIT, HostHarness


class Ping(msgspec.Struct, frozen=True):
    n: int


class Here(Spot):
    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        return msg.n


class Routes:
    """Routes every Spot id starting with "far-" (a route is the pair (kind, id)); records
    what it was asked and handed."""

    first: frozenset[ObjectKind] = frozenset()

    def __init__(self) -> None:
        self.sent: list[tuple[ObjectKind, str, object, dict[str, object] | None]] = []
        self.asked: list[tuple[str, object, float, bool]] = []
        self.routed: list[tuple[ObjectKind, str]] = []

    def route(self, kind: ObjectKind, target: str) -> object:
        self.routed.append((kind, target))
        if kind is ObjectKind.SPOT and target.startswith("far-"):
            return (kind, target)
        return None

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        kind, target = route  # type: ignore[misc]
        self.sent.append((kind, target, payload, metadata))
        source: CompletionSource[None] = CompletionSource()
        source.set_result(None)
        return source.completion

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: object,
    ) -> Completion[Any]:
        _, target = route  # type: ignore[misc]
        self.asked.append((target, payload, timeout, cancel is not None))
        source: CompletionSource[Any] = CompletionSource()
        source.set_result(("answered by", target))
        return source.completion


def test_a_host_without_a_mesh_routes_nothing_away(harness: HostHarness) -> None:
    host = harness.host(spots=[Here])
    assert host._runtime.remote is LOCAL_ONLY
    with pytest.raises(NotFoundError):
        host.request_to_spot("far-1", Ping(1)).submit_sync()


def test_calls_to_a_target_the_routes_hold_are_handed_to_them(harness: HostHarness) -> None:
    host = harness.host(spots=[Here], default_request_timeout=7.0)
    routes = Routes()
    host._runtime.remote = routes
    host.spots.get_or_create("near", Here).submit_sync()

    assert host.request_to_spot("far-1", Ping(1)).submit_sync() == ("answered by", "far-1")
    assert host.request_to_spot("far-2", Ping(2)).timeout(2.5).submit().result(WAIT) == (
        "answered by",
        "far-2",
    )
    host.send_to_spot("far-3", Ping(3)).metadata("k", "v").submit_sync()
    # A local target never reaches the routes; an id they do not hold is NotFoundError.
    assert host.request_to_spot("near", Ping(4)).submit_sync() == 4
    with pytest.raises(NotFoundError):
        host.request_to_spot("nowhere", Ping(5)).submit_sync()

    assert routes.asked == [("far-1", Ping(1), 7.0, False), ("far-2", Ping(2), 2.5, False)]
    assert routes.sent == [(ObjectKind.SPOT, "far-3", Ping(3), {"k": "v"})]
    # Asked once per call, and only when no local target exists (Spots are not `first`).
    assert (ObjectKind.SPOT, "near") not in routes.routed
    assert routes.routed.count((ObjectKind.SPOT, "far-1")) == 1


def test_kinds_in_first_are_routed_before_the_local_table(harness: HostHarness) -> None:
    host = harness.host(spots=[Here])
    routes = Routes()
    routes.first = frozenset({ObjectKind.SPOT})
    host._runtime.remote = routes
    host.spots.get_or_create("near", Here).submit_sync()

    # The routes answer None: the call stays local, and they are not asked again.
    assert host.request_to_spot("near", Ping(4)).submit_sync() == 4
    assert routes.routed == [(ObjectKind.SPOT, "near")]
    with pytest.raises(NotFoundError):
        host.request_to_spot("nowhere", Ping(5)).submit_sync()
    assert routes.routed == [(ObjectKind.SPOT, "near"), (ObjectKind.SPOT, "nowhere")]


def test_a_route_answering_a_failed_completion_ends_the_call_with_it(
    harness: HostHarness,
) -> None:
    host = harness.host(spots=[Here])
    with pytest.raises(NotFoundError, match="this Host has no mesh"):
        host.request_to_node("game", "node-1", Ping(1)).submit_sync()
    with pytest.raises(NotFoundError, match="this Host has no mesh"):
        host.send_to_node("game", "node-1", Ping(1)).submit_sync()


def test_a_cancelled_call_never_reaches_the_routes(harness: HostHarness) -> None:
    host = harness.host(spots=[Here])
    routes = Routes()
    host._runtime.remote = routes
    source = CancellationSource()
    source.cancel()

    with pytest.raises(CancelledError):
        host.request_to_spot("far-1", Ping(1)).submit_sync(source.token)
    with pytest.raises(CancelledError):
        host.send_to_spot("far-1", Ping(1)).submit_sync(source.token)

    assert routes.asked == []
    assert routes.sent == []
