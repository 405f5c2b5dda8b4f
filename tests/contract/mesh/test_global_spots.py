"""Instance Spots, Logical Multicast and Join across meshed Hosts in one process (issue 16
items 5, 6, 7; design/mesh.md §2 "Global objects", "Logical Multicast").

Every test starts real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`) on
tcp loopback; the objects journal what they do, and every wait is bounded and asserted.
"""

from __future__ import annotations

from collections import Counter

import pytest

from zlink_actors import (
    Completion,
    InvalidOperationError,
    JoinResult,
    NotFoundError,
    TypeMismatchError,
)
from zlink_actors.mesh import codec as wire
from zlink_actors.testing import WAIT, wait_until

from ._global import GlobalMesh, mesh_stats, run_racers
from ._global_objects import (
    Board,
    Enter,
    Hit,
    Lounge,
    Match,
    News,
    Player,
    Room,
    Where,
    WhichSpot,
    where,
)

# -- Instance Spots ----------------------------------------------------------------------


@pytest.mark.stress
def test_racing_first_messages_from_two_hosts_activate_an_instance_spot_once(
    mesh: GlobalMesh,
) -> None:
    hosts = [mesh.add(spots=[Match]) for _ in range(2)]
    ids = [f"m{i}" for i in range(10)]
    per_sender = 5

    def race(i: int) -> list[str]:
        host, sender = hosts[i], f"h{i}"
        calls: list[Completion[str]] = [
            host.request_to_spot(spot_id, Hit(sender, n), reply=str).activate(Match).submit()
            for n in range(per_sender)
            for spot_id in ids
        ]
        return [c.result(WAIT) for c in calls]

    replies = run_racers(2, race)
    log = mesh.journal
    built = log.items("match-built")
    assert sorted(s for s, _ in built) == ids  # each id activated once in the whole mesh
    owner = dict(built)
    hits = log.counts("hit")
    expected = {(s, f"h{i}", n) for s in ids for i in range(2) for n in range(per_sender)}
    assert set(hits) == expected
    assert all(count == 1 for count in hits.values())  # every message handled once
    for spot_id in ids:  # the activating message is the first one the Spot handles
        first = next(h for h in log.items("hit") if h[0] == spot_id)  # type: ignore[index]
        assert first[2] == 0, f"{spot_id} first handled {first}"  # type: ignore[index]
    for i in range(2):
        answered = replies[i]
        assert isinstance(answered, list)
        sent = [s for _ in range(per_sender) for s in ids]
        assert answered == [owner[s] for s in sent]


@pytest.mark.stress
def test_first_messages_of_an_object_client_racing_two_servers_are_all_handled(
    mesh: GlobalMesh,
) -> None:
    # Two Object Servers activate locally; the Object Client places on one of them. The
    # race is in the timing, so a few rounds of fresh ids give it room.
    hosts = [mesh.add(spots=[Match]), mesh.add(spots=[Match]), mesh.add()]
    failures: list[tuple[str, str, BaseException]] = []
    for round_ in range(4):
        ids = [f"m{round_}-{i}" for i in range(30)]

        def race(i: int, ids: list[str] = ids) -> list[tuple[str, str, BaseException]]:
            host, sender = hosts[i], f"h{i}"
            calls = [
                (spot_id, host.request_to_spot(spot_id, Hit(sender, n), reply=str))
                for n in range(2)
                for spot_id in ids
            ]
            done = [(spot_id, call.activate(Match).submit()) for spot_id, call in calls]
            return [(sender, s, e) for s, c in done if (e := c.exception(WAIT)) is not None]

        for failed in run_racers(3, race):
            assert isinstance(failed, list)
            failures.extend(failed)
    assert failures == []
    built = Counter(s for s, _ in mesh.journal.items("match-built"))  # type: ignore[misc]
    assert set(built.values()) == {1}  # each id activated once
    assert len(built) == 4 * 30
    assert all(n == 1 for n in mesh.journal.counts("hit").values())


def test_an_object_client_activates_an_instance_spot_on_a_peer(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Match])
    client = mesh.add()
    client.send_to_spot("m1", Hit("client", 0)).activate(Match).submit_sync()
    assert mesh.journal.wait_count("hit", 1)
    assert mesh.journal.items("match-built") == [("m1", server.node.routing_id)]
    reply = client.request_to_spot("m1", Hit("client", 1), reply=str).activate(Match)
    assert reply.submit_sync() == server.node.routing_id
    assert mesh.journal.items("hit") == [("m1", "client", 0), ("m1", "client", 1)]


def test_an_instance_spot_closed_from_another_node_is_activated_again_where_asked(
    mesh: GlobalMesh,
) -> None:
    a = mesh.add(spots=[Match])
    b = mesh.add(spots=[Match])
    assert a.request_to_spot("m", Hit("a", 0), reply=str).activate(Match).submit_sync() == (
        a.node.routing_id
    )
    assert b.spots.close("m").submit_sync() is True
    with pytest.raises(NotFoundError):  # no instance intent: nothing is activated
        b.request_to_spot("m", Hit("b", 1), reply=str).submit_sync()
    assert b.request_to_spot("m", Hit("b", 2), reply=str).activate(Match).submit_sync() == (
        b.node.routing_id
    )
    assert mesh.journal.items("match-built") == [("m", a.node.routing_id), ("m", b.node.routing_id)]
    assert mesh.journal.items("hit") == [("m", "a", 0), ("m", "b", 2)]


def test_instance_intent_to_a_user_spot_on_another_node_is_a_type_mismatch(
    mesh: GlobalMesh,
) -> None:
    a = mesh.add(spots=[Room, Match])
    b = mesh.add(spots=[Match])
    a.spots.get_or_create("lobby", Room).submit_sync()
    with pytest.raises(TypeMismatchError):
        b.request_to_spot("lobby", Hit("b", 1), reply=str).activate(Match).submit_sync()
    # A one-way completes at local admission; it activates nothing either (the owner logs
    # the mismatch). Behind it on the same pipe, a request finds the Room as it was.
    b.send_to_spot("lobby", Hit("b", 0)).activate(Match).submit_sync()
    assert b.request_to_spot("lobby", Where(), reply=str).submit_sync() == a.node.routing_id
    assert mesh.journal.items("match-built") == []
    assert mesh.journal.items("hit") == []


# -- Logical Multicast -------------------------------------------------------------------


@pytest.mark.parametrize("remotes", [0, 1, 3])
def test_publish_reaches_each_subscribed_spot_on_every_node_once(
    mesh: GlobalMesh, remotes: int
) -> None:
    publisher = mesh.add(spots=[Board, Room])
    others = [mesh.add(spots=[Board, Room]) for _ in range(remotes)]
    boards: list[str] = []
    for k, host in enumerate([publisher, *others]):
        for j in range(2):
            spot_id = f"board-{k}-{j}"
            host.spots.get_or_create(spot_id, Board).submit_sync()
            assert where(publisher, spot_id) == host.node.routing_id
            boards.append(spot_id)
        host.spots.get_or_create(f"room-{k}", Room).submit_sync()  # not subscribed

    assert publisher.publish("news", "sport", News(0)).submit_sync() is None  # no targets
    assert publisher.publish("news", "all", News(1)).submit_sync() is None
    assert publisher.publish("news", "all", News(2)).submit_sync() is None
    log = mesh.journal
    assert log.wait_count("news", 2 * len(boards))
    got = log.counts("news")
    assert got == Counter({(b, n): 1 for b in boards for n in (1, 2)}), got


def test_publish_from_an_object_client_reaches_the_object_servers(mesh: GlobalMesh) -> None:
    servers = [mesh.add(spots=[Board]) for _ in range(2)]
    client = mesh.add()
    for k, host in enumerate(servers):
        host.spots.get_or_create(f"board-{k}", Board).submit_sync()
    assert client.publish("news", "all", News(7)).submit_sync() is None
    assert mesh.journal.wait_count("news", 2)
    assert mesh.journal.counts("news") == Counter({("board-0", 7): 1, ("board-1", 7): 1})


# -- Join across nodes -------------------------------------------------------------------


def test_a_join_to_a_spot_on_another_node_is_declined_with_invalid_operation(
    mesh: GlobalMesh,
) -> None:
    players = mesh.add(actors=[Player])
    lounges = mesh.add(spots=[Lounge])
    players.spots.get_or_create("far", Lounge).submit_sync()
    assert where(players, "far") == lounges.node.routing_id
    players.actors.create("ana", Player).submit_sync()

    players.send_to_actor("ana", Enter("far")).submit_sync()
    log = mesh.journal
    assert log.event("join_completed").wait(WAIT)
    [(actor_id, result)] = log.items("join_completed")  # type: ignore[misc]
    assert actor_id == "ana"
    assert isinstance(result, JoinResult)
    assert result.approved is False
    assert isinstance(result.error, InvalidOperationError)
    assert log.items("on_actor_join") == []
    # Still in its Entry Spot, still reachable from both nodes.
    assert players.request_to_actor("ana", WhichSpot(), reply=str).submit_sync() == (
        players.entry_spot_id
    )
    assert lounges.request_to_actor("ana", Where(), reply=str).submit_sync() == (
        players.node.routing_id
    )


def test_a_one_way_with_instance_intent_sent_again_after_a_pause_runs_once(
    mesh: GlobalMesh,
) -> None:
    """A one-way with instance intent carries its sender's sequence number like any
    other; one sent again (what a sender does for the one-ways a peer had not
    acknowledged when it comes back from a pause) is a duplicate and never runs twice.
    The resend is made here with the sender node's own encoder and transport (no public
    way exists to resend a numbered one-way: `MeshNode` internals, as `GlobalMesh.kill`)."""
    owner = mesh.add(spots=[Match])
    client = mesh.add()
    rid = owner.node.routing_id
    client.send_to_spot("m", Hit("c", 0)).activate(Match).submit_sync()
    assert mesh.journal.wait_count("hit", 1)
    node = client._mesh
    assert node is not None
    peer = node._peers.by_rid[rid]
    type_name, data = node._encode(Hit("c", 0), peer)
    again = wire.encode_send(
        peer.out_seq, "Spot", "m", node.config.name, None, type_name, Match.type_name
    )
    before = mesh_stats(owner).duplicate_messages
    node.shared.transport.submit(peer.conn, (again, data))  # type: ignore[union-attr]
    assert wait_until(lambda: mesh_stats(owner).duplicate_messages == before + 1)
    # What the sender sends next runs, after it: the duplicate did not.
    client.send_to_spot("m", Hit("c", 1)).activate(Match).submit_sync()
    assert mesh.journal.wait_count("hit", 2)
    assert mesh.journal.items("hit") == [("m", "c", 0), ("m", "c", 1)]
