"""The MeshNode lifecycle seen from the Host (issue 15 items 2 and 9; design/mesh.md §1
`wait_for_peers`, `connect_peer`, `peers()`, design/mesh.md §2 "Liveness"): waiting for
peers, dialling at run time, the handshake refusing another mesh, both sides READY from
one connection, a peer that shut down (DRAINING, then LOST, never selected again), and
the mesh section of `host.statistics()`."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import ClassVar

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness, wait_until

from .._support import ShutdownThread
from ._mesh import (
    MESH,
    TIMEOUT,
    find_peer,
    mesh_config,
    mesh_hosts,
    peer_state,
    ready_ids,
    wait_for_state,
)


class Ping(msgspec.Struct):
    n: int


class Who(z.ChannelHandler):
    """Answers with the routing id of the node it runs on."""

    @z.handler
    def who(self, ctx: z.ChannelContext, msg: Ping) -> str:
        info: z.NodeInfo = ctx.node
        return info.routing_id


class Waiter(z.ChannelHandler):
    """Calls `host.wait_for_peers` from inside its turn and reports what it raised."""

    host: ClassVar[z.Host | None] = None

    @z.handler
    def wait(self, ctx: z.ChannelContext, msg: Ping) -> str:
        assert Waiter.host is not None
        try:
            Waiter.host.wait_for_peers(0, timeout=1.0)
        except z.InvalidOperationError:
            return "InvalidOperationError"
        return "returned"


class Held(z.NodeHandler):
    """Holds each request until `release` is set (bounded)."""

    entered: ClassVar[threading.Event]
    release: ClassVar[threading.Event]

    @z.handler
    def hold(self, ctx: z.NodeContext, msg: Ping) -> int:
        Held.entered.set()
        assert Held.release.wait(WAIT)
        return msg.n


# -- wait_for_peers ------------------------------------------------------------------------


def test_wait_for_zero_peers_returns_at_once(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config())
    started = time.monotonic()
    assert host.wait_for_peers(0, timeout=60) == []
    assert time.monotonic() - started < WAIT


def test_wait_for_zero_peers_returns_the_ready_ones(harness: HostHarness) -> None:
    a, b = mesh_hosts(harness, 2)
    assert [p.routing_id for p in a.wait_for_peers(0, timeout=60)] == [b.node.routing_id]


def test_wait_for_more_peers_than_ready_raises_deadline_exceeded(harness: HostHarness) -> None:
    a, b = mesh_hosts(harness, 2)
    started = time.monotonic()
    with pytest.raises(z.DeadlineExceededError):
        a.wait_for_peers(2, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < WAIT
    ready = a.wait_for_peers(1, timeout=WAIT)
    assert [p.routing_id for p in ready] == [b.node.routing_id]


def test_wait_for_peers_inside_a_handler_is_an_invalid_operation(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config(), channels={"wait": Waiter})
    Waiter.host = host
    try:
        got = host.request_to_channel("wait", Ping(0), reply=str).submit_sync()
    finally:
        Waiter.host = None
    assert got == "InvalidOperationError"


# -- connect_peer and the handshake --------------------------------------------------------


def test_connect_peer_completes_with_the_peers_info_ready_with_its_channels(
    harness: HostHarness,
) -> None:
    server = harness.host(
        mesh=mesh_config(), channels={"who": z.ChannelServer(Who, weight=7), "w0": Waiter}
    )
    client = harness.host(mesh=mesh_config())
    info = client.connect_peer(server.node.endpoint).result(WAIT)
    assert isinstance(info, z.PeerInfo)
    assert info.routing_id == server.node.routing_id
    assert info.endpoint == server.node.endpoint
    assert info.state is z.PeerState.READY
    assert dict(info.channels) == {"who": 7, "w0": 100}
    assert ready_ids(client) == {server.node.routing_id}


def test_connect_peer_to_another_mesh_fails_unavailable_and_neither_side_lists_the_other(
    harness: HostHarness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zlink_actors.mesh")
    ours = harness.host(mesh=mesh_config("game"))
    theirs = harness.host(mesh=mesh_config("other"))
    with pytest.raises(z.UnavailableError) as caught:
        ours.connect_peer(theirs.node.endpoint).result(WAIT)
    assert caught.value.reason is z.UnavailableReason.UNREACHABLE
    assert peer_state(ours, theirs.node.routing_id) is not z.PeerState.READY
    assert peer_state(theirs, ours.node.routing_id) is not z.PeerState.READY
    assert ready_ids(ours) == set()
    assert ready_ids(theirs) == set()
    with pytest.raises(z.DeadlineExceededError):
        theirs.wait_for_peers(1, timeout=3 * 0.2)
    warned = {r.message for r in caplog.records if r.name == "zlink_actors.mesh"}
    assert any(theirs.node.routing_id in m for m in warned), warned  # the refusal is logged


def test_connect_peer_to_a_peer_already_ready_completes_with_it(harness: HostHarness) -> None:
    a, b = mesh_hosts(harness, 2)
    info = b.connect_peer(a.node.endpoint).result(WAIT)
    assert (info.routing_id, info.state) == (a.node.routing_id, z.PeerState.READY)
    assert len(b.peers()) == 1


def test_connect_peer_to_an_endpoint_where_nothing_listens_fails_unavailable(
    harness: HostHarness,
) -> None:
    host = harness.host(mesh=mesh_config())
    with socket.socket() as s:  # a port nobody listens on: bound here, never listened
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(z.UnavailableError) as caught:
            host.connect_peer(f"tcp://127.0.0.1:{port}").result(WAIT)
        assert caught.value.reason is z.UnavailableReason.UNREACHABLE
    assert time.monotonic() - started < TIMEOUT + WAIT
    assert host.peers() == []


def test_connect_peer_before_start_is_an_invalid_operation_and_after_shutdown_shutting_down(
    harness: HostHarness,
) -> None:
    target = harness.host(mesh=mesh_config())
    host = z.Host(mesh=mesh_config())
    try:
        with pytest.raises(z.InvalidOperationError):
            host.connect_peer(target.node.endpoint).result(WAIT)
        host.start()
    finally:
        assert host.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    with pytest.raises(z.ShuttingDownError):
        host.connect_peer(target.node.endpoint).result(WAIT)


def test_a_duplicate_routing_id_is_refused(harness: HostHarness) -> None:
    a = harness.host(mesh=mesh_config(routing_id="same"))
    b = harness.host(mesh=mesh_config(routing_id="same"))
    with pytest.raises(z.AlreadyExistsError, match="duplicate routing id 'same'"):
        b.connect_peer(a.node.endpoint).result(WAIT)
    assert ready_ids(a) == set()
    assert ready_ids(b) == set()


def test_a_listener_with_a_duplicate_routing_id_is_told_once_however_often_it_is_dialled(
    harness: HostHarness, caplog: pytest.LogCaptureFixture
) -> None:
    # P dials two listeners of one routing id: the one it admits first is "first"; the
    # other admits P (it cannot know), P refuses its ADMIT and tells it so; P's `peers=`
    # keeper dials it again and again with its back-off (0.05, 0.1, 0.2 ... s).
    caplog.set_level(logging.WARNING)
    fast = mesh_config(routing_id="dup", liveness_interval=0.05)
    a, b = harness.host(mesh=fast), harness.host(mesh=fast)
    p = harness.host(
        mesh=mesh_config(liveness_interval=0.05, peers=(a.node.endpoint, b.node.endpoint))
    )
    rid = p.node.routing_id
    assert wait_for_state(p, "dup", z.PeerState.READY)
    first, newcomer = (a, b) if find_peer(p, "dup").endpoint == a.node.endpoint else (b, a)

    def lost(host: z.Host) -> int:
        mesh = host.statistics().mesh
        assert mesh is not None
        return mesh.lost_peers

    assert wait_until(lambda: lost(newcomer) >= 5, WAIT)  # the first dial and 4 redials
    assert wait_for_state(newcomer, rid, z.PeerState.LOST)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, warned  # not a "peer LOST" at each redial
    assert (
        sum(f"peer {rid} refused this node: duplicate routing id 'dup'" in m for m in warned) == 1
    )
    assert sum(f"connection to {newcomer.node.endpoint} failed" in m for m in warned) == 1
    # The first node and P never lost each other.
    assert (find_peer(p, "dup").state, find_peer(p, "dup").endpoint) == (
        z.PeerState.READY,
        first.node.endpoint,
    )
    assert peer_state(first, rid) is z.PeerState.READY
    assert lost(first) == lost(p) == 0


def test_a_node_dialling_its_own_endpoint_is_refused(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config())
    with pytest.raises(z.UnavailableError):
        host.connect_peer(host.node.endpoint).result(WAIT)
    assert ready_ids(host) == set()


def test_a_restart_with_the_same_fixed_routing_id_replaces_the_lost_entry(
    harness: HostHarness,
) -> None:
    Held.entered, Held.release = threading.Event(), harness.latch()
    Held.release.set()  # answer at once
    stay = harness.host(mesh=mesh_config(), message_types=[Ping])
    first = harness.host(mesh=mesh_config(routing_id="zone-1", peers=(stay.node.endpoint,)))
    assert wait_for_state(stay, "zone-1", z.PeerState.READY)
    assert first.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(stay, "zone-1", z.PeerState.LOST)
    again = harness.host(
        mesh=mesh_config(routing_id="zone-1", peers=(stay.node.endpoint,)), node_handler=Held
    )
    assert wait_for_state(stay, "zone-1", z.PeerState.READY)
    entry = find_peer(stay, "zone-1")
    assert entry.endpoint == again.node.endpoint != first.node.endpoint
    assert [p.routing_id for p in stay.peers()] == ["zone-1"]
    assert stay.request_to_node(MESH, "zone-1", Ping(9), reply=int).submit_sync() == 9


def test_both_sides_see_each_other_ready_after_one_side_dialled(harness: HostHarness) -> None:
    listener = harness.host(mesh=mesh_config())  # never dials
    dialler = harness.host(mesh=mesh_config(peers=(listener.node.endpoint,)))
    seen = listener.wait_for_peers(1, timeout=WAIT)
    assert [p.routing_id for p in seen] == [dialler.node.routing_id]
    assert seen[0].endpoint == dialler.node.endpoint
    assert [p.routing_id for p in dialler.wait_for_peers(1, timeout=WAIT)] == [
        listener.node.routing_id
    ]


@pytest.mark.parametrize("round_", range(3))
def test_two_nodes_dialling_each_other_at_once_keep_one_ready_entry_each(
    harness: HostHarness, round_: int
) -> None:
    Held.entered, Held.release = threading.Event(), harness.latch()
    Held.release.set()  # answer at once
    a = harness.host(mesh=mesh_config(), node_handler=Held)
    b = harness.host(mesh=mesh_config(), node_handler=Held)
    barrier = threading.Barrier(2)
    done: dict[str, z.Completion[z.PeerInfo]] = {}

    def dial(name: str, host: z.Host, other: z.Host) -> None:
        barrier.wait(WAIT)
        done[name] = host.connect_peer(other.node.endpoint)

    threads = [
        threading.Thread(target=dial, args=("a", a, b)),
        threading.Thread(target=dial, args=("b", b, a)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert done["a"].result(WAIT).routing_id == b.node.routing_id
    assert done["b"].result(WAIT).routing_id == a.node.routing_id
    for host, other in ((a, b), (b, a)):
        assert [(p.routing_id, p.state) for p in host.peers()] == [
            (other.node.routing_id, z.PeerState.READY)
        ]
        rid = other.node.routing_id
        for i in range(5):
            assert host.request_to_node(MESH, rid, Ping(i), reply=int).submit_sync() == i
    assert b.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(a, b.node.routing_id, z.PeerState.LOST)
    assert len(a.peers()) == 1


def test_a_peer_that_shut_down_is_listed_lost(harness: HostHarness) -> None:
    a, b = mesh_hosts(harness, 2)
    rid = b.node.routing_id
    assert b.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(a, rid, z.PeerState.LOST)
    assert find_peer(a, rid).endpoint == b.node.endpoint  # still known


def test_a_peer_that_shuts_down_is_draining_then_lost_and_never_selected_again(
    harness: HostHarness,
) -> None:
    Held.entered, Held.release = threading.Event(), harness.latch()
    stay, leave, caller = mesh_hosts(
        harness,
        3,
        each=[
            {"channels": {"who": Who}},
            {"channels": {"who": Who}, "node_handler": Held},
            {"message_types": [Ping]},
        ],
    )
    gone = leave.node.routing_id
    held = caller.request_to_node(MESH, gone, Ping(5), reply=int).timeout(WAIT).submit()
    assert Held.entered.wait(WAIT)
    stopping = ShutdownThread(leave, WAIT)
    # its handler is held, so its shutdown cannot finish: it stays DRAINING meanwhile
    assert wait_for_state(caller, gone, z.PeerState.DRAINING)
    stats = caller.statistics().mesh
    assert stats is not None
    assert (stats.peers.get("ready"), stats.peers.get("draining")) == (1, 1)
    picked = {caller.request_to_channel("who", Ping(i), reply=str).submit_sync() for i in range(20)}
    assert picked == {stay.node.routing_id}
    Held.release.set()
    assert held.result(WAIT) == 5  # accepted work finished while draining
    assert stopping.join().outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(caller, gone, z.PeerState.LOST)
    picked = {caller.request_to_channel("who", Ping(i), reply=str).submit_sync() for i in range(20)}
    assert picked == {stay.node.routing_id}


# -- discovery through a Location Store ------------------------------------------------------


def _descriptor_keys(store: z.MemoryLocationStore) -> list[str]:
    page = asyncio.run(store.scan(""))
    assert page.cursor is None
    return [key for key, _ in page.items]


def test_nodes_sharing_a_location_store_find_each_other_and_withdraw_at_shutdown(
    harness: HostHarness,
) -> None:
    store = z.MemoryLocationStore()
    try:
        a = harness.host(mesh=mesh_config(), location=store)
        b = harness.host(mesh=mesh_config(), location=store)
        # polled about once a second; the lower routing id leaves the dial to the other
        assert [p.routing_id for p in a.wait_for_peers(1, timeout=3 * WAIT)] == [b.node.routing_id]
        assert [p.routing_id for p in b.wait_for_peers(1, timeout=WAIT)] == [a.node.routing_id]
        gone = b.node.routing_id
        assert any(gone in key for key in _descriptor_keys(store))
        assert b.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
        assert wait_until(lambda: not any(gone in key for key in _descriptor_keys(store)))
        assert wait_for_state(a, gone, z.PeerState.LOST)
    finally:
        harness.close()
        store.close()


# -- statistics().mesh (item 9) -----------------------------------------------------------


def test_statistics_mesh_is_none_without_a_mesh(harness: HostHarness) -> None:
    assert harness.host().statistics().mesh is None


def test_statistics_mesh_counts_peers_by_state_frames_and_lost_peers(
    harness: HostHarness,
) -> None:
    a, b, c = mesh_hosts(
        harness, 3, each=[{"channels": {"who": Who}}, {}, {}], message_types=[Ping]
    )
    first = a.statistics().mesh
    assert isinstance(first, z.MeshStatistics)
    assert first.routing_id == a.node.routing_id
    assert first.peers.get("ready") == 2
    assert first.lost_peers == 0
    for i in range(10):
        assert b.request_to_channel("who", Ping(i), reply=str).submit_sync()
    second = a.statistics().mesh
    assert second is not None
    assert second.frames_in > first.frames_in
    assert second.frames_out > first.frames_out
    assert c.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(a, c.node.routing_id, z.PeerState.LOST)
    third = a.statistics().mesh
    assert third is not None
    assert third.peers.get("ready") == 1
    assert third.peers.get("lost") == 1
    assert third.lost_peers == 1
