"""A node process recovers from a Redis restarted without persistence, or shuts down for
its supervisor (issue 26 item 4): a real redis-server of the test's own, killed and
started again on the same port (everything it held is gone), a real node process
holding a Room, and this test's Host as the Object Client that calls it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness, RedisServer, redis_server_binary

from .nodes import FAST, NodeProcess, NodeProcesses, wait_until
from .rooms import ROOM_TYPES, Room, Said, Say

MESH = "lease"
LEASE = {"renew_interval": 0.2, "ttl": 1.5, "renew_timeout": 0.2, "fencing_margin": 0.5}


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (no persistence), stopped at the end."""
    binary = redis_server_binary()
    if binary is None:
        pytest.fail("these tests need redis-server on the PATH", pytrace=False)
    server = RedisServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stores() -> Iterator[list[z.RedisLocationStore]]:
    """The test's stores, closed at the end (after the Hosts: ask for it first)."""
    made: list[z.RedisLocationStore] = []
    try:
        yield made
    finally:
        for store in made:
            store.close()


def _setup(
    harness: HostHarness,
    nodes: NodeProcesses,
    redis: RedisServer,
    stores: list[z.RedisLocationStore],
    **extra: object,
) -> tuple[z.Host, NodeProcess]:
    prefix = f"zll-{uuid.uuid4().hex}"
    node = nodes.launch(
        mesh=MESH,
        redis={"url": redis.url, "key_prefix": prefix},
        rooms=True,
        lease=LEASE,
        **extra,
    )
    nodes.ready(node)
    store = z.RedisLocationStore(redis.url, key_prefix=prefix, operation_timeout=1.0)
    stores.append(store)
    client = harness.host(
        mesh=z.MeshConfig(MESH, lease=z.LeaseConfig(**LEASE), **FAST),
        location=store,
        message_types=ROOM_TYPES,
    )
    client.connect_peer(node.endpoint).result(WAIT)
    return client, node


def _say(host: z.Host, spot_id: str, text: str) -> Said:
    said: Said = host.request_to_spot(spot_id, Say(text), reply=Said).timeout(WAIT).submit_sync()
    return said


def _lines(node: NodeProcess, key: str, want: int, within: float) -> list[dict[str, object]]:
    """Read the node's stdout until `want` lines carrying `key` came (bounded)."""
    deadline = time.monotonic() + within
    found = [line for line in map(json.loads, node.lines) if key in line]
    while len(found) < want:
        line = node._read_line(deadline)
        if key in line:
            found.append(line)
    return found


def test_a_node_process_recovers_after_redis_restarts_without_persistence(
    own_redis: RedisServer,
    stores: list[z.RedisLocationStore],
    harness: HostHarness,
    nodes: NodeProcesses,
) -> None:
    client, node = _setup(harness, nodes, own_redis, stores)
    made = client.spots.get_or_create("r1", Room).timeout(WAIT).submit_sync()
    assert made.ref.routing_id == node.routing_id  # placed on the node: the client has none
    assert _say(client, "r1", "before").routing_id == node.routing_id

    own_redis.kill()
    own_redis.start()

    changes = _lines(node, "state_change", 2, WAIT * 2)
    assert [c["state_change"] for c in changes] == ["fenced", "recovered"]
    assert int(changes[1]["generation"]) > 1  # type: ignore[call-overload]

    # The node serves its Room again (its record written again), and creates new ones.
    said: list[Said] = []

    def served() -> bool:
        try:
            said.append(_say(client, "r1", "after"))
        except z.UnavailableError:
            return False
        return True

    assert wait_until(served, WAIT * 2), node.log()
    assert said[-1].routing_id == node.routing_id
    for i in range(4):
        fresh = client.spots.get_or_create(f"new-{i}", Room).timeout(WAIT).submit_sync()
        assert type(fresh) is z.Created
        assert fresh.ref.routing_id == node.routing_id
    assert node.stop() == 0, node.log()


def test_a_node_process_with_on_lease_lost_shutdown_exits_for_its_supervisor(
    own_redis: RedisServer,
    stores: list[z.RedisLocationStore],
    harness: HostHarness,
    nodes: NodeProcesses,
) -> None:
    client, node = _setup(harness, nodes, own_redis, stores, on_lease_lost="shutdown")
    client.spots.get_or_create("r1", Room).timeout(WAIT).submit_sync()

    own_redis.kill()
    own_redis.start()

    # It exits by itself (no stdin closed, no signal), saying why.
    assert wait_until(lambda: node.proc.poll() is not None, WAIT * 2), node.log()
    assert node.proc.returncode == 4, node.log()
    node._read_rest()
    lines = [json.loads(line) for line in node.lines]
    assert {"state_change": "lease_lost", "generation": 0} in lines
    assert (lines[-1]["stopped"], lines[-1]["reason"]) == ("stopped", "lease_lost")
