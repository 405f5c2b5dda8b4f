"""Owner leases of global objects (issue 16 item 4; design/mesh.md §2 "Owner leases"):
a node whose renewals fail past its admission deadline admits no new work for its
objects and lets accepted work finish; once a dead owner's lease has expired in the store,
another node takes its records over by compare-and-set.

Real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`). Leases run on real
time with short timings; the store's clock is moved forward to expire them in the store
(`StoreClock`), or one Host is cut off from the store (`Cuttable`). Every wait is bounded
and asserted.
"""

from __future__ import annotations

import time

import pytest

from zlink_actors import (
    Created,
    Existing,
    Host,
    LeaseConfig,
    UnavailableError,
)
from zlink_actors.testing import WAIT, wait_until

from .._support import NEGATIVE_WAIT
from ._global import GlobalMesh, mesh_stats
from ._global_objects import Board, Hold, News, Note, Ping, Player, Room, Ticker, Where

#: Short lease timings: renewed every 0.2 s, admission stops 0.5 s before the TTL ends.
SHORT = LeaseConfig(renew_interval=0.2, ttl=1.5, renew_timeout=0.2, fencing_margin=0.5)
#: The lease of a Host that is killed: long enough that a call made right after the kill
#: meets an unexpired lease, short enough that its expiry is waited for in a test.
DYING = LeaseConfig(renew_interval=0.2, ttl=3.0, renew_timeout=0.3, fencing_margin=1.0)


def _wait_fenced(owner: Host, spot_id: str) -> None:
    """Wait (bounded) until `owner` reports its lease lapsed and refuses a request to its
    Spot `spot_id` (a `Where`, which changes nothing).

    The refusal is waited for too, so what follows relies on admission having stopped,
    not only on the statistic (the two were once updated at different moments).
    """
    assert wait_until(lambda: mesh_stats(owner).lease_admitting is False)

    def refused() -> bool:
        try:
            owner.request_to_spot(spot_id, Where(), reply=str).submit_sync()
        except UnavailableError:
            return True
        return False

    assert wait_until(refused)


def test_a_healthy_node_admits_and_counts_the_objects_it_owns(mesh: GlobalMesh) -> None:
    owner = mesh.add(spots=[Room], actors=[Player])
    client = mesh.add()
    for host in (owner, client):
        assert mesh_stats(host).lease_admitting is True
        assert mesh_stats(host).owned_objects == 0
    owner.spots.get_or_create("r1", Room).submit_sync()
    client.spots.get_or_create("r2", Room).submit_sync()  # placed on the owner
    client.actors.create("ana", Player).submit_sync()
    assert mesh_stats(owner).owned_objects == 3
    assert client.spots.close("r1").submit_sync() is True
    assert mesh_stats(owner).owned_objects == 2
    assert mesh_stats(client).owned_objects == 0


def test_when_renewals_fail_the_owner_admits_no_new_work_and_accepted_work_finishes() -> None:
    with GlobalMesh(lease=SHORT) as mesh:
        owner = mesh.add(spots=[Room], cuttable=True)
        client = mesh.add()
        owner.spots.get_or_create("busy", Room).submit_sync()
        owner.spots.get_or_create("idle", Room).submit_sync()
        assert client.request_to_spot("idle", Where(), reply=str).submit_sync() == (
            owner.node.routing_id
        )
        held = client.request_to_spot("busy", Hold(), reply=str).timeout(WAIT * 3).submit()
        assert mesh.journal.event("entered").wait(WAIT)
        assert mesh_stats(owner).lease_admitting is True

        # Its renewals fail from now on (the store stays cut off: it cannot recover).
        mesh.cut(owner)
        _wait_fenced(owner, "idle")

        for host in (client, owner):
            with pytest.raises(UnavailableError):
                host.request_to_spot("idle", Ping(1), reply=int).submit_sync()
        with pytest.raises(UnavailableError):
            owner.send_to_spot("idle", Note(1)).submit_sync()
        with pytest.raises(UnavailableError):
            owner.spots.get_or_create("new", Room).submit_sync()
        with pytest.raises(UnavailableError):  # placed on the owner, which admits none
            client.spots.create(Room).submit_sync()

        mesh.journal.latch("hold").set()
        assert held.result(WAIT) == "held"  # the request already running got its reply
        assert mesh.journal.items("ping") == []
        assert mesh.journal.items("note") == []
        assert [spot for spot, _ in mesh.journal.items("created")] == ["busy", "idle"]  # type: ignore[misc]


def _until_not_unavailable(call: object, within: float = WAIT + DYING.ttl) -> object:
    """Repeat `call()` while it raises `UnavailableError` (bounded); return its result."""
    outcome: list[object] = []

    def attempt() -> bool:
        try:
            outcome.append(call())  # type: ignore[operator]
        except UnavailableError:
            return False
        return True

    assert wait_until(attempt, within), "still UnavailableError"
    return outcome[-1]


def test_after_a_dead_owners_lease_expired_another_node_closes_and_recreates_its_objects(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    other = mesh.add(spots=[Room])
    old = owner.spots.get_or_create("r", Room).submit_sync()
    assert other.request_to_spot("r", Where(), reply=str).submit_sync() == owner.node.routing_id
    killed_at = time.monotonic()
    mesh.kill(owner)

    # The lease has not expired yet: the record is the dead owner's.
    with pytest.raises(UnavailableError):
        other.spots.close("r").submit_sync()
    assert time.monotonic() - killed_at < DYING.ttl - DYING.renew_interval, "too slow to tell"

    # Once it expired in the store, the close removes the record by compare-and-set.
    assert _until_not_unavailable(lambda: other.spots.close("r").submit_sync()) is True
    assert time.monotonic() - killed_at >= DYING.ttl - DYING.renew_interval - DYING.renew_timeout
    made = other.spots.get_or_create("r", Room).submit_sync()
    assert type(made) is Created
    assert made.ref.routing_id == other.node.routing_id
    assert made.ref != old.ref
    assert other.request_to_spot("r", Where(), reply=str).submit_sync() == other.node.routing_id


def test_an_id_left_reserved_by_a_dead_creator_gets_a_fresh_attempt_once_its_lease_expired(
    mesh: GlobalMesh,
) -> None:
    creator = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    other = mesh.add(spots=[Room])
    creator.spots.get_or_create("s", Room).request("hold-create").timeout(WAIT * 3).submit()
    assert mesh.journal.event("created").wait(WAIT)  # Reserved; on_create is held
    mesh.kill(creator)

    made = _until_not_unavailable(lambda: other.spots.get_or_create("s", Room).submit_sync())
    assert type(made) is Created
    assert made.ref.routing_id == other.node.routing_id
    assert mesh.journal.items("created") == [
        ("s", creator.node.routing_id),
        ("s", other.node.routing_id),
    ]
    assert other.request_to_spot("s", Ping(4), reply=int).submit_sync() == 4


def test_a_fenced_owner_admits_no_new_timer_ticks() -> None:
    with GlobalMesh(lease=SHORT) as mesh:
        owner = mesh.add(spots=[Ticker], cuttable=True)
        owner.spots.get_or_create("t", Ticker).submit_sync()
        assert mesh.journal.wait_count("tick", 3)  # it ticks while the lease admits
        mesh.cut(owner)
        _wait_fenced(owner, "t")
        fenced_at = mesh.journal.count("tick")
        # Watched for NEGATIVE_WAIT (ten intervals): at most the tick already admitted.
        assert not mesh.journal.wait_count("tick", fenced_at + 2, NEGATIVE_WAIT)


def test_a_recovered_owner_ticks_again() -> None:
    with GlobalMesh(lease=SHORT) as mesh:
        owner = mesh.add(spots=[Ticker], cuttable=True)
        owner.spots.get_or_create("t", Ticker).submit_sync()
        assert mesh.journal.wait_count("tick", 2)
        mesh.cut(owner)
        _wait_fenced(owner, "t")
        fenced_at = mesh.journal.count("tick")
        mesh.heal(owner)
        assert wait_until(lambda: mesh_stats(owner).lease_admitting, WAIT)
        assert mesh.journal.wait_count("tick", fenced_at + 3)  # its timer runs again
        assert mesh_stats(owner).lease_recoveries == 1


def _fenced_board(mesh: GlobalMesh) -> tuple[Host, Host]:
    """An owner with the subscribed Board "b" (delivered one publish) and a client; the
    owner is then cut off from the store until its lease lapses (it cannot recover)."""
    owner = mesh.add(spots=[Board], cuttable=True)
    client = mesh.add()
    owner.spots.get_or_create("b", Board).submit_sync()
    assert client.publish("news", "all", News(1)).submit_sync() is None
    assert mesh.journal.wait_count("news", 1)
    mesh.cut(owner)
    _wait_fenced(owner, "b")
    return owner, client


def test_a_fenced_owners_subscribed_spots_get_no_publish_from_another_node() -> None:
    with GlobalMesh(lease=SHORT) as mesh:
        _, client = _fenced_board(mesh)
        assert client.publish("news", "all", News(2)).submit_sync() is None  # committed
        assert not mesh.journal.wait_count("news", 2, NEGATIVE_WAIT)
        assert mesh.journal.items("news") == [("b", 1)]


def test_a_fenced_owners_subscribed_spots_get_no_publish_from_the_owner_itself() -> None:
    with GlobalMesh(lease=SHORT) as mesh:
        owner, _ = _fenced_board(mesh)
        assert owner.publish("news", "all", News(3)).submit_sync() is None
        assert not mesh.journal.wait_count("news", 2, NEGATIVE_WAIT)
        assert mesh.journal.items("news") == [("b", 1)]


def test_an_owner_cut_off_from_the_store_is_fenced_and_its_objects_are_taken_over(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    other = mesh.add(spots=[Room])
    client = mesh.add()
    old = owner.spots.get_or_create("r", Room).submit_sync()
    assert client.request_to_spot("r", Where(), reply=str).submit_sync() == owner.node.routing_id
    mesh.cut(owner)  # a partition from the store: the owner still runs and is READY

    assert wait_until(lambda: mesh_stats(owner).lease_admitting is False, WAIT + DYING.ttl)

    # Once the lease expired in the store (a second after the fence), another node takes
    # the record over.
    closing = lambda: other.spots.close("r").submit_sync()  # noqa: E731
    assert _until_not_unavailable(closing, DYING.ttl) is True
    made = other.spots.get_or_create("r", Room).submit_sync()
    assert type(made) is Created
    assert made.ref.routing_id == other.node.routing_id
    assert made.ref != old.ref
    # The client's route may still name the fenced owner: Unavailable at most once.
    try:
        first = client.request_to_spot("r", Where(), reply=str).submit_sync()
    except UnavailableError:
        first = other.node.routing_id
    assert first == other.node.routing_id
    assert client.request_to_spot("r", Where(), reply=str).submit_sync() == other.node.routing_id


def test_the_fence_holds_at_the_admission_deadline_even_when_the_io_loop_stalls(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    owner.spots.get_or_create("r", Room).submit_sync()
    stalled = mesh.journal.latch("loop")

    async def stall(token: object) -> None:
        # Blocks the owner's I/O loop (on purpose: a loop held up by slow work).
        assert stalled.wait(WAIT + DYING.ttl)

    mesh.cut(owner)  # renewals fail from now on
    job = owner.run_io_worker(stall).timeout(WAIT * 3).submit()
    try:
        assert wait_until(lambda: mesh_stats(owner).lease_admitting is False, WAIT)
        outcome: object
        try:
            outcome = owner.request_to_spot("r", Ping(1), reply=int).timeout(WAIT).submit_sync()
        except UnavailableError as exc:
            outcome = exc
        assert isinstance(outcome, UnavailableError), f"admitted past the deadline: {outcome}"
        assert mesh.journal.items("ping") == []
    finally:
        stalled.set()
        assert job.wait(WAIT)


def test_a_dead_owner_that_reaches_the_store_again_deletes_none_of_the_records_taken_over(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    other = mesh.add(spots=[Room])
    owner.spots.get_or_create("r", Room).submit_sync()
    mesh.kill(owner)
    assert _until_not_unavailable(lambda: other.spots.close("r").submit_sync()) is True
    made = other.spots.get_or_create("r", Room).submit_sync()
    assert type(made) is Created

    # The old run reaches the store again and shuts down gracefully: it deletes what it
    # still owns, by compare-and-set, so the record of the new "r" stays.
    mesh.heal(owner)
    owner.shutdown(WAIT)
    assert other.spots.get_or_create("r", Room).submit_sync() == Existing(made.ref)
    assert other.request_to_spot("r", Where(), reply=str).submit_sync() == other.node.routing_id
    assert mesh_stats(other).owned_objects == 1


def test_a_fenced_owner_reconnected_to_the_store_after_its_lease_expired_recovers(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    other = mesh.add(spots=[Room])
    owner.spots.get_or_create("r", Room).submit_sync()
    lost = mesh_stats(owner).lease_generation
    cut_at = time.monotonic()
    mesh.cut(owner)
    _wait_fenced(owner, "r")
    # Its lease expires in the store at most a TTL after its last renewal, before the cut:
    # wait that out (a time bound, what the lease is), then the partition heals.
    assert wait_until(lambda: time.monotonic() > cut_at + DYING.ttl + 0.2, WAIT + DYING.ttl)
    mesh.heal(owner)
    # It recovers by itself with a new lease (a higher generation: the lost one never
    # admits again), claims its record again and serves "r" as before.
    assert wait_until(lambda: mesh_stats(owner).lease_admitting, WAIT)
    stats = mesh_stats(owner)
    assert stats.lease_generation > lost
    assert (stats.lease_recoveries, stats.objects_reclaimed, stats.owned_objects) == (1, 1, 1)
    assert (
        _until_not_unavailable(lambda: other.request_to_spot("r", Ping(1), reply=int).submit_sync())
        == 1
    )
    assert other.request_to_spot("r", Where(), reply=str).submit_sync() == owner.node.routing_id
    assert type(other.spots.get_or_create("r", Room).submit_sync()) is Existing
