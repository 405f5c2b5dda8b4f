"""A one-way its target's node acknowledged and never handled is told to its sender
(issue 26; docs/mesh.md "What a one-way that completed at its sender may still lose").

Its sender saw it complete at admission; the node that received it lived on and lost it
(its target closed with the one-way still queued, or refused it). That node counts it in
`dropped_messages` and tells the sender (a DROPPED notice), which counts it in
`dropped_after_admission` / `dropped_by_peer`. Real Hosts sharing one
`MemoryLocationStore` (`_global.GlobalMesh`) on tcp loopback; every wait is bounded and
asserted.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from zlink_actors import Completion, Host, PeerState
from zlink_actors.testing import WAIT, wait_until

from ._global import GlobalMesh, mesh_stats
from ._global_objects import Hold, Note, Room, journal

QUEUED = 3


def _queued(host: Host, n: int) -> bool:
    return host.statistics().queued_records == n


def test_one_ways_queued_when_their_target_closes_are_counted_by_their_sender(
    mesh: GlobalMesh,
) -> None:
    """Three one-ways wait in a Room's queue behind a held turn; the Room is closed. They
    never run: before, only the owner counted them (`dropped_records`) and the sender
    counted nothing."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()
    owner.spots.get_or_create("q", Room).submit_sync()
    client.send_to_spot("q", Hold("q")).submit_sync()
    assert wait_until(lambda: ("q", "q") in journal().items("entered"))
    for n in range(QUEUED):
        assert client.send_to_spot("q", Note(n)).submit_sync() is None
    assert wait_until(lambda: _queued(owner, QUEUED)), owner.statistics().queued_records

    closing: Completion[bool] = owner.spots.close("q").submit()
    # Its `on_closing` is queued too (ahead of the one-ways, in the lifecycle lane).
    assert wait_until(lambda: _queued(owner, QUEUED + 1)), owner.statistics().queued_records
    journal().latch("q").set()  # the held turn returns; the close drops the queue
    assert closing.result(WAIT) is True
    assert journal().items("note") == []
    assert owner.statistics().dropped_records == QUEUED
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == QUEUED)
    assert mesh_stats(client).dropped_by_peer == {owner.node.routing_id: QUEUED}
    assert mesh_stats(owner).dropped_messages == QUEUED


def test_a_one_way_that_reaches_its_target_as_it_closes_is_counted_by_its_sender(
    mesh: GlobalMesh,
) -> None:
    """The Room is closing (its held turn runs, its close waits for it) when a one-way
    reaches it: refused there, lost after its sender saw it complete. Before, the owner
    counted it and the sender did not."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()
    owner.spots.get_or_create("c", Room).submit_sync()
    client.send_to_spot("c", Hold("c")).submit_sync()
    assert wait_until(lambda: ("c", "c") in journal().items("entered"))
    closing: Completion[bool] = owner.spots.close("c").submit()
    # Its `on_closing` is queued behind the held turn: the Room admits nothing more.
    assert wait_until(lambda: _queued(owner, 1)), owner.statistics().queued_records
    assert client.send_to_spot("c", Note(7)).submit_sync() is None
    assert wait_until(lambda: mesh_stats(owner).dropped_messages == 1)
    assert owner.statistics().dropped_records == 0  # refused, not queued
    journal().latch("c").set()
    assert closing.result(WAIT) is True
    assert journal().items("note") == []
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 1)
    assert mesh_stats(client).dropped_by_peer == {owner.node.routing_id: 1}


def _lose_one(owner: Host, client: Host, spot_id: str) -> None:
    """One one-way from `client` that reaches `spot_id` on `owner` as it closes."""
    owner.spots.get_or_create(spot_id, Room).submit_sync()
    client.send_to_spot(spot_id, Hold(spot_id)).submit_sync()
    assert wait_until(lambda: (spot_id, spot_id) in journal().items("entered"))
    closing: Completion[bool] = owner.spots.close(spot_id).submit()
    assert wait_until(lambda: _queued(owner, 1)), owner.statistics().queued_records
    assert client.send_to_spot(spot_id, Note(0)).submit_sync() is None
    journal().latch(spot_id).set()
    assert closing.result(WAIT) is True


def test_a_dropped_total_told_again_on_a_new_connection_counts_nothing_twice(
    mesh: GlobalMesh,
) -> None:
    """DROPPED carries a running total: the receiver tells it again after a resume (the
    notice may have been lost with the old connection), and the sender counts only
    what a total adds. Before, each notice was added."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()
    _lose_one(owner, client, "a")
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 1)
    peer = owner._node()._peers.by_rid[client.node.routing_id]  # the owner's view of it
    peer.dropped_told = 0  # as a resume leaves it: the total may not have been heard
    assert wait_until(lambda: peer.dropped_told == 1)  # the ticker told it again
    _lose_one(owner, client, "b")  # total 2, on the same connection, after the resend
    assert wait_until(lambda: mesh_stats(owner).dropped_messages == 2)
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission >= 2)
    assert mesh_stats(client).dropped_after_admission == 2
    assert mesh_stats(client).dropped_by_peer == {owner.node.routing_id: 2}


def test_a_dropped_total_told_before_the_admit_of_a_resumed_connection_is_counted(
    mesh: GlobalMesh,
) -> None:
    """The client's connection to the owner is replaced (the client dials again, the same
    lifecycle on both sides: a resume). The owner resumes on the new connection as the
    HELLO comes and answers ADMIT after that; a one-way it loses at that moment (in the
    chaos run: one held while fenced whose target moved, handed on as it resumed) is
    told at once, so the DROPPED notice leaves before the ADMIT and reaches the client
    while its dial has not finished. Before, the client ignored it (a notice from a
    connection with no peer) and the owner, having told that total on the peer's
    connection, never told it again: counted by the owner, never by its sender."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()  # it dials the owner (`GlobalMesh.add`)
    _lose_one(owner, client, "a")
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 1)
    node = owner._node()
    rid = client.node.routing_id
    resumed = threading.Event()
    real_admit = node._admit

    def admit(conn: bytes, hello: Any, clock: Any = None) -> Any:
        peer = real_admit(conn, hello, clock)
        if hello.routing_id == rid and not resumed.is_set():
            resumed.set()
            # On the I/O thread, before `_receive_hello` answers ADMIT: told at once.
            node._lost_here(peer, "lost as its sender resumed (the test)")
        return peer

    node._admit = admit  # type: ignore[method-assign]
    dialler = client._node()
    before = dialler._peers.by_rid[owner.node.routing_id]
    assert dialler.shared.transport is not None
    dialler.shared.transport.disconnect(before.conn)  # the client's connection is gone
    assert wait_until(lambda: before.state is PeerState.LOST)
    client.connect_peer(owner.node.endpoint).result(WAIT)  # the same lifecycle: resumed
    assert resumed.wait(WAIT)
    assert dialler._peers.by_rid[owner.node.routing_id] is before  # resumed, not replaced
    assert wait_until(lambda: mesh_stats(owner).dropped_messages == 2)
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 2)
    assert mesh_stats(client).dropped_by_peer == {owner.node.routing_id: 2}


def test_an_ack_told_before_the_admit_of_a_resumed_connection_frees_what_it_covers(
    mesh: GlobalMesh,
) -> None:
    """The same window with an ACK: the owner acknowledges the client's one-ways (the
    ticker, every 50 ms) after it resumed on the new connection and before its ADMIT
    left. Before, the client ignored that ACK and the owner, having acknowledged that
    number, never acknowledged it again: the client kept the one-ways as unacknowledged
    (sent again at the next pause, counted lost if the owner then died)."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()  # it dials the owner (`GlobalMesh.add`)
    owner.spots.get_or_create("r", Room).submit_sync()
    node = owner._node()
    rid = client.node.routing_id
    holding = threading.Event()  # the owner's ACKs to the client wait while set
    holding.set()
    real_ack = node._ack

    def ack(peer: Any) -> None:
        if not (holding.is_set() and peer.routing_id == rid):
            real_ack(peer)

    resumed = threading.Event()
    real_admit = node._admit

    def admit(conn: bytes, hello: Any, clock: Any = None) -> Any:
        peer = real_admit(conn, hello, clock)
        if hello.routing_id == rid and not resumed.is_set():
            resumed.set()
            holding.clear()
            real_ack(peer)  # the ticker's ACK, before `_receive_hello` answers ADMIT
        return peer

    node._ack = ack  # type: ignore[method-assign]
    node._admit = admit  # type: ignore[method-assign]
    for n in range(3):
        assert client.send_to_spot("r", Note(n)).submit_sync() is None
    assert wait_until(lambda: len(journal().items("note")) == 3)
    dialler = client._node()
    before = dialler._peers.by_rid[owner.node.routing_id]
    assert len(before.unacked) == 3  # reached the owner, not acknowledged yet
    assert dialler.shared.transport is not None
    dialler.shared.transport.disconnect(before.conn)
    assert wait_until(lambda: before.state is PeerState.LOST)
    client.connect_peer(owner.node.endpoint).result(WAIT)  # the same lifecycle: resumed
    assert resumed.wait(WAIT)
    assert dialler._peers.by_rid[owner.node.routing_id] is before  # resumed, not replaced
    assert wait_until(lambda: not before.unacked), list(before.unacked)
    assert before.acked_out == 3
    assert len(journal().items("note")) == 3  # the three sent again were not run twice
    assert mesh_stats(client).dropped_after_admission == 0


def _losing(delivery: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """While the returned event is set, `delivery` (a node's `Delivery`) ignores what its
    method `name` (`acked`, `dropped_there`) would apply: a notice lost on its way, with
    the connection it came on. The other nodes' are untouched."""
    losing = threading.Event()
    losing.set()
    cls = type(delivery)
    real = getattr(cls, name)

    def apply(self: Any, peer: Any, number: int) -> None:
        if not (self is delivery and losing.is_set()):
            real(self, peer, number)

    monkeypatch.setattr(cls, name, apply)
    return losing


def _dial_again(client: Host, owner: Host) -> Any:
    """The client's connection to the owner closes, and the client dials again: the same
    lifecycle on both sides, a resume (the client's view of the owner is returned)."""
    dialler = client._node()
    before = dialler._peers.by_rid[owner.node.routing_id]
    assert dialler.shared.transport is not None
    dialler.shared.transport.disconnect(before.conn)
    assert wait_until(lambda: before.state is PeerState.LOST)
    return before


def test_an_ack_lost_with_its_connection_is_told_again_when_the_peer_resumes(
    mesh: GlobalMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's ACK of the client's one-ways is lost on its way (with the connection,
    which closes: a pause, a partition). The client dials again and both resume; the
    owner's connection keeps its name (the dialling node's lifecycle), so its ACK was
    not told again and the client kept those one-ways as unacknowledged (sent again at
    the next pause, counted lost if the owner then died). Now each side tells its ACK
    and DROPPED totals again when a peer resumes: they are running totals, so a total
    heard twice counts once."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()  # it dials the owner (`GlobalMesh.add`)
    owner.spots.get_or_create("r", Room).submit_sync()
    seen = owner._node()._peers.by_rid[client.node.routing_id]  # the owner's view
    losing = _losing(client._node().delivery, "acked", monkeypatch)
    for n in range(3):
        assert client.send_to_spot("r", Note(n)).submit_sync() is None
    assert wait_until(lambda: len(journal().items("note")) == 3)
    assert wait_until(lambda: seen.acked_in == seen.in_seq > 0)  # acknowledged, lost
    before = _dial_again(client, owner)
    assert len(before.unacked) == 3
    losing.clear()
    client.connect_peer(owner.node.endpoint).result(WAIT)
    assert client._node()._peers.by_rid[owner.node.routing_id] is before  # resumed
    assert wait_until(lambda: not before.unacked), list(before.unacked)
    assert before.acked_out == 3
    assert len(journal().items("note")) == 3  # the three sent again were not run twice
    assert mesh_stats(client).dropped_after_admission == 0


def test_a_dropped_total_lost_with_its_connection_is_told_again_when_the_peer_resumes(
    mesh: GlobalMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above with DROPPED: the owner loses one of the client's one-ways (as a fenced
    node does when it admits again) and its notice is lost on its way. Before, the total
    was never told again (its connection kept its name): the client never counted it."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()  # it dials the owner (`GlobalMesh.add`)
    _lose_one(owner, client, "a")
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 1)
    node = owner._node()
    seen = node._peers.by_rid[client.node.routing_id]  # the owner's view of the client
    losing = _losing(client._node().delivery, "dropped_there", monkeypatch)
    node._lost_here(seen, "lost as its sender went away (the test)")
    assert seen.dropped_told == 2  # told on the live connection, and lost on its way
    _dial_again(client, owner)
    losing.clear()
    assert mesh_stats(client).dropped_after_admission == 1
    client.connect_peer(owner.node.endpoint).result(WAIT)
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 2)
    assert mesh_stats(client).dropped_by_peer == {owner.node.routing_id: 2}
