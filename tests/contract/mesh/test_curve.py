"""CURVE between mesh nodes (docs/mesh.md "Topology"): the advertised endpoint carries the
node's public key; an accepted key reaches READY, a refused one never does."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
import zmq

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness


class Ping(msgspec.Struct):
    n: int


class Doubler(z.NodeHandler):
    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> int:
        return msg.n * 2


Keys = tuple[bytes, bytes]


def _mesh(keys: Keys, accepted: list[bytes], **options: object) -> z.MeshConfig:
    curve = z.CurveConfig(keys[0], keys[1], accepted)
    return z.MeshConfig("sec", liveness_interval=0.2, liveness_timeout=1.0, curve=curve, **options)  # type: ignore[arg-type]


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    with HostHarness() as h:
        yield h


def test_nodes_with_accepted_keys_talk_and_the_endpoint_carries_the_key(
    harness: HostHarness,
) -> None:
    ka, kb = zmq.curve_keypair(), zmq.curve_keypair()
    a = harness.host(node_handler=Doubler, mesh=_mesh(ka, [kb[0]]))
    endpoint = a.node.endpoint
    assert endpoint.endswith("|" + ka[0].decode())
    b = harness.host(mesh=_mesh(kb, [ka[0]], peers=(endpoint,)))
    [peer] = b.wait_for_peers(1, timeout=WAIT)
    assert peer.routing_id == a.node.routing_id
    assert b.request_to_node("sec", a.node.routing_id, Ping(21)).submit_sync() == 42


def test_a_node_whose_key_is_not_accepted_never_becomes_ready(harness: HostHarness) -> None:
    ka, kb, kc = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    a = harness.host(node_handler=Doubler, mesh=_mesh(ka, [kb[0]]))
    c = harness.host(mesh=_mesh(kc, [ka[0]]))
    with pytest.raises(z.UnavailableError) as caught:
        c.connect_peer(a.node.endpoint).result(WAIT)
    assert caught.value.reason is z.UnavailableReason.UNREACHABLE
    assert [p for p in c.peers() if p.state is z.PeerState.READY] == []
    assert [p for p in a.peers() if p.state is z.PeerState.READY] == []


def test_a_curve_node_refuses_an_endpoint_without_a_key(harness: HostHarness) -> None:
    ka, kb = zmq.curve_keypair(), zmq.curve_keypair()
    a = harness.host(node_handler=Doubler, mesh=_mesh(ka, [kb[0]]))
    b = harness.host(mesh=_mesh(kb, [ka[0]]))
    bare = a.node.endpoint.rpartition("|")[0]
    with pytest.raises(z.UnavailableError, match="public key") as caught:
        b.connect_peer(bare).result(WAIT)
    assert caught.value.reason is z.UnavailableReason.UNREACHABLE
