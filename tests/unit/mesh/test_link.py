"""`mesh/shared.py`: a node's context (`NodeShared`) and its edge to the transport
(`Link`), each driven through its public methods on a real `transports.Transport` pair
(ours, "A", and a peer, "B", in this process over tcp loopback) and a real Host's
runtime, with an injected clock for the drop log."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest
from _pair import Side, linked, node_shared, pair

import transports as t
from zlink_actors import (
    NodeInfo,
    NotFoundError,
    ProtocolError,
    ShuttingDownError,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.mesh import codec as wire
from zlink_actors.mesh.codec import Codec
from zlink_actors.mesh.peers import Peer
from zlink_actors.mesh.shared import (
    ERROR_TEXT,
    Link,
    admission_error,
    gone_error,
    submit_error,
)
from zlink_actors.testing import WAIT, HostHarness, wait_until


def _request(b: t.Transport, ours: Side, route: int, payload: bytes = b"") -> t.Inbound:
    """B sends A a request; A's record of it."""
    b.submit_request(b"A", route, [wire.encode_fields(wire.REQUEST), payload])
    return ours.first(lambda r: r.kind is t.InboundKind.REQUEST and r.route_id == route)


def _reply(theirs: Side, route: int) -> wire.Envelope:
    rec = theirs.first(lambda r: r.kind is t.InboundKind.REPLY and r.route_id == route)
    env = wire.decode_envelope(rec.frames[0])
    assert env is not None
    return env


def _reply_error(theirs: Side, route: int) -> BaseException:
    """The error B's request `route` was answered with."""
    env = _reply(theirs, route)
    assert env.error_kind >= 0, "answered with a value"
    return Codec.decode_error(env.error_kind, env.error, env.reason)


def test_the_context_s_changing_fields_each_have_one_method(harness: HostHarness) -> None:
    shared = node_shared(harness, c=3)
    with shared.lock:
        assert not shared.begin_drain()  # not started: nothing to drain
        shared.set_weight("c", 7)
        with pytest.raises(NotFoundError):
            shared.set_weight("other", 1)
        assert shared.mark_closed()
        assert not shared.mark_closed()  # once
        shared.set_lease_state("fenced")
    assert shared.weights == {"c": 7}
    assert shared.closed
    assert shared.lease_state == "fenced"
    assert shared.generation > 0
    assert shared.node_key != ""
    with pair() as (a, _, _, _):
        shared.attach(a)
        with shared.lock:
            assert not shared.begin_drain()  # bound, but no info yet
        shared.attach(a, NodeInfo("m", "a", "tcp://127.0.0.1:1"))
        with shared.lock:
            assert shared.begin_drain()
            assert not shared.begin_drain()
        assert shared.draining


def test_a_reply_error_is_cut_at_the_limit_and_counted_by_its_reason(
    harness: HostHarness,
) -> None:
    with linked(harness) as (link, b, ours, theirs):
        rec = _request(b, ours, 11)
        too_long = UnavailableError("x" * (ERROR_TEXT + 500), reason=UnavailableReason.QUEUE_FULL)
        link.reply_error(rec.peer, rec.route_id, too_long)
        env = _reply(theirs, 11)
        assert env.error == "x" * ERROR_TEXT + " [...]"
        assert env.reason == "queue_full"
        exc = Codec.decode_error(env.error_kind, env.error, env.reason)
        assert isinstance(exc, UnavailableError)
        assert exc.reason is UnavailableReason.QUEUE_FULL
        rec = _request(b, ours, 12)
        link.reply_error(rec.peer, rec.route_id, ProtocolError("short"))  # no reason
        assert _reply(theirs, 12).error == "short"
    assert link.unavailable == {"queue_full": 1}


def test_a_reply_too_large_becomes_a_protocol_error_reply(harness: HostHarness) -> None:
    small = t.TransportConfig(
        heartbeat_interval=0.1, heartbeat_timeout=5.0, max_message_size=4096, min_charge=256
    )
    with linked(harness, small) as (link, b, ours, theirs):
        rec = _request(b, ours, 21)
        link.reply_value(rec.peer, rec.route_id, "y" * 10_000)  # 10 KB over a 4 KB limit
        exc = _reply_error(theirs, 21)
        assert isinstance(exc, ProtocolError)
        assert "the reply could not be sent" in str(exc)
        rec = _request(b, ours, 22)
        link.reply_value(rec.peer, rec.route_id, "fits")
        assert _reply(theirs, 22).error_kind < 0  # a value


def test_a_bad_request_is_counted_answered_and_its_credit_given_back(
    harness: HostHarness,
) -> None:
    with linked(harness) as (link, b, ours, theirs):
        rec = _request(b, ours, 31, b"z" * 4000)
        assert rec.charge > 0
        assert b.statistics().credit_in_use >= rec.charge
        link.bad(rec, "an unknown command 99")
        exc = _reply_error(theirs, 31)
        assert isinstance(exc, ProtocolError)
        assert str(exc) == "an unknown command 99"
        assert wait_until(lambda: b.statistics().credit_in_use == 0)
    assert link.decode_errors == 1


def test_credit_and_notices_go_back_quietly_also_once_the_peer_is_gone(
    harness: HostHarness,
) -> None:
    Link(node_shared(harness)).notify(b"B", wire.encode_fields(wire.ACK), b"")  # no transport
    with linked(harness) as (link, b, ours, theirs):
        b.submit(b"A", [wire.encode_fields(wire.SEND, route=1), b"p" * 3000])
        rec = ours.first(lambda r: r.kind is t.InboundKind.MESSAGE)
        assert b.statistics().credit_in_use > 0
        link.release(rec)
        assert wait_until(lambda: b.statistics().credit_in_use == 0)
        link.notify(b"B", wire.encode_fields(wire.ACK, route=5), b"")
        notice = theirs.first(lambda r: r.kind is t.InboundKind.NOTICE)
        env = wire.decode_envelope(notice.frames[0])
        assert env is not None
        assert (env.command, env.route) == (wire.ACK, 5)
        # To a connection that is not there: nothing is raised, nothing is sent.
        link.notify(b"nobody", wire.encode_fields(wire.ACK, route=6), b"")
        link.give_back(b"nobody", 100)
        link.reply_frames(b"nobody", 1, [b"x"])
        link.disconnect(b"nobody")
    # Closed: still nothing raised.
    link.notify(b"B", wire.encode_fields(wire.ACK, route=7), b"")
    link.reply_error(b"B", 1, ProtocolError("late"))
    link.release(rec)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_drop_log_is_rate_limited_and_its_held_count_swept_later(
    harness: HostHarness, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _Clock()
    link = Link(node_shared(harness), clock=clock)
    caplog.set_level(logging.WARNING, logger="zlink_actors.mesh")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "a bad record" in r.getMessage()]

    for _ in range(3):
        link.warn_dropped("bad", b"B", "why", "mesh %s: a bad record from %r", b"B")
    assert len(lines()) == 1  # the first; the other two are counted
    link.warn_dropped("bad", b"C", "why", "mesh %s: a bad record from %r", b"C")
    assert len(lines()) == 2  # another peer: its own window
    # The window ends (on the log's clock); nothing else is dropped: the sweep the held
    # lines scheduled on the I/O loop (a little over a second later) logs their count.
    clock.now += 1.0
    assert wait_until(lambda: len(lines()) == 3, WAIT)
    assert "2" in lines()[-1]
    assert lines()[-1].count("B") >= 1


def test_transport_refusals_of_a_submit_map_to_typed_errors(harness: HostHarness) -> None:
    peer = Peer("b", "tcp://127.0.0.1:1", 1, b"nobody")
    small = t.TransportConfig(heartbeat_interval=0.1, heartbeat_timeout=5.0, max_message_size=1024)
    with pair(small) as (a, _, _, _):
        for frames, conn, expected in (
            ([b"e", b"x"], b"nobody", UnavailableError),
            ([b"e", b"x" * 4096], b"B", ProtocolError),
        ):
            with pytest.raises((t.UnknownPeer, t.PayloadTooLarge)) as refused:
                a.submit(conn, frames)
            assert isinstance(refused.value, t.TransportError)
            error = submit_error(refused.value, peer, 60.0)
            assert type(error) is expected
    with pytest.raises(t.Closed) as closed:
        a.submit(b"B", [b"e", b"x"])
    assert isinstance(submit_error(closed.value, peer, 60.0), ShuttingDownError)
    peer.state = peer.state.LOST
    peer.lost_reason = UnavailableReason.PEER_PAUSED
    peer.lost_at = 1.0  # it was READY once
    paused = gone_error(peer, 60.0)
    assert paused.reason is UnavailableReason.PEER_PAUSED
    assert "60 s" in str(paused)


def test_a_failed_admission_says_why_the_call_ends() -> None:
    peer = Peer("b", "tcp://127.0.0.1:1", 1, b"B")
    silent = t.PeerLost("lost")
    silent.silent = True
    cases: list[tuple[BaseException | None, object]] = [
        (None, None),
        (t.Closed("closed"), ShuttingDownError),
        (silent, UnavailableReason.PEER_PAUSED),
        (t.PeerLost("lost"), UnavailableReason.PEER_LOST),
        (NotFoundError("as is"), NotFoundError),  # the node's own: as it is
    ]
    for exc, expected in cases:
        done: Future[None] = Future()
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)
        error = admission_error(done, peer)
        if expected is None:
            assert error is None
        elif isinstance(expected, UnavailableReason):
            assert isinstance(error, UnavailableError)
            assert error.reason is expected
        else:
            assert type(error) is expected
