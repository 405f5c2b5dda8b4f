"""The handshake seen from the side that admits (issue 15, item 2: "both sides of a pair
see each other READY from one connection"; the restart row: "the first request after it
is READY succeeds without retry"). In one process, so the race is cheap to repeat."""

from __future__ import annotations

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from .messages import ALL_TYPES, Ping, Pong
from .node_main import Control
from .nodes import FAST

#: Pairs tried: the race lost about one pair in ten when this test was written (in
#: processes one in three), so 200 pairs all passing means it is fixed.
PAIRS = 200


def test_the_first_request_from_the_admitting_side_after_ready_succeeds() -> None:
    for _ in range(PAIRS):
        with HostHarness(node_handler=Control, message_types=ALL_TYPES) as harness:
            listener = harness.host(mesh=z.MeshConfig("game", **FAST))
            dialler = harness.host(
                mesh=z.MeshConfig("game", peers=(listener.node.endpoint,), **FAST)
            )
            listener.wait_for_peers(1, timeout=WAIT)  # READY here, on the admitting side
            rid = dialler.node.routing_id
            call = listener.request_to_node("game", rid, Ping(1), reply=Pong)
            assert call.timeout(WAIT).submit_sync() == Pong(2, rid)
