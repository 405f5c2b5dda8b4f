"""The RouteMesh wire codec (design/mesh.md §2 "Wire"): envelopes, payload type names, the type
registry, payload decoding into the expected type, and errors by kind.

Every failure to encode or decode is a `ProtocolError`, never another exception; the
hypothesis tests feed random bytes and random MessagePack values to the decoders.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import threading
from typing import Any, ClassVar, NamedTuple, Protocol, TypedDict

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zlink_actors._core.errors import (
    ConfigurationError,
    ErrorKind,
    InternalFailureError,
    NotFoundError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    error_for_kind,
)
from zlink_actors.mesh.codec import (
    ACK,
    ADMIT,
    BYE,
    CANCEL,
    COMMANDS,
    DROPPED,
    FIN,
    FULL,
    HELD,
    HELLO,
    OPEN,
    REJECT,
    REPLY,
    REQUEST,
    REQUEST_AGAIN,
    SEND,
    TARGET_KINDS,
    UPDATE,
    WAITING,
    Codec,
    Envelope,
    TypeRegistry,
    decode_envelope,
    encode_envelope,
    encode_fields,
    encode_request,
    encode_send,
    route_of,
    type_name,
)

MAX = 16 * 2**20


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


class OtherPoint(msgspec.Struct, frozen=True):
    """The same fields as Point: still another type."""

    x: int
    y: int


class Named(msgspec.Struct):
    type_name: ClassVar[str] = "game.Named"
    value: str


@dataclasses.dataclass(frozen=True)
class Move:
    dx: int
    dy: int
    label: str = ""


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Base(msgspec.Struct):
    a: int


class Derived(Base):
    b: str


class Outer:
    class Inner(msgspec.Struct):
        n: int


class Pair(NamedTuple):
    left: int
    right: str


class Shape(TypedDict):
    sides: int


def codec(*types: type, max_message_size: int = MAX) -> Codec:
    return Codec(TypeRegistry(types), max_message_size)


def msgpack(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


# --- envelopes -------------------------------------------------------------------------


def test_the_commands_are_the_pinned_numbers() -> None:
    assert tuple(range(1, 10)) == (SEND, REQUEST, REPLY, CANCEL, HELLO, ADMIT, REJECT, UPDATE, BYE)
    assert (FULL, OPEN, WAITING, HELD) == (10, 11, 12, 13)
    assert (ACK, FIN, DROPPED, REQUEST_AGAIN) == (14, 15, 16, 17)
    assert frozenset(range(1, 18)) == COMMANDS


def test_an_envelope_with_every_field_set_round_trips() -> None:
    env = Envelope(
        command=REPLY,
        op=bytes(range(16)),
        route=2**64 - 1,
        target_kind="channel",
        target="match",
        mesh="game",
        deadline=4.25,
        metadata={"trace": "abc", "n": 3, "nested": [1, {"k": b"v"}], "none": None},
        type_name="game.Named",
        error_kind=int(ErrorKind.UNAVAILABLE),
        error="peer lost",
    )
    data = encode_envelope(env)
    assert isinstance(data, bytes)
    assert decode_envelope(data) == env
    assert decode_envelope(bytearray(data)) == env
    assert decode_envelope(memoryview(data)) == env


def test_an_envelope_with_only_a_command_round_trips_with_the_defaults() -> None:
    env = decode_envelope(encode_envelope(Envelope(BYE)))
    assert env == Envelope(BYE)
    assert (env.op, env.route, env.target_kind, env.deadline, env.error_kind) == (
        b"",
        0,
        "",
        0.0,
        -1,
    )
    assert env.metadata is None


def test_an_envelope_is_a_msgpack_array_and_extra_trailing_elements_are_ignored() -> None:
    data = encode_envelope(Envelope(SEND, target_kind="Spot", target="s-1"))
    assert msgspec.msgpack.decode(data)[:5] == [SEND, b"", 0, "Spot", "s-1"]
    newer = msgpack([*msgspec.msgpack.decode(data), "a field from a newer peer"])
    assert decode_envelope(newer) == Envelope(SEND, target_kind="Spot", target="s-1")


def test_a_shorter_envelope_from_an_older_peer_gets_the_defaults() -> None:
    assert decode_envelope(msgpack([SEND, b"", 0, "Spot", "s-1"])) == Envelope(
        SEND, target_kind="Spot", target="s-1"
    )


def test_the_reason_is_the_field_after_intent_and_an_older_peers_reply_has_none() -> None:
    unavailable = int(ErrorKind.UNAVAILABLE)
    data = encode_fields(REPLY, error_kind=unavailable, error="full", reason="queue_full")
    fields = msgspec.msgpack.decode(data)
    # error_kind .. seq
    assert fields[9:] == [unavailable, "full", None, "queue_full", 0.0, 0]
    assert decode_envelope(data).reason == "queue_full"
    # An older peer's reply stops after `intent` (or after `error`): no reason.
    for older in (fields[:12], fields[:11]):
        env = decode_envelope(msgpack(older))
        assert env.reason == ""
        error = Codec.decode_error(env.error_kind, env.error, env.reason)
        assert type(error) is UnavailableError
        assert error.reason is UnavailableReason.UNSPECIFIED
    # A newer peer's field after the reason is ignored.
    assert decode_envelope(msgpack([*fields, 1.5, "more"])).reason == "queue_full"


def test_a_request_carries_its_callers_deadline_last_and_an_older_peers_has_none() -> None:
    """Field 13, `due` (docs/mesh.md "Deadlines across nodes"): what `encode_request`
    writes; a request of a peer that predates it (11 to 13 elements) decodes with 0.0."""
    head = (REQUEST, bytes(16), 7, "node", "node-b", "game")
    data = encode_request(head, 0.25, None, "Ping", None, 12345.678)
    env = decode_envelope(data)
    assert (env.deadline, env.due, env.type_name, env.intent) == (0.25, 12345.678, "Ping", None)
    # no reason, then due, then its request number (none given: 0)
    assert msgspec.msgpack.decode(data)[12:] == ["", 12345.678, 0]
    older = [*head, 0.25, None, "Ping", -1, "", None, ""]
    for fields in (older, older[:-1], older[:-2]):
        assert decode_envelope(msgpack(fields)).due == 0.0


def test_a_request_carries_its_number_after_its_deadline_and_an_older_peers_has_none() -> None:
    """Field 14, `seq` (docs/mesh.md "Requests across a pause"): the request's number
    among its caller's requests to this receiver, also on a `REQUEST_AGAIN`; a request
    of a peer that predates it decodes with 0 (never taken as sent again)."""
    for command in (REQUEST, REQUEST_AGAIN):
        head = (command, bytes(16), 7, "node", "node-b", "game")
        data = encode_request(head, 0.25, None, "Ping", None, 12345.678, 42)
        env = decode_envelope(data)
        assert (env.command, env.route, env.due, env.seq) == (command, 7, 12345.678, 42)
        assert msgspec.msgpack.decode(data)[14] == 42
    older = [REQUEST, bytes(16), 7, "node", "node-b", "game", 0.25, None, "Ping"]
    assert decode_envelope(msgpack([*older, -1, "", None, "", 1.0])).seq == 0
    with pytest.raises(ProtocolError):
        decode_envelope(msgpack([*older, -1, "", None, "", 1.0, -1]))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"\xc1", "a byte msgpack never uses"),
        (b"\xff\x00garbage\x13", "garbage"),
        (msgpack([REQUEST, bytes(16), 7, "Spot", "s-1"])[:-2], "truncated"),
        (msgpack([REQUEST]) + b"\x00", "trailing bytes"),
        (msgpack({"command": REQUEST}), "a map instead of an array"),
        (msgpack([]), "no command"),
        (msgpack(REQUEST), "a bare int"),
        (msgpack(["2"]), "a str command"),
        (msgpack([True]), "a bool command"),
        (msgpack([REQUEST, "op"]), "a str OperationId"),
        (msgpack([REQUEST, b"", "7"]), "a str route"),
        (msgpack([REQUEST, b"", 0, 5]), "an int target kind"),
        (msgpack([REQUEST, b"", 0, "", "", "", "soon"]), "a str deadline"),
        (msgpack([REQUEST, b"", 0, "", "", "", 0.0, [1, 2]]), "a list as metadata"),
        (msgpack([REQUEST, b"", 0, "", "", "", 0.0, {1: 2}]), "an int metadata key"),
        (msgpack([REPLY, b"", 0, "", "", "", 0.0, None, "", "9"]), "a str error kind"),
        (msgpack([REPLY, b"", 0, "", "", "", 0.0, None, "", 9, 42]), "an int error"),
        (msgpack([REPLY, b"", 0, "", "", "", 0.0, None, "", 5, "x", None, 3]), "an int reason"),
        (msgpack([REPLY, b"", 0, "", "", "", 0.0, None, "", 5, "x", None, None]), "a nil reason"),
        (msgpack([REPLY, b"", 0, "", "", "", 0.0, None, "", 5, "x", None, b"x"]), "bytes reason"),
    ],
)
def test_a_malformed_envelope_is_a_protocol_error(data: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match="malformed envelope"):
        decode_envelope(data)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ([0], "unknown command"),
        ([18], "unknown command"),
        ([REQUEST, b"\x01" * 15], "OperationId"),
        ([REQUEST, b"\x01" * 17], "OperationId"),
        ([REQUEST, b"", -1], "ReplyRouteId"),
        ([REQUEST, b"", 0, "spot"], "target kind"),
        ([REQUEST, b"", 0, "", "", "", -0.5], "deadline"),
        ([REQUEST, b"", 0, "", "", "", math.nan], "deadline"),
        ([REQUEST, b"", 0, "", "", "", math.inf], "deadline"),
        ([REPLY, b"", 0, "", "", "", 0.0, None, "", -2], "error_kind"),
        ([REQUEST, b"", 0, "", "", "", 1.0, None, "", -1, "", None, "", -1.0], "due"),
        ([REQUEST, b"", 0, "", "", "", 1.0, None, "", -1, "", None, "", math.nan], "due"),
        ([REQUEST, b"", 0, "", "", "", 1.0, None, "", -1, "", None, "", math.inf], "due"),
    ],
)
def test_an_envelope_value_out_of_range_is_refused_on_decode_and_when_made(
    fields: list[Any], match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_envelope(msgpack(fields))
    with pytest.raises(ValueError, match=match):
        Envelope(*fields)


def test_encode_envelope_refuses_another_object_and_unencodable_metadata() -> None:
    with pytest.raises(TypeError, match="takes an Envelope"):
        encode_envelope((SEND,))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="envelope cannot be encoded"):
        encode_envelope(Envelope(SEND, metadata={"lock": threading.Lock()}))


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.binary(max_size=200))
def test_decode_envelope_of_random_bytes_decodes_or_is_a_protocol_error(data: bytes) -> None:
    try:
        env = decode_envelope(data)
    except ProtocolError:
        return
    assert type(env) is Envelope
    assert env.command in COMMANDS


_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_MSGPACK_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=30,
)
#: Arrays that look like envelopes: a command near the valid range, then fields that are
#: often of the right type, so that many decode and the checks of each field are reached.
_NEAR_ENVELOPES = st.builds(
    lambda command, rest: [command, *rest],
    st.integers(min_value=-1, max_value=11),
    st.lists(
        st.sampled_from(
            [b"", bytes(16), 0, 2**64 - 1, "Spot", "node", "x", 1.5, None, {}, "queue_full"]
        )
        | _LEAVES,
        max_size=14,
    ),
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(_NEAR_ENVELOPES | _MSGPACK_VALUES)
def test_decode_envelope_of_random_msgpack_values_decodes_or_is_a_protocol_error(
    value: object,
) -> None:
    try:
        env = decode_envelope(msgpack(value))
    except ProtocolError:
        return
    assert type(env) is Envelope
    assert decode_envelope(encode_envelope(env)) == env


def test_deeply_nested_metadata_is_a_protocol_error_not_a_recursion_error() -> None:
    head = msgpack([SEND, b"", 0, "", "", "", 0.0])[1:]  # the first seven fields
    nested = b"\x98" + head + b"\x81\xa1k" + b"\x91" * 200_000 + b"\xc0"
    shallow = b"\x98" + head + b"\x81\xa1k" + b"\x91\xc0"
    assert decode_envelope(shallow).metadata == {"k": [None]}
    with pytest.raises(ProtocolError, match="RecursionError"):
        decode_envelope(nested)


# --- type names and the registry -------------------------------------------------------


def test_a_type_name_is_the_class_attribute_when_it_is_a_str_else_the_qualname() -> None:
    assert type_name(Named) == "game.Named"
    assert type_name(Point) == "Point"
    assert type_name(Outer.Inner) == "Outer.Inner"

    class NotAStr:
        type_name = 3

    assert type_name(NotAStr).endswith("<locals>.NotAStr")


def test_a_type_name_field_of_a_struct_is_not_a_class_attribute_name() -> None:
    class HasField(msgspec.Struct):
        type_name: str = "x"

    assert type_name(HasField) == HasField.__qualname__


def test_the_default_of_a_dataclass_field_named_type_name_is_not_a_type_name() -> None:
    @dataclasses.dataclass
    class Tagged:
        type_name: str = "looks like one"

    @dataclasses.dataclass
    class Declared:
        type_name: ClassVar[str] = "declared"

    assert type_name(Tagged) == Tagged.__qualname__
    assert type_name(Declared) == "declared"


def test_the_registry_maps_names_to_classes() -> None:
    registry = TypeRegistry([Point, Named, Move])
    registry.add(Point)  # the same class again: nothing changes
    assert registry.names() == ["Move", "Point", "game.Named"]
    assert registry.get("game.Named") is Named
    assert registry.get("Named") is None
    assert "Point" in registry
    assert "OtherPoint" not in registry
    assert 3 not in registry


def test_two_classes_with_one_type_name_are_a_configuration_error() -> None:
    class Impostor(msgspec.Struct):
        type_name: ClassVar[str] = "Point"
        z: int

    registry = TypeRegistry([Point])
    with pytest.raises(ConfigurationError, match="the same type name 'Point'"):
        registry.add(Impostor)
    assert registry.get("Point") is Point
    assert registry.names() == ["Point"]


@pytest.mark.parametrize(
    ("cls", "match"),
    [
        (threading.Lock, "must be a class"),
        (list[int], "must be a class"),
        (type("Opaque", (), {}), "not a type msgspec can encode"),
        (object, "not a type msgspec can encode"),
    ],
)
def test_registering_what_msgspec_cannot_carry_is_a_configuration_error(
    cls: Any, match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        TypeRegistry().add(cls)


class Opaque:
    """A class msgspec cannot encode or decode without hooks."""


@dataclasses.dataclass
class Holder:
    items: list[Opaque]


def test_a_class_with_a_field_msgspec_cannot_carry_is_a_configuration_error() -> None:
    class FloatEnum(enum.Enum):
        HALF = 0.5

    with pytest.raises(ConfigurationError, match="it holds Opaque, which is not a type msgspec"):
        TypeRegistry([Holder])
    with pytest.raises(ConfigurationError, match="all str or all int values"):
        TypeRegistry([FloatEnum])


def test_a_class_whose_annotations_do_not_resolve_is_a_configuration_error() -> None:
    class Dangling(msgspec.Struct):
        ref: NoSuchType  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(ConfigurationError, match="NameError"):
        TypeRegistry([Dangling])


def test_a_typed_dict_is_not_a_payload_type_but_decodes_as_a_shape() -> None:
    with pytest.raises(ConfigurationError, match="is a TypedDict"):
        TypeRegistry([Shape])
    c = codec()
    name, data = c.encode_payload(Shape(sides=3))
    assert name == ""
    assert c.decode_payload(name, data, Shape) == {"sides": 3}
    with pytest.raises(ProtocolError, match="does not decode"):
        c.decode_payload("", msgpack({"sides": "3"}), Shape)


def test_an_empty_type_name_is_a_configuration_error() -> None:
    class Blank(msgspec.Struct):
        type_name: ClassVar[str] = ""

    with pytest.raises(ConfigurationError, match="must not be empty"):
        TypeRegistry([Blank])


class Node(msgspec.Struct):
    value: int
    next: Node | None = None


def test_a_recursive_struct_registers() -> None:
    c = Codec(TypeRegistry([Node]), MAX)
    chain = Node(1, Node(2, Node(3)))
    assert c.roundtrip(chain) == chain


# --- encoding payloads -----------------------------------------------------------------


def test_a_registered_payload_is_encoded_under_its_type_name() -> None:
    c = codec(Point, Named)
    assert c.encode_payload(Point(1, 2)) == ("Point", msgpack(Point(1, 2)))
    assert c.encode_payload(Named("n"))[0] == "game.Named"


@pytest.mark.parametrize(
    "value",
    [None, True, 3, -(2**63), 2**64 - 1, 2.5, "text", b"\x00bytes", [1, "a"], {"k": [1]}, (1, 2)],
)
def test_a_plain_value_is_encoded_with_the_empty_name(value: object) -> None:
    assert codec().encode_payload(value) == ("", msgpack(value))


def test_a_registered_plain_class_is_encoded_under_its_name() -> None:
    assert codec(int).encode_payload(3) == ("int", msgpack(3))


def test_a_class_a_host_sends_without_declaring_it_is_learned() -> None:
    c = codec(Point)
    assert "OtherPoint" not in c.registry
    name, data = c.encode_payload(OtherPoint(1, 2))
    assert name == "OtherPoint"
    assert "OtherPoint" in c.registry
    assert c.decode_payload(name, data) == OtherPoint(1, 2)  # its replies decode too
    name, _ = codec(Base).encode_payload(Derived(1, "b"))  # the exact class counts
    assert name == "Derived"


def test_a_class_that_cannot_cross_the_wire_is_a_protocol_error() -> None:
    c = codec(Point)
    with pytest.raises(ProtocolError, match="cannot cross the wire"):
        c.encode_payload(object())
    with pytest.raises(ProtocolError, match="cannot cross the wire"):
        c.encode_payload(threading.Lock())


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ([threading.Lock()], "TypeError"),
        (2**64, "OverflowError"),
        ({"k": object()}, "TypeError"),
    ],
)
def test_a_value_msgspec_cannot_encode_is_a_protocol_error(value: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=f"cannot be encoded: {match}"):
        codec().encode_payload(value)


def test_a_payload_larger_than_max_message_size_is_a_protocol_error() -> None:
    fits = b"x" * 95  # bin 8: 2 bytes of header
    c = codec(max_message_size=97)
    assert c.encode_payload(fits) == ("", msgpack(fits))
    with pytest.raises(ProtocolError, match="98 bytes encoded, more than max_message_size"):
        c.encode_payload(fits + b"x")
    with pytest.raises(ProtocolError, match="more than max_message_size"):
        c.decode_payload("", msgpack(fits + b"x"))


@pytest.mark.parametrize(
    ("registry", "size", "error"),
    [
        (TypeRegistry(), 0, ConfigurationError),
        (TypeRegistry(), -5, ConfigurationError),
        (TypeRegistry(), True, ConfigurationError),
        (TypeRegistry(), 1.5, ConfigurationError),
        ([Point], MAX, TypeError),
    ],
)
def test_a_codec_refuses_a_bad_registry_or_size(registry: Any, size: Any, error: type) -> None:
    with pytest.raises(error):
        Codec(registry, size)


# --- decoding payloads -----------------------------------------------------------------


def test_a_known_name_decodes_into_its_registered_class() -> None:
    c = codec(Point, Move, Color)
    for value in (Point(1, 2), Move(3, 4, "up"), Color.BLUE):
        name, data = c.encode_payload(value)
        decoded = c.decode_payload(name, data)
        assert decoded == value
        assert type(decoded) is type(value)


def test_plain_values_decode_as_plain_values() -> None:
    c = codec()
    value = {"a": [1, 2.5, "s", b"b", None, True], "t": (1, 2)}
    assert c.decode_payload("", msgpack(value)) == {
        "a": [1, 2.5, "s", b"b", None, True],
        "t": [1, 2],
    }


def test_an_unknown_payload_type_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="unknown payload type 'Elsewhere'"):
        codec(Point).decode_payload("Elsewhere", msgpack({"x": 1}))


def test_a_reply_of_another_struct_with_the_same_fields_is_a_protocol_error() -> None:
    c = codec(Point, OtherPoint)
    name, data = c.encode_payload(OtherPoint(1, 2))
    with pytest.raises(ProtocolError, match="the payload is OtherPoint, expected Point"):
        c.decode_payload(name, data, Point)
    assert c.decode_payload(name, data, OtherPoint) == OtherPoint(1, 2)


def test_a_plain_value_where_a_struct_is_expected_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="the payload is a plain value, expected Point"):
        codec(Point).decode_payload("", msgpack({"x": 1, "y": 2}), Point)


def test_into_a_class_decodes_by_its_own_type_name_even_when_not_registered() -> None:
    assert codec().decode_payload("game.Named", msgpack({"value": "v"}), Named) == Named("v")


def test_a_registered_subclass_decodes_where_its_base_is_expected() -> None:
    c = codec(Base, Derived)
    name, data = c.encode_payload(Derived(1, "b"))
    decoded = c.decode_payload(name, data, Base)
    assert type(decoded) is Derived
    assert decoded == Derived(1, "b")
    with pytest.raises(ProtocolError, match="the payload is Base, expected Derived"):
        c.decode_payload(*c.encode_payload(Base(1)), Derived)


def test_decode_into_an_optional_int() -> None:
    c = codec()
    assert c.decode_payload("", msgpack(5), int | None) == 5
    assert c.decode_payload("", msgpack(None), int | None) is None
    with pytest.raises(ProtocolError, match="Expected `int \\| null`, got `str`"):
        c.decode_payload("", msgpack("5"), int | None)


def test_decode_into_plain_classes_and_generic_types_is_strict() -> None:
    c = codec(Point)
    assert c.decode_payload("", msgpack(7), int) == 7
    assert c.decode_payload("", msgpack([1, 2]), tuple) == (1, 2)
    assert c.decode_payload("", msgpack([{"x": 1, "y": 2}]), list[Point]) == [Point(1, 2)]
    with pytest.raises(ProtocolError, match="does not decode"):
        c.decode_payload("", msgpack("7"), int)
    with pytest.raises(ProtocolError, match="does not decode"):
        c.decode_payload("", msgpack([{"x": 1}]), list[Point])


@pytest.mark.parametrize(
    ("name", "payload"),
    [
        ("Point", {"x": 1}),  # a field missing
        ("Point", {"x": 1, "y": "2"}),  # a field of the wrong type
        ("Point", [1, 2]),  # an array for a map Struct
        ("Move", {"dx": 1, "dy": True}),  # a bool is not an int
        ("Color", "green"),  # no such member
        ("Pair", [1, 2]),  # the NamedTuple's second field is a str
    ],
)
def test_a_payload_of_the_wrong_shape_for_its_type_is_a_protocol_error(
    name: str, payload: object
) -> None:
    c = codec(Point, Move, Color, Pair)
    with pytest.raises(ProtocolError, match=f"the {name} payload does not decode"):
        c.decode_payload(name, msgpack(payload))
    cls = c.registry.get(name)
    with pytest.raises(ProtocolError, match="does not decode"):
        c.decode_payload(name, msgpack(payload), cls)


def test_a_named_payload_where_a_plain_class_is_expected_must_be_a_subclass_of_it() -> None:
    c = codec(Point, Pair)
    with pytest.raises(ProtocolError, match="the payload is Point, expected int"):
        c.decode_payload(*c.encode_payload(Point(1, 2)), int)
    with pytest.raises(ProtocolError, match="the payload is Elsewhere, expected dict"):
        c.decode_payload("Elsewhere", msgpack({"x": 1}), dict)
    pair = c.decode_payload(*c.encode_payload(Pair(1, "r")), tuple)
    assert type(pair) is Pair
    assert pair == Pair(1, "r")


@pytest.mark.parametrize("into", [object, Any])
def test_into_object_or_any_decodes_by_the_name_as_with_no_into(into: object) -> None:
    c = codec(Point)
    assert c.decode_payload(*c.encode_payload(Point(1, 2)), into) == Point(1, 2)
    assert c.decode_payload("", msgpack([1, "a"]), into) == [1, "a"]
    with pytest.raises(ProtocolError, match="unknown payload type 'Elsewhere'"):
        c.decode_payload("Elsewhere", msgpack(1), into)


def test_into_a_class_whose_subclass_check_refuses_is_a_protocol_error() -> None:
    class Sized(Protocol):
        def area(self) -> float: ...

    c = codec(Point)
    with pytest.raises(ProtocolError, match="the payload is Point, expected"):
        c.decode_payload(*c.encode_payload(Point(1, 2)), Sized)


def test_deeply_nested_payloads_are_protocol_errors() -> None:
    c = codec()
    with pytest.raises(ProtocolError, match="RecursionError"):
        c.decode_payload("", b"\x91" * 200_000 + b"\xc0")
    with pytest.raises(ProtocolError, match="RecursionError"):
        c.decode_payload("", b"\x91" * 200_000 + b"\xc0", list[Any])
    value: list[Any] = []
    for _ in range(200_000):
        value = [value]
    with pytest.raises(ProtocolError, match="RecursionError"):
        c.encode_payload(value)


def test_bytes_that_are_not_msgpack_are_a_protocol_error() -> None:
    c = codec(Point)
    for name, into in (("", None), ("Point", None), ("Point", Point), ("", int | None)):
        with pytest.raises(ProtocolError, match="does not decode"):
            c.decode_payload(name, b"\xc1", into)
        with pytest.raises(ProtocolError, match="does not decode"):
            c.decode_payload(name, msgpack(Point(1, 2))[:-1], into)


def test_into_a_type_msgspec_cannot_decode_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="cannot decode into"):
        codec().decode_payload("", msgpack([1]), list[threading.Lock])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.sampled_from(["", "Point", "Move", "Color", "Pair", "Unknown"]),
    st.sampled_from([None, Point, OtherPoint, int, int | None, list[Point], Color]),
    st.one_of(st.binary(max_size=60), _MSGPACK_VALUES.map(msgpack)),
)
def test_decode_payload_of_random_data_decodes_or_is_a_protocol_error(
    name: str, into: object, data: bytes
) -> None:
    c = codec(Point, Move, Color, Pair)
    try:
        value = c.decode_payload(name, data, into)
    except ProtocolError:
        return
    if into is None and name:
        assert type(value) is c.registry.get(name)


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_error_kind_crosses_as_its_own_subclass(kind: ErrorKind) -> None:
    c = codec()
    sent = error_for_kind(kind, f"failed: {kind.name}")
    wire_kind, message = c.encode_error(sent)
    assert (wire_kind, message) == (int(kind), f"failed: {kind.name}")
    assert type(wire_kind) is int
    received = Codec.decode_error(wire_kind, message)
    assert type(received) is type(sent)
    assert received.kind is kind
    assert str(received) == f"failed: {kind.name}"


def test_not_found_is_kind_zero() -> None:
    error = Codec.decode_error(0, "no such Spot")
    assert type(error) is NotFoundError
    assert str(error) == "no such Spot"


def test_a_plain_exception_becomes_internal_failure_naming_its_class() -> None:
    c = codec()
    kind, message = c.encode_error(KeyError("missing"))
    assert (kind, message) == (int(ErrorKind.INTERNAL_FAILURE), "KeyError: 'missing'")
    received = Codec.decode_error(kind, message)
    assert type(received) is InternalFailureError
    assert str(received) == "KeyError: 'missing'"


def test_a_zlink_error_with_a_kind_that_is_not_an_error_kind_becomes_internal_failure() -> None:
    class Odd(ZlinkError):
        kind = 99  # type: ignore[assignment]

    kind, message = codec().encode_error(Odd("odd"))
    assert kind == int(ErrorKind.INTERNAL_FAILURE)
    assert message.endswith("<locals>.Odd: odd")


@pytest.mark.parametrize("reason", list(UnavailableReason), ids=lambda r: r.value)
def test_an_unavailable_error_crosses_with_its_reason(reason: UnavailableReason) -> None:
    c = codec()
    sent = UnavailableError("the target's queue is full", reason=reason)
    kind, message = c.encode_error(sent)
    wire_reason = c.encode_reason(sent)
    # UNSPECIFIED crosses as no reason at all, as from an older peer.
    assert wire_reason == ("" if reason is UnavailableReason.UNSPECIFIED else reason.value)
    env = decode_envelope(encode_fields(REPLY, error_kind=kind, error=message, reason=wire_reason))
    received = Codec.decode_error(env.error_kind, env.error, env.reason)
    assert type(received) is UnavailableError
    assert received.reason is reason
    assert str(received) == "the target's queue is full"


@pytest.mark.parametrize(
    "reason", ["", "QUEUE_FULL", "queue-full", "a reason from a newer peer", " fenced", "\x00"]
)
def test_an_unknown_reason_reads_as_unspecified_never_as_an_error(reason: str) -> None:
    received = Codec.decode_error(int(ErrorKind.UNAVAILABLE), "gone", reason)
    assert type(received) is UnavailableError
    assert received.reason is UnavailableReason.UNSPECIFIED
    assert str(received) == "gone"


@pytest.mark.parametrize("reason", [None, 3, b"fenced", ["fenced"]])
def test_a_reason_of_another_type_reads_as_unspecified(reason: Any) -> None:
    received = Codec.decode_error(int(ErrorKind.UNAVAILABLE), "gone", reason)
    assert type(received) is UnavailableError
    assert received.reason is UnavailableReason.UNSPECIFIED


def test_only_an_unavailable_error_carries_a_reason() -> None:
    c = codec()
    assert c.encode_reason(KeyError("k")) == ""
    assert c.encode_reason(NotFoundError("x")) == ""
    assert c.encode_reason(UnavailableError("x")) == ""
    received = Codec.decode_error(int(ErrorKind.NOT_FOUND), "no such Spot", "queue_full")
    assert type(received) is NotFoundError
    assert not hasattr(received, "reason")


@settings(max_examples=300, derandomize=True)
@given(
    reason=st.sampled_from([r.value for r in UnavailableReason]) | st.text(max_size=30),
    kind=st.integers(-1, 14),
)
def test_any_reason_on_the_wire_decodes_to_a_known_reason_or_unspecified(
    reason: str, kind: int
) -> None:
    data = encode_fields(REPLY, error_kind=kind, error="why", reason=reason)
    env = decode_envelope(data)
    assert env.reason == reason
    received = Codec.decode_error(env.error_kind, env.error, env.reason)
    if kind == int(ErrorKind.UNAVAILABLE):
        assert type(received) is UnavailableError
        known = {r.value: r for r in UnavailableReason}
        assert received.reason is known.get(reason, UnavailableReason.UNSPECIFIED)
    elif kind in {int(k) for k in ErrorKind}:
        assert type(received) is type(error_for_kind(ErrorKind(kind), "why"))
    else:
        assert type(received) is ProtocolError


@pytest.mark.parametrize(
    ("kind", "message"), [(13, "x"), (-1, "x"), (True, "x"), ("5", "x"), (5, 5)]
)
def test_an_unknown_error_kind_is_a_protocol_error(kind: Any, message: Any) -> None:
    error = Codec.decode_error(kind, message)
    assert type(error) is ProtocolError


# --- roundtrip (Host(check_codec=True)) ------------------------------------------------


def test_roundtrip_of_a_dataclass_and_a_struct_gives_equal_values_of_the_same_class() -> None:
    c = codec(Move, Point)
    for value in (Move(1, -2, "left"), Point(3, 4)):
        back = c.roundtrip(value)
        assert back == value
        assert back is not value
        assert type(back) is type(value)
    assert c.roundtrip(Point(3, 4), Point) == Point(3, 4)


def test_roundtrip_shows_what_the_other_side_sees_or_fails_as_the_wire_would() -> None:
    c = codec(Point)
    assert c.roundtrip((1, "a")) == [1, "a"]  # msgpack has no tuple
    assert c.roundtrip([Point(1, 2)]) == [{"x": 1, "y": 2}]  # no name inside a container
    assert c.roundtrip([Point(1, 2)], list[Point]) == [Point(1, 2)]
    assert c.roundtrip(OtherPoint(1, 2)) == OtherPoint(1, 2)  # learned as it is sent
    with pytest.raises(ProtocolError, match="cannot cross the wire"):
        c.roundtrip(threading.Lock())
    with pytest.raises(ProtocolError, match="expected OtherPoint"):
        c.roundtrip(Point(1, 2), OtherPoint)


@settings(max_examples=200, derandomize=True)
@given(
    command=st.sampled_from(sorted(COMMANDS)),
    op=st.sampled_from([b"", bytes(range(16))]),
    route=st.integers(0, 2**64 - 1),
    target_kind=st.sampled_from(sorted(TARGET_KINDS)),
    text=st.text(max_size=20),
    deadline=st.floats(0.0, 1e6, allow_nan=False),
    metadata=st.none()
    | st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3),
    error_kind=st.integers(-1, 12),
    intent=st.none() | st.text(max_size=5),
    reason=st.text(max_size=20),
)
def test_encode_fields_is_byte_for_byte_the_envelope(
    command: int,
    op: bytes,
    route: int,
    target_kind: str,
    text: str,
    deadline: float,
    metadata: dict[str, Any] | None,
    error_kind: int,
    intent: str | None,
    reason: str,
) -> None:
    fields = (command, op, route, target_kind, text, text, deadline, metadata, text, error_kind)
    env = Envelope(*fields, error=text, intent=intent, reason=reason)
    data = encode_fields(*fields, error=text, intent=intent, reason=reason)
    assert data == encode_envelope(env)
    assert decode_envelope(data) == env


@settings(max_examples=200, derandomize=True)
@given(
    route=st.integers(0, 2**64 - 1),
    target_kind=st.sampled_from(sorted(TARGET_KINDS)),
    text=st.text(max_size=20),
    metadata=st.none()
    | st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3),
    intent=st.none() | st.text(max_size=5),
)
def test_a_send_envelope_leaves_off_its_default_tail_and_decodes_the_same(
    route: int, target_kind: str, text: str, metadata: dict[str, Any] | None, intent: str | None
) -> None:
    # Issue 26 item 8: a parked one-way keeps its envelope; the fields after type_name
    # (after intent when it has one) are at their defaults, and a shorter array decodes
    # to them, as an older peer's does.
    full = encode_fields(
        SEND,
        route=route,
        target_kind=target_kind,
        target=text,
        mesh=text,
        metadata=metadata,
        type_name=text,
        intent=intent,
    )
    data = encode_send(route, target_kind, text, text, metadata, text, intent)
    env = decode_envelope(data)
    assert env == decode_envelope(full)
    assert type(env.deadline) is float
    assert env.deadline == 0.0
    assert route_of(data) == route
    # seq (1 byte), due (9 bytes), reason and, without an intent, error_kind, error and
    # intent are left off; the deadline 0.0 is the 1-byte int 0, not a 9-byte float
    assert len(full) - len(data) == (14 + 8 if intent is None else 11 + 8)


class Loose(msgspec.Struct):
    value: object
    items: list[object] = []
    extra: dict[str, object] = {}


@dataclasses.dataclass
class LooseData:
    value: object


def test_a_field_typed_object_is_registered_and_carried_as_any() -> None:
    # msgspec encodes and decodes a field typed `object` as it does `Any`.
    registry = TypeRegistry([Loose, LooseData])
    codec = Codec(registry, MAX)
    back = codec.roundtrip(Loose({"k": (1, 2)}, [b"x"], {"n": None}))
    assert back == Loose({"k": [1, 2]}, [b"x"], {"n": None})
    assert codec.roundtrip(LooseData(3.5)) == LooseData(3.5)
    with pytest.raises(ProtocolError, match="cannot be encoded"):
        codec.encode_payload(Loose(Opaque()))
    with pytest.raises(ProtocolError, match="cannot be encoded"):
        codec.encode_payload(LooseData([Opaque()]))
    # A class that really needs hooks is still refused, also next to an `object` field.

    @dataclasses.dataclass
    class Mixed:
        loose: object
        held: Opaque

    with pytest.raises(ConfigurationError, match="it holds Opaque"):
        TypeRegistry([Mixed])
