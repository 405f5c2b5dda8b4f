"""Global Spots across node processes on a real Redis (issue 16): an Object Client (this
test's Host) creates Rooms on two Object Server processes, reaches them, and sees the
typed errors when an owner process is SIGKILLed; once the dead owner's lease expired, the
id is closed from here and created again elsewhere with a new generation. And racing
get-or-create from three processes runs one factory per id."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import zlink_actors as z
from zlink_actors.location import Missing
from zlink_actors.location.keys import lease_key
from zlink_actors.testing import WAIT, HostHarness

from .nodes import FAST, NodeProcess, NodeProcesses, wait_until
from .rooms import ROOM_TYPES, CreateRooms, Made, Room, RoomCounts, Rooms, Said, Say

MESH = "game"
#: Short lease timings: a killed owner's lease expires in the store within 1.5 s.
LEASE = {"renew_interval": 0.2, "ttl": 1.5, "renew_timeout": 0.2, "fencing_margin": 0.5}
DISCOVERY_WAIT = 2 * WAIT


def _client(harness: HostHarness, store: z.RedisLocationStore) -> z.Host:
    """An Object Client: `location=` and no Spot or Actor types of its own."""
    return harness.host(
        mesh=z.MeshConfig(MESH, lease=z.LeaseConfig(**LEASE), **FAST),
        location=store,
        message_types=ROOM_TYPES,
    )


def _servers(nodes: NodeProcesses, redis: dict[str, str], count: int) -> list[NodeProcess]:
    return [
        nodes.launch(
            mesh=MESH,
            redis=redis,
            rooms=True,
            lease=LEASE,
            expect_peers=count,
            peer_wait=DISCOVERY_WAIT,
        )
        for _ in range(count)
    ]


def _counts(host: z.Host, node: NodeProcess) -> Rooms:
    call = host.request_to_node(MESH, node.routing_id, RoomCounts(), reply=Rooms)
    result: Rooms = call.timeout(WAIT).submit_sync()
    return result


def _say(host: z.Host, spot_id: str, text: str) -> Said:
    result: Said = host.request_to_spot(spot_id, Say(text), reply=Said).timeout(WAIT).submit_sync()
    return result


def _lease_gone(store: z.RedisLocationStore, routing_id: str) -> bool:
    found = asyncio.run(store.read(lease_key(routing_id)))
    return isinstance(found, Missing)


def test_rooms_on_two_server_processes_a_killed_owner_and_its_take_over(
    harness: HostHarness,
    nodes: NodeProcesses,
    redis_store: tuple[z.RedisLocationStore, dict[str, str]],
) -> None:
    store, redis = redis_store
    a, b = _servers(nodes, redis, 2)
    client = _client(harness, store)
    nodes.ready(a, b)
    client.wait_for_peers(2, timeout=DISCOVERY_WAIT)
    nodes.joined(a, b, timeout=DISCOVERY_WAIT)

    # Placement: the client registers no Room; both servers get some (equal weights).
    refs = [client.spots.get_or_create(f"room-{n}", Room).submit_sync().ref for n in range(6)]
    assert {ref.routing_id for ref in refs} == {a.routing_id, b.routing_id}
    for ref in refs:
        assert _say(client, ref.spot_id, "hi") == Said("hi", ref.spot_id, ref.routing_id)
    on_a = [ref for ref in refs if ref.routing_id == a.routing_id]
    on_b = [ref for ref in refs if ref.routing_id == b.routing_id]
    assert _counts(client, a).constructed == len(on_a)
    before = _counts(client, b)
    assert before.constructed == len(on_b)

    # The owner of some rooms dies: calls to them fail typed, within the liveness bound,
    # and nothing is resent to the other node.
    a.kill()
    started = time.monotonic()
    with pytest.raises(z.UnavailableError) as caught:
        _say(client, on_a[0].spot_id, "are you there")
    assert time.monotonic() - started < WAIT
    # SIGKILL closed its connections: the peer is gone (fail over), not paused.
    gone = z.UnavailableReason.PEER_LOST
    assert caught.value.reason is gone
    for ref in on_a:
        with pytest.raises(z.UnavailableError) as caught:
            client.send_to_spot(ref.spot_id, Say("one-way")).submit_sync()
        assert caught.value.reason is gone
        with pytest.raises(z.UnavailableError) as caught:
            _say(client, ref.spot_id, "again")
        assert caught.value.reason is gone
    # Never-created ids are NotFoundError, not UnavailableError.
    with pytest.raises(z.NotFoundError):
        _say(client, "room-never", "hi")
    # The rest of the mesh keeps serving.
    for ref in on_b:
        assert _say(client, ref.spot_id, "still here").routing_id == b.routing_id
    after = _counts(client, b)
    assert after.handled == before.handled + len(on_b)
    assert after.constructed == before.constructed

    # get-or-create of a dead owner's Ready record is UnavailableError (close it first);
    # so is close() while the dead owner's lease has not expired in the store.
    lost = on_a[0].spot_id
    with pytest.raises(z.UnavailableError) as caught:
        client.spots.get_or_create(lost, Room).submit_sync()
    assert caught.value.reason is z.UnavailableReason.PEER_LOST
    # Once its lease expired, any node takes over: close() deletes the record and a new
    # get-or-create makes a new generation on a live node.
    assert wait_until(lambda: _lease_gone(store, a.routing_id), timeout=WAIT)
    assert client.spots.close(lost).submit_sync() is True
    again = client.spots.get_or_create(lost, Room).submit_sync()
    assert isinstance(again, z.Created)
    assert again.ref.routing_id == b.routing_id
    assert again.ref.generation > on_a[0].generation
    assert _say(client, lost, "reborn") == Said("reborn", lost, b.routing_id)
    assert _counts(client, b).constructed == before.constructed + 1


def test_get_or_create_racing_from_three_processes_runs_one_factory_per_id(
    harness: HostHarness,
    nodes: NodeProcesses,
    redis_store: tuple[z.RedisLocationStore, dict[str, str]],
) -> None:
    store, redis = redis_store
    servers = _servers(nodes, redis, 3)  # each also sees this client: expect 3 peers
    client = _client(harness, store)
    nodes.ready(*servers)
    client.wait_for_peers(3, timeout=DISCOVERY_WAIT)
    nodes.joined(*servers, timeout=DISCOVERY_WAIT)
    ids = [f"race-{n}" for n in range(50)]
    results: dict[str, list[Made]] = {}
    barrier = threading.Barrier(len(servers))

    def ask(node: NodeProcess) -> None:
        barrier.wait(WAIT)
        call = client.request_to_node(MESH, node.routing_id, CreateRooms(ids), reply=list[Made])
        results[node.routing_id] = call.timeout(4 * WAIT).submit_sync()

    threads = [threading.Thread(target=ask, args=(node,)) for node in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5 * WAIT)
    assert all(not thread.is_alive() for thread in threads)
    assert set(results) == {node.routing_id for node in servers}
    for n, spot_id in enumerate(ids):
        made = [results[node.routing_id][n] for node in servers]
        assert {(m.spot_id, m.generation, m.routing_id) for m in made} == {
            (spot_id, made[0].generation, made[0].routing_id)
        }
        assert "Created" in {m.outcome for m in made}
    constructed = sum(_counts(client, node).constructed for node in servers)
    assert constructed == len(ids)
