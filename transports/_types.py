"""The values the transport hands out: configuration, submit results, inbound records,
peer events, flow states and statistics. All are immutable snapshots except the
`admitted` future a BACKPRESSURED result carries."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from zmq.utils import z85

from ._errors import TransportError, TransportUsageError
from ._wire import MAX_MESSAGE_SIZE

__all__ = [
    "MIB",
    "CurveConfig",
    "Endpoints",
    "FlowState",
    "Inbound",
    "InboundKind",
    "PeerEvent",
    "PeerEventKind",
    "PeerStatistics",
    "SubmitResult",
    "SubmitStatus",
    "TransportConfig",
    "TransportStatistics",
]

MIB = 1024 * 1024


def _curve_key(name: str, key: object) -> bytes:
    """A Z85-encoded CURVE key (40 bytes), decoded to its 32 bytes."""
    if not isinstance(key, bytes) or len(key) != 40:
        raise TransportUsageError(f"{name} must be a 40-byte Z85 CURVE key")
    try:
        return z85.decode(key)
    except (ValueError, KeyError, IndexError) as exc:
        raise TransportUsageError(f"{name} is not valid Z85") from exc


@dataclass(frozen=True)
class CurveConfig:
    """CURVE security for both ROUTERs of a transport (off unless configured).

    Attributes:
        public_key: this transport's Z85 public key (`zmq.curve_keypair()`).
        secret_key: its Z85 secret key.
        accepted_keys: the Z85 public keys of the peers allowed to connect to us,
            checked by the transport's own ZAP handler; any other is refused.
    """

    public_key: bytes
    secret_key: bytes
    accepted_keys: frozenset[bytes] = frozenset()

    def __post_init__(self) -> None:
        _curve_key("public_key", self.public_key)
        _curve_key("secret_key", self.secret_key)
        if not isinstance(self.accepted_keys, frozenset):
            raise TransportUsageError("accepted_keys must be a frozenset of Z85 keys")
        for key in self.accepted_keys:
            _curve_key("an accepted key", key)

    def accepted_raw(self) -> frozenset[bytes]:
        """The accepted keys as the 32-byte values ZAP requests carry."""
        return frozenset(z85.decode(k) for k in self.accepted_keys)


@dataclass(frozen=True)
class TransportConfig:
    """How one transport behaves; every field is checked when the transport is built.

    Attributes:
        credit_window: bytes a sender may have in flight to one peer before it parks.
        min_charge: the least a message costs against the window, however small.
        max_message_size: the largest payload (all frames) a submit accepts; a receiver
            rejects a larger one after reading its envelope.
        hard_message_cap: libzmq `MAXMSGSIZE` per frame, above `max_message_size`: a
            frame beyond it drops the connection (counted as a peer loss).
        slots: request slots per peer (completions it may owe us at once).
        heartbeat_interval: seconds between application probes to each peer.
        heartbeat_timeout: seconds of silence after which a peer is lost; also the
            longest a `connect()` may take to complete its hello exchange.
        batch: records handed to `on_receive` per socket per wake (32: see
            docs/transports.md, "Why one I/O thread").
        curve: CURVE keys for both ROUTERs; None (the default) is plaintext.
    """

    credit_window: int = 16 * MIB
    min_charge: int = 256
    max_message_size: int = 4 * MIB
    hard_message_cap: int | None = None
    slots: int = 65_536
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    batch: int = 32
    curve: CurveConfig | None = None

    def __post_init__(self) -> None:
        for name in ("credit_window", "min_charge", "max_message_size", "slots", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TransportUsageError(f"{name} must be a positive int, got {value!r}")
        if self.max_message_size > MAX_MESSAGE_SIZE:
            raise TransportUsageError(
                f"max_message_size must be at most {MAX_MESSAGE_SIZE} (4 GiB - 1), "
                f"got {self.max_message_size}"
            )
        if self.min_charge > self.credit_window:
            raise TransportUsageError("min_charge must not exceed credit_window")
        cap = self.hard_message_cap
        if cap is not None and (not isinstance(cap, int) or cap <= self.max_message_size):
            raise TransportUsageError("hard_message_cap must be an int above max_message_size")
        for name in ("heartbeat_interval", "heartbeat_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise TransportUsageError(f"{name} must be positive seconds, got {value!r}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise TransportUsageError("heartbeat_timeout must exceed heartbeat_interval")
        if self.curve is not None and not isinstance(self.curve, CurveConfig):
            raise TransportUsageError("curve must be a CurveConfig or None")

    @property
    def frame_cap(self) -> int:
        """The libzmq per-frame hard cap in use."""
        return self.hard_message_cap or 2 * self.max_message_size + 65_536


@dataclass(frozen=True)
class Endpoints:
    """The two bound addresses of a transport: the application connection (messages,
    requests, under credit) and the completion connection (replies and flow frames),
    and its CURVE public key when it has one (a connecting peer needs it)."""

    application: str
    completion: str
    curve_public_key: bytes | None = None


class SubmitStatus(enum.Enum):
    """OK: admitted now. BACKPRESSURED: not yet; see `SubmitResult.admitted`."""

    OK = "ok"
    BACKPRESSURED = "backpressured"


@dataclass(frozen=True)
class SubmitResult:
    """What `submit` / `submit_request` promise. Built by the transport only.

    * `OK`: the frames are admitted (charged against credit, queued to the I/O thread).
    * `BACKPRESSURED` with `admitted`: parked; the future completes with None exactly
      once when the frames are admitted, or fails once with `PeerLost` or `Closed`.
    * `BACKPRESSURED` with `admitted` None: a request found no free slot; nothing was
      accepted (the framework maps it to `UnavailableError`).
    """

    status: SubmitStatus
    admitted: Future[None] | None = None

    @property
    def no_slot(self) -> bool:
        """True when a request was refused for want of a completion slot."""
        return self.status is SubmitStatus.BACKPRESSURED and self.admitted is None


class InboundKind(enum.Enum):
    """What a received record is."""

    MESSAGE = "message"
    REQUEST = "request"
    REPLY = "reply"
    NOTICE = "notice"


@dataclass(frozen=True)
class Inbound:
    """One received record, handed to the `on_receive` callback.

    Attributes:
        peer: the sender's name.
        kind: MESSAGE, REQUEST (reply with `Transport.reply(peer, route_id, ...)`),
            REPLY or NOTICE (both on the completion connection; they carry no credit).
        route_id: the opaque reply-route id of a REQUEST or REPLY, else 0.
        frames: the payload frames (empty when `rejected` is set).
        charge: the credit this record holds; give it back with `Transport.release`
            once consumed (0 for replies and rejected records).
        rejected: set when the transport refused the payload (too large) after reading
            the envelope; the route id is still good for an error reply.
    """

    peer: bytes
    kind: InboundKind
    route_id: int
    frames: Sequence[bytes]
    charge: int
    rejected: TransportError | None = None


_new = object.__new__


def make_inbound(
    peer: bytes,
    kind: InboundKind,
    route_id: int,
    frames: Sequence[bytes],
    charge: int,
    rejected: TransportError | None = None,
) -> Inbound:
    """The receiver's constructor of an `Inbound`: the same frozen record, its fields
    written straight into its `__dict__` (a frozen dataclass's `__init__` goes through
    `object.__setattr__` once per field, four times the cost, once per message)."""
    record: Inbound = _new(Inbound)
    fields = record.__dict__
    fields["peer"] = peer
    fields["kind"] = kind
    fields["route_id"] = route_id
    fields["frames"] = frames
    fields["charge"] = charge
    fields["rejected"] = rejected
    return record


class PeerEventKind(enum.Enum):
    """CONNECTED: a connection to the peer is up. READY: both connections are open and
    the hello exchange is done. LOST: the peer is gone; its parked frames failed."""

    CONNECTED = "connected"
    READY = "ready"
    LOST = "lost"


@dataclass(frozen=True)
class PeerEvent:
    """A change of a peer's state, handed to the `on_event` callback."""

    peer: bytes
    kind: PeerEventKind
    reason: str = ""
    #: LOST only: True when the peer was declared lost because it went silent (no
    #: frame within `heartbeat_timeout`: it may be paused, overloaded or cut off, and may
    #: come back); False when its connection closed, it restarted or was disconnected.
    silent: bool = False


class FlowState(enum.Enum):
    """The receive flow state a transport announces to its senders."""

    RUNNING = 0
    PAUSED = 1


@dataclass(frozen=True)
class PeerStatistics:
    """A snapshot of one peer as this transport sees it."""

    peer: bytes
    ready: bool
    credit_window: int
    credit_in_use: int
    credit_owed: int
    unreleased: int
    parked_messages: int
    parked_bytes: int
    slots_in_use: int
    paused_by_peer: bool
    sent_frames: int
    sent_bytes: int
    received_frames: int
    received_bytes: int


@dataclass(frozen=True)
class TransportStatistics:
    """A snapshot of the whole transport.

    The `*_frames` counters count records (a message, request, reply or protocol
    record, with its payload frames), `*_bytes` their envelopes and payloads; the
    `*_messages` counters count the wire messages that carried them (the I/O thread
    packs the records of one wake to one peer into as few as it can).
    """

    name: bytes
    flow: FlowState
    peers: int
    lost_peers: int
    dropped_frames: int
    parked_messages: int
    parked_bytes: int
    credit_in_use: int
    sent_frames: int
    sent_bytes: int
    received_frames: int
    received_bytes: int
    per_peer: tuple[PeerStatistics, ...] = field(default=())
    sent_messages: int = 0
    received_messages: int = 0
    #: of `sent_messages`, those the submitting thread sent itself while the I/O thread
    #: slept (one record each; docs/transports.md, "Direct sends")
    direct_messages: int = 0
