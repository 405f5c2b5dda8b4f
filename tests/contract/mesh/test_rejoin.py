"""`peers=` stay dialled (docs/mesh.md "Topology"): a peer restarted at the same fixed
address is a new node, and the node that lists it rejoins it without being told."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness


class Ping(msgspec.Struct):
    n: int


class Doubler(z.NodeHandler):
    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> int:
        return msg.n * 2


def _mesh(**options: object) -> z.MeshConfig:
    return z.MeshConfig("m", liveness_interval=0.2, liveness_timeout=1.0, **options)  # type: ignore[arg-type]


def _free_pair() -> int:
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no free pair of ports")


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    with HostHarness() as h:
        yield h


def test_a_peer_restarted_at_its_address_is_rejoined(harness: HostHarness) -> None:
    port = _free_pair()
    listen = f"tcp://127.0.0.1:{port}"
    first = harness.host(node_handler=Doubler, mesh=_mesh(listen=listen))
    # Spelt otherwise than the peer advertises it: still one connection, kept.
    caller = harness.host(mesh=_mesh(peers=(f"tcp://localhost:{port}",)))
    caller.wait_for_peers(1, timeout=WAIT)
    assert caller.request_to_node("m", first.node.routing_id, Ping(1)).submit_sync() == 2

    old = first.node.routing_id
    first.shutdown(WAIT)
    _until(lambda: _state(caller, old) is z.PeerState.LOST)  # still known, not READY
    second = harness.host(node_handler=Doubler, mesh=_mesh(listen=listen))
    assert second.node.routing_id != old  # a restart is a new node
    [peer] = caller.wait_for_peers(1, timeout=WAIT)
    assert peer.routing_id == second.node.routing_id
    assert caller.request_to_node("m", second.node.routing_id, Ping(2)).submit_sync() == 4
    with pytest.raises(z.UnavailableError):
        caller.request_to_node("m", old, Ping(3)).submit_sync()


def _state(host: z.Host, routing_id: str) -> z.PeerState | None:
    return next((p.state for p in host.peers() if p.routing_id == routing_id), None)


def _until(condition: Callable[[], bool]) -> None:
    """A bounded wait for a state another thread reaches (asserted)."""
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, "the condition did not hold within WAIT"
        time.sleep(0.01)
