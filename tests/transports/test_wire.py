"""The envelope codec (`transports._wire`): round trips, each kind of bad frame, and a
hypothesis fuzz that any bytes either decode or raise `MalformedFrame`, nothing else."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports import MalformedFrame
from transports._wire import ENVELOPE_SIZE, VERSION, Envelope, Kind, decode, encode


@given(
    kind=st.sampled_from(list(Kind)),
    aux=st.integers(0, 1),
    route_id=st.integers(0, 2**64 - 1),
    credit=st.integers(0, 2**64 - 1),
)
def test_every_envelope_round_trips(kind: Kind, aux: int, route_id: int, credit: int) -> None:
    assert decode(encode(kind, aux, route_id, credit)) == Envelope(kind, aux, route_id, credit)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_malformed_frame(data: bytes) -> None:
    try:
        env = decode(data)
    except MalformedFrame:
        return
    assert len(data) == ENVELOPE_SIZE
    assert encode(env.kind, env.aux, env.route_id, env.credit) == data


@given(st.binary(min_size=ENVELOPE_SIZE - 1, max_size=ENVELOPE_SIZE - 1))
def test_an_envelope_sized_frame_decodes_exactly_when_its_fields_are_valid(rest: bytes) -> None:
    frame = bytes([VERSION]) + rest
    _, kind, flags, aux, _, _ = struct.unpack("!BBHIQQ", frame)
    valid = kind in {int(k) for k in Kind} and flags == 0
    valid = valid and (kind != Kind.FLOW or aux in (0, 1))
    try:
        decode(frame)
    except MalformedFrame:
        assert not valid
    else:
        assert valid


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (encode(Kind.MESSAGE)[:-1], "bytes"),
        (b"", "bytes"),
        (encode(Kind.MESSAGE) + b"x", "bytes"),
        (struct.pack("!BBHIQQ", 2, 3, 0, 0, 0, 0), "version 2"),
        (struct.pack("!BBHIQQ", VERSION, 99, 0, 0, 0, 0), "kind 99"),
        (struct.pack("!BBHIQQ", VERSION, 3, 1, 0, 0, 0), "flags"),
        (struct.pack("!BBHIQQ", VERSION, int(Kind.FLOW), 0, 7, 1, 0), "flow state 7"),
    ],
    ids=["truncated", "empty", "long", "version", "kind", "flags", "flow-state"],
)
def test_each_bad_envelope_is_a_malformed_frame(frame: bytes, words: str) -> None:
    with pytest.raises(MalformedFrame, match=words):
        decode(frame)
