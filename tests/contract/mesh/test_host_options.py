"""`Host(...)` with the RouteMesh options (issue 15 item 1; design/mesh.md §1
"Configuration (pinned)"): the combinations `Host(...)` refuses before any socket is
bound, `host.node` before and after `start()`, automatic routing ids, a listen address
in use, and the two forms of a `channels=` value."""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness

from ._mesh import MESH, find_peer, mesh_config, mesh_hosts


class Ping(msgspec.Struct):
    n: int


class Gate(z.NodeHandler):
    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> int:
        return msg.n + 1


class Match(z.ChannelHandler):
    @z.handler
    def ping(self, ctx: z.ChannelContext, msg: Ping) -> str:
        return "match"


class Chat(z.ChannelHandler):
    @z.handler
    def ping(self, ctx: z.ChannelContext, msg: Ping) -> str:
        return "chat"


_AUTO = re.compile(
    r"(?P<prefix>.+)-(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12})"
)


def _free_port() -> int:
    """A tcp port P on 127.0.0.1 with P and P+1 (the completion endpoint) free now."""
    for _ in range(64):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise AssertionError("no free pair of ports")


def _assert_unbound(port: int) -> None:
    """Nothing listens on `port` or `port + 1`: we can bind both ourselves."""
    for p in (port, port + 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


@pytest.fixture
def store() -> Iterator[z.MemoryLocationStore]:
    s = z.MemoryLocationStore()
    try:
        yield s
    finally:
        s.close()


# -- what Host(...) refuses, before any socket is bound ---------------------------------


def test_a_fixed_routing_id_with_location_is_refused_before_anything_is_bound(
    store: z.MemoryLocationStore,
) -> None:
    port = _free_port()
    mesh = mesh_config(listen=f"tcp://127.0.0.1:{port}", routing_id="fixed-1")
    with pytest.raises(z.ConfigurationError, match="routing_id"):
        z.Host(mesh=mesh, location=store)
    _assert_unbound(port)


def test_location_without_mesh_is_refused(store: z.MemoryLocationStore) -> None:
    with pytest.raises(z.ConfigurationError, match="location"):
        z.Host(location=store)


def test_a_location_that_is_not_a_location_store_is_refused() -> None:
    with pytest.raises(z.ConfigurationError, match="LocationStore"):
        z.Host(mesh=mesh_config(), location=object())  # type: ignore[arg-type]


def test_check_codec_that_is_not_a_bool_is_refused() -> None:
    with pytest.raises(z.ConfigurationError, match="check_codec"):
        z.Host(mesh=mesh_config(), check_codec=1)  # type: ignore[arg-type]


def test_node_handler_without_mesh_is_refused() -> None:
    with pytest.raises(z.ConfigurationError, match="node_handler"):
        z.Host(node_handler=Gate)


@pytest.mark.parametrize("value", ["game", {"name": "game"}, object()])
def test_a_mesh_that_is_not_a_mesh_config_is_refused(value: object) -> None:
    with pytest.raises(z.ConfigurationError, match="MeshConfig"):
        z.Host(mesh=value)  # type: ignore[arg-type]


# -- host.node -----------------------------------------------------------------------


def test_node_without_a_mesh_is_not_configured_before_and_after_start() -> None:
    host = z.Host()
    try:
        with pytest.raises(z.NotConfiguredError):
            _ = host.node
        host.start()
        with pytest.raises(z.NotConfiguredError):
            _ = host.node
        with pytest.raises(z.NotConfiguredError):
            host.peers()
    finally:
        host.shutdown(WAIT)


def test_node_before_start_is_an_invalid_operation() -> None:
    host = z.Host(mesh=mesh_config())
    try:
        with pytest.raises(z.InvalidOperationError):
            _ = host.node
    finally:
        host.shutdown(WAIT)


def test_node_after_start_has_the_real_port_and_an_automatic_routing_id(
    harness: HostHarness,
) -> None:
    host = harness.host(mesh=mesh_config())
    info = host.node
    assert isinstance(info, z.NodeInfo)
    assert info.mesh == MESH
    m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", info.endpoint)
    assert m is not None, info.endpoint
    port = int(m.group(1))
    assert port != 0
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT):
        pass  # something listens there
    auto = _AUTO.fullmatch(info.routing_id)
    assert auto is not None, info.routing_id
    assert auto["prefix"] == "node"
    assert uuid.UUID(auto["uuid"]).version == 4


def test_a_custom_routing_id_prefix_is_used(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config(routing_id_prefix="zone.eu_1"))
    auto = _AUTO.fullmatch(host.node.routing_id)
    assert auto is not None, host.node.routing_id
    assert auto["prefix"] == "zone.eu_1"


def test_two_hosts_of_one_config_get_different_routing_ids_and_ports(
    harness: HostHarness,
) -> None:
    config = mesh_config()
    a = harness.host(mesh=config)
    b = harness.host(mesh=config)
    assert a.node.routing_id != b.node.routing_id
    assert a.node.endpoint != b.node.endpoint


def test_an_advertise_host_replaces_the_host_of_the_advertised_endpoint(
    harness: HostHarness,
) -> None:
    host = harness.host(mesh=mesh_config(advertise_host="localhost"))
    m = re.fullmatch(r"tcp://localhost:(\d+)", host.node.endpoint)
    assert m is not None, host.node.endpoint
    with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=WAIT):
        pass  # the real, bound port


def test_an_ipc_listen_endpoint_is_advertised_as_given_and_serves(
    harness: HostHarness, tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/node-a"
    server = harness.host(mesh=mesh_config(listen=endpoint), node_handler=Gate)
    assert server.node.endpoint == endpoint
    client = harness.host(
        mesh=mesh_config(listen=f"ipc://{tmp_path}/node-b", peers=(endpoint,)),
        message_types=[Ping],
    )
    assert [p.endpoint for p in client.wait_for_peers(1, timeout=WAIT)] == [endpoint]
    rid = server.node.routing_id
    assert client.request_to_node(MESH, rid, Ping(1), reply=int).submit_sync() == 2


def test_a_fixed_routing_id_without_location_is_used_as_given(harness: HostHarness) -> None:
    host = harness.host(mesh=mesh_config(routing_id="zone-7"))
    assert host.node.routing_id == "zone-7"


def _stop_unstarted(host: z.Host) -> None:
    """Shut down a Host whose `start()` failed (its threads never started)."""
    host.shutdown(WAIT)


def test_a_listen_address_in_use_fails_start_with_unavailable(harness: HostHarness) -> None:
    first = harness.host(mesh=mesh_config())
    second = z.Host(mesh=mesh_config(listen=first.node.endpoint))
    try:
        with pytest.raises(z.UnavailableError, match="in use") as caught:
            second.start()
        assert caught.value.reason is z.UnavailableReason.UNREACHABLE
    finally:
        _stop_unstarted(second)


def test_a_listen_address_in_use_leaves_the_host_unserved_and_the_first_node_serving(
    harness: HostHarness,
) -> None:
    first = harness.host(mesh=mesh_config(), node_handler=Gate)
    second = z.Host(mesh=mesh_config(listen=first.node.endpoint))
    try:
        with pytest.raises(z.UnavailableError, match="in use"):
            second.start()
        assert second.state is z.HostState.PREPARING
    finally:
        _stop_unstarted(second)
    rid = first.node.routing_id
    assert first.request_to_node(MESH, rid, Ping(1), reply=int).submit_sync() == 2


def test_a_host_whose_start_failed_shuts_down_cleanly(harness: HostHarness) -> None:
    first = harness.host(mesh=mesh_config())
    second = z.Host(mesh=mesh_config(listen=first.node.endpoint))
    with pytest.raises(z.UnavailableError, match="in use"):
        second.start()
    try:
        result = second.shutdown(WAIT)
    finally:
        _stop_unstarted(second)
    assert result.outcome is z.ShutdownOutcome.STOPPED
    assert second.state is z.HostState.STOPPED


# -- channels= values ------------------------------------------------------------------


def test_a_channel_server_and_a_bare_class_both_serve_with_their_weights(
    harness: HostHarness,
) -> None:
    server, client = mesh_hosts(
        harness,
        2,
        each=[
            {"channels": {"match": z.ChannelServer(Match, weight=5), "chat": Chat}},
            {"message_types": [Ping]},
        ],
    )
    peer = find_peer(client, server.node.routing_id)
    assert dict(peer.channels) == {"match": 5, "chat": 100}
    assert client.request_to_channel("match", Ping(1), reply=str).submit_sync() == "match"
    assert client.request_to_channel("chat", Ping(1), reply=str).submit_sync() == "chat"
    assert server.request_to_channel("match", Ping(1), reply=str).submit_sync() == "match"


# -- ctx.node --------------------------------------------------------------------------


class Where(z.Spot):
    @z.handler
    def where(self, ctx: z.SpotContext, msg: Ping) -> str | None:
        info: z.NodeInfo | None = ctx.node
        return None if info is None else info.routing_id


def test_ctx_node_is_the_hosts_node_info_and_none_without_a_mesh(harness: HostHarness) -> None:
    meshed = harness.host(mesh=mesh_config(), spots=[Where])
    plain = harness.host(spots=[Where])
    for host in (meshed, plain):
        host.spots.get_or_create("w", Where).submit_sync()
    assert meshed.request_to_spot("w", Ping(0)).submit_sync() == meshed.node.routing_id
    assert plain.request_to_spot("w", Ping(0)).submit_sync() is None
