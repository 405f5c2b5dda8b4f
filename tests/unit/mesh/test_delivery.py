"""`mesh/delivery.py`: the one-ways a node sends, from the send to the peer's
acknowledgement, driven through `Delivery`'s public methods on a real `transports`
pair: ours ("A", the sender) and the peer's ("B", which records what arrives and gives
credit back only when the test says so)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec
import pytest
from _pair import FAST, Side, node_shared, pair

import transports as t
from zlink_actors import ProtocolError, UnavailableError, UnavailableReason
from zlink_actors._core.completion import Completion
from zlink_actors._engine.objects import ObjectKind
from zlink_actors.mesh import codec as wire
from zlink_actors.mesh.config import PeerState
from zlink_actors.mesh.delivery import Delivery
from zlink_actors.mesh.peers import Peer
from zlink_actors.mesh.shared import Link, Route
from zlink_actors.testing import WAIT, HostHarness, wait_until

#: A small credit window: 16 one-ways of 256 B (the least one costs) before one parks.
_SMALL = t.TransportConfig(
    heartbeat_interval=0.1, heartbeat_timeout=5.0, credit_window=4096, min_charge=256
)
_ROOM = ("Spot", "room")


@dataclass
class _Sender:
    delivery: Delivery
    peer: Peer
    b: t.Transport
    theirs: Side
    #: What `fail_requests` was told: (peer, why, reason).
    failed: list[tuple[Peer, str, UnavailableReason]] = field(default_factory=list)

    def send(
        self, target: str, value: object, kind: ObjectKind = ObjectKind.SPOT
    ) -> Completion[None]:
        return self.delivery.send(Route(self.peer, kind, target), value, None, None)

    def arrived(self, count: int, command: int = wire.SEND) -> list[wire.Envelope]:
        """The first `count` records of `command` B received, in order (waited for)."""

        def found() -> list[wire.Envelope]:
            with self.theirs.changed:
                records = list(self.theirs.records)
            envs = [wire.decode_envelope(r.frames[0]) for r in records if r.frames]
            return [e for e in envs if e is not None and e.command == command]

        assert wait_until(lambda: len(found()) >= count), found()
        return found()[:count]

    def values(self, count: int) -> list[tuple[int, str, object]]:
        """(sequence number, target, value) of the first `count` one-ways B received, in
        the order they came (waited for)."""

        def found() -> list[tuple[int, str, object]]:
            with self.theirs.changed:
                records = [r for r in self.theirs.records if r.kind is t.InboundKind.MESSAGE]
            sends = []
            for rec in records:
                env = wire.decode_envelope(rec.frames[0])
                if env is not None and env.command == wire.SEND:
                    sends.append((env.route, env.target, msgspec.msgpack.decode(rec.frames[1])))
            return sends

        assert wait_until(lambda: len(found()) >= count), found()
        return found()[:count]

    def give_credit_back(self) -> None:
        """B gives back the credit of every record it received and has not released."""
        with self.theirs.changed:
            fresh = self.theirs.records[self._released :]
            self._released = len(self.theirs.records)
        charge = sum(r.charge for r in fresh)
        if charge:
            self.b.release(b"A", charge)

    #: How many of B's records had their credit given back (`give_credit_back`).
    _released: int = 0


@contextmanager
def _sender(harness: HostHarness, config: t.TransportConfig = FAST) -> Iterator[_Sender]:
    shared = node_shared(harness)
    failed: list[tuple[Peer, str, UnavailableReason]] = []
    delivery = Delivery(shared, Link(shared), lambda p, why, r: failed.append((p, why, r)))
    with pair(config) as (a, _, b, theirs):
        shared.attach(a)
        peer = Peer("b", "tcp://127.0.0.1:1", 1, b"B")
        yield _Sender(delivery, peer, b, theirs, failed)


def test_a_one_way_is_kept_until_the_peer_acknowledges_it(harness: HostHarness) -> None:
    with _sender(harness) as s:
        for i in range(3):
            assert s.send("room", i).done()
        assert [entry[0] for entry in s.peer.unacked] == [1, 2, 3]
        assert s.values(3) == [(1, "room", 0), (2, "room", 1), (3, "room", 2)]
        s.delivery.acked(s.peer, 2)
        assert [entry[0] for entry in s.peer.unacked] == [3]
        s.delivery.acked(s.peer, 1)  # an older ACK: nothing changes
        assert [entry[0] for entry in s.peer.unacked] == [3]
        assert s.peer.acked_out == 2


def test_a_payload_above_the_peer_s_limit_fails_and_nothing_is_sent(
    harness: HostHarness,
) -> None:
    with _sender(harness) as s:
        s.peer.max_message_size = 100
        sent = s.send("room", "x" * 500)
        with pytest.raises(ProtocolError, match="max_message_size"):
            sent.result(WAIT)
        with pytest.raises(ProtocolError):
            s.delivery.encode("x" * 500, s.peer)
        assert s.peer.out_seq == 0
        assert not s.peer.unacked


def test_a_full_target_holds_its_one_ways_and_open_n_sends_n_in_order(
    harness: HostHarness,
) -> None:
    with _sender(harness) as s:
        s.delivery.full(b"B", wire.Envelope(wire.FULL, target_kind="Spot", target="room"), s.peer)
        held = s.arrived(1, wire.HELD)[0]  # the peer is told HELD
        assert (held.target_kind, held.target) == _ROOM
        waiting = [s.send("room", i) for i in range(3)]
        assert not any(c.done() for c in waiting)
        assert s.send("other", "x").done()  # another target does not wait behind them
        s.delivery.open(s.peer, _ROOM, 2)
        assert [c.done() for c in waiting] == [True, True, False]
        s.arrived(1, wire.WAITING)  # one more waits: the peer is asked for the next OPEN
        s.delivery.open(s.peer, _ROOM, 5)
        assert waiting[2].result(WAIT) is None
        assert not s.peer.full_targets
        assert s.values(4) == [(1, "other", "x"), (2, "room", 0), (3, "room", 1), (4, "room", 2)]


def test_a_full_target_takes_back_what_the_transport_parked_for_it(harness: HostHarness) -> None:
    with _sender(harness, _SMALL) as s:
        sent = [s.send("room", i) for i in range(40)]  # B gives no credit back
        parked = [c for c in sent if not c.done()]
        assert parked, "nothing parked for credit"
        s.delivery.full(b"B", wire.Envelope(wire.FULL, target_kind="Spot", target="room"), s.peer)
        key_waits = s.peer.full_targets[_ROOM]
        assert len(key_waits) == len(parked)  # taken back: they wait here now, in order
        assert all(entry[2] is None for entry in s.peer.unacked)  # only completed ones
        s.give_credit_back()
        s.delivery.open(s.peer, _ROOM, len(parked))

        def all_done() -> bool:
            s.give_credit_back()  # as a receiver does, as they arrive
            return all(c.done() for c in sent)

        assert wait_until(all_done)
        assert all(c.result(WAIT) is None for c in sent)
        got = s.values(len(sent))
        assert [v for _, _, v in got] == list(range(len(sent)))  # in the order sent
        numbers = [seq for seq, _, _ in got]
        assert numbers == sorted(set(numbers))  # each new, rising


def test_fin_tells_the_last_number_and_ends_held_one_ways_draining(harness: HostHarness) -> None:
    with _sender(harness) as s:
        assert s.send("other", 1).done()
        s.delivery.full(b"B", wire.Envelope(wire.FULL, target_kind="Spot", target="room"), s.peer)
        held = s.send("room", 2)
        s.delivery.fin(s.peer)
        with pytest.raises(UnavailableError) as draining:
            held.result(WAIT)
        assert draining.value.reason is UnavailableReason.DRAINING
        assert s.arrived(1, wire.FIN)[0].route == 1  # the last number it was sent
        with pytest.raises(UnavailableError) as after:
            s.send("other", 3).result(WAIT)
        assert after.value.reason is UnavailableReason.DRAINING
        s.delivery.fin(s.peer)  # once
        assert len(s.arrived(1, wire.FIN)) == 1


def test_expiry_counts_the_completed_unacknowledged_ones_lost(harness: HostHarness) -> None:
    with _sender(harness) as s:
        for i in range(3):
            assert s.send("room", i).done()
        s.delivery.acked(s.peer, 1)
        s.delivery.full(b"B", wire.Envelope(wire.FULL, target_kind="Spot", target="other"), s.peer)
        waiting = s.send("other", 9)
        s.delivery.expire(s.peer, "left the mesh")
        assert s.delivery.dropped_after_admission == 2  # 2 and 3: completed, never acked
        assert s.delivery.dropped_by_peer == {"b": 2}
        assert s.failed == [(s.peer, "left the mesh", UnavailableReason.PEER_LOST)]
        with pytest.raises(UnavailableError) as lost:
            waiting.result(WAIT)
        assert lost.value.reason is UnavailableReason.PEER_LOST
        s.delivery.expire(s.peer, "again")  # once
        assert s.delivery.dropped_after_admission == 2
        assert len(s.failed) == 1
        # DROPPED: a running total of ours it never handled; what it adds is lost.
        s.delivery.dropped_there(s.peer, 3)
        assert s.delivery.dropped_by_peer == {"b": 5}
        s.delivery.dropped_there(s.peer, 3)  # told again (a replaced connection)
        s.delivery.dropped_there(s.peer, 0)
        assert s.delivery.dropped_by_peer == {"b": 5}
        s.delivery.dropped_there(s.peer, 4)
        assert s.delivery.dropped_after_admission == 6


def test_a_resume_sends_the_unacknowledged_again_in_order_then_the_held(
    harness: HostHarness,
) -> None:
    with _sender(harness) as s:
        for i in range(3):
            assert s.send("room", i).done()
        s.delivery.acked(s.peer, 1)
        s.delivery.full(b"B", wire.Envelope(wire.FULL, target_kind="Spot", target="other"), s.peer)
        held = s.send("other", "h")
        with s.peer.flow:
            resent, settles = s.delivery.resend(s.peer, b"B")
        assert resent == 2
        s.delivery.settle_sent(settles, s.peer)
        assert held.result(WAIT) is None
        got = s.values(6)
        assert got[3:] == [(2, "room", 1), (3, "room", 2), (4, "other", "h")]
        assert not s.peer.full_targets


def test_a_send_to_a_peer_that_cannot_take_it_fails_with_why(harness: HostHarness) -> None:
    with _sender(harness) as s:
        s.peer.fenced = True
        with pytest.raises(UnavailableError) as fenced:
            s.send("room", 1).result(WAIT)
        assert fenced.value.reason is UnavailableReason.FENCED
        assert s.send("b", 1, ObjectKind.NODE).done()  # its node handler still takes it
        s.peer.state = PeerState.LOST
        s.peer.lost_at = 1.0
        s.peer.lost_reason = UnavailableReason.PEER_PAUSED
        with pytest.raises(UnavailableError) as paused:
            s.send("b", 2, ObjectKind.NODE).result(WAIT)
        assert paused.value.reason is UnavailableReason.PEER_PAUSED
        s.peer.state = PeerState.READY
        s.peer.conn = b"nobody"  # a connection the transport does not know
        with pytest.raises(UnavailableError):
            s.send("b", 3, ObjectKind.NODE).result(WAIT)
        assert s.peer.out_seq == 1
