"""A request whose caller got `DeadlineExceededError` never starts its handler, also when
the receiver was paused (SIGSTOP) or the request sat in socket buffers (issue 26 item 2;
docs/mesh.md "Deadlines across nodes").

This process is the caller (a Host of the mesh); the receiver is a node process whose
channel handler counts every run (`HowMany`). The receiver is frozen with SIGSTOP for
less than the liveness timeout (so it stays READY and the calls end by their deadline,
not as lost), requests with a short timeout are sent to it, they all end with
`DeadlineExceededError` here, and after SIGCONT none of their handlers ever starts: a
later request to the same channel (its gate is FIFO) is answered, and the count has
grown by that request alone.
"""

from __future__ import annotations

import pathlib
import signal
import time
from typing import Any

import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from .messages import ALL_TYPES, Count, Done, HowMany, Job, Nap, Napped
from .node_main import Control
from .nodes import NodeProcess, NodeProcesses, wait_until

MESH = "game"
#: Liveness well above the pauses below: the receiver stays READY while it is frozen.
LIVENESS: dict[str, float] = {"liveness_interval": 0.2, "liveness_timeout": 4.0}
#: Requests per test, and their timeout.
CALLS = 40
TIMEOUT = 0.3


def _host(harness: HostHarness) -> z.Host:
    config = z.MeshConfig(MESH, **LIVENESS)
    return harness.host(mesh=config, node_handler=Control, message_types=ALL_TYPES)


def _receiver(host: z.Host, nodes: NodeProcesses) -> NodeProcess:
    node = nodes.start(peers=[host.node.endpoint], channels={"work": 100}, **LIVENESS)
    nodes.joined(node)
    host.wait_for_peers(1, timeout=WAIT)
    return node


def _handled(host: z.Host, node: NodeProcess) -> int:
    count: Count = (
        host.request_to_node(MESH, node.routing_id, HowMany(), reply=Count)
        .timeout(WAIT)
        .submit_sync()
    )
    return count.handled


def _job(host: z.Host, n: int, timeout: float) -> z.Completion[Any]:
    return host.request_to_channel("work", Job(n), reply=Done).timeout(timeout).submit()


def _credit_in_use(host: z.Host) -> int:
    mesh = host.statistics().mesh
    assert mesh is not None
    return mesh.credit_in_use


def _peer_ready(host: z.Host, node: NodeProcess) -> bool:
    return any(
        p.routing_id == node.routing_id and p.state is z.PeerState.READY for p in host.peers()
    )


def _freeze(node: NodeProcess) -> float:
    """SIGSTOP `node` and wait (bounded) until it is stopped: the signal is delivered
    asynchronously, and a process busy on another CPU runs on for a moment. Returns
    when it was frozen (this process's monotonic clock)."""
    node.proc.send_signal(signal.SIGSTOP)
    stat = pathlib.Path(f"/proc/{node.pid}/stat")
    # Field 3, after the parenthesised command name: T = stopped by a signal.
    assert wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T")
    return time.monotonic()


def _ran_after_resume(host: z.Host, node: NodeProcess) -> int:
    """Once the node serves again: a request to the same channel after everything sent
    before it, answered (so every earlier record on that gate ran or was refused first);
    returns how many handlers ran in all."""
    done = _job(host, -1, WAIT).result(WAIT)
    assert done == Done(-1, node.routing_id)
    return _handled(host, node)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "first-calls"])
def test_requests_sent_to_a_frozen_receiver_that_time_out_never_start_after_it_resumes(
    warm: bool, harness: HostHarness, nodes: NodeProcesses
) -> None:
    """first-calls: the receiver is frozen right after the handshake, before any request
    reached it (its first heartbeat sample of our clock is all it has)."""
    host = _host(harness)
    node = _receiver(host, nodes)
    if warm:
        for i in range(20):
            assert _job(host, i, WAIT).result(WAIT) == Done(i, node.routing_id)
    before = _handled(host, node)

    frozen = _freeze(node)
    try:
        calls = [_job(host, i, TIMEOUT) for i in range(CALLS)]
        outcomes = [type(call.exception(WAIT)) for call in calls]
        assert outcomes == [z.DeadlineExceededError] * CALLS
        # Frozen past every deadline, well within the liveness timeout: still READY.
        assert time.monotonic() - frozen < LIVENESS["liveness_timeout"] - 1.0
        assert _peer_ready(host, node)
    finally:
        node.proc.send_signal(signal.SIGCONT)

    # None of the 40 ran: only the probe did.
    assert _ran_after_resume(host, node) == before + 1, node.log()
    assert _peer_ready(host, node)


def test_requests_queued_behind_a_handler_when_the_receiver_froze_never_start_after_it_resumes(
    harness: HostHarness, nodes: NodeProcesses
) -> None:
    """The requests were admitted into the channel's queue (behind a nap) before the
    freeze; the receiver's own timers for them were frozen too, and race the handler's
    gate when it resumes: the check as each leaves the queue decides."""
    host = _host(harness)
    node = _receiver(host, nodes)
    before = _handled(host, node)
    nap_for = 0.8
    nap = host.request_to_channel("work", Nap(nap_for), reply=Napped).timeout(WAIT).submit()
    calls = [_job(host, i, TIMEOUT) for i in range(CALLS)]
    # Everything admitted at the receiver (their credit came back), the nap running.
    assert wait_until(lambda: _credit_in_use(host) == 0)
    assert not nap.done()

    frozen = _freeze(node)
    try:
        outcomes = [type(call.exception(WAIT)) for call in calls]
        assert outcomes == [z.DeadlineExceededError] * CALLS
        # Stay frozen until the nap's time is over too: on SIGCONT the nap returns at
        # once, and the queued requests' expired timers race its gate.
        while time.monotonic() - frozen < nap_for:
            time.sleep(0.05)  # the length of the freeze itself, not a synchronisation
        assert _peer_ready(host, node)
    finally:
        node.proc.send_signal(signal.SIGCONT)

    assert nap.result(WAIT) == Napped(node.routing_id)
    # The nap and the probe ran; none of the 40.
    assert _ran_after_resume(host, node) == before + 2, node.log()
