"""Channel select-one across the mesh (issue 15 item 4; design/mesh.md §1 `ChannelServer`,
`set_channel_weight`, design/mesh.md §2 "No resend, no re-pick"): smooth weighted round
robin over every READY server (this node included), the weights' shares over many calls,
weight 0, weight changes at run time here and on peers, no server -> `NotFoundError`, a
Host that serves nothing calling its peers, and `ctx.sender` in a `ChannelContext`."""

from __future__ import annotations

import threading
from collections import Counter
from typing import ClassVar

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness, HostOptions, wait_until

from ._mesh import find_peer, mesh_config, mesh_hosts, wait_for_state


class Ping(msgspec.Struct):
    n: int


class Who(z.ChannelHandler):
    """Answers with the routing id of its node; one-way messages are counted by node."""

    sent: ClassVar[Counter[str]] = Counter()
    lock: ClassVar[threading.Lock] = threading.Lock()

    @z.handler
    def who(self, ctx: z.ChannelContext, msg: Ping) -> str:
        info: z.NodeInfo = ctx.node
        return info.routing_id

    @z.handler
    def note(self, ctx: z.ChannelContext, msg: str) -> None:
        info: z.NodeInfo = ctx.node
        with Who.lock:
            Who.sent[info.routing_id] += 1


class Sender(z.ChannelHandler):
    @z.handler
    def sender(self, ctx: z.ChannelContext, msg: Ping) -> str | None:
        return ctx.sender


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    Who.sent = Counter()


def _picks(host: z.Host, n: int, channel: str = "who") -> Counter[str]:
    """Which node answered each of `n` sequential requests from `host`."""
    return Counter(
        host.request_to_channel(channel, Ping(i), reply=str).submit_sync() for i in range(n)
    )


CLIENT: HostOptions = {"message_types": [Ping]}


def _server(weight: int = 100) -> HostOptions:
    return {"channels": {"who": z.ChannelServer(Who, weight=weight)}}


# -- select-one and the weights -------------------------------------------------------------


def test_select_one_picks_among_three_hosts_this_node_included(harness: HostHarness) -> None:
    hosts = mesh_hosts(harness, 3, each=[_server(), _server(), _server()])
    picks = _picks(hosts[0], 300)
    assert set(picks) == {h.node.routing_id for h in hosts}
    for rid, count in picks.items():
        assert 70 <= count <= 130, (rid, picks)


def test_equal_weights_share_400_requests_35_to_65_percent_each(harness: HostHarness) -> None:
    first, second, client = mesh_hosts(harness, 3, each=[_server(), _server(), CLIENT])
    picks = _picks(client, 400)
    assert sum(picks.values()) == 400
    for host in (first, second):
        assert 140 <= picks[host.node.routing_id] <= 260, picks


def test_weights_300_to_100_put_65_to_85_percent_of_800_on_the_first(
    harness: HostHarness,
) -> None:
    heavy, light, client = mesh_hosts(harness, 3, each=[_server(300), _server(100), CLIENT])
    picks = _picks(client, 800)
    assert 520 <= picks[heavy.node.routing_id] <= 680, picks
    assert picks[heavy.node.routing_id] + picks[light.node.routing_id] == 800


def test_one_way_sends_are_selected_across_servers_too(harness: HostHarness) -> None:
    first, second, client = mesh_hosts(harness, 3, each=[_server(), _server(), CLIENT])
    for i in range(40):
        client.send_to_channel("who", f"m{i}").submit_sync()
    assert wait_until(lambda: sum(Who.sent.values()) == 40)
    for host in (first, second):
        assert 14 <= Who.sent[host.node.routing_id] <= 26, Who.sent


def test_a_weight_0_server_is_listed_but_never_selected(harness: HostHarness) -> None:
    idle, busy, client = mesh_hosts(harness, 3, each=[_server(0), _server(), CLIENT])
    assert find_peer(client, idle.node.routing_id).channels == {"who": 0}
    assert _picks(client, 50) == Counter({busy.node.routing_id: 50})
    assert _picks(idle, 20) == Counter({busy.node.routing_id: 20})  # not even locally


def test_set_channel_weight_0_stops_selections_here_at_once_and_on_peers_after_the_update(
    harness: HostHarness,
) -> None:
    changed, other, client = mesh_hosts(harness, 3, each=[_server(), _server(), CLIENT])
    rid = changed.node.routing_id
    assert rid in _picks(client, 20)
    changed.set_channel_weight("who", 0)
    assert _picks(changed, 20) == Counter({other.node.routing_id: 20})  # at once, here
    assert wait_until(lambda: find_peer(client, rid).channels.get("who") == 0)
    assert _picks(client, 20) == Counter({other.node.routing_id: 20})
    changed.set_channel_weight("who", 100)
    assert wait_until(lambda: find_peer(client, rid).channels.get("who") == 100)
    assert rid in _picks(client, 20)


def test_a_peer_that_connects_after_a_weight_change_sees_the_new_weight(
    harness: HostHarness,
) -> None:
    changed, other = mesh_hosts(harness, 2, each=[_server(), _server()])
    changed.set_channel_weight("who", 0)
    late = harness.host(
        mesh=mesh_config(peers=(changed.node.endpoint, other.node.endpoint)),
        message_types=[Ping],
    )
    late.wait_for_peers(2, timeout=WAIT)
    assert find_peer(late, changed.node.routing_id).channels == {"who": 0}
    assert _picks(late, 20) == Counter({other.node.routing_id: 20})


def test_set_channel_weight_of_a_channel_not_served_here_is_not_found(
    harness: HostHarness,
) -> None:
    host, _ = mesh_hosts(harness, 2, each=[CLIENT, _server()])
    with pytest.raises(z.NotFoundError):
        host.set_channel_weight("who", 0)


def test_set_channel_weight_refuses_a_weight_outside_0_to_10000(harness: HostHarness) -> None:
    (host,) = mesh_hosts(harness, 1, each=[_server()])
    for bad in (-1, 10001, True):
        with pytest.raises(z.ConfigurationError):
            host.set_channel_weight("who", bad)
    assert _picks(host, 3) == Counter({host.node.routing_id: 3})


def test_set_channel_weight_before_start_takes_effect_or_is_an_invalid_operation(
    harness: HostHarness,
) -> None:
    host = z.Host(mesh=mesh_config(), channels={"who": Who})
    try:
        try:
            host.set_channel_weight("who", 5)
        except z.InvalidOperationError:
            expected = 100
        else:
            expected = 5
        host.start()
        client = harness.host(mesh=mesh_config(peers=(host.node.endpoint,)), message_types=[Ping])
        assert client.wait_for_peers(1, timeout=WAIT)[0].channels == {"who": expected}
    finally:
        host.shutdown(WAIT)


# -- no server ---------------------------------------------------------------------------


def test_no_server_of_the_channel_anywhere_is_not_found(harness: HostHarness) -> None:
    client, _ = mesh_hosts(harness, 2, each=[CLIENT, _server()])
    with pytest.raises(z.NotFoundError):
        client.request_to_channel("nobody", Ping(1)).submit_sync()
    with pytest.raises(z.NotFoundError):
        client.send_to_channel("nobody", Ping(1)).submit_sync()


def test_only_weight_0_servers_is_not_found(harness: HostHarness) -> None:
    idle, client = mesh_hosts(harness, 2, each=[_server(0), CLIENT])
    for host in (client, idle):
        with pytest.raises(z.NotFoundError):
            host.request_to_channel("who", Ping(1)).submit_sync()
        with pytest.raises(z.NotFoundError):
            host.send_to_channel("who", "x").submit_sync()


def test_the_only_server_lost_is_not_found(harness: HostHarness) -> None:
    server, client = mesh_hosts(harness, 2, each=[_server(), CLIENT])
    rid = server.node.routing_id
    assert _picks(client, 1) == Counter({rid: 1})
    assert server.shutdown(WAIT).outcome is z.ShutdownOutcome.STOPPED
    assert wait_for_state(client, rid, z.PeerState.LOST)
    with pytest.raises(z.NotFoundError):
        client.request_to_channel("who", Ping(1)).submit_sync()


# -- who may call, and ctx.sender -----------------------------------------------------------


def test_a_host_that_serves_no_channel_calls_the_channel_on_its_peers(
    harness: HostHarness,
) -> None:
    server, client = mesh_hosts(harness, 2, each=[_server(), CLIENT])
    assert _picks(client, 5) == Counter({server.node.routing_id: 5})


def test_ctx_sender_is_the_callers_routing_id_remotely_and_none_locally(
    harness: HostHarness,
) -> None:
    server, client = mesh_hosts(harness, 2, each=[{"channels": {"sender": Sender}}, CLIENT])
    remote = client.request_to_channel("sender", Ping(1), reply=str).submit_sync()
    assert remote == client.node.routing_id
    assert server.request_to_channel("sender", Ping(1)).submit_sync() is None


class Plain(z.ChannelHandler):
    @z.handler
    def ping(self, ctx: z.ChannelContext, msg: Ping) -> str:
        return "chat"


def test_a_weight_zero_server_of_a_host_without_a_mesh_takes_no_calls(
    harness: HostHarness,
) -> None:
    host = harness.host(
        channels={"closed": z.ChannelServer(Plain, weight=0), "open": z.ChannelServer(Plain, 7)}
    )
    with pytest.raises(z.NotFoundError, match="weight 0"):
        host.request_to_channel("closed", Ping(1), reply=str).submit_sync()
    with pytest.raises(z.NotFoundError, match="weight 0"):
        host.send_to_channel("closed", Ping(1)).submit_sync()
    assert host.request_to_channel("open", Ping(1), reply=str).submit_sync() == "chat"
