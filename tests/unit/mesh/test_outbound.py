"""`mesh/outbound.py`: the requests a node sends and the replies that come back, driven
through `Outbound`'s public methods on a real `transports` pair: ours ("A", the
caller's) and the peer's ("B", which records the requests and answers them when the
test says so). The replies A receives are handed to `receive_reply`, as the node's
dispatcher hands them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from _pair import FAST, Side, node_shared, pair

import transports as t
from zlink_actors import (
    CancelledError,
    DeadlineExceededError,
    NotFoundError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors._core.cancellation import CancellationSource
from zlink_actors._core.completion import Completion
from zlink_actors._engine.objects import ObjectKind
from zlink_actors.mesh import codec as wire
from zlink_actors.mesh.codec import Envelope
from zlink_actors.mesh.delivery import Delivery
from zlink_actors.mesh.outbound import Outbound
from zlink_actors.mesh.peers import Peer, PeerTable
from zlink_actors.mesh.shared import Link, NodeShared, Route
from zlink_actors.testing import WAIT, HostHarness, wait_until

_ROOM = (ObjectKind.SPOT, "room")


@dataclass
class _Routes:
    """A route cache of our own (`ObjectRoutes`): it only records what it is told to
    forget; every route it gives is local."""

    forgotten: list[object] = field(default_factory=list)

    def route(self, kind: ObjectKind, target: str) -> object:
        return None

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        raise AssertionError("no route of ours is sent along")

    def request(self, *args: object) -> Completion[Any]:
        raise AssertionError("no route of ours is sent along")

    def forget(self, key: object) -> None:
        self.forgotten.append(key)


@dataclass
class _Caller:
    outbound: Outbound
    shared: NodeShared
    link: Link
    peers: PeerTable
    peer: Peer
    ours: Side
    b: t.Transport
    theirs: Side
    routes: _Routes
    a: t.Transport

    def node_route(self) -> Route:
        return Route(self.peer, ObjectKind.NODE, "b")

    def request(
        self, route: Route | None = None, timeout: float = WAIT, **options: Any
    ) -> Completion[Any]:
        return self.outbound.request(
            route or self.node_route(), "ping", None, None, timeout, options.get("cancel")
        )

    def received(self, count: int) -> list[t.Inbound]:
        """The first `count` requests B received (waited for)."""

        def requests() -> list[t.Inbound]:
            with self.theirs.changed:
                return [r for r in self.theirs.records if r.kind is t.InboundKind.REQUEST]

        assert wait_until(lambda: len(requests()) >= count), requests()
        return requests()[:count]

    def reply(self, rec: t.Inbound, value: object = None, exc: BaseException | None = None) -> None:
        """B answers request `rec` with `value` (or `exc`)."""
        if exc is not None:
            frames = self.link.error_frames(exc)
        else:
            type_name, data = self.shared.codec.encode_payload(value)
            frames = [wire.encode_fields(wire.REPLY, type_name=type_name), data]
        self.b.reply(b"A", rec.route_id, frames)

    def deliver_reply(self, route_id: int, conn: bytes = b"B") -> None:
        """Hand A's reply `route_id` (from `conn`) to `receive_reply`, as the dispatcher."""
        rec = self.ours.first(
            lambda r: r.kind is t.InboundKind.REPLY and r.route_id == route_id and r.peer == conn
        )
        env = wire.decode_envelope(rec.frames[0])
        assert isinstance(env, Envelope)
        self.outbound.receive_reply(rec, env)


@contextmanager
def _caller(harness: HostHarness) -> Iterator[_Caller]:
    shared = node_shared(harness)
    link = Link(shared)
    peers = PeerTable()
    outbound: Outbound | None = None

    def fail_requests(peer: Peer, why: str, reason: UnavailableReason) -> None:
        assert outbound is not None
        outbound.fail_inflight(peer, why, reason)

    delivery = Delivery(shared, link, fail_requests)
    outbound = Outbound(shared, link, peers, delivery)
    routes = _Routes()
    outbound.route_objects(routes)
    with pair(FAST) as (a, ours, b, theirs):
        shared.attach(a)
        peer = Peer("b", "tcp://127.0.0.1:1", 1, b"B")
        peer.has_node_handler = True
        peers.add(peer)
        yield _Caller(outbound, shared, link, peers, peer, ours, b, theirs, routes, a)


def test_a_reply_ends_its_request_with_the_value(harness: HostHarness) -> None:
    with _caller(harness) as c:
        route = c.outbound.route(ObjectKind.NODE, "m\x00b")
        assert route == c.node_route()
        done = c.request()
        (rec,) = c.received(1)
        assert c.peer.inflight == {rec.route_id}
        c.reply(rec, 42)
        c.deliver_reply(rec.route_id)
        assert done.result(WAIT) == 42
        assert not c.peer.inflight
        assert c.outbound.late_replies == 0


def test_a_reply_to_a_request_that_ended_is_counted_late(harness: HostHarness) -> None:
    with _caller(harness) as c:
        done = c.request(timeout=0.05)
        (rec,) = c.received(1)
        with pytest.raises(DeadlineExceededError):
            done.result(WAIT)
        assert not c.peer.inflight  # it left the tables when it ended
        c.reply(rec, 42)
        c.deliver_reply(rec.route_id)
        assert c.outbound.late_replies == 1


def test_a_reply_from_another_peer_s_connection_is_not_taken(harness: HostHarness) -> None:
    with _caller(harness) as c:
        done = c.request()
        (rec,) = c.received(1)
        # Node C, connected to us too, answers the request it was never sent.
        other = Side()
        rogue = t.Transport(b"C", other.on_receive, on_event=other.on_event, config=FAST)
        try:
            c.a.connect(b"C", rogue.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
            with other.changed:
                assert other.changed.wait_for(
                    lambda: any(e.kind is t.PeerEventKind.READY for e in other.events), WAIT
                )
            rogue.reply(b"A", rec.route_id, [wire.encode_fields(wire.REPLY), b"\xc0"])
            c.deliver_reply(rec.route_id, conn=b"C")
        finally:
            rogue.close()
        assert not done.done()  # not its to answer
        assert c.link.decode_errors == 1
        assert c.outbound.late_replies == 0
        c.reply(rec, "pong")  # the peer's own reply still ends it
        c.deliver_reply(rec.route_id)
        assert done.result(WAIT) == "pong"


def test_a_stale_owner_s_unavailable_reply_drops_the_cached_route(harness: HostHarness) -> None:
    with _caller(harness) as c:
        stale = UnavailableError("not the owner", reason=UnavailableReason.NOT_OWNER)
        done = c.request(Route(c.peer, *_ROOM))
        (rec,) = c.received(1)
        c.reply(rec, exc=stale)
        c.deliver_reply(rec.route_id)
        with pytest.raises(UnavailableError) as raised:
            done.result(WAIT)
        assert raised.value.reason is UnavailableReason.NOT_OWNER
        assert c.routes.forgotten == [_ROOM]
        # A node's `UnavailableError` names no cached route: nothing is forgotten.
        done = c.request()
        rec = c.received(2)[1]
        c.reply(rec, exc=stale)
        c.deliver_reply(rec.route_id)
        with pytest.raises(UnavailableError):
            done.result(WAIT)
        assert c.routes.forgotten == [_ROOM]


def test_a_request_to_a_lost_peer_ends_peer_lost(harness: HostHarness) -> None:
    with _caller(harness) as c:
        in_flight = c.request()
        c.received(1)
        c.outbound.fail_inflight(c.peer, "lost: closed", UnavailableReason.PEER_LOST)
        with pytest.raises(UnavailableError, match="'b' lost: closed") as raised:
            in_flight.result(WAIT)
        assert raised.value.reason is UnavailableReason.PEER_LOST
        assert not c.peer.inflight
        c.peers.mark_lost(c.peer)
        later = c.request()
        with pytest.raises(UnavailableError) as raised:
            later.result(WAIT)
        assert raised.value.reason is UnavailableReason.PEER_LOST
        assert len(c.received(1)) == 1  # nothing more was sent
        # The route of a LOST node is refused before any request is made.
        refused = c.outbound.route(ObjectKind.NODE, "m\x00b")
        assert isinstance(refused, Completion)
        with pytest.raises(UnavailableError) as raised:
            refused.result(WAIT)
        assert raised.value.reason is UnavailableReason.PEER_LOST


def test_a_cancelled_request_is_told_to_the_peer(harness: HostHarness) -> None:
    with _caller(harness) as c:
        source = CancellationSource()
        done = c.request(cancel=source.token)
        (rec,) = c.received(1)
        source.cancel()
        with pytest.raises(CancelledError):
            done.result(WAIT)

        def told() -> bool:
            with c.theirs.changed:
                records = list(c.theirs.records)
            envs = [wire.decode_envelope(r.frames[0]) for r in records if r.frames]
            return any(e is not None and e.command == wire.CANCEL for e in envs)

        assert wait_until(told)
        assert rec.route_id not in c.peer.inflight


def test_calls_to_objects_go_to_the_registered_route_cache(harness: HostHarness) -> None:
    with _caller(harness) as c:
        assert c.outbound.route(ObjectKind.SPOT, "room") is None  # `_Routes`: local
        assert c.outbound.route(ObjectKind.NODE, "m\x00a") is not None  # our own: no handler
        unknown = c.outbound.route(ObjectKind.NODE, "m\x00z")
        assert isinstance(unknown, Completion)
        with pytest.raises(NotFoundError):
            unknown.result(WAIT)


def test_close_ends_every_request_in_flight(harness: HostHarness) -> None:
    with _caller(harness) as c:
        pending = [c.request() for _ in range(3)]
        c.received(3)
        c.outbound.fail_all()
        for done in pending:
            with pytest.raises(Exception, match="the call finished"):
                done.result(WAIT)


def test_an_undecodable_reply_ends_its_request_with_a_protocol_error(
    harness: HostHarness,
) -> None:
    with _caller(harness) as c:
        done = c.request()
        (rec,) = c.received(1)
        c.b.reply(b"A", rec.route_id, [b"\xc1 not an envelope"])
        bad = c.ours.first(lambda r: r.kind is t.InboundKind.REPLY and r.route_id == rec.route_id)
        c.outbound.bad_reply(bad, "undecodable")  # what the dispatcher does with it
        with pytest.raises(ProtocolError, match="an undecodable reply: undecodable"):
            done.result(WAIT)
        assert c.link.decode_errors == 1
        assert not c.peer.inflight
