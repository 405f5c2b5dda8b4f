"""The RouteMesh wire codec: the envelope frame, payload types by name, errors by kind.

A message between two nodes is an `Envelope` frame (a msgspec MessagePack array, checked
on its own so that a request's ids are readable even when its payload is refused) and,
for sends, requests and replies, a payload frame encoded by `Codec.encode_payload`.

A payload crosses under its *type name* (`type_name`: the class attribute `type_name`
when it is a str, else the class's `__qualname__`). A node decodes only the types it knows
(`TypeRegistry`: its handler parameters and return annotations, its `reply=` types and
`message_types=`); a plain value (None, bool, int, float, str, bytes, list, dict, tuple)
crosses with the empty name. Every failure to encode or decode is a `ProtocolError`,
never another exception (design/mesh.md §2 "Wire"). Never pickle.

docs/mesh-codec.md ("Wire and codec") has the rules and the figures.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import typing
from collections.abc import Iterable, Iterator
from typing import Any, Final, cast

import msgspec
import msgspec.inspect as mi

from .._core.errors import (
    ConfigurationError,
    ErrorKind,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    error_for_kind,
)

__all__ = [
    "ACK",
    "ADMIT",
    "BYE",
    "CANCEL",
    "COMMANDS",
    "DROPPED",
    "ENVELOPE_DECODER",
    "FIN",
    "FULL",
    "HELD",
    "HELLO",
    "OBJECTS",
    "OPEN",
    "REJECT",
    "REPLY",
    "REQUEST",
    "REQUEST_AGAIN",
    "SEND",
    "TARGET_KINDS",
    "UPDATE",
    "WAITING",
    "Codec",
    "Envelope",
    "TypeRegistry",
    "decode_envelope",
    "encode_envelope",
    "encode_fields",
    "encode_send",
    "renumbered",
    "route_of",
    "encode_request",
    "type_name",
]

SEND: Final = 1
REQUEST: Final = 2
REPLY: Final = 3
CANCEL: Final = 4
HELLO: Final = 5
ADMIT: Final = 6
REJECT: Final = 7
#: Channel weights or draining, after the handshake.
UPDATE: Final = 8
BYE: Final = 9
#: Per-target flow (docs/mesh.md "One full target"), naming the target by `target_kind`
#: and `target`: a notice that one of our one-ways to it had to wait (send it no more
#: one-ways); a notice that it has room again (`route`: for how many); the sender's
#: record, behind what it sent on OPEN, that more are waiting for it; the sender's
#: notice that it holds them back now.
FULL: Final = 10
OPEN: Final = 11
WAITING: Final = 12
HELD: Final = 13
#: A notice from the receiver of one-ways: every SEND of this sender's lifecycle up to
#: sequence number `route` reached it (the sender stops keeping them for a resend).
ACK: Final = 14
#: A notice from a peer that learned of our drain: its last one-way to us is sequence
#: number `route`, and it sends us no more (we handle every one up to it first).
FIN: Final = 15
#: A notice from the receiver of one-ways: `route` of this sender lifecycle's one-ways
#: that it had acknowledged were never handled there, in all (a running total, so a
#: notice sent again after a lost connection counts nothing twice); the sender counts
#: what the total adds as lost.
DROPPED: Final = 16
#: A request sent again to a peer that came back with the same lifecycle after it was
#: found silent (docs/mesh.md "Requests across a pause"): the same `route` and request
#: number (`seq`) as the first time; the receiver runs it only if the first one never
#: reached it, else it answers from what it knows (running: the reply goes on this
#: connection; a reply kept for it; else an `UnavailableError` that says it may have run).
REQUEST_AGAIN: Final = 17
#: Every command an envelope may carry.
COMMANDS: Final = frozenset(
    {
        SEND,
        REQUEST,
        REPLY,
        CANCEL,
        HELLO,
        ADMIT,
        REJECT,
        UPDATE,
        BYE,
        FULL,
        OPEN,
        WAITING,
        HELD,
        ACK,
        FIN,
        DROPPED,
        REQUEST_AGAIN,
    }
)
#: The target kind of the global objects' own requests between nodes (create, close,
#: publish: `mesh/objects.py`).
OBJECTS: Final = "objects"
#: Every `Envelope.target_kind` ("" = no target: handshake, replies, flow).
TARGET_KINDS: Final = frozenset({"Spot", "Actor", "channel", "node", OBJECTS, ""})

_OP_BYTES: Final = 16  # an OperationId is 128 bits
_MAX_ROUTE: Final = 2**64 - 1  # a ReplyRouteId is 64 bits
_MAX_DEADLINE: Final = threading.TIMEOUT_MAX  # the longest budget any call accepts
_NO_ERROR: Final = -1


class Envelope(msgspec.Struct, array_like=True, frozen=True):
    """The first frame of every message between nodes.

    Checked when made and when decoded: `command` one of `COMMANDS`, `op` empty or 16
    bytes, `route` in 0..2**64-1, `target_kind` one of `TARGET_KINDS`, `deadline` in
    0..`threading.TIMEOUT_MAX` (NaN refused), `error_kind` -1 or more; `reason` is any
    str (one this version does not know reads as `UNSPECIFIED`, never an error); `due`
    finite and >= 0. Trailing array elements a newer peer may add are ignored.
    """

    command: int
    op: bytes = b""  # the 16-byte OperationId (b"" when none)
    route: int = 0  # the ReplyRouteId (0 when none)
    target_kind: str = ""
    target: str = ""  # a Spot or Actor id, a ChannelName or a routing id
    mesh: str = ""  # the mesh name (node calls and the handshake)
    deadline: float = 0.0  # remaining seconds at send (requests); 0.0 = none
    metadata: dict[str, Any] | None = None  # msgspec-encodable values only
    type_name: str = ""  # the payload's type name ("" = none, or a plain value)
    error_kind: int = _NO_ERROR  # replies: -1 success, else an ErrorKind value
    error: str = ""  # replies: the error message
    #: Instance intent of a Spot message (None: none; "": the receiver's only
    #: InstanceSpot type; else that type's name).
    intent: str | None = None
    #: Replies of kind UNAVAILABLE: the `UnavailableReason` value ("" = none given; an
    #: older peer's shorter array leaves it so).
    reason: str = ""
    #: A request's deadline on its caller's `time.monotonic()` clock, seconds; 0.0 =
    #: none (another command, a caller on an injected clock, an older peer). The
    #: receiver reads it through its heartbeat's bound on the caller's clock offset
    #: (docs/mesh.md "Deadlines across nodes").
    due: float = 0.0
    #: A request's number among its caller lifecycle's requests to this receiver
    #: lifecycle (1, 2, ... in the order they were sent; 0 = none: another command, an
    #: older peer). The receiver remembers which it received, so a request sent again
    #: after a pause (`REQUEST_AGAIN`) never runs twice.
    seq: int = 0

    def __post_init__(self) -> None:
        # On decode msgspec has checked the types and turns these into ValidationError.
        if self.command not in COMMANDS:
            raise ValueError(f"unknown command {self.command!r}")
        if len(self.op) not in (0, _OP_BYTES):
            raise ValueError(f"an OperationId is {_OP_BYTES} bytes, got {len(self.op)}")
        if not 0 <= self.route <= _MAX_ROUTE:
            raise ValueError(f"a ReplyRouteId is 0..2**64-1, got {self.route!r}")
        if self.target_kind not in TARGET_KINDS:
            raise ValueError(f"unknown target kind {self.target_kind!r}")
        if not 0.0 <= self.deadline <= _MAX_DEADLINE:  # False for NaN
            raise ValueError(f"deadline must be 0..TIMEOUT_MAX seconds, got {self.deadline!r}")
        if not 0.0 <= self.due < math.inf:  # False for NaN
            raise ValueError(f"due must be a finite time >= 0, got {self.due!r}")
        if self.error_kind < _NO_ERROR:
            raise ValueError(f"error_kind must be -1 or an ErrorKind, got {self.error_kind}")
        if not 0 <= self.seq <= _MAX_ROUTE:
            raise ValueError(f"a request number is 0..2**64-1, got {self.seq!r}")


#: Decodes an envelope frame without the checks' frame around it: the receive paths
#: call it directly (`decode_envelope` turns its errors into `ProtocolError`).
ENVELOPE_DECODER: Final = msgspec.msgpack.Decoder(Envelope)
_ENCODER: Final = msgspec.msgpack.Encoder()


def encode_fields(
    command: int,
    op: bytes = b"",
    route: int = 0,
    target_kind: str = "",
    target: str = "",
    mesh: str = "",
    deadline: float = 0.0,
    metadata: dict[str, Any] | None = None,
    type_name: str = "",
    error_kind: int = _NO_ERROR,
    error: str = "",
    intent: str | None = None,
    reason: str = "",
    due: float = 0.0,
    seq: int = 0,
) -> bytes:
    """The bytes `encode_envelope(Envelope(...))` gives for these fields (an array-like
    Struct is a MessagePack array), without making and checking an `Envelope`: for the
    node's own envelopes on the hot path, whose fields it made itself.

    Raises:
        ProtocolError: a `metadata` value msgspec cannot encode.
    """
    fields = (command, op, route, target_kind, target, mesh, deadline, metadata, type_name)
    try:
        return _ENCODER.encode((*fields, error_kind, error, intent, reason, due, seq))
    except Exception as exc:  # TypeError, OverflowError, RecursionError from msgspec
        raise ProtocolError(f"the envelope cannot be encoded: {_why(exc)}") from None


def encode_send(
    route: int,
    target_kind: str,
    target: str,
    mesh: str,
    metadata: dict[str, Any] | None,
    type_name: str,
    intent: str | None,
) -> bytes:
    """A one-way's (SEND) envelope, as short as it decodes: the fields after
    `type_name` (or after `intent` when it has one) are left off, which decodes to their
    defaults (an older, shorter array), and its `deadline` of 0.0 is written as the int
    0, which a float field reads as 0.0: 18 or 21 bytes less per one-way, kept while it
    is parked or not acknowledged (docs/mesh.md "What a parked one-way costs its
    sender").

    Raises:
        ProtocolError: a `metadata` value msgspec cannot encode.
    """
    try:
        if intent is None:
            return _ENCODER.encode(
                (SEND, b"", route, target_kind, target, mesh, 0, metadata, type_name)
            )
        return _ENCODER.encode(
            (
                SEND,
                b"",
                route,
                target_kind,
                target,
                mesh,
                0,
                metadata,
                type_name,
                _NO_ERROR,
                "",
                intent,
            )
        )
    except Exception as exc:  # TypeError, OverflowError, RecursionError from msgspec
        raise ProtocolError(f"the envelope cannot be encoded: {_why(exc)}") from None


def route_of(frame: bytes) -> int:
    """The `route` of envelope `frame` (ours: well formed), e.g. a one-way's sequence
    number, which a parked one-way's `Peer.unacked` entry reads back rather than keep."""
    route: int = ENVELOPE_DECODER.decode(frame).route
    return route


def renumbered(frame: bytes, route: int) -> bytes:
    """The envelope `frame` (ours, as `encode_fields` made it) with `route` in place of
    its own: a one-way held back for a full target gets its sequence number only when
    it is handed to the transport (docs/mesh.md "One-ways across a pause")."""
    return _ENCODER.encode(msgspec.structs.replace(ENVELOPE_DECODER.decode(frame), route=route))


def encode_request(
    head: tuple[int, bytes, int, str, str, str],
    deadline: float,
    metadata: dict[str, Any] | None,
    type_name: str,
    intent: str | None,
    due: float,
    seq: int = 0,
) -> bytes:
    """A request's envelope from its leading fields (command, op, route, target kind,
    target, mesh): `encode_envelope(Envelope(*head, deadline, metadata, type_name,
    intent=intent, due=due, seq=seq))` (its `reason` is ""), without making and checking the
    `Envelope` (every request sent; its `except` is `encode_fields`').

    Raises:
        ProtocolError: a `metadata` value msgspec cannot encode.
    """
    try:
        return _ENCODER.encode(
            (*head, deadline, metadata, type_name, _NO_ERROR, "", intent, "", due, seq)
        )
    except Exception as exc:  # TypeError, OverflowError, RecursionError from msgspec
        raise ProtocolError(f"the envelope cannot be encoded: {_why(exc)}") from None


def encode_envelope(env: Envelope) -> bytes:
    """The MessagePack bytes of `env`.

    Raises:
        TypeError: `env` is not an `Envelope`.
        ProtocolError: a field msgspec cannot encode (a `metadata` value of another type).
    """
    if type(env) is not Envelope:
        raise TypeError(f"encode_envelope takes an Envelope, got {type(env).__name__}")
    try:
        return _ENCODER.encode(env)
    except Exception as exc:  # TypeError, OverflowError, RecursionError from msgspec
        raise ProtocolError(f"the envelope cannot be encoded: {_why(exc)}") from None


def decode_envelope(data: bytes | bytearray | memoryview) -> Envelope:
    """The `Envelope` in `data` (bytes, bytearray or memoryview).

    Raises:
        ProtocolError: `data` is not a well-formed envelope: not MessagePack, truncated or
            followed by more bytes, not an array, a field of the wrong type, or a value
            out of range (see `Envelope`).
    """
    try:
        return ENVELOPE_DECODER.decode(data)
    except (msgspec.MsgspecError, RecursionError) as exc:  # RecursionError: deep metadata
        raise ProtocolError(f"malformed envelope: {_why(exc)}") from None
    except TypeError as exc:  # not a bytes-like object at all
        raise ProtocolError(f"malformed envelope: {_why(exc)}") from None


def type_name(cls: type) -> str:
    """The name a payload of class `cls` crosses the wire under: `cls.type_name` when it
    is a str class attribute (set on the class or inherited; the default of a dataclass
    field named `type_name` is not one), else `cls.__qualname__`."""
    name = getattr(cls, "type_name", None)
    if isinstance(name, str) and not _is_dataclass_field(cls, "type_name"):
        return name
    return cls.__qualname__


def _is_dataclass_field(cls: type, name: str) -> bool:
    return dataclasses.is_dataclass(cls) and any(f.name == name for f in dataclasses.fields(cls))


#: The classes of plain values: they cross with the empty type name, unregistered.
_PLAIN: Final[frozenset[type]] = frozenset(
    {type(None), bool, int, float, str, bytes, list, dict, tuple}
)


class TypeRegistry:
    """The payload types one node can decode, by type name.

    Filled before the node starts (its handler types, `reply=` types and
    `message_types=`); read on every message afterwards.
    """

    def __init__(self, types: Iterable[type] = ()) -> None:
        self._by_name: dict[str, type] = {}
        self._by_class: dict[type, str] = {}
        for cls in types:
            self.add(cls)

    def add(self, cls: type) -> None:
        """Register `cls` under `type_name(cls)`; adding the same class again does nothing.

        Raises:
            ConfigurationError: `cls` is not a class; its `type_name` is the empty str;
                another class already has its type name; or msgspec cannot encode and
                decode it (a class that is not a Struct, dataclass, enum of int or str
                values, NamedTuple or builtin, or one with a field of such a class; a
                field typed `object` is fine: msgspec carries it as `Any`); a TypedDict
                (its values are plain dicts, so they never carry its name).
        """
        if not isinstance(cls, type):
            raise ConfigurationError(f"a payload type must be a class, got {cls!r}")
        if cls in self._by_class:
            return
        name = type_name(cls)
        if not name:
            raise ConfigurationError(f"{cls.__qualname__}.type_name must not be empty")
        if typing.is_typeddict(cls):
            raise ConfigurationError(
                f"{_where(cls)} is a TypedDict: its values are plain dicts, which cross "
                "unnamed; use a Struct or a dataclass for a payload type"
            )
        other = self._by_name.get(name)
        if other is not None:
            raise ConfigurationError(
                f"{_where(cls)} and {_where(other)} have the same type name {name!r}: "
                "set a distinct `type_name` class attribute on one of them"
            )
        _check_msgspec(cls)
        self._by_name[name] = cls
        self._by_class[cls] = name

    def get(self, name: str) -> type | None:
        """The class registered under `name`, or None."""
        return self._by_name.get(name)

    def name_of(self, cls: type) -> str | None:
        """The type name `cls` is registered under, or None when it is not registered."""
        return self._by_class.get(cls)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        """Every registered type name, sorted."""
        return sorted(self._by_name)


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_msgspec(cls: type) -> None:
    try:
        msgspec.msgpack.Decoder(cls)
        info = mi.type_info(cls)
    except Exception as exc:  # TypeError; NameError for an annotation that does not resolve
        raise ConfigurationError(f"{_where(cls)} cannot cross the wire: {_why(exc)}") from None
    # `object` as a payload type of its own says nothing a receiver could decode into
    custom = cls if cls is object else next(_custom_types(info, set()), None)
    if custom is not None:
        what = "it is" if custom is cls else f"it holds {custom.__qualname__}, which is"
        raise ConfigurationError(
            f"{_where(cls)} cannot cross the wire: {what} not a type msgspec can encode "
            "and decode (a Struct, a dataclass, an enum of int or str values, a builtin)"
        )


def _custom_types(info: object, seen: set[int]) -> Iterator[type]:
    """The classes msgspec would need hooks for, anywhere inside `info` (a type_info).

    `object` is not one: msgspec encodes and decodes a field typed `object` as it does
    `Any` (a value it cannot encode fails that one call, with `ProtocolError`)."""
    if isinstance(info, mi.CustomType):
        if info.cls is not object:
            yield info.cls
        return
    if not isinstance(info, mi.Type) or id(info) in seen:  # a recursive Struct: seen
        return
    seen.add(id(info))
    for field in info.__struct_fields__:
        value = getattr(info, field)
        for item in value if isinstance(value, tuple) else (value,):
            yield from _custom_types(item.type if isinstance(item, mi.Field) else item, seen)


#: Decoders for `into` types that are not registered (reply= types), bounded.
_MAX_DECODERS: Final = 1024


class Codec:
    """Payloads and errors to and from the wire, for one node.

    The decoders are made once per type and cached: the node calls this on every message,
    from several threads (msgspec's encoders and decoders may be shared).
    """

    def __init__(self, registry: TypeRegistry, max_message_size: int) -> None:
        """Not meant to be made by applications: the mesh node makes its own.

        Raises:
            TypeError: `registry` is not a `TypeRegistry`.
            ConfigurationError: `max_message_size` is not an int > 0.
        """
        if not isinstance(registry, TypeRegistry):
            raise TypeError(f"registry must be a TypeRegistry, got {type(registry).__name__}")
        if type(max_message_size) is not int or max_message_size <= 0:
            raise ConfigurationError(
                f"max_message_size must be an int > 0, got {max_message_size!r}"
            )
        self._registry = registry
        self._by_class = registry._by_class
        self._max = max_message_size
        self._encoder = msgspec.msgpack.Encoder()
        self._plain = msgspec.msgpack.Decoder()
        self._decoders: dict[object, msgspec.msgpack.Decoder[Any]] = {}
        self._expected: dict[type, str | None] = {}  # each `into` class's type name
        # The decoder of every message, found in one dict read (`_target` and `_decoder`
        # are two frames more). A registered name never changes class, so `_named` (one
        # entry per registered name) never goes stale; `_exact` keeps only the pairs
        # whose payload is the expected class itself, which no registration can change.
        self._named: dict[str, msgspec.msgpack.Decoder[Any]] = {}
        self._exact: dict[tuple[str, type], msgspec.msgpack.Decoder[Any]] = {}

    @property
    def registry(self) -> TypeRegistry:
        return self._registry

    @property
    def max_message_size(self) -> int:
        return self._max

    def encode_payload(self, value: object) -> tuple[str, bytes]:
        """The type name and MessagePack bytes of `value`.

        The name is the registered type name of `type(value)` (the exact class, not a base
        class), or "" for a plain value whose class is not registered.

        Raises:
            ProtocolError: the value's class is not plain and cannot be registered (a
                class msgspec cannot carry, or a type name another class holds); msgspec
                cannot encode it (an unsupported value inside it, an int beyond 64 bits);
                or it encodes to more than `max_message_size` bytes. Nothing was sent.
        """
        cls = type(value)
        name = self._by_class.get(cls)  # `registry.name_of`, without its frame
        if name is None:
            name = "" if cls in _PLAIN else self._learn(cls)
        try:
            data = self._encoder.encode(value)
        except Exception as exc:  # TypeError, OverflowError, RecursionError from msgspec
            raise ProtocolError(
                f"a {cls.__qualname__} payload cannot be encoded: {_why(exc)}"
            ) from None
        if len(data) > self._max:
            raise ProtocolError(
                f"a {cls.__qualname__} payload is {len(data)} bytes encoded, more than "
                f"max_message_size ({self._max})"
            )
        return name, data

    def _learn(self, cls: type) -> str:
        """A class this Host sends without having declared it: registered now, so its
        name is known from here on (a reply of it decodes too)."""
        try:
            self._registry.add(cls)
        except ConfigurationError as exc:
            raise ProtocolError(
                f"a {cls.__qualname__} payload cannot cross the wire: {exc}"
            ) from None
        name = self._registry.name_of(cls)
        assert name is not None
        return name

    def decode_payload(
        self, name: str, data: bytes | bytearray | memoryview, into: object = None
    ) -> object:
        """The value `data` holds, a payload that crossed under type name `name`.

        Args:
            name: the envelope's type name ("" = a plain value).
            data: the payload frame.
            into: what the receiver expects (a handler's parameter type, a `reply=`), or
                None (`object` and `typing.Any` expect nothing either). A class must be
                the payload's own type (its type name is `name`) or a base class of the
                registered class named `name`: another type, even with the same fields,
                is refused, and a plain value (name "") is accepted only by a plain class
                (`int`, `list`, ...). Any other type msgspec validates (`int | None`,
                `list[Point]`) is decoded into strictly, whatever the name.

        Raises:
            ProtocolError: the type is not the expected one; `name` is unknown (no
                `into`); `data` is not valid MessagePack of that type; `data` is larger
                than `max_message_size`.
        """
        if len(data) > self._max:
            raise ProtocolError(
                f"the payload is {len(data)} bytes, more than max_message_size ({self._max})"
            )
        if into is None or into is object or into is Any:  # no expectation at all
            if not name:
                decoder = self._plain
            else:
                found = self._named.get(name)
                if found is None:
                    cls = self._registry.get(name)
                    if cls is None:
                        raise ProtocolError(f"unknown payload type {name!r}")
                    found = self._named[name] = self._decoder(cls)
                decoder = found
        elif isinstance(into, type):
            try:
                exact = self._exact.get((name, into))
            except TypeError:  # a class that refuses hashing: the full path, uncached
                exact = self._decoder(self._target(name, into))
            if exact is None:
                target = self._target(name, into)
                exact = self._decoder(target)
                if target is into and len(self._exact) < _MAX_DECODERS:
                    self._exact[(name, into)] = exact
            decoder = exact
        else:
            decoder = self._decoder(into)
        try:
            return decoder.decode(data)
        except Exception as exc:  # ValidationError, DecodeError, RecursionError, not bytes
            shown = name or "plain value"
            raise ProtocolError(f"the {shown} payload does not decode: {_why(exc)}") from None

    def _target(self, name: str, into: type) -> type:
        """The class to decode a payload named `name` into, when a class is expected."""
        try:
            expected = self._expected[into]
        except KeyError:
            # A TypedDict has no instances of its own (its values are dicts): a shape only.
            expected = None if typing.is_typeddict(into) else type_name(into)
            if len(self._expected) < _MAX_DECODERS:
                self._expected[into] = expected
        if expected is None or name == expected:
            return into
        if not name:
            if into in _PLAIN:
                return into
            raise ProtocolError(f"the payload is a plain value, expected {expected}")
        cls = self._registry.get(name)
        if cls is not None and _is_subclass(cls, into):
            return cls  # as in one process: an instance of a subclass is an instance
        raise ProtocolError(f"the payload is {name}, expected {expected}")

    def _decoder(self, target: object) -> msgspec.msgpack.Decoder[Any]:
        try:
            return self._decoders[target]
        except KeyError:
            pass
        except TypeError:  # an unhashable type: make it, do not cache it
            return self._new_decoder(target)
        decoder = self._new_decoder(target)
        if len(self._decoders) < _MAX_DECODERS:
            self._decoders[target] = decoder
        return decoder

    @staticmethod
    def _new_decoder(target: object) -> msgspec.msgpack.Decoder[Any]:
        try:
            return msgspec.msgpack.Decoder(target)
        except Exception as exc:  # TypeError: not a type msgspec can decode into
            raise ProtocolError(f"cannot decode into {target!r}: {_why(exc)}") from None

    def encode_error(self, exc: BaseException) -> tuple[int, str]:
        """The error kind and message a failure crosses as.

        A `ZlinkError` keeps its kind and message; anything else (or a `ZlinkError` whose
        `kind` is not an `ErrorKind`) is `INTERNAL_FAILURE` with the class named.
        """
        if isinstance(exc, ZlinkError):
            kind = exc.kind
            if type(kind) is ErrorKind or (type(kind) is int and kind in _KINDS):
                return int(kind), str(exc)
        return int(ErrorKind.INTERNAL_FAILURE), f"{type(exc).__qualname__}: {exc}"

    @staticmethod
    def encode_reason(exc: BaseException) -> str:
        """The `Envelope.reason` a failure crosses with: an `UnavailableError`'s reason
        value, "" for any other error or an unspecified reason."""
        if isinstance(exc, UnavailableError) and exc.reason is not _UNSPECIFIED:
            return cast(str, exc.reason.value)
        return ""

    @staticmethod
    def decode_error(kind: int, message: str, reason: str = "") -> ZlinkError:
        """The `ZlinkError` subclass of `kind` with `message` as is; an unknown kind (or
        a kind or message of the wrong type) is a `ProtocolError` saying so. An
        `UnavailableError` gets the `UnavailableReason` whose value is `reason`;
        `UNSPECIFIED` when `reason` is "", unknown or not a str (never an error)."""
        if type(kind) is not int and type(kind) is not ErrorKind:
            return ProtocolError(f"the error kind is a {type(kind).__name__}, not an int")
        if not isinstance(cast(object, message), str):  # it came off a wire
            return ProtocolError(f"the error message is a {type(message).__name__}, not a str")
        if kind not in _KINDS:
            return ProtocolError(f"unknown error kind {kind}: {message}")
        if kind == _UNAVAILABLE:
            found = _REASONS.get(reason) if type(reason) is str else None
            return UnavailableError(message, reason=found or _UNSPECIFIED)
        return error_for_kind(ErrorKind(kind), message)

    def roundtrip(self, value: object, into: object = None) -> object:
        """`value` as the other side would see it: encoded, then decoded (into `into`).

        For `Host(check_codec=True)`: a value that could not cross fails here too.

        Raises:
            ProtocolError: as `encode_payload` and `decode_payload`.
        """
        name, data = self.encode_payload(value)
        return self.decode_payload(name, data, into)


_KINDS: Final = frozenset(int(kind) for kind in ErrorKind)
_UNAVAILABLE: Final = int(ErrorKind.UNAVAILABLE)
_UNSPECIFIED: Final = UnavailableReason.UNSPECIFIED
#: Every reason by its wire value ("" and an unknown value are not in it).
_REASONS: Final = {reason.value: reason for reason in UnavailableReason}


def _is_subclass(cls: type, base: type) -> bool:
    try:
        return issubclass(cls, base)
    except TypeError:  # a base whose subclass check refuses (a non-runtime Protocol)
        return False


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
