"""The RouteMesh configuration values (design/mesh.md §1 "Configuration (pinned)").

Every value checks itself in its constructor and raises `ConfigurationError` naming the
option, so a Host with a bad mesh option never binds a socket. Combinations across
options of the Host (a fixed `routing_id` with `location=`) are the Host's to refuse.

One listen endpoint per node: the completion connection listens on the application
port + 1 (`tcp://HOST:PORT+1`), or on the application path + ".c" (`ipc://PATH.c`);
see `completion_endpoint` and docs/mesh.md "Configuration".
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
import struct
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

import zmq
from zmq.utils import z85

from .._core.errors import ConfigurationError
from .._core.validation import check_id, check_seconds
from .._engine.objects import ChannelHandler
from ..location.lease import LeaseConfig

__all__ = [
    "ChannelServer",
    "CurveConfig",
    "Endpoint",
    "MeshConfig",
    "NodeInfo",
    "PeerInfo",
    "PeerState",
    "StateChange",
    "StateChangeKind",
    "advertised",
    "completion_endpoint",
    "parse_endpoint",
    "split_key",
]

MAX_WEIGHT = 10_000
#: `MeshConfig.on_lease_lost`: recover by itself (a new lease), or shut the Host down.
ON_LEASE_LOST = ("recover", "shutdown")
MAX_MESSAGE_SIZE = 2**30  # 1 GiB
MAX_CREDIT_WINDOW = 2**40  # 1 TiB: far beyond any real window, safe in the u64 wire field
MAX_IPC_PATH = 100  # bytes: PATH + ".c" must still fit sun_path (108 bytes on Linux)
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PORT = re.compile(r"0|[1-9][0-9]{0,4}")


def _int(name: str, value: object, low: int, high: int | None = None) -> int:
    if type(value) is bool or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigurationError(f"{name} must be {bound}, got {value}")
    return int(value)


def _name(what: str, value: object) -> str:
    try:
        return check_id(what, value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


def _items(name: str, value: object) -> tuple[object, ...]:
    """An iterable as a tuple; one str or bytes is refused (it would iterate by item)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigurationError(f"{name} must be an iterable, got {type(value).__name__}")
    return tuple(value)


def _seconds(name: str, value: object) -> float:
    try:
        return check_seconds(name, value)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


def _host(text: str) -> bool:
    """An IPv4 address, `*`, or a host name (which `localhost` and interfaces are)."""
    if text == "*":
        return True
    if all(part.isdigit() for part in text.split(".")):  # only digits: an IPv4 address
        try:
            return str(ipaddress.IPv4Address(text)) == text
        except ValueError:
            return False
    return len(text) <= 253 and all(_LABEL.fullmatch(label) for label in text.split("."))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A parsed endpoint: `tcp` has `host` and `port` (path ""), `ipc` has `path`."""

    scheme: str
    host: str
    port: int
    path: str

    def __str__(self) -> str:
        if self.scheme == "ipc":
            return f"ipc://{self.path}"
        return f"tcp://{self.host}:{self.port}"


def split_key(text: str) -> tuple[str, bytes | None]:
    """An endpoint and the CURVE public key it may carry: `tcp://h:p|<Z85 key>` (with
    CURVE a node advertises its endpoint so, since a dialling peer needs the key).

    Raises:
        ConfigurationError: a `|` suffix that is not a 40-character Z85 key.
    """
    endpoint, bar, key = text.rpartition("|")
    if not bar or len(key) != 40:
        return text, None  # no key suffix (an ipc path may hold a "|" of its own)
    return endpoint, _curve_key(f"endpoint {text!r}: the public key", key)


def parse_endpoint(text: str, *, allow_any_port: bool) -> Endpoint:
    """Parse `tcp://HOST:PORT` or `ipc://PATH`.

    Args:
        text: the endpoint. HOST is an IPv4 address, `*`, `localhost` or a host name;
            PORT is 1..65534 (65535 is refused: the completion connection uses PORT+1),
            or 0 (any free port) when `allow_any_port`. PATH is 1..100 UTF-8 bytes.
        allow_any_port: accept port 0 (an endpoint to listen on, not one to dial).

    Raises:
        ConfigurationError: anything else (IPv6, a missing port, another scheme, ...).
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"an endpoint must be a str, got {type(text).__name__}")
    text, _ = split_key(text)
    scheme, sep, rest = text.partition("://")
    if sep and scheme == "ipc":
        try:
            size = len(rest.encode("utf-8"))
        except UnicodeEncodeError:
            size = -1
        if not 1 <= size <= MAX_IPC_PATH or "\0" in rest or rest == "*":
            raise ConfigurationError(
                f"endpoint {text!r}: an ipc path must be 1..{MAX_IPC_PATH} UTF-8 bytes, "
                "without NUL, and named (not '*')"
            )
        return Endpoint("ipc", "", 0, rest)
    if not (sep and scheme == "tcp"):
        raise ConfigurationError(f"endpoint {text!r} must be tcp://HOST:PORT or ipc://PATH")
    host, colon, port_text = rest.rpartition(":")
    if not colon or not _host(host):
        raise ConfigurationError(
            f"endpoint {text!r}: the host must be an IPv4 address, '*', or a host name"
        )
    if not _PORT.fullmatch(port_text) or int(port_text) > 65534:
        raise ConfigurationError(
            f"endpoint {text!r}: the port must be a number in 0..65534 (PORT+1 carries "
            "the completion connection)"
        )
    port = int(port_text)
    if port == 0 and not allow_any_port:
        raise ConfigurationError(f"endpoint {text!r}: port 0 (any port) cannot be dialled")
    return Endpoint("tcp", host, port, "")


def completion_endpoint(application: str) -> str:
    """The completion connection's endpoint for a bound application endpoint: tcp the
    same host on PORT+1, ipc PATH + ".c".

    Raises:
        ConfigurationError: a malformed endpoint, or port 0 (not a bound port).
    """
    ep = parse_endpoint(application, allow_any_port=False)
    if ep.scheme == "ipc":
        return f"ipc://{ep.path}.c"
    return f"tcp://{ep.host}:{ep.port + 1}"


def _advertise_host(value: object) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or value == "*"
        or any(c in "/:" or c.isspace() or not c.isprintable() for c in value)
    ):
        raise ConfigurationError(
            f"advertise_host must be None or a host name or address (no '/', ':' or "
            f"whitespace, not '*'), got {value!r}"
        )
    return value


def advertised(bound_app_endpoint: str, advertise_host: str | None) -> str:
    """The endpoint peers dial: the bound one with its host replaced by `advertise_host`,
    or a wildcard host (`0.0.0.0`, `*`) by `127.0.0.1`; an ipc endpoint as it is.

    Raises:
        ConfigurationError: a malformed endpoint or port 0, or a bad `advertise_host`.
    """
    ep = parse_endpoint(bound_app_endpoint, allow_any_port=False)
    host = _advertise_host(advertise_host)
    if ep.scheme == "ipc":
        return str(ep)
    if host is None:
        host = "127.0.0.1" if ep.host in ("0.0.0.0", "*") else ep.host
    return f"tcp://{host}:{ep.port}"


def _curve_key(name: str, value: object) -> bytes:
    """A Z85 (40 chars, str or bytes) or raw (32 bytes) key, as Z85 bytes."""
    raw: bytes | None = None
    try:
        if isinstance(value, bytes) and len(value) == 32:
            raw = value
        elif isinstance(value, str | bytes) and len(value) == 40:
            raw = z85.decode(value)
    except (KeyError, ValueError, struct.error):  # what z85.decode raises on bad text
        raw = None
    if raw is None:
        raise ConfigurationError(
            f"{name} must be a CURVE key: 40 Z85 characters (str or bytes) or 32 raw bytes"
        )
    return z85.encode(raw)


@dataclass(frozen=True, slots=True, init=False)
class CurveConfig:
    """CURVE keys of one node (`zmq.curve_keypair()`), all stored as Z85 bytes.

    Args:
        public_key: this node's public key.
        secret_key: its secret key; must match `public_key`.
        authorized_keys: the public keys of the peers this node accepts (may be empty).

    Raises:
        ConfigurationError: a malformed key, a secret that does not match the public
            key, or `authorized_keys` given as one str/bytes instead of an iterable.
    """

    public_key: bytes
    secret_key: bytes = field(repr=False)
    authorized_keys: tuple[bytes, ...]

    def __init__(
        self,
        public_key: str | bytes,
        secret_key: str | bytes,
        authorized_keys: Iterable[str | bytes],
    ) -> None:
        public = _curve_key("public_key", public_key)
        secret = _curve_key("secret_key", secret_key)
        if zmq.curve_public(secret) != public:
            raise ConfigurationError("secret_key does not belong to public_key")
        keys = _items("authorized_keys", authorized_keys)
        authorized = tuple(_curve_key(f"authorized_keys[{i}]", k) for i, k in enumerate(keys))
        object.__setattr__(self, "public_key", public)
        object.__setattr__(self, "secret_key", secret)
        object.__setattr__(self, "authorized_keys", authorized)

    def public_z85(self) -> str:
        """This node's public key as Z85 text."""
        return self.public_key.decode("ascii")


@dataclass(frozen=True, slots=True)
class ChannelServer:
    """A channel handler class with its select-one weight (0..10000; 0 = not selected)."""

    handler_cls: type[ChannelHandler]
    weight: int = 100

    def __post_init__(self) -> None:
        cls: object = self.handler_cls
        if not (isinstance(cls, type) and issubclass(cls, ChannelHandler)):
            raise ConfigurationError(
                f"handler_cls must be a subclass of ChannelHandler, got {cls!r}"
            )
        _int("weight", self.weight, 0, MAX_WEIGHT)


def _text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} must be a str, got {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of a mesh: its mesh name, routing id and advertised endpoint."""

    mesh: str
    routing_id: str
    endpoint: str

    def __post_init__(self) -> None:
        for name in ("mesh", "routing_id", "endpoint"):
            _text(name, getattr(self, name))


class PeerState(enum.Enum):
    """Where a peer stands, as `host.peers()` reports it."""

    CONNECTING = "connecting"
    READY = "ready"
    DRAINING = "draining"
    LOST = "lost"


class StateChangeKind(enum.Enum):
    """What a `StateChange` reports (`Host(on_state_change=...)`)."""

    #: The node's owner lease stopped admitting (its renewals failed past the admission
    #: deadline, or the lease was found gone): its Spots and Actors admit no new work,
    #: it left placement and channel selection, its peers were told.
    FENCED = "fenced"
    #: Admitting again after `FENCED`: the same lease renewed in time, or a new lease
    #: (a new generation) acquired and the objects still held claimed again.
    RECOVERED = "recovered"
    #: `MeshConfig(on_lease_lost="shutdown")`: the lease was lost and the Host shuts
    #: itself down (`ShutdownResult.reason` is `ShutdownReason.LEASE_LOST`).
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True, slots=True)
class StateChange:
    """One change of a node's owner lease, as `Host(on_state_change=callback)` hears it
    (the callback runs on the completion dispatcher: it must not block).

    Attributes:
        kind: what happened (`StateChangeKind`).
        routing_id: the node's routing id.
        lease_generation: the generation of the lease held now (`RECOVERED`: the new
            one when it was acquired again; 0: none is held).
        detail: why, in words (the error a renewal met, say).
        reclaimed_objects: `RECOVERED`: objects whose records this recovery claimed
            again for the node.
        lost_objects: `RECOVERED`: objects another node had claimed meanwhile, closed
            here with `CloseReason.OWNERSHIP_LOST`.
    """

    kind: StateChangeKind
    routing_id: str
    lease_generation: int
    detail: str = ""
    reclaimed_objects: int = 0
    lost_objects: int = 0


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """A snapshot of one peer; `channels` (ChannelName -> weight) is read-only.
    `fenced`: the peer said its owner lease is not admitting (it is left out of
    placement, and chosen for a channel only when no other server is)."""

    routing_id: str
    endpoint: str
    state: PeerState
    channels: Mapping[str, int] = field(hash=False)
    fenced: bool = False

    def __post_init__(self) -> None:
        _text("routing_id", self.routing_id)
        _text("endpoint", self.endpoint)
        if not isinstance(self.state, PeerState):
            raise ConfigurationError(f"state must be a PeerState, got {self.state!r}")
        if not isinstance(self.channels, Mapping):
            raise ConfigurationError("channels must be a mapping of ChannelName to weight")
        if not isinstance(self.fenced, bool):
            raise ConfigurationError(f"fenced must be a bool, got {self.fenced!r}")
        channels = dict(self.channels)
        for key, weight in channels.items():
            _text("a channel name", key)
            _int(f"channels[{key!r}]", weight, 0, MAX_WEIGHT)
        object.__setattr__(self, "channels", types.MappingProxyType(channels))


@dataclass(frozen=True, slots=True)
class MeshConfig:
    """The mesh options of one Host (`Host(mesh=...)`); see docs/mesh.md "Configuration".

    Raises:
        ConfigurationError: a bad value of any option, naming it; or
            `liveness_timeout <= liveness_interval`, or `peer_expiry <= liveness_timeout`.
    """

    name: str
    _: KW_ONLY
    listen: str = "tcp://127.0.0.1:0"
    routing_id: str | None = None
    routing_id_prefix: str = "node"
    advertise_host: str | None = None
    peers: Sequence[str] = ()  # stored as a tuple
    liveness_interval: float = 5.0
    liveness_timeout: float = 15.0
    max_message_size: int = 16 * 2**20
    placement_weight: int = 100
    credit_window: int = 16 * 2**20
    inbound_permits: int | None = None
    target_permits: int | None = None
    route_cache_max_age: float = 15.0
    #: Seconds a silent (LOST) peer may come back with the same lifecycle and resume:
    #: what was admitted for it is kept until then, and counted as lost after.
    peer_expiry: float = 60.0
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    curve: CurveConfig | None = None
    on_lease_lost: str = "recover"

    def __post_init__(self) -> None:
        _name("name", self.name)
        try:
            parse_endpoint(self.listen, allow_any_port=True)
        except ConfigurationError as exc:
            raise ConfigurationError(f"listen: {exc}") from None
        self._check_ids()
        _advertise_host(self.advertise_host)
        object.__setattr__(self, "peers", self._check_peers())
        for name in ("liveness_interval", "liveness_timeout", "route_cache_max_age", "peer_expiry"):
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))
        if self.liveness_timeout <= self.liveness_interval:
            raise ConfigurationError(
                f"liveness_timeout ({self.liveness_timeout:g}) must be greater than "
                f"liveness_interval ({self.liveness_interval:g})"
            )
        if self.peer_expiry <= self.liveness_timeout:
            raise ConfigurationError(
                f"peer_expiry ({self.peer_expiry:g}) must be greater than "
                f"liveness_timeout ({self.liveness_timeout:g})"
            )
        _int("max_message_size", self.max_message_size, 1, MAX_MESSAGE_SIZE)
        _int("credit_window", self.credit_window, 1, MAX_CREDIT_WINDOW)
        _int("placement_weight", self.placement_weight, 0, MAX_WEIGHT)
        if self.inbound_permits is not None:
            _int("inbound_permits", self.inbound_permits, 1)
        if self.target_permits is not None:
            _int("target_permits", self.target_permits, 1)
        if not isinstance(self.lease, LeaseConfig):
            raise ConfigurationError(f"lease must be a LeaseConfig, got {self.lease!r}")
        if self.curve is not None and not isinstance(self.curve, CurveConfig):
            raise ConfigurationError(f"curve must be None or a CurveConfig, got {self.curve!r}")
        if self.on_lease_lost not in ON_LEASE_LOST:
            raise ConfigurationError(
                f"on_lease_lost must be one of {', '.join(map(repr, ON_LEASE_LOST))}, "
                f"got {self.on_lease_lost!r}"
            )

    def _check_ids(self) -> None:
        rid: object = self.routing_id
        if rid is not None:
            rid = _name("routing_id", rid)
            if any(ord(c) < 0x20 or c == "\x7f" for c in rid):
                raise ConfigurationError(f"routing_id may not hold control characters: {rid!r}")
        prefix: object = self.routing_id_prefix
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"routing_id_prefix must be 1..64 letters, digits, '-', '_' or '.', got {prefix!r}"
            )

    def _check_peers(self) -> tuple[str, ...]:
        checked: list[str] = []
        for i, peer in enumerate(_items("peers", self.peers)):
            try:
                if not isinstance(peer, str):
                    raise ConfigurationError(f"an endpoint must be a str, got {peer!r}")
                if parse_endpoint(peer, allow_any_port=False).host == "*":
                    raise ConfigurationError(f"endpoint {peer!r}: '*' cannot be dialled")
            except ConfigurationError as exc:
                raise ConfigurationError(f"peers[{i}]: {exc}") from None
            checked.append(peer)
        return tuple(checked)

    def permits(self) -> int:
        """The inbound permits M: `inbound_permits`, or 128 x CPUs when it is None."""
        if self.inbound_permits is not None:
            return self.inbound_permits
        return 128 * (os.cpu_count() or 1)

    def target_cap(self) -> int:
        """The inbound permits records for one target may hold at once:
        `target_permits`, or an eighth of `permits()` (at least 1) when it is None; never
        more than `permits()`. Records for a target beyond it are admitted without a
        permit (docs/mesh.md "One full target")."""
        permits = self.permits()
        if self.target_permits is not None:
            return min(self.target_permits, permits)
        return max(1, permits // 8)
