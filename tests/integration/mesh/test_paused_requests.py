"""Requests in flight to a peer that goes silent stay pending within their deadline and
get their real outcome if it resumes (issue 26 item 2, its last sentence; docs/mesh.md
"Requests across a pause").

This process is the caller (a Host of the mesh); the receiver is a node process whose
channel handler logs the number of every `Job` it runs (`JobLog`). The receiver is
frozen with SIGSTOP past the liveness timeout (1.0 s), so the caller finds it silent
(LOST) and it resumes with the same lifecycle: requests whose deadline outlives the pause
end with their reply, each run once; those whose deadline is shorter end
`DeadlineExceededError` and never run. A receiver killed (its connection closes) still
fails its requests at once with `PEER_LOST`.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from .messages import ALL_TYPES, Done, Job, JobLog, Nap, Napped
from .node_main import Control
from .nodes import FAST, NodeProcess, NodeProcesses, wait_until
from .test_deadlines import _credit_in_use, _freeze

MESH = "game"
#: Requests per test.
CALLS = 40
#: How long the receiver stays frozen (from when it stopped), past `liveness_timeout`.
PAUSE = 2.0
#: A deadline that outlives the pause (and the resume that follows it).
LONG = 8.0
#: Deadlines longer than the liveness timeout but shorter than the pause.
SHORT = 1.5


def _start(harness: HostHarness, nodes: NodeProcesses, dialler: str) -> tuple[z.Host, NodeProcess]:
    """The caller and the receiver, connected; `dialler` is the side that dials (the
    connection a silent peer's loss closes is the dialler's)."""
    mesh: dict[str, Any] = {**FAST, "peer_expiry": 30.0}
    if dialler == "caller":
        node = nodes.start(channels={"work": 100}, **mesh)
        config = z.MeshConfig(MESH, peers=(node.endpoint,), **mesh)
        host = harness.host(mesh=config, node_handler=Control, message_types=ALL_TYPES)
    else:
        config = z.MeshConfig(MESH, **mesh)
        host = harness.host(mesh=config, node_handler=Control, message_types=ALL_TYPES)
        node = nodes.start(peers=[host.node.endpoint], channels={"work": 100}, **mesh)
        nodes.joined(node)
    host.wait_for_peers(1, timeout=WAIT)
    # Warm: a few requests answered (a heartbeat sample of each clock on both sides).
    for i in range(5):
        assert _job(host, -1 - i, WAIT).result(WAIT) == Done(-1 - i, node.routing_id)
    return host, node


def _job(host: z.Host, n: int, timeout: float) -> z.Completion[Any]:
    return host.request_to_channel("work", Job(n), reply=Done).timeout(timeout).submit()


def _state(host: z.Host, node: NodeProcess) -> z.PeerState | None:
    return next((p.state for p in host.peers() if p.routing_id == node.routing_id), None)


def _jobs_run(host: z.Host, node: NodeProcess) -> list[int]:
    call = host.request_to_node(MESH, node.routing_id, JobLog(), reply=list[int])
    ran: list[int] = call.timeout(WAIT).submit_sync()
    return ran


def _pause_past_liveness(host: z.Host, node: NodeProcess, frozen: float) -> None:
    """While `node` is frozen (since `frozen`): wait until the caller finds it silent,
    then until the pause has lasted `PAUSE`, and resume it."""
    try:
        assert wait_until(lambda: _state(host, node) is z.PeerState.LOST, WAIT)
        left = PAUSE - (time.monotonic() - frozen)
        if left > 0:
            time.sleep(left)  # the length of the pause itself, not a synchronisation
    finally:
        node.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("dialler", ["caller", "receiver"])
@pytest.mark.parametrize("where", ["sockets", "queue"])
def test_requests_in_flight_across_a_sigstop_get_their_reply_each_run_once(
    where: str, dialler: str, harness: HostHarness, nodes: NodeProcesses
) -> None:
    """sockets: sent after the receiver froze (they wait in socket buffers); queue:
    admitted at the receiver behind a handler that naps, before it froze (they run, and
    are answered, after it resumes)."""
    host, node = _start(harness, nodes, dialler)
    nap = None
    if where == "queue":
        nap = host.request_to_channel("work", Nap(0.3), reply=Napped).timeout(LONG).submit()
        calls = [_job(host, i, LONG) for i in range(CALLS)]
        # Everything admitted at the receiver (their credit came back), the nap running.
        assert wait_until(lambda: _credit_in_use(host) == 0)
        frozen = _freeze(node)
    else:
        frozen = _freeze(node)
        calls = [_job(host, i, LONG) for i in range(CALLS)]
    _pause_past_liveness(host, node, frozen)
    assert all(not call.done() for call in calls)  # none failed while it was away

    outcomes = [call.exception(LONG + WAIT) or call.result() for call in calls]
    assert outcomes == [Done(i, node.routing_id) for i in range(CALLS)]
    if nap is not None:
        assert nap.result(WAIT) == Napped(node.routing_id)
    ran = [n for n in _jobs_run(host, node) if n >= 0]
    assert sorted(ran) == list(range(CALLS)), ran  # each once
    mesh = host.statistics().mesh
    assert mesh is not None
    assert mesh.unavailable == {}


@pytest.mark.parametrize("dialler", ["caller", "receiver"])
def test_requests_whose_deadline_ends_during_a_sigstop_end_deadline_exceeded_and_never_run(
    dialler: str, harness: HostHarness, nodes: NodeProcesses
) -> None:
    host, node = _start(harness, nodes, dialler)
    frozen = _freeze(node)
    calls = [_job(host, i, SHORT) for i in range(CALLS)]
    try:
        outcomes = [type(call.exception(WAIT)) for call in calls]
        # Past the liveness timeout (1.0 s), found silent: still their deadline decides.
        assert outcomes == [z.DeadlineExceededError] * CALLS
        assert _state(host, node) is z.PeerState.LOST
    finally:
        _pause_past_liveness(host, node, frozen)

    assert wait_until(lambda: _state(host, node) is z.PeerState.READY, 3 * WAIT)
    # A later request to the same channel (FIFO) is answered: none of the 40 ran first.
    assert _job(host, CALLS, WAIT).result(WAIT) == Done(CALLS, node.routing_id)
    assert [n for n in _jobs_run(host, node) if n >= 0] == [CALLS]


@pytest.mark.parametrize("dialler", ["caller", "receiver"])
def test_requests_to_a_killed_receiver_still_fail_at_once_with_peer_lost(
    dialler: str, harness: HostHarness, nodes: NodeProcesses
) -> None:
    """Its connection closes (not silence): in flight, they fail within milliseconds."""
    host, node = _start(harness, nodes, dialler)
    nap = host.request_to_channel("work", Nap(LONG), reply=Napped).timeout(LONG).submit()
    calls = [nap, *(_job(host, i, LONG) for i in range(CALLS))]
    assert wait_until(lambda: _credit_in_use(host) == 0)
    killed = time.monotonic()
    node.proc.send_signal(signal.SIGKILL)
    errors = [call.exception(WAIT) for call in calls]
    took = time.monotonic() - killed
    assert all(isinstance(e, z.UnavailableError) for e in errors), errors
    assert {e.reason for e in errors if isinstance(e, z.UnavailableError)} == {
        z.UnavailableReason.PEER_LOST
    }
    assert took < FAST["liveness_timeout"] / 2, took  # the close, not the silence


def test_cancelling_or_shutting_down_the_caller_ends_a_request_waiting_for_a_silent_peer(
    harness: HostHarness, nodes: NodeProcesses
) -> None:
    host, node = _start(harness, nodes, "caller")
    frozen = _freeze(node)
    try:
        cancelled = _job(host, 0, LONG)
        kept = _job(host, 1, LONG)
        assert wait_until(lambda: _state(host, node) is z.PeerState.LOST, WAIT)
        assert not cancelled.done()
        assert not kept.done()
        # Calls made while it is silent fail at once (they never left); a channel it
        # served has no READY server now.
        late = host.request_to_node(MESH, node.routing_id, JobLog(), reply=list[int])
        with pytest.raises(z.UnavailableError) as caught:
            late.timeout(LONG).submit().result(0.5)
        assert caught.value.reason is z.UnavailableReason.PEER_PAUSED
        with pytest.raises(z.NotFoundError):
            _job(host, 2, LONG).result(0.5)
        assert cancelled.cancel()
        with pytest.raises(z.CancelledError):
            cancelled.result(0.5)
        started = time.monotonic()
        host.shutdown(LONG)
        assert time.monotonic() - started < 2 * FAST["liveness_timeout"]
        assert isinstance(kept.exception(0), z.ShuttingDownError)
        assert time.monotonic() - frozen < LONG  # ended by shutdown, not its deadline
    finally:
        node.proc.send_signal(signal.SIGCONT)
