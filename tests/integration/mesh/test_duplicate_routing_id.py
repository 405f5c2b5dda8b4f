"""Two nodes with one routing id (issue 26, item 6): the second is refused with a typed
error (`AlreadyExistsError`) logged once, the first keeps serving, nothing aborts; in one
process (a child: a libzmq abort ends it, not the test run) and across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from .messages import ALL_TYPES, Ping, Pong, Stats, StatsReply
from .node_main import Control
from .nodes import FAST, ROOT, NodeProcesses, wait_until

MESH = "game"
_REFUSED = "refused a handshake from"
_REJECTED = "failed: rejected: duplicate routing id 'dup'"


def test_two_nodes_with_one_routing_id_in_one_process_never_abort_it() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.mesh.duplicate_main"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=6 * WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]  # libzmq's abort: -6 (SIGABRT)
    assert "Assertion failed" not in done.stderr
    [line] = done.stdout.splitlines()
    seen = json.loads(line)
    assert seen["b_error"] == "AlreadyExistsError", seen
    # The first node keeps its place at P, and every call P made after the refusal
    # reached it (none the second, none failed).
    assert seen["p_dup"] == [["ready", seen["a"]]], seen
    assert set(seen["answers"]) == {seen["a"]}, seen
    assert sum(seen["answers"].values()) >= 50, seen
    assert seen["errors"] == {}, seen
    # Once on each side, however often the second node's peers= keeper dialled again.
    assert done.stderr.count(_REFUSED) == 1, done.stderr[-4000:]
    assert done.stderr.count(_REJECTED) == 1, done.stderr[-4000:]


def test_a_second_process_with_a_live_routing_id_is_refused_and_the_first_keeps_serving(
    harness: HostHarness, nodes: NodeProcesses
) -> None:
    config = z.MeshConfig(MESH, **FAST)
    p = harness.host(mesh=config, node_handler=Control, message_types=ALL_TYPES)
    endpoint = p.node.endpoint
    first = nodes.start(routing_id="dup", peers=[endpoint])
    nodes.joined(first)
    second = nodes.launch(routing_id="dup", peers=[endpoint], peer_wait=1.5)
    nodes.ready(second)
    line = second._read_line(time.monotonic() + 3 * WAIT)
    assert "ready_error" in line, (line, second.log())  # never READY with P
    assert wait_until(lambda: _REJECTED in second.log()), second.log()

    [entry] = [q for q in p.peers() if q.routing_id == "dup"]
    assert (entry.state, entry.endpoint) == (z.PeerState.READY, first.endpoint)
    # P's calls to "dup" reach the first node: the one that has P READY.
    stats = p.request_to_node(MESH, "dup", Stats(), reply=StatsReply).timeout(WAIT)
    assert stats.submit_sync().peers == {p.node.routing_id: "ready"}
    assert p.request_to_node(MESH, "dup", Ping(1), reply=Pong).submit_sync() == Pong(2, "dup")
    assert second.stop() == 0
    assert first.stop() == 0
    assert "Assertion failed" not in second.log() + first.log()
    assert second.log().count(_REJECTED) == 1, second.log()
