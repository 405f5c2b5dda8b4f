"""RouteMesh configuration values (issue 15 item 1; design/mesh.md §1 "Configuration
(pinned)"): defaults, every refused value naming its option, CURVE key normalisation,
channel server weights, peer snapshots and the endpoint helpers."""

from __future__ import annotations

import dataclasses
import math
import os
from fractions import Fraction
from typing import Any

import pytest
import zmq
from zmq.utils import z85

from zlink_actors import ChannelHandler, ConfigurationError, LeaseConfig, Spot
from zlink_actors.mesh import (
    ChannelServer,
    CurveConfig,
    Endpoint,
    MeshConfig,
    NodeInfo,
    PeerInfo,
    PeerState,
    advertised,
    completion_endpoint,
    parse_endpoint,
)


class Matchmaker(ChannelHandler):
    pass


# -- MeshConfig ------------------------------------------------------------------------


def test_mesh_config_defaults_are_the_pinned_values() -> None:
    config = MeshConfig("game")
    assert config.name == "game"
    assert config.listen == "tcp://127.0.0.1:0"
    assert config.routing_id is None
    assert config.routing_id_prefix == "node"
    assert config.advertise_host is None
    assert config.peers == ()
    assert (config.liveness_interval, config.liveness_timeout) == (5.0, 15.0)
    assert config.max_message_size == 16 * 2**20
    assert config.placement_weight == 100
    assert config.credit_window == 16 * 2**20
    assert config.inbound_permits is None
    assert config.target_permits is None
    assert config.route_cache_max_age == 15.0
    assert config.lease == LeaseConfig()
    assert config.curve is None


def test_mesh_config_options_after_the_name_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        MeshConfig("game", "tcp://127.0.0.1:0")  # type: ignore[misc]


def test_mesh_config_is_frozen() -> None:
    config = MeshConfig("game")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"listen": "tcp://*:0"},
        {"listen": "tcp://0.0.0.0:7101"},
        {"listen": "tcp://localhost:65534"},
        {"listen": "tcp://node-a.example.com:7101"},
        {"listen": "tcp://my_service:7101"},
        {"listen": "tcp://eth0:1"},
        {"listen": "ipc:///tmp/zlink-mesh"},
        {"listen": "ipc://@abstract-name"},
        {"listen": "ipc://" + "p" * 100},
        {"routing_id": "r" * 255},
        {"routing_id": "nœud-1"},
        {"routing_id_prefix": "a" * 64},
        {"routing_id_prefix": "eu-west_1.gw"},
        {"advertise_host": "10.0.0.4"},
        {"advertise_host": "node-a.example.com"},
        {"peers": ["tcp://10.0.0.5:7101", "ipc:///tmp/other", "tcp://localhost:65534"]},
        {"liveness_interval": 0.001, "liveness_timeout": 0.002},
        {"route_cache_max_age": 1},
        {"max_message_size": 1, "credit_window": 1},
        {"max_message_size": 2**30},
        {"placement_weight": 0},
        {"placement_weight": 10_000},
        {"inbound_permits": 1},
    ],
)
def test_mesh_config_accepts_values_at_their_bounds(kwargs: dict[str, Any]) -> None:
    config = MeshConfig("game", **kwargs)
    for name, value in kwargs.items():
        expected = tuple(value) if name == "peers" else value
        assert getattr(config, name) == expected


def test_mesh_name_may_be_255_utf8_bytes() -> None:
    assert MeshConfig("é" * 127 + "x").name == "é" * 127 + "x"


def test_seconds_are_stored_as_floats() -> None:
    config = MeshConfig(
        "game", liveness_interval=1, liveness_timeout=Fraction(5, 2), route_cache_max_age=3
    )
    values = (config.liveness_interval, config.liveness_timeout, config.route_cache_max_age)
    assert values == (1.0, 2.5, 3.0)
    assert all(type(v) is float for v in values)


def test_peers_accept_any_iterable_of_str_and_are_stored_as_a_tuple() -> None:
    endpoints = ["tcp://10.0.0.5:7101", "ipc:///tmp/x"]
    assert MeshConfig("game", peers=iter(endpoints)).peers == tuple(endpoints)
    assert MeshConfig("game", peers=endpoints).peers == tuple(endpoints)


_SECONDS_BAD = [0, -1, 0.0, math.nan, math.inf, 1e300, True, False, "5", None]
_REJECTED: list[tuple[str, object]] = [
    *(("name", v) for v in (5, None, b"game", "", "x" * 256, "é" * 128, "\ud800")),
    *(
        ("listen", v)
        for v in (
            None,
            7101,
            b"tcp://127.0.0.1:1",
            "",
            "127.0.0.1:7101",
            "TCP://127.0.0.1:7101",
            "udp://127.0.0.1:7101",
            "inproc://x",
            "tcp://",
            "tcp://127.0.0.1",
            "tcp://127.0.0.1:",
            "tcp://:7101",
            "tcp://127.0.0.1:65535",
            "tcp://127.0.0.1:65536",
            "tcp://127.0.0.1:-1",
            "tcp://127.0.0.1:+1",
            "tcp://127.0.0.1:007",
            "tcp://127.0.0.1:x",
            "tcp://127.0.0.1:7101/x",
            "tcp://[::1]:7101",
            "tcp://256.0.0.1:7101",
            "tcp://1.2.3:7101",
            "tcp://bad host:7101",
            "tcp://-bad:7101",
            "tcp://bad-.example:7101",
            "tcp://a..b:7101",
            "tcp://" + "a" * 64 + ":7101",
            "ipc://",
            "ipc://*",
            "ipc://a\0b",
            "ipc://" + "p" * 101,
            "ipc://" + "é" * 51,
        )
    ),
    *(("routing_id", v) for v in (5, b"rid", "", "r" * 256, "a\x00b", "a\nb", "a\x7fb")),
    *(
        ("routing_id_prefix", v)
        for v in (None, 3, "", "a" * 65, "no de", "nodé", "a/b", "a:b", "a\n")
    ),
    *(("advertise_host", v) for v in (5, b"host", "", "*", "a/b", "a:7101", "a b", "a\tb")),
    *(
        ("peers", v)
        for v in (
            "tcp://10.0.0.5:7101",
            b"tcp://10.0.0.5:7101",
            5,
            [5],
            ["tcp://10.0.0.5:0"],
            ["tcp://*:7101"],
            ["tcp://10.0.0.5"],
            ["tcp://10.0.0.5:65535"],
            ["ipc://"],
            ["udp://10.0.0.5:7101"],
            ["tcp://10.0.0.5:7101", "nonsense"],
        )
    ),
    *(("liveness_interval", v) for v in _SECONDS_BAD),
    *(("liveness_timeout", v) for v in _SECONDS_BAD),
    *(("route_cache_max_age", v) for v in _SECONDS_BAD),
    *(("max_message_size", v) for v in (0, -1, True, 1.5, "1", None, 2**30 + 1)),
    *(("credit_window", v) for v in (0, -1, True, 1.5, "1", None, 2**40 + 1)),
    *(("placement_weight", v) for v in (-1, 10_001, True, False, 1.5, "1", None)),
    *(("inbound_permits", v) for v in (0, -1, True, 1.5, "1")),
    *(("target_permits", v) for v in (0, -1, True, 1.5, "1")),
    *(("lease", v) for v in (None, {}, "LeaseConfig()")),
    *(("curve", v) for v in ("curve", {}, object())),
]


@pytest.mark.parametrize(("option", "value"), _REJECTED)
def test_every_bad_value_is_refused_naming_its_option(option: str, value: object) -> None:
    kwargs: dict[str, Any] = {} if option == "name" else {option: value}
    name = value if option == "name" else "game"
    with pytest.raises(ConfigurationError) as info:
        MeshConfig(name, **kwargs)  # type: ignore[arg-type]
    assert option in str(info.value)


@pytest.mark.parametrize(
    "option",
    [
        "liveness_interval",
        "liveness_timeout",
        "route_cache_max_age",
        "max_message_size",
        "credit_window",
        "placement_weight",
        "inbound_permits",
        "target_permits",
    ],
)
@pytest.mark.parametrize("flag", [True, False])
def test_bools_are_refused_where_numbers_are_expected(option: str, flag: bool) -> None:
    with pytest.raises(ConfigurationError, match=option):
        MeshConfig("game", **{option: flag})


@pytest.mark.parametrize(("interval", "timeout"), [(5.0, 5.0), (5.0, 4.0), (20, 15.0)])
def test_liveness_timeout_must_exceed_liveness_interval(interval: float, timeout: float) -> None:
    with pytest.raises(ConfigurationError, match="liveness_timeout") as info:
        MeshConfig("game", liveness_interval=interval, liveness_timeout=timeout)
    assert "liveness_interval" in str(info.value)


def test_lease_config_passes_through_as_given() -> None:
    lease = LeaseConfig(renew_interval=1.0, ttl=6.0, renew_timeout=1.0, fencing_margin=2.0)
    assert MeshConfig("game", lease=lease).lease is lease


def test_a_bad_lease_config_is_refused_by_lease_config_itself() -> None:
    with pytest.raises(ConfigurationError, match="ttl - fencing_margin"):
        MeshConfig("game", lease=LeaseConfig(ttl=8.0))


def test_permits_default_is_128_per_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert MeshConfig("game").permits() == 128 * (os.cpu_count() or 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert MeshConfig("game").permits() == 384
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert MeshConfig("game").permits() == 128
    assert MeshConfig("game", inbound_permits=7).permits() == 7


def test_one_target_holds_an_eighth_of_the_permits_unless_told_otherwise() -> None:
    assert MeshConfig("game", inbound_permits=256).target_cap() == 32
    assert MeshConfig("game", inbound_permits=7).target_cap() == 1  # at least one
    assert MeshConfig("game", inbound_permits=64, target_permits=5).target_cap() == 5
    # Never more than the node has.
    assert MeshConfig("game", inbound_permits=64, target_permits=100).target_cap() == 64


# -- CurveConfig -----------------------------------------------------------------------


def test_curve_keys_in_z85_str_z85_bytes_and_raw_bytes_normalise_equal() -> None:
    public, secret = zmq.curve_keypair()
    peer, _ = zmq.curve_keypair()
    forms = [
        CurveConfig(public.decode(), secret.decode(), [peer.decode()]),
        CurveConfig(public, secret, (peer,)),
        CurveConfig(z85.decode(public), z85.decode(secret), iter([z85.decode(peer)])),
        CurveConfig(public.decode(), z85.decode(secret), [peer]),
    ]
    assert all(form == forms[0] for form in forms)
    config = forms[0]
    assert (config.public_key, config.secret_key, config.authorized_keys) == (
        public,
        secret,
        (peer,),
    )
    assert config.public_z85() == public.decode()
    assert type(config.public_z85()) is str


def test_curve_config_may_authorize_no_key_and_hides_its_secret() -> None:
    public, secret = zmq.curve_keypair()
    config = CurveConfig(public, secret, [])
    assert config.authorized_keys == ()
    assert secret.decode() not in repr(config)
    assert MeshConfig("game", curve=config).curve is config


def test_a_secret_key_that_does_not_match_the_public_key_is_refused() -> None:
    public, _ = zmq.curve_keypair()
    _, other_secret = zmq.curve_keypair()
    with pytest.raises(ConfigurationError, match="secret_key"):
        CurveConfig(public, other_secret, [])


_BAD_KEYS: list[object] = [None, 5, "", "a" * 39, "a" * 41, "~" * 40, "#" * 40, "é" * 40]
_BAD_KEYS += [b"\x01" * 31, b"\x01" * 33, b"~" * 40]


@pytest.mark.parametrize("bad", _BAD_KEYS)
@pytest.mark.parametrize("option", ["public_key", "secret_key", "authorized_keys"])
def test_a_malformed_curve_key_is_refused_naming_it(option: str, bad: object) -> None:
    public, secret = zmq.curve_keypair()
    args: dict[str, Any] = {"public_key": public, "secret_key": secret, "authorized_keys": []}
    args[option] = [public, bad] if option == "authorized_keys" else bad
    with pytest.raises(ConfigurationError, match=option):
        CurveConfig(**args)


@pytest.mark.parametrize("bare", ["a" * 40, b"a" * 40, 5, None])
def test_authorized_keys_must_be_an_iterable_not_one_key(bare: object) -> None:
    public, secret = zmq.curve_keypair()
    with pytest.raises(ConfigurationError, match="authorized_keys"):
        CurveConfig(public, secret, bare)  # type: ignore[arg-type]


# -- ChannelServer, NodeInfo, PeerState, PeerInfo --------------------------------------


@pytest.mark.parametrize("weight", [0, 1, 100, 10_000])
def test_channel_server_accepts_weights_0_to_10000(weight: int) -> None:
    server = ChannelServer(Matchmaker, weight=weight)
    assert (server.handler_cls, server.weight) == (Matchmaker, weight)


def test_channel_server_weight_defaults_to_100() -> None:
    assert ChannelServer(Matchmaker).weight == 100


@pytest.mark.parametrize("weight", [-1, 10_001, True, False, 1.5, "100", None])
def test_channel_server_refuses_a_bad_weight(weight: object) -> None:
    with pytest.raises(ConfigurationError, match="weight"):
        ChannelServer(Matchmaker, weight=weight)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [object, Spot, Matchmaker(), "Matchmaker", None])
def test_channel_server_refuses_what_is_not_a_channel_handler_class(cls: object) -> None:
    with pytest.raises(ConfigurationError, match="handler_cls"):
        ChannelServer(cls)  # type: ignore[arg-type]


def test_node_info_holds_mesh_routing_id_and_endpoint() -> None:
    info = NodeInfo(mesh="game", routing_id="node-1", endpoint="tcp://10.0.0.4:7101")
    assert (info.mesh, info.routing_id, info.endpoint) == ("game", "node-1", "tcp://10.0.0.4:7101")
    assert info == NodeInfo("game", "node-1", "tcp://10.0.0.4:7101")
    with pytest.raises(ConfigurationError, match="routing_id"):
        NodeInfo("game", None, "tcp://10.0.0.4:7101")  # type: ignore[arg-type]


def test_peer_states_are_the_four_lower_case_values() -> None:
    assert {s.name: s.value for s in PeerState} == {
        "CONNECTING": "connecting",
        "READY": "ready",
        "DRAINING": "draining",
        "LOST": "lost",
    }


def test_peer_info_channels_are_a_read_only_copy() -> None:
    channels = {"match": 50, "chat": 0}
    info = PeerInfo("node-2", "tcp://10.0.0.5:7101", PeerState.READY, channels)
    channels["match"] = 1
    assert dict(info.channels) == {"match": 50, "chat": 0}
    with pytest.raises(TypeError):
        info.channels["chat"] = 5  # type: ignore[index]
    same = PeerInfo("node-2", "tcp://10.0.0.5:7101", PeerState.READY, {"chat": 0, "match": 50})
    assert info == same
    assert hash(info) == hash(same)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("node-2", "tcp://a:1", "ready", {}), "state"),
        (("node-2", "tcp://a:1", PeerState.READY, [("match", 1)]), "channels"),
        (("node-2", "tcp://a:1", PeerState.READY, {"match": 10_001}), "channels"),
        ((None, "tcp://a:1", PeerState.READY, {}), "routing_id"),
        (("node-2", 5, PeerState.READY, {}), "endpoint"),
        (("node-2", "tcp://a:1", PeerState.READY, {}, "yes"), "fenced"),
    ],
)
def test_peer_info_refuses_bad_fields(args: tuple[Any, ...], option: str) -> None:
    with pytest.raises(ConfigurationError, match=option):
        PeerInfo(*args)


# -- endpoint helpers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tcp://10.0.0.4:7101", Endpoint("tcp", "10.0.0.4", 7101, "")),
        ("tcp://*:0", Endpoint("tcp", "*", 0, "")),
        ("tcp://localhost:65534", Endpoint("tcp", "localhost", 65534, "")),
        ("ipc:///tmp/mesh.sock", Endpoint("ipc", "", 0, "/tmp/mesh.sock")),
    ],
)
def test_parse_endpoint_splits_tcp_and_ipc(text: str, expected: Endpoint) -> None:
    endpoint = parse_endpoint(text, allow_any_port=True)
    assert endpoint == expected
    assert str(endpoint) == text


def test_parse_endpoint_refuses_port_0_unless_any_port_is_allowed() -> None:
    with pytest.raises(ConfigurationError, match="port 0"):
        parse_endpoint("tcp://127.0.0.1:0", allow_any_port=False)
    assert parse_endpoint("ipc://x", allow_any_port=False).path == "x"


@pytest.mark.parametrize(
    ("application", "completion"),
    [
        ("tcp://10.0.0.4:7101", "tcp://10.0.0.4:7102"),
        ("tcp://0.0.0.0:65534", "tcp://0.0.0.0:65535"),
        ("tcp://localhost:1", "tcp://localhost:2"),
        ("ipc:///tmp/mesh", "ipc:///tmp/mesh.c"),
        ("ipc://" + "p" * 100, "ipc://" + "p" * 100 + ".c"),
    ],
)
def test_completion_endpoint_is_port_plus_one_or_path_dot_c(
    application: str, completion: str
) -> None:
    assert completion_endpoint(application) == completion


@pytest.mark.parametrize("bad", ["tcp://127.0.0.1:0", "tcp://*:0", "tcp://a:65535", "x", ""])
def test_completion_endpoint_refuses_port_0_and_malformed_endpoints(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="endpoint"):
        completion_endpoint(bad)


@pytest.mark.parametrize(
    ("bound", "host", "expected"),
    [
        ("tcp://0.0.0.0:7101", None, "tcp://127.0.0.1:7101"),
        ("tcp://*:7101", None, "tcp://127.0.0.1:7101"),
        ("tcp://10.0.0.4:7101", None, "tcp://10.0.0.4:7101"),
        ("tcp://0.0.0.0:7101", "10.0.0.4", "tcp://10.0.0.4:7101"),
        ("tcp://127.0.0.1:40000", "gw.example.com", "tcp://gw.example.com:40000"),
        ("ipc:///tmp/mesh", None, "ipc:///tmp/mesh"),
        ("ipc:///tmp/mesh", "10.0.0.4", "ipc:///tmp/mesh"),
    ],
)
def test_advertised_replaces_the_host_as_configured(
    bound: str, host: str | None, expected: str
) -> None:
    assert advertised(bound, host) == expected


def test_advertised_refuses_an_unbound_port_and_a_bad_advertise_host() -> None:
    with pytest.raises(ConfigurationError, match="port 0"):
        advertised("tcp://0.0.0.0:0", None)
    with pytest.raises(ConfigurationError, match="advertise_host"):
        advertised("tcp://0.0.0.0:7101", "10.0.0.4:7101")


def test_peer_expiry_defaults_to_60_s_and_must_exceed_liveness_timeout() -> None:
    assert MeshConfig("game").peer_expiry == 60.0
    fast = MeshConfig("game", liveness_interval=0.5, liveness_timeout=1.0, peer_expiry=2)
    assert fast.peer_expiry == 2.0
    with pytest.raises(ConfigurationError, match="peer_expiry"):
        MeshConfig("game", peer_expiry=15.0)  # liveness_timeout is 15.0
    for bad in (float("nan"), float("inf"), -1.0, True, "60"):
        with pytest.raises(ConfigurationError, match="peer_expiry"):
            MeshConfig("game", peer_expiry=bad)  # type: ignore[arg-type]
