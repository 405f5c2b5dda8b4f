"""The route cache of global objects (issue 16 item 3; design/mesh.md §2 "Global
objects"): what a node remembers of where an object lives, how long, what it never
caches, and the order of the one-ways that go through it.

Real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`) on tcp loopback;
every wait is bounded and asserted.
"""

from __future__ import annotations

import time

import pytest

from zlink_actors import (
    Created,
    NotFoundError,
    UnavailableError,
)
from zlink_actors.testing import WAIT, wait_until

from ._global import GlobalMesh, mesh_stats
from ._global_objects import (
    Note,
    Ping,
    Player,
    Room,
    journal,
    where,
)


def test_route_cache_hits_and_misses_are_counted(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    server.spots.get_or_create("r", Room).submit_sync()
    before = mesh_stats(client)
    assert client.request_to_spot("r", Ping(1), reply=int).submit_sync() == 1
    first = mesh_stats(client)
    assert first.route_cache_misses == before.route_cache_misses + 1
    assert first.route_cache_hits == before.route_cache_hits
    assert client.request_to_spot("r", Ping(2), reply=int).submit_sync() == 2
    client.send_to_spot("r", Note(3)).submit_sync()
    second = mesh_stats(client)
    assert second.route_cache_hits == first.route_cache_hits + 2
    assert second.route_cache_misses == first.route_cache_misses


def test_after_the_owner_is_replaced_a_stale_route_fails_once_then_the_new_owner_answers(
    mesh: GlobalMesh,
) -> None:
    age = {"route_cache_max_age": 0.2}
    client = mesh.add(mesh=age)
    old = mesh.add(spots=[Room], mesh=age)
    new = mesh.add(spots=[Room], mesh=age)
    old.spots.get_or_create("r", Room).submit_sync()
    assert where(client, "r") == old.node.routing_id  # cached: old is the owner

    assert new.spots.close("r").submit_sync() is True
    assert type(new.spots.get_or_create("r", Room).submit_sync()) is Created
    try:
        first = where(client, "r")
    except UnavailableError:
        first = "unavailable"  # the stale route: "not the owner", once
    assert first in (new.node.routing_id, "unavailable")
    assert where(client, "r") == new.node.routing_id  # resolved again


def test_a_cached_route_lives_at_most_route_cache_max_age(mesh: GlobalMesh) -> None:
    age = 0.2
    client = mesh.add(mesh={"route_cache_max_age": age})
    old = mesh.add(spots=[Room])
    new = mesh.add(spots=[Room])
    old.spots.get_or_create("r", Room).submit_sync()
    assert where(client, "r") == old.node.routing_id
    cached_at = time.monotonic()
    assert new.spots.close("r").submit_sync() is True
    new.spots.get_or_create("r", Room).submit_sync()

    # The time bound itself is what is tested: wait until the entry must have expired.
    assert wait_until(lambda: time.monotonic() > cached_at + age * 2)
    # A one-way gets no "not the owner" answer back: only the age bound keeps it from
    # going to the old owner. It reaches the new one.
    client.send_to_spot("r", Note(9)).submit_sync()
    assert journal().wait_count("note", 1)
    assert journal().items("note") == [("r", 9, new.node.routing_id)]


def test_a_missing_id_is_never_cached(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    with pytest.raises(NotFoundError):
        client.request_to_spot("later", Ping(1), reply=int).submit_sync()
    server.spots.get_or_create("later", Room).submit_sync()
    assert client.request_to_spot("later", Ping(2), reply=int).submit_sync() == 2


def _notes_to(target: str) -> list[int]:
    """The numbers of the `Note`s the object `target` handled, in order."""
    return [n for t, n, _ in journal().items("note") if t == target]  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["Spot", "Actor"])
def test_one_ways_submitted_at_once_on_a_cold_route_arrive_in_submission_order(
    mesh: GlobalMesh, kind: str
) -> None:
    server = mesh.add(spots=[Room], actors=[Player])
    client = mesh.add()
    # The overtaking depends on when the resolution ends, so a few rounds of fresh ids.
    for round_ in range(5):
        target = f"x{round_}"
        if kind == "Spot":
            server.spots.get_or_create(target, Room).submit_sync()
            send = client.send_to_spot
        else:
            server.actors.get_or_create(target, Player).submit_sync()
            send = client.send_to_actor
        # Nothing cached yet: the first send resolves the owner while the others follow.
        sends = [send(target, Note(n)).submit() for n in range(300)]
        for s in sends:
            assert s.wait(WAIT)
            assert s.result() is None
        assert wait_until(lambda t=target: len(_notes_to(t)) == 300)
        got = _notes_to(target)
        assert got == list(range(300)), f"round {round_}: {got[:10]}..."


def test_a_stream_of_one_ways_keeps_its_order_across_route_cache_refreshes(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add(mesh={"route_cache_max_age": 0.02})
    server.spots.get_or_create("x", Room).submit_sync()
    assert where(client, "x") == server.node.routing_id  # warm
    total = 0
    for round_ in range(6):  # each round spans several cache lifetimes
        sends = [client.send_to_spot("x", Note(total + n)).submit() for n in range(2000)]
        for s in sends:
            assert s.wait(WAIT)
            assert s.result() is None
        total += 2000
        assert wait_until(lambda total=total: len(_notes_to("x")) == total)
        got = _notes_to("x")
        assert got == sorted(got), f"round {round_}: reordered"
