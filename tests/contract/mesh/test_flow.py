"""Inbound flow control across meshed Hosts (issue 15 item 6; design/mesh.md §2 "Inbound flow
control", "Backpressure waits, never drops").

A node admits received records against M permits (`inbound_permits`), taken when a record
is received and given back when its handler starts; at 80% in use it tells its senders
PAUSED, at 60% RUNNING. Senders told PAUSED park new messages (they wait, never fail);
replies travel on the completion connection, which is read while paused, so requests in
flight still complete.

R is the receiver with `inbound_permits=10`, its node handler held in `Hold`; S sends to
it. These tests are about the node-wide permits, the last resort against a flood: R lets
one target (its node handler) take all of them (`target_permits=10`; by default one
target holds at most an eighth, test_target_flow.py).
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from zlink_actors import Completion, Host
from zlink_actors.testing import WAIT, HostHarness, wait_until

from .._support import NEGATIVE_WAIT
from ._nodes import (
    MESH,
    Hold,
    Nodes,
    Note,
    Recorder,
    Work,
    mesh_stats,
    probe,
    recording_gate,
)

#: The receiver's permits: PAUSED once 8 records wait for their handler, RUNNING at 6.
PERMITS = 10
#: The receiver's `MeshConfig` options.
RECEIVER = {"inbound_permits": PERMITS, "target_permits": PERMITS}


@pytest.fixture
def nodes(harness: HostHarness) -> Nodes:
    return Nodes(harness)


def _paused(host: Host) -> bool:
    return mesh_stats(host).paused


def _pause(sender: Host, receiver: Host, rec: Recorder, count: int) -> list[Completion[None]]:
    """Hold the receiver's node handler, then send `count` notes until it is PAUSED;
    return the sends' completions."""
    rid = receiver.node.routing_id
    sender.send_to_node(MESH, rid, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)
    sends = [sender.send_to_node(MESH, rid, Note(i)).submit() for i in range(count)]
    assert wait_until(lambda: _paused(receiver))
    return sends


def _until_one_parks(sender: Host, rid: str, first: int) -> list[Completion[None]]:
    """PAUSED reaches the sender on the completion connection a moment after the receiver
    paused; from then on the sender parks each new send: send notes numbered from
    `first`, one at a time, until one waits; return their completions."""
    later: list[Completion[None]] = []

    def a_send_waits() -> bool:
        later.append(sender.send_to_node(MESH, rid, Note(first + len(later))).submit())
        return not later[-1].done()

    assert wait_until(a_send_waits)
    return later


def test_a_receiver_out_of_permits_pauses_and_its_senders_wait_instead_of_failing(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    s = nodes.add()
    r = nodes.add(node_handler=recording_gate(rec), mesh=RECEIVER)
    rid = r.node.routing_id
    first = _pause(s, r, rec, 20)
    later = _until_one_parks(s, rid, 20)
    later += [s.send_to_node(MESH, rid, Note(20 + len(later) + i)).submit() for i in range(5)]
    assert not later[-1].wait(NEGATIVE_WAIT)  # no time limit, no failure: it waits
    assert mesh_stats(s).parked_sends >= 6
    assert all(c.exception() is None for c in [*first, *later] if c.done())
    assert _paused(r)

    rec.latch.set()
    for c in [*first, *later]:
        assert c.wait(WAIT)
        assert c.result() is None
    # The Probe follows every note on the same pipe: each ran once, in order.
    seen = probe(s, rid)
    assert seen == ["hold", *range(20 + len(later))]
    assert wait_until(lambda: not _paused(r))
    assert mesh_stats(r).permits_in_use == 0
    assert mesh_stats(s).parked_sends == 0


def test_a_node_never_holds_more_received_records_than_its_permits(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    s = nodes.add()
    r = nodes.add(node_handler=recording_gate(rec), mesh=RECEIVER)
    sends = _pause(s, r, rec, 40)

    def over() -> bool:
        mesh = mesh_stats(r)
        assert mesh.permits == PERMITS
        return mesh.permits_in_use > PERMITS

    assert not wait_until(over, within=NEGATIVE_WAIT)

    rec.latch.set()
    assert all(c.wait(WAIT) for c in sends)


def test_a_paused_nodes_own_requests_in_flight_still_complete(
    harness: HostHarness, nodes: Nodes
) -> None:
    at_s, at_r = Recorder(harness), Recorder(harness)
    s = nodes.add(node_handler=recording_gate(at_s))
    r = nodes.add(node_handler=recording_gate(at_r), mesh=RECEIVER)
    s_rid = s.node.routing_id

    # R asks S something S's handler holds on to, and then R is paused.
    in_flight = r.request_to_node(MESH, s_rid, Hold(), reply=str).timeout(30.0).submit()
    assert at_s.entered.wait(WAIT)
    _pause(s, r, at_r, 20)

    # S's reply comes back on the completion connection, read while R is paused.
    at_s.latch.set()
    assert in_flight.result(WAIT) == "held"
    # A new request from the paused node makes the whole round trip as well.
    assert r.request_to_node(MESH, s_rid, Work(5), reply=int).timeout(WAIT).submit_sync() == 5
    assert _paused(r)  # R's handler is still held: all of that happened while PAUSED


def test_a_request_to_a_paused_node_waits_and_completes_after_it_resumes(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    s = nodes.add()
    r = nodes.add(node_handler=recording_gate(rec), mesh=RECEIVER)
    sends = _pause(s, r, rec, 20)

    call = s.request_to_node(MESH, r.node.routing_id, Work(9), reply=int).timeout(30.0).submit()
    assert not call.wait(NEGATIVE_WAIT)  # within its deadline it waits, it does not fail

    rec.latch.set()
    assert call.result(WAIT) == 9
    assert all(c.wait(WAIT) and c.exception() is None for c in sends)
    assert wait_until(lambda: not _paused(r))


def test_a_parked_one_way_costs_its_sender_under_half_a_kibibyte(
    harness: HostHarness, nodes: Nodes
) -> None:
    # Issue 26: about 2.5 KiB each before (a concurrent.futures.Future with its
    # Condition per parked message, a closure, a cell with a lock of its own); the
    # envelope and the payload are about 180 bytes of it (benchmarks/parked.py).
    rec = Recorder(harness)
    s = nodes.add()
    r = nodes.add(node_handler=recording_gate(rec), mesh=RECEIVER)
    rid = r.node.routing_id
    first = _pause(s, r, rec, 20)
    later = _until_one_parks(s, rid, 20)
    parked_before = mesh_stats(s).parked_sends
    count = 10_000  # about 1.7 s under tracemalloc on the shared 2-CPU machine
    start = 20 + len(later)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(start, start + count):
            s.send_to_node(MESH, rid, Note(i)).submit()
        each = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert mesh_stats(s).parked_sends == parked_before + count  # every one waits
    # The issue's rule: < 512 bytes. With item 1's resume a parked one-way also stays in
    # `Peer.unacked` until the peer acknowledges it (its cell is that entry too): 469
    # measured, 615 before item 8 (docs/mesh.md).
    assert each < 512, f"{each:.0f} bytes per parked one-way"

    rec.latch.set()
    assert all(c.wait(WAIT) for c in [*first, *later])
    assert wait_until(lambda: mesh_stats(s).parked_sends == 0, within=3 * WAIT)
    seen = probe(s, rid)
    assert seen == ["hold", *range(start + count)]  # each ran once, in order
