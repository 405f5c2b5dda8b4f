"""Global Spots and Actors: creation, placement and close across meshed Hosts in one
process (issue 16 items 1, 2; design/mesh.md §1 "Object roles", design/mesh.md §2
"Global objects").

Every test starts real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`) on
tcp loopback; the objects journal what they do, and every wait is bounded and asserted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from zlink_actors import (
    ActorRef,
    AlreadyExistsError,
    Created,
    DeadlineExceededError,
    Existing,
    Host,
    NotFoundError,
    Rejected,
    Spot,
    SpotContext,
    SpotRef,
    TypeMismatchError,
    UnavailableError,
    handler,
)
from zlink_actors.testing import WAIT, wait_until

from .._support import NEGATIVE_WAIT
from ._global import GlobalMesh, mesh_stats, run_racers
from ._global_objects import (
    Enter,
    Hall,
    Lounge,
    Note,
    Ping,
    Player,
    Room,
    Where,
    WhichSpot,
    journal,
    where,
)

# -- get_or_create racing from several nodes ---------------------------------------------


@pytest.mark.stress
@pytest.mark.parametrize("with_client", [False, True], ids=["3-servers", "2-servers-1-client"])
def test_racing_get_or_create_from_three_hosts_runs_one_factory_per_id_and_all_see_one_ref(
    mesh: GlobalMesh, with_client: bool
) -> None:
    # With a client: it places each id on one of the servers while both create it locally.
    # That race is in the timing, so it gets a few rounds of fresh ids.
    hosts = [mesh.add(spots=[Room]) for _ in range(2 if with_client else 3)]
    rids = {h.node.routing_id for h in hosts}
    if with_client:
        hosts.append(mesh.add())
    log = mesh.journal
    for round_ in range(4 if with_client else 1):
        ids = [f"race-{round_}-{i}" for i in range(50)]
        _race_get_or_create(hosts, rids, ids, log.count("room-built"))


def _race_get_or_create(hosts: list[Host], rids: set[str], ids: list[str], built: int) -> None:
    def race(i: int) -> list[object]:
        host = hosts[i]
        calls = [
            host.spots.get_or_create(spot_id, Room).timeout(WAIT * 2).submit() for spot_id in ids
        ]
        return [c.result(WAIT * 3) for c in calls]

    per_host = run_racers(3, race)
    log = journal()
    assert log.count("room-built") == built + len(ids)  # one factory per id, whoever won
    created_on = {s: rid for s, rid in log.items("created") if s in ids}  # type: ignore[misc]
    assert sorted(created_on) == sorted(ids)
    assert sum(1 for s, _ in log.items("created") if s in ids) == len(ids)  # type: ignore[misc]

    for k, spot_id in enumerate(ids):
        results = [per_host[h][k] for h in range(3)]  # type: ignore[index]
        assert all(type(r) in (Created, Existing) for r in results), results
        refs = {r.ref for r in results}  # type: ignore[attr-defined]
        assert len(refs) == 1, f"{spot_id}: {results}"
        [ref] = refs
        assert isinstance(ref, SpotRef)
        assert ref.spot_id == spot_id
        assert ref.routing_id in rids
        assert ref.routing_id == created_on[spot_id]
        created = [r for r in results if type(r) is Created]
        assert created, f"{spot_id}: nobody saw the attempt's Created: {results}"
        # One attempt: every caller that joined it saw its one Created.
        assert all(c == created[0] for c in created)
        assert created[0].reply == f"made on {ref.routing_id}"

    # Later callers, on every node, see the same refs as Existing.
    for host in hosts:
        for k in (0, 17, 49):
            again = host.spots.get_or_create(ids[k], Room).submit_sync()
            assert type(again) is Existing
            assert again.ref == per_host[0][k].ref  # type: ignore[index]
    assert log.count("room-built") == built + len(ids)


def test_racing_actor_get_or_create_from_two_hosts_builds_one_actor(mesh: GlobalMesh) -> None:
    a = mesh.add(actors=[Player])
    b = mesh.add(actors=[Player])
    results = run_racers(2, lambda i: (a, b)[i].actors.get_or_create("ana", Player).submit_sync())
    assert mesh.journal.count("player-built") == 1
    refs = {r.ref for r in results}  # type: ignore[attr-defined]
    assert len(refs) == 1
    [ref] = refs
    assert isinstance(ref, ActorRef)
    assert ref.actor_id == "ana"
    assert ref.routing_id in (a.node.routing_id, b.node.routing_id)
    assert any(type(r) is Created for r in results)
    for host in (a, b):
        assert host.request_to_actor("ana", Where(), reply=str).submit_sync() == ref.routing_id


# -- placement ---------------------------------------------------------------------------


def test_an_object_client_creates_spots_and_actors_on_a_peer_that_registers_the_type(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room], actors=[Player])
    client = mesh.add()  # location= and no types: an Object Client
    srid = server.node.routing_id

    made = client.spots.create(Room).submit_sync()
    assert type(made) is Created
    prefix, _, suffix = made.ref.spot_id.rpartition("-")
    assert prefix == "g.Room"
    assert len(suffix) == 32
    assert made.ref.routing_id == srid
    assert made.reply == f"made on {srid}"
    assert where(client, made.ref.spot_id) == srid

    got = client.spots.get_or_create("lobby", Room).submit_sync()
    assert type(got) is Created
    assert got.ref.routing_id == srid
    assert server.spots.get_or_create("lobby", Room).submit_sync() == Existing(got.ref)

    ana = client.actors.create("ana", Player).submit_sync()
    assert type(ana) is Created
    assert ana.ref.routing_id == srid
    assert client.request_to_actor("ana", Where(), reply=str).submit_sync() == srid
    assert mesh_stats(server).owned_objects == 3
    assert mesh_stats(client).owned_objects == 0


def test_a_type_no_node_registers_ends_the_create_with_not_found(mesh: GlobalMesh) -> None:
    mesh.add(spots=[Room])
    client = mesh.add()
    with pytest.raises(NotFoundError):
        client.spots.create(Hall).submit_sync()
    with pytest.raises(NotFoundError):
        client.spots.get_or_create("h1", Hall).submit_sync()
    with pytest.raises(NotFoundError):
        client.actors.get_or_create("ana", Player).submit_sync()
    # Nothing was reserved: the ids are free.
    with pytest.raises(NotFoundError):
        client.request_to_spot("h1", Where(), reply=str).submit_sync()


def test_a_node_with_placement_weight_zero_is_never_chosen(mesh: GlobalMesh) -> None:
    zero = mesh.add(spots=[Room], mesh={"placement_weight": 0})
    client = mesh.add()
    with pytest.raises(NotFoundError):  # the only server takes no placements
        client.spots.create(Room).submit_sync()

    one = mesh.add(spots=[Room])
    two = mesh.add(spots=[Room])
    owners = Counter(client.spots.create(Room).submit_sync().ref.routing_id for _ in range(24))
    assert zero.node.routing_id not in owners
    assert set(owners) == {one.node.routing_id, two.node.routing_id}, owners
    assert mesh_stats(zero).owned_objects == 0


def test_create_of_a_taken_id_from_another_host_is_already_exists_or_type_mismatch(
    mesh: GlobalMesh,
) -> None:
    a = mesh.add(spots=[Room, Hall], actors=[Player])
    b = mesh.add(spots=[Room, Hall], actors=[Player])
    client = mesh.add()
    ana = a.actors.create("ana", Player).submit_sync()
    room = a.spots.get_or_create("r1", Room).submit_sync()
    for other in (b, client):
        with pytest.raises(AlreadyExistsError):
            other.actors.create("ana", Player).submit_sync()
        with pytest.raises(TypeMismatchError):
            other.spots.get_or_create("r1", Hall).submit_sync()
        assert other.spots.get_or_create("r1", Room).submit_sync() == Existing(room.ref)
        assert other.actors.get_or_create("ana", Player).submit_sync() == Existing(ana.ref)
    assert mesh.journal.count("player-built") == 1
    assert mesh.journal.count("room-built") == 1


def test_a_rejected_creation_leaves_the_id_free_for_another_host(mesh: GlobalMesh) -> None:
    a = mesh.add(spots=[Room])
    b = mesh.add(spots=[Room])
    assert a.spots.get_or_create("r", Room).request("reject").submit_sync() == Rejected("no")
    with pytest.raises(NotFoundError):
        b.send_to_spot("r", Note(1)).submit_sync()
    made = b.spots.get_or_create("r", Room).submit_sync()
    assert type(made) is Created
    assert made.ref.routing_id == b.node.routing_id  # b registers Room: placed on b
    assert where(a, "r") == b.node.routing_id


# -- close -------------------------------------------------------------------------------


def test_close_from_another_host_closes_at_the_owner_and_the_id_is_free_at_once(
    mesh: GlobalMesh,
) -> None:
    a = mesh.add(spots=[Room])
    b = mesh.add(spots=[Room])
    old = a.spots.get_or_create("r1", Room).submit_sync()
    assert where(b, "r1") == a.node.routing_id
    assert mesh_stats(a).owned_objects == 1

    assert b.spots.close("r1").submit_sync() is True
    assert mesh.journal.items("closed") == [("r1", a.node.routing_id)]
    assert mesh_stats(a).owned_objects == 0
    with pytest.raises(NotFoundError):
        a.request_to_spot("r1", Where(), reply=str).submit_sync()

    new = b.spots.get_or_create("r1", Room).submit_sync()  # at once: the record is gone
    assert type(new) is Created
    assert new.ref.routing_id == b.node.routing_id
    assert new.ref != old.ref
    assert where(a, "r1") == b.node.routing_id


def test_close_of_an_actor_from_an_object_client(mesh: GlobalMesh) -> None:
    server = mesh.add(actors=[Player])
    client = mesh.add()
    server.actors.create("ana", Player).submit_sync()
    assert client.actors.close("ana").submit_sync() is True
    with pytest.raises(NotFoundError):
        client.request_to_actor("ana", Ping(1), reply=int).submit_sync()
    again = client.actors.create("ana", Player).submit_sync()
    assert type(again) is Created
    assert again.ref.routing_id == server.node.routing_id


def test_close_of_a_missing_id_is_not_found_from_every_host(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Room], actors=[Player])
    client = mesh.add()
    for host in (server, client):
        with pytest.raises(NotFoundError):
            host.spots.close("nobody").submit_sync()
        with pytest.raises(NotFoundError):
            host.actors.close("nobody").submit_sync()
    server.spots.get_or_create("gone", Room).submit_sync()
    assert client.spots.close("gone").submit_sync() is True
    for host in (server, client):
        with pytest.raises(NotFoundError):
            host.spots.close("gone").submit_sync()


def test_racing_closes_from_two_nodes_close_once(mesh: GlobalMesh) -> None:
    owner = mesh.add(spots=[Room])
    a, b = mesh.add(), mesh.add()
    for k in range(10):
        owner.spots.get_or_create(f"r{k}", Room).submit_sync()

    def close_all(i: int) -> list[object]:
        outcomes: list[object] = []
        for k in range(10):
            try:
                outcomes.append((a, b)[i].spots.close(f"r{k}").submit_sync())
            except NotFoundError:  # the other node's close came first
                outcomes.append("missing")
            except UnavailableError:  # it reached the owner after the other one's close
                outcomes.append("not the owner")
        return outcomes

    first, second = run_racers(2, close_all)
    assert isinstance(first, list)
    assert isinstance(second, list)
    for k in range(10):
        assert True in (first[k], second[k]), (k, first[k], second[k])
        assert {first[k], second[k]} <= {True, "missing", "not the owner"}
    assert sorted(s for s, _ in mesh.journal.items("closed")) == sorted(  # type: ignore[misc]
        f"r{k}" for k in range(10)
    )
    assert mesh_stats(owner).owned_objects == 0
    for host in (a, b):  # "not the owner" was once: the ids are Missing now
        with pytest.raises(NotFoundError):
            host.spots.close("r0").submit_sync()


def test_a_remote_close_of_a_spot_with_members_is_false_and_changes_nothing(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Lounge], actors=[Player])
    client = mesh.add()
    server.spots.get_or_create("lounge", Lounge).submit_sync()
    server.actors.get_or_create("ana", Player).submit_sync()
    server.send_to_actor("ana", Enter("lounge")).submit_sync()
    assert mesh.journal.event("join_completed").wait(WAIT)
    [(_, joined)] = mesh.journal.items("join_completed")  # type: ignore[misc]
    assert joined.approved is True

    assert client.spots.close("lounge").submit_sync() is False
    assert client.request_to_spot("lounge", Where(), reply=str).submit_sync() == (
        server.node.routing_id
    )
    assert client.request_to_actor("ana", WhichSpot(), reply=str).submit_sync() == "lounge"
    assert mesh_stats(server).owned_objects == 2


def test_a_get_or_create_from_another_node_joins_the_attempt_in_progress(
    mesh: GlobalMesh,
) -> None:
    a = mesh.add(spots=[Room])
    b = mesh.add(spots=[Room])
    first = a.spots.get_or_create("r", Room).request("hold-create").timeout(WAIT * 2).submit()
    assert mesh.journal.event("created").wait(WAIT)  # Reserved by a; on_create is held
    joined = b.spots.get_or_create("r", Room).timeout(WAIT * 2).submit()
    impatient = b.spots.get_or_create("r", Room).timeout(0.2).submit()
    assert isinstance(impatient.exception(WAIT), DeadlineExceededError)
    with pytest.raises(TypeMismatchError):  # being created as a Room
        b.spots.get_or_create("r", Hall).submit_sync()
    assert not joined.done()
    assert not first.done()

    mesh.journal.latch("create").set()
    made = first.result(WAIT)
    assert type(made) is Created
    assert made.ref.routing_id == a.node.routing_id
    assert joined.result(WAIT) == made  # it joined the attempt: its Created
    assert b.spots.get_or_create("r", Room).submit_sync() == Existing(made.ref)
    assert mesh.journal.count("room-built") == 1


def test_an_object_client_names_a_type_by_its_type_name_alone(mesh: GlobalMesh) -> None:
    class RoomStub(Spot):
        """What a front end in another process knows of Room: its type name."""

        type_name = "g.Room"

    server = mesh.add(spots=[Room])
    client = mesh.add()
    made = client.spots.get_or_create("r", RoomStub).submit_sync()
    assert type(made) is Created
    assert made.ref.routing_id == server.node.routing_id
    assert made.reply == f"made on {server.node.routing_id}"  # the real Room's on_create
    assert server.spots.get_or_create("r", Room).submit_sync() == Existing(made.ref)


def test_a_remote_creation_hooks_request_and_rejection_cross_the_network(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    assert client.spots.get_or_create("r", Room).request("reject").submit_sync() == Rejected("no")
    assert mesh.journal.items("created") == [("r", server.node.routing_id)]
    with pytest.raises(NotFoundError):  # the id stayed free
        client.request_to_spot("r", Where(), reply=str).submit_sync()
    made = client.spots.get_or_create("r", Room).request("fine").submit_sync()
    assert type(made) is Created
    assert made.reply == f"made on {server.node.routing_id}"


def test_one_deadline_covers_a_remote_creation_and_the_attempt_goes_on(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    late = client.spots.get_or_create("r", Room).request("hold-create").timeout(0.3).submit()
    assert mesh.journal.event("created").wait(WAIT)  # on_create runs, held, on the server
    assert isinstance(late.exception(WAIT), DeadlineExceededError)
    mesh.journal.latch("create").set()
    # The attempt finished on the server: the object is there, once.
    assert wait_until(lambda: mesh_stats(server).owned_objects == 1)
    got = client.spots.get_or_create("r", Room).submit_sync()
    assert type(got) is Existing
    assert got.ref.routing_id == server.node.routing_id
    assert mesh.journal.count("room-built") == 1


def test_a_handler_creates_and_reaches_an_object_on_another_node(mesh: GlobalMesh) -> None:
    class Maker(Spot):
        type_name = "g.Maker"

        @handler
        async def make(self, ctx: SpotContext, msg: Ping) -> str:
            made = await ctx.spots.get_or_create(f"room-{msg.n}", Room).submit()
            assert type(made) is Created
            where = await ctx.request_to_spot(f"room-{msg.n}", Where(), reply=str).submit()
            assert where == made.ref.routing_id
            return where

    here = mesh.add(spots=[Maker])
    there = mesh.add(spots=[Room])
    here.spots.get_or_create("maker", Maker).submit_sync()
    reply = here.request_to_spot("maker", Ping(1), reply=str).submit_sync()
    assert reply == there.node.routing_id
    assert mesh.journal.items("created") == [("room-1", there.node.routing_id)]


def test_an_actor_create_from_another_node_during_an_attempt_is_already_exists(
    mesh: GlobalMesh,
) -> None:
    class SlowPlayer(Player):
        type_name = "g.SlowPlayer"

        def on_create(self, ctx: Any, request: object) -> str:
            journal().note("created", (ctx.actor_id, ctx.node.routing_id))
            assert journal().latch("create").wait(WAIT + 5)
            return "made"

    a = mesh.add(actors=[SlowPlayer])
    b = mesh.add(actors=[SlowPlayer])
    first = a.actors.create("ana", SlowPlayer).timeout(WAIT * 2).submit()
    assert mesh.journal.event("created").wait(WAIT)
    with pytest.raises(AlreadyExistsError):
        b.actors.create("ana", SlowPlayer).submit_sync()
    mesh.journal.latch("create").set()
    made = first.result(WAIT)
    assert type(made) is Created
    assert made.reply == "made"
    assert b.request_to_actor("ana", Where(), reply=str).submit_sync() == a.node.routing_id


def test_a_rejecting_attempt_rejects_the_callers_that_joined_it_from_another_node(
    mesh: GlobalMesh,
) -> None:
    a = mesh.add(spots=[Room])
    b = mesh.add(spots=[Room])
    first = a.spots.get_or_create("r", Room).request("hold-reject").timeout(WAIT * 2).submit()
    assert mesh.journal.event("created").wait(WAIT)
    joined = b.spots.get_or_create("r", Room).timeout(WAIT * 2).submit()
    assert not joined.wait(NEGATIVE_WAIT)  # it waits for the attempt
    mesh.journal.latch("create").set()
    assert first.result(WAIT) == Rejected("no")
    assert joined.result(WAIT) == Rejected("no")
    made = b.spots.get_or_create("r", Room).submit_sync()  # the id stayed free
    assert type(made) is Created
    assert made.ref.routing_id == b.node.routing_id
