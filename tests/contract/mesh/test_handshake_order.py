"""The side that was dialled may send at once: a record that reaches the dialling side
before its ADMIT (which travels on the other connection) waits for it, never dropped."""

from __future__ import annotations

from collections.abc import Iterator

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
    return z.MeshConfig("h", liveness_interval=0.2, liveness_timeout=1.5, **options)  # type: ignore[arg-type]


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    with HostHarness() as h:
        yield h


@pytest.mark.parametrize("attempt", range(5))
def test_the_dialled_side_calls_the_moment_it_admits(harness: HostHarness, attempt: int) -> None:
    dialled = harness.host(mesh=_mesh())
    dialler = harness.host(node_handler=Doubler, mesh=_mesh(peers=(dialled.node.endpoint,)))
    [peer] = dialled.wait_for_peers(1, timeout=WAIT)  # READY here: the ADMIT is on its way
    calls = [dialled.request_to_node("h", peer.routing_id, Ping(i)).submit() for i in range(20)]
    assert [c.result(WAIT) for c in calls] == [2 * i for i in range(20)]
    stats = dialler.statistics().mesh
    assert stats is not None
    assert stats.decode_errors == 0
