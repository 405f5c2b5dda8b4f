"""RouteMesh across real processes (issue 15, items 2-5 and 8): two node processes and
this process as a third Host, over tcp and ipc loopback; SIGKILL of a peer with requests
in flight and sends waiting; a restarted node; payloads up to 1 MiB; a clean stop that
drains."""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
import re
import signal
import threading
import time
from typing import Any

import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from .messages import (
    ALL_TYPES,
    Blob,
    Count,
    Done,
    Echoed,
    HowMany,
    Job,
    Load,
    Nap,
    Napped,
    Ping,
    Pong,
    Relay,
    SetWeight,
    Stats,
    StatsReply,
)
from .node_main import Control
from .nodes import FAST, NodeProcess, NodeProcesses, wait_until

MESH = "game"
#: What a loaded machine may add to `liveness_timeout` before a lost peer's calls end:
#: the next liveness tick, the I/O thread's wake-up and the dispatcher hop.
LOSS_MARGIN = 1.0
#: The test Host's `peer_expiry` where a frozen peer must expire within the test.
EXPIRY = 3.0
_RID = re.compile(r"node-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def _test_host(harness: HostHarness, listen: str = "tcp://127.0.0.1:0", **mesh: Any) -> z.Host:
    """This process's Host: a node of the mesh with the same node handler as the nodes."""
    config = z.MeshConfig(MESH, listen=listen, **{**FAST, **mesh})
    return harness.host(mesh=config, node_handler=Control, message_types=ALL_TYPES)


def _ask(
    host: z.Host, node: NodeProcess | str, msg: object, reply: type, timeout: float = WAIT
) -> Any:
    rid = node if isinstance(node, str) else node.routing_id
    return host.request_to_node(MESH, rid, msg, reply=reply).timeout(timeout).submit_sync()


def _stats(host: z.Host, node: NodeProcess) -> StatsReply:
    stats: StatsReply = _ask(host, node, Stats(), StatsReply)
    return stats


def _credit_in_use(host: z.Host) -> int:
    mesh = host.statistics().mesh
    assert mesh is not None
    return mesh.credit_in_use


def _peer_state(host: z.Host, rid: str) -> z.PeerState | None:
    for peer in host.peers():
        if peer.routing_id == rid:
            return peer.state
    return None


def _peer_weight(host: z.Host, rid: str, channel: str) -> int | None:
    for peer in host.peers():
        if peer.routing_id == rid:
            return peer.channels.get(channel)
    return None


class _Ends:
    """Records, per completion, every time its done-callback ran and when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: dict[int, list[float]] = {}

    def watch(self, completion: z.Completion[Any]) -> z.Completion[Any]:
        key = id(completion)
        with self._lock:
            self.calls[key] = []

        def ended(_: z.Completion[Any]) -> None:
            with self._lock:
                self.calls[key].append(time.monotonic())

        completion.add_done_callback(ended)
        return completion

    def of(self, completion: z.Completion[Any]) -> list[float]:
        with self._lock:
            return list(self.calls[id(completion)])


def _listen(kind: str, ipc_dir: pathlib.Path, name: str) -> str:
    return "tcp://127.0.0.1:0" if kind == "tcp" else f"ipc://{ipc_dir}/{name}"


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
def test_two_node_processes_and_this_host_call_each_other_directly_and_by_channel(
    kind: str, harness: HostHarness, nodes: NodeProcesses, ipc_dir: pathlib.Path
) -> None:
    host = _test_host(harness, _listen(kind, ipc_dir, "host"))
    a = nodes.start(
        listen=_listen(kind, ipc_dir, "a"), peers=[host.node.endpoint], channels={"work": 100}
    )
    b = nodes.start(
        listen=_listen(kind, ipc_dir, "b"),
        peers=[host.node.endpoint, a.endpoint],
        channels={"work": 100},
    )
    nodes.joined(a, b)
    ready = host.wait_for_peers(2, timeout=WAIT)
    assert {(p.routing_id, p.endpoint) for p in ready} == {
        (a.routing_id, a.endpoint),
        (b.routing_id, b.endpoint),
    }
    if kind == "ipc":
        assert a.endpoint == f"ipc://{ipc_dir}/a"  # advertised as given
    # Both sides of every pair see each other READY (A admitted B before B joined).
    me = host.node.routing_id
    assert set(a.ready_peers) == {me}
    assert set(b.ready_peers) == {me, a.routing_id}
    for node, others in ((a, {me, b.routing_id}), (b, {me, a.routing_id})):
        peers = _stats(host, node).peers
        assert {rid for rid, state in peers.items() if state == "ready"} == others, peers
    for node in (a, b):
        assert _RID.fullmatch(node.routing_id)
        assert _ask(host, node, Ping(41), Pong) == Pong(42, node.routing_id)
    # Node process to node process, both ways (this Host asks one to call the other).
    for src, dst in ((a, b), (b, a)):
        echoed = _ask(host, src, Relay(dst.routing_id, b"across"), Echoed)
        assert (echoed.routing_id, echoed.data) == (dst.routing_id, b"across")
    # Select-one over the two processes' channel servers (this Host serves none).
    served: dict[str, int] = {a.routing_id: 0, b.routing_id: 0}
    for i in range(40):
        done = host.request_to_channel("work", Job(i), reply=Done).timeout(WAIT).submit_sync()
        assert done.n == i
        served[done.routing_id] += 1
    assert served[a.routing_id] >= 1, served
    assert served[b.routing_id] >= 1, served
    for node in (a, b):
        assert _ask(host, node, HowMany(), Count).handled == served[node.routing_id]
    # One-way sends complete at admission here; every one is handled exactly once there.
    for _ in range(10):
        assert host.send_to_channel("work", Load(b"x")).submit_sync() is None
    assert wait_until(lambda: sum(_ask(host, n, HowMany(), Count).handled for n in (a, b)) >= 50)
    assert sum(_ask(host, n, HowMany(), Count).handled for n in (a, b)) == 50
    for node in (a, b):
        assert node.stop() == 0, node.log()
        assert node.gone()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_lost_peer_ends_requests_in_flight_and_waiting_sends_once_and_the_survivor_serves(
    sig: signal.Signals, harness: HostHarness, nodes: NodeProcesses
) -> None:
    """killed: its sockets close (found at once); frozen (SIGSTOP): it just goes silent,
    found by the liveness probes after `liveness_timeout`."""
    window = 8 * 1024
    # A small window on both sides (so the sends wait whichever side's window binds).
    host = _test_host(harness, credit_window=window, peer_expiry=EXPIRY)
    a = nodes.launch(
        peers=[host.node.endpoint], channels={"work": 100}, lane_items=4, credit_window=window
    )
    b = nodes.launch(peers=[host.node.endpoint], channels={"work": 0})
    nodes.ready(a, b)
    nodes.joined(a, b)
    host.wait_for_peers(2, timeout=WAIT)
    ends = _Ends()
    # B serves the channel with weight 0: everything below goes to A. A's channel
    # handler naps on the first request; the other three fill its lane (4 items).
    requests = [
        ends.watch(host.request_to_channel("work", Nap(60), reply=Napped).timeout(30).submit())
        for _ in range(4)
    ]
    # A node-direct request whose handler naps too.
    requests.append(
        ends.watch(
            host.request_to_node(MESH, a.routing_id, Nap(60), reply=Napped).timeout(30).submit()
        )
    )
    # All their credit is back: A admitted every one of them into its queues.
    assert wait_until(lambda: _credit_in_use(host) == 0)
    assert not any(c.done() for c in requests), [c.exception() for c in requests if c.done()]
    # From now on A admits nothing (its lane is full, its handler naps), so no credit
    # comes back: the sends that got credit complete at once, the rest wait here.
    sends = [
        ends.watch(host.send_to_channel("work", Load(b"s" * 1024)).submit()) for _ in range(40)
    ]
    admitted = [c for c in sends if c.done()]
    waiting = [c for c in sends if not c.done()]
    assert admitted
    assert all(c.exception() is None for c in admitted)
    assert len(waiting) >= 30
    parked = host.statistics().mesh
    assert parked is not None
    assert parked.parked_sends == len(waiting)
    # B becomes a server of the channel for the calls after the kill.
    assert _ask(host, b, SetWeight("work", 100), int) == 100
    assert wait_until(lambda: _peer_weight(host, b.routing_id, "work") == 100)
    assert not any(c.done() for c in requests + waiting)

    killed = time.monotonic()
    a.proc.send_signal(sig)
    bound = FAST["liveness_timeout"] + LOSS_MARGIN
    # Killed: its connections closed, it is gone. Frozen: it went silent, it may be back.
    why = (
        z.UnavailableReason.PEER_LOST if sig is signal.SIGKILL else z.UnavailableReason.PEER_PAUSED
    )
    # Killed, its requests in flight end at once; frozen, they wait for it within their
    # deadline (it may resume: docs/mesh.md "Requests across a pause") and end
    # PEER_LOST at `peer_expiry`. The sends held back here for its full channel
    # stay while it may come back with the same lifecycle and resume (a lost
    # connection does not tell a killed process from a frozen one), and end PEER_LOST
    # (never sent) at `peer_expiry`; those still parked for credit end at once.
    prompt = requests if sig is signal.SIGKILL else []
    for call in prompt:
        exc = call.exception(bound + WAIT)
        assert isinstance(exc, z.UnavailableError), call
        assert exc.reason is why, (call, exc)
    for call in prompt:
        assert wait_until(lambda call=call: len(ends.of(call)) >= 1)
        assert ends.of(call)[0] - killed < bound, ends.of(call)[0] - killed
    assert wait_until(lambda: _peer_state(host, a.routing_id) is z.PeerState.LOST, bound + WAIT)
    if sig is signal.SIGSTOP:
        assert not any(call.done() for call in requests)
    held = [call for call in waiting if not call.done()]
    assert held  # held back for the full channel: not failed while A may resume
    for call in waiting:
        exc = call.exception(EXPIRY + bound + WAIT)
        assert isinstance(exc, z.UnavailableError), call
        late = call in held
        assert exc.reason is (z.UnavailableReason.PEER_LOST if late else why), (call, exc)
        if late:
            assert wait_until(lambda call=call: len(ends.of(call)) >= 1)
            assert ends.of(call)[0] - killed > EXPIRY, ends.of(call)[0] - killed
    for call in requests if sig is signal.SIGSTOP else []:
        exc = call.exception(EXPIRY + bound + WAIT)
        assert isinstance(exc, z.UnavailableError), call
        assert exc.reason is z.UnavailableReason.PEER_LOST, (call, exc)
        assert ends.of(call)[0] - killed > EXPIRY, ends.of(call)[0] - killed
    why = z.UnavailableReason.PEER_LOST  # expired: it never resumes now

    # The next 20 requests to the channel all go to B and succeed; nothing of what A
    # had was replayed to B (its count is exactly 20).
    for i in range(20):
        done = host.request_to_channel("work", Job(i), reply=Done).timeout(WAIT).submit_sync()
        assert done == Done(i, b.routing_id)
    assert _ask(host, b, HowMany(), Count) == Count(20, b.routing_id)
    # Every call ended exactly once.
    for call in requests + sends:
        assert len(ends.of(call)) == 1, (call, ends.of(call))
    with pytest.raises(z.UnavailableError) as caught:  # a LOST routing id stays known
        _ask(host, a, Ping(1), Pong)
    assert caught.value.reason is why
    a.kill()  # (frozen: SIGKILL ends a stopped process too)
    assert a.gone()


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_restarted_node_has_a_new_routing_id_and_answers_its_first_request(
    how: str, harness: HostHarness, nodes: NodeProcesses
) -> None:
    host = _test_host(harness)
    first = nodes.start(peers=[host.node.endpoint])
    nodes.joined(first)
    host.wait_for_peers(1, timeout=WAIT)
    assert _ask(host, first, Ping(1), Pong) == Pong(2, first.routing_id)
    if how == "killed":
        first.kill()
    else:
        assert first.stop() == 0, first.log()
    assert first.gone()
    assert wait_until(lambda: _peer_state(host, first.routing_id) is z.PeerState.LOST)

    second = nodes.start(peers=[host.node.endpoint])
    assert second.routing_id != first.routing_id
    assert _RID.fullmatch(second.routing_id)
    nodes.joined(second)  # READY there
    assert wait_until(lambda: _peer_state(host, second.routing_id) is z.PeerState.READY)
    # The first request once it is READY (on both sides) succeeds: no retry.
    assert _ask(host, second, Ping(7), Pong) == Pong(8, second.routing_id)
    with pytest.raises(z.UnavailableError):
        _ask(host, first, Ping(1), Pong)


def test_payloads_up_to_1_mib_cross_processes_intact(
    harness: HostHarness, nodes: NodeProcesses
) -> None:
    host = _test_host(harness)
    a = nodes.start(peers=[host.node.endpoint])
    b = nodes.start(peers=[host.node.endpoint, a.endpoint])
    nodes.joined(a, b)
    host.wait_for_peers(2, timeout=WAIT)
    assert wait_until(lambda: _stats(host, a).peers.get(b.routing_id) == "ready")
    rng = random.Random(15)
    for size in (1, 4 * 1024, 256 * 1024, 1024 * 1024):
        data = rng.randbytes(size)
        digest = hashlib.sha256(data).hexdigest()
        # This process -> A and back.
        echoed = _ask(host, a, Blob(data), Echoed)
        assert (echoed.sha256, echoed.size, echoed.routing_id) == (digest, size, a.routing_id)
        assert hashlib.sha256(echoed.data).hexdigest() == digest
        # This process -> A -> B and back: between the two node processes.
        relayed = _ask(host, a, Relay(b.routing_id, data), Echoed)
        assert (relayed.sha256, relayed.size, relayed.routing_id) == (digest, size, b.routing_id)
        assert hashlib.sha256(relayed.data).hexdigest() == digest


def test_a_node_that_stops_drains_finishes_accepted_work_and_says_goodbye(
    harness: HostHarness, nodes: NodeProcesses
) -> None:
    host = _test_host(harness)
    a = nodes.launch(peers=[host.node.endpoint], channels={"work": 100})
    b = nodes.launch(peers=[host.node.endpoint], channels={"work": 0})
    nodes.ready(a, b)
    nodes.joined(a, b)
    host.wait_for_peers(2, timeout=WAIT)
    # A request running on A's channel handler when A begins to stop: accepted work,
    # which A's shutdown lets finish.
    nap = host.request_to_channel("work", Nap(1.5, through_stop=True), reply=Napped)
    napping = nap.timeout(WAIT).submit()
    assert wait_until(lambda: _stats(host, a).napping == 1)
    assert _ask(host, b, SetWeight("work", 100), int) == 100
    assert wait_until(lambda: _peer_weight(host, b.routing_id, "work") == 100)
    assert a.proc.stdin is not None
    a.proc.stdin.close()  # A begins to shut down
    assert wait_until(lambda: _peer_state(host, a.routing_id) is z.PeerState.DRAINING)
    # While A drains it is never selected (its weight is still 100): all go to B.
    for i in range(20):
        done = host.request_to_channel("work", Job(i), reply=Done).timeout(WAIT).submit_sync()
        assert done.routing_id == b.routing_id
    with pytest.raises(z.UnavailableError) as caught:  # DRAINING: not READY for node calls
        _ask(host, a, Ping(1), Pong)
    assert caught.value.reason is z.UnavailableReason.DRAINING
    assert napping.result(WAIT) == Napped(a.routing_id)  # its accepted work finished
    assert a.stop() == 0, a.log()
    last = json.loads(a.lines[-1])
    assert (last["stopped"], last["reason"]) == ("stopped", "requested")
    # It said goodbye: LOST without waiting for the liveness timeout.
    assert wait_until(lambda: _peer_state(host, a.routing_id) is z.PeerState.LOST)
    assert _ask(host, b, HowMany(), Count) == Count(20, b.routing_id)
    assert a.gone()


def _parked(host: z.Host) -> int:
    mesh = host.statistics().mesh
    assert mesh is not None
    return mesh.parked_sends


def test_the_receivers_credit_window_governs_what_a_sender_has_in_flight(
    harness: HostHarness, nodes: NodeProcesses
) -> None:
    window = 8 * 1024
    host = _test_host(harness)  # the default window (16 MiB) here
    a = nodes.start(
        peers=[host.node.endpoint], channels={"work": 100}, lane_items=2, credit_window=window
    )
    nodes.joined(a)
    host.wait_for_peers(1, timeout=WAIT)
    # A's channel handler naps and its lane (2 items) fills: A admits nothing more, so
    # what it received holds its credit.
    nap = host.request_to_channel("work", Nap(60), reply=Napped).timeout(30).submit()
    assert wait_until(lambda: _stats(host, a).napping == 1)
    sends = [host.send_to_channel("work", Load(b"w" * 1024)).submit() for _ in range(40)]
    # (No request to A now: it would queue behind the parked sends, FIFO per peer.)
    assert wait_until(lambda: _parked(host) >= 1)
    mesh = host.statistics().mesh
    assert mesh is not None
    # A grants each sender 8 KiB: this Host may have no more than that in flight to it,
    # so most of the 40 KiB wait here.
    assert mesh.credit_in_use <= window, mesh
    assert not all(c.done() for c in sends), mesh
    assert not nap.done()
