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

from zlink_actors import Completion, Host
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
    """DROPPED carries a running total: the receiver tells it again when the connection
    it went on was replaced since (a pause: the notice may have been lost with it), and
    the sender counts only what a total adds. Before, each notice was added."""
    owner = mesh.add(spots=[Room])
    client = mesh.add()
    _lose_one(owner, client, "a")
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 1)
    peer = owner._node()._peers.by_rid[client.node.routing_id]  # the owner's view of it
    peer.dropped_conn = b""  # as if the connection the total went on was replaced since
    assert wait_until(lambda: peer.dropped_conn == peer.conn)  # the ticker told it again
    _lose_one(owner, client, "b")  # total 2, on the same connection, after the resend
    assert wait_until(lambda: mesh_stats(owner).dropped_messages == 2)
    assert wait_until(lambda: mesh_stats(client).dropped_after_admission >= 2)
    assert mesh_stats(client).dropped_after_admission == 2
    assert mesh_stats(client).dropped_by_peer == {owner.node.routing_id: 2}
