"""Authority records and node descriptors on both providers: every transition is one
compare-and-set batch against the version read; conflicts change nothing."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from zlink_actors import InvalidOperationError, ProtocolError, UnavailableError
from zlink_actors.location import (
    MAX_GENERATION,
    Authority,
    AuthorityKind,
    AuthorityRecord,
    AuthorityState,
    Committed,
    Conflict,
    Delete,
    GenerationExhausted,
    GenerationExhaustedError,
    LeaseConfig,
    NodeDescriptor,
    NodeDescriptorState,
    OwnerFence,
    OwnerLease,
    Put,
    list_nodes,
    publish_node,
    withdraw_node,
)
from zlink_actors.location.keys import (
    authority_key,
    generation_key,
    lease_counter_key,
    lease_key,
)

from .conftest import StoreFactory

SPOT = AuthorityKind.SPOT
A = OwnerFence("node-a", 1)
B = OwnerFence("node-b", 7)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_reserve_commit_new_owner_delete_walk_the_lifecycle(make_store: StoreFactory) -> None:
    auth = Authority(make_store())

    async def go() -> None:
        assert await auth.read(SPOT, "room-1") is None
        reserved = await auth.reserve(SPOT, "room-1", "Room", A)
        assert isinstance(reserved, AuthorityRecord)
        assert (reserved.state, reserved.generation, reserved.owner) == (
            AuthorityState.RESERVED,
            1,
            A,
        )
        assert await auth.read(SPOT, "room-1") == reserved
        ready = await auth.commit(reserved)
        assert isinstance(ready, AuthorityRecord)
        assert ready.state is AuthorityState.READY
        assert ready.version != reserved.version
        moved = await auth.new_owner(ready, B)
        assert isinstance(moved, AuthorityRecord)
        assert (moved.owner, moved.owner_generation, moved.generation) == (B, 2, 1)
        assert isinstance(await auth.delete(moved), Committed)
        assert await auth.read(SPOT, "room-1") is None
        again = await auth.reserve(SPOT, "room-1", "Room", A)
        assert isinstance(again, AuthorityRecord)
        assert again.generation == 2  # generations are never reused after a delete

    run(go())


def test_every_transition_against_a_stale_version_conflicts_and_changes_nothing(
    make_store: StoreFactory,
) -> None:
    auth = Authority(make_store())

    async def go() -> None:
        reserved = await auth.reserve(SPOT, "r", "Room", A)
        assert isinstance(reserved, AuthorityRecord)
        assert isinstance(await auth.reserve(SPOT, "r", "Room", B), Conflict)
        ready = await auth.commit(reserved)
        assert isinstance(ready, AuthorityRecord)
        assert isinstance(await auth.commit(reserved), Conflict)  # stale version
        assert isinstance(await auth.abort(reserved), Conflict)
        moved = await auth.new_owner(ready, B)
        assert isinstance(moved, AuthorityRecord)
        assert isinstance(await auth.new_owner(ready, A), Conflict)
        assert isinstance(await auth.delete(ready), Conflict)
        assert await auth.read(SPOT, "r") == moved

    run(go())


def test_illegal_transitions_are_invalid_operation(make_store: StoreFactory) -> None:
    auth = Authority(make_store())

    async def go() -> None:
        reserved = await auth.reserve(SPOT, "r", "Room", A)
        assert isinstance(reserved, AuthorityRecord)
        with pytest.raises(InvalidOperationError, match="new_owner needs a ready"):
            await auth.new_owner(reserved, B)
        with pytest.raises(InvalidOperationError, match="delete needs a ready"):
            await auth.delete(reserved)
        ready = await auth.commit(reserved)
        assert isinstance(ready, AuthorityRecord)
        with pytest.raises(InvalidOperationError, match="commit needs a reserved"):
            await auth.commit(ready)
        with pytest.raises(InvalidOperationError, match="abort needs a reserved"):
            await auth.abort(ready)

    run(go())


def test_abort_returns_a_reserved_record_to_missing(make_store: StoreFactory) -> None:
    auth = Authority(make_store())

    async def go() -> None:
        reserved = await auth.reserve(AuthorityKind.ACTOR, "p", "Player", A)
        assert isinstance(reserved, AuthorityRecord)
        assert isinstance(await auth.abort(reserved), Committed)
        assert await auth.read(AuthorityKind.ACTOR, "p") is None
        assert await auth.read(SPOT, "p") is None  # kinds do not share records

    run(go())


def test_concurrent_reserves_of_one_id_have_exactly_one_winner(make_store: StoreFactory) -> None:
    auth = Authority(make_store())

    async def go() -> list[Any]:
        return await asyncio.gather(
            *(auth.reserve(SPOT, "race", "Room", OwnerFence(f"n{i}", 1)) for i in range(8))
        )

    results = run(go())
    assert len([r for r in results if isinstance(r, AuthorityRecord)]) == 1


def test_generations_never_wrap(make_store: StoreFactory) -> None:
    store = make_store()
    auth = Authority(store)
    run(store.write([], [Put(generation_key("spot", "old"), b"%d" % MAX_GENERATION)]))
    with pytest.raises(GenerationExhaustedError):
        run(auth.reserve(SPOT, "old", "Room", A))
    assert run(auth.read(SPOT, "old")) is None
    assert GenerationExhausted is GenerationExhaustedError

    async def exhausted_owner() -> None:
        reserved = await auth.reserve(SPOT, "o", "Room", A)
        assert isinstance(reserved, AuthorityRecord)
        ready = await auth.commit(reserved)
        assert isinstance(ready, AuthorityRecord)
        with pytest.raises(GenerationExhaustedError):
            await auth.new_owner(replace(ready, owner_generation=MAX_GENERATION), B)

    run(exhausted_owner())


def test_undecodable_record_is_protocol_error(make_store: StoreFactory) -> None:
    store = make_store()
    run(store.write([], [Put(authority_key("spot", "bad"), b"\xc1garbage")]))
    with pytest.raises(ProtocolError):
        run(Authority(store).read(SPOT, "bad"))


def test_take_over_of_a_record_whose_owner_lease_expired(make_store: StoreFactory) -> None:
    store = make_store()
    auth = Authority(store)
    config = LeaseConfig(renew_interval=0.05, ttl=0.5, renew_timeout=0.05, fencing_margin=0.1)

    async def go() -> None:
        lease = OwnerLease(store, "node-x", config)
        grant = await lease.acquire()
        owner = OwnerFence("node-x", grant.generation)
        reserved = await auth.reserve(SPOT, "s", "Room", owner)
        assert isinstance(reserved, AuthorityRecord)
        ready = await auth.commit(reserved)
        assert isinstance(ready, AuthorityRecord)
        stale_reserved = await auth.reserve(SPOT, "t", "Room", owner)
        assert isinstance(stale_reserved, AuthorityRecord)
        assert await auth.owner_alive(owner)
        with pytest.raises(InvalidOperationError, match="still holds its lease"):
            await auth.take_over_stale(ready)
        await lease.release()  # the run ends (as if its lease expired)
        assert not await auth.owner_alive(owner)
        assert isinstance(await auth.take_over_stale(ready), Committed)
        assert isinstance(await auth.take_over_stale(stale_reserved), Committed)
        assert await auth.read(SPOT, "s") is None
        assert await auth.read(SPOT, "t") is None
        # a new run of the same node id has a new lease generation: still stale
        again = await auth.reserve(SPOT, "u", "Room", owner)
        assert isinstance(again, AuthorityRecord)
        new_run = await OwnerLease(store, "node-x", config).acquire()
        assert new_run.generation == grant.generation + 1
        assert not await auth.owner_alive(owner)
        assert isinstance(await auth.take_over_stale(again), Committed)

    run(go())


def test_node_descriptors_are_published_under_a_ttl_and_found_by_scan(
    make_store: StoreFactory,
) -> None:
    store = make_store()

    async def go() -> None:
        a = NodeDescriptor("game", "node-a", ("tcp://127.0.0.1:7101",), 1, channels={"chat": 100})
        b = NodeDescriptor(
            "game", "node-b", ("tcp://127.0.0.1:7102",), 3, NodeDescriptorState.DRAINING
        )
        other = NodeDescriptor("gamex", "node-c", ("ipc:///tmp/c",), 1)
        for node in (a, b, other):
            await publish_node(store, node, ttl=30)
        found = await list_nodes(store, "game")
        assert sorted(found, key=lambda n: n.routing_id) == [a, b]
        assert await list_nodes(store, "gamex") == [other]
        await withdraw_node(store, "game", "node-a")
        assert await list_nodes(store, "game") == [b]
        short = NodeDescriptor("brief", "node-d", (), 1)
        done = await publish_node(store, short, ttl=0.1)
        for _ in range(2000):  # bounded poll of the store's own clock
            nodes = await list_nodes(store, "brief")
            if not nodes:
                break
            await asyncio.sleep(0.005)
        else:
            pytest.fail("the descriptor never expired")
        page = await store.scan("")
        assert page.store_now >= done.store_now + 0.1

    run(go())


def test_reclaim_writes_a_missing_record_again_and_moves_one_that_names_the_node(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    auth = Authority(store)
    a2 = OwnerFence("node-a", 2)  # node-a's new run, after its lease was lost

    async def go() -> None:
        reserved = await auth.reserve(SPOT, "r", "Room", A)
        assert isinstance(reserved, AuthorityRecord)
        held = await auth.commit(reserved)
        assert isinstance(held, AuthorityRecord)
        # Still there, naming the lost run: moved by compare-and-set.
        moved = await auth.reclaim(held, await auth.read(SPOT, "r"), a2)
        assert isinstance(moved, AuthorityRecord)
        assert (moved.owner, moved.owner_generation, moved.generation) == (a2, 2, 1)
        assert await auth.read(SPOT, "r") == moved
        # Read before it changed: a conflict, nothing written.
        assert isinstance(await auth.reclaim(held, held, a2), Conflict)
        # Gone with the store's data (record and counter): written again, counter too.
        await store.write(
            [], [Delete(authority_key("spot", "r")), Delete(generation_key("spot", "r"))]
        )
        again = await auth.reclaim(held, None, a2)
        assert isinstance(again, AuthorityRecord)
        assert (again.state, again.generation, again.owner) == (AuthorityState.READY, 1, a2)
        assert await auth.read(SPOT, "r") == again
        # ... and the generation is never issued again.
        assert isinstance(await auth.delete(again), Committed)
        fresh = await auth.reserve(SPOT, "r", "Room", B)
        assert isinstance(fresh, AuthorityRecord)
        assert fresh.generation == 2
        # Missing when read, but written meanwhile: a conflict.
        assert isinstance(await auth.reclaim(held, None, a2), Conflict)
        # Another node's record is not this node's to claim.
        with pytest.raises(InvalidOperationError):
            await auth.reclaim(held, fresh, a2)

    run(go())


def test_a_lease_acquired_again_after_a_loss_takes_a_higher_generation_even_without_its_counter(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    lease = OwnerLease(
        store, "node-a", LeaseConfig(renew_interval=1, ttl=10, renew_timeout=1, fencing_margin=2)
    )

    async def go() -> None:
        first = await lease.acquire()
        # The store loses everything it held (a Redis restarted without persistence).
        await store.write([], [Delete(lease_key("node-a")), Delete(lease_counter_key("node-a"))])
        with pytest.raises(UnavailableError):
            await lease.renew()  # found lost: the grant is dropped
        assert lease.grant is None
        second = await lease.acquire()
        assert second.generation > first.generation
        assert lease.last_generation == second.generation

    run(go())
