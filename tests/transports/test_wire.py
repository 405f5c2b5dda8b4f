"""The wire codec (`transports._wire`): messages of one or many records round trip, each
kind of bad message is a `MalformedFrame`, and hypothesis fuzzes that any bytes either
decode into records that encode back to the same bytes or raise `MalformedFrame`."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports import MalformedFrame
from transports._wire import (
    ENVELOPE_SIZE,
    RECORDS_PER_MESSAGE,
    VERSION,
    Kind,
    Record,
    decode,
    encode,
    entry,
)

_records = st.lists(
    st.tuples(
        st.sampled_from(list(Kind)),
        st.integers(0, 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**64 - 1),
        st.lists(st.binary(max_size=40), max_size=4),
    ),
    min_size=1,
    max_size=8,
)


def _message(records: list[Record]) -> tuple[bytes, bytes]:
    head = b"".join(entry(k, aux, rid, credit, frames) for k, aux, rid, credit, frames in records)
    return head, b"".join(b"".join(frames) for *_, frames in records)


@given(_records)
def test_a_message_of_any_records_round_trips(records: list[Record]) -> None:
    assert decode(*_message(records)) == records


def test_a_record_with_one_frame_is_one_entry_of_28_bytes_and_its_frame_is_the_body() -> None:
    head, body = encode(Kind.REQUEST, 0, 7, 300, [b"payload"])
    assert len(head) == ENVELOPE_SIZE + 4
    assert body == b"payload"
    assert decode(head, body) == [(Kind.REQUEST, 0, 7, 300, [b"payload"])]


def test_a_message_of_more_records_than_a_sender_packs_is_malformed() -> None:
    one = entry(Kind.MESSAGE, 0, 0, 256, ())
    assert len(decode(one * RECORDS_PER_MESSAGE, b"")) == RECORDS_PER_MESSAGE
    with pytest.raises(MalformedFrame, match="more than 64 records"):
        decode(one * (RECORDS_PER_MESSAGE + 1), b"")


def test_a_record_without_payload_has_an_empty_body() -> None:
    assert encode(Kind.HELLO) == [entry(Kind.HELLO, 0, 0, 0, ()), b""]
    assert decode(*encode(Kind.PING, 0, 3)) == [(Kind.PING, 0, 3, 0, [])]


@given(st.binary(max_size=120), st.binary(max_size=60))
def test_arbitrary_bytes_decode_or_raise_malformed_frame(head: bytes, body: bytes) -> None:
    try:
        records = decode(head, body)
    except MalformedFrame:
        return
    assert records
    assert _message(records) == (head, body)


@given(st.binary(min_size=ENVELOPE_SIZE - 1, max_size=ENVELOPE_SIZE - 1))
def test_an_entry_without_frames_decodes_exactly_when_its_fields_are_valid(rest: bytes) -> None:
    head = bytes([VERSION]) + rest[0:1] + b"\x00\x00" + rest[3:]
    _, kind, _, aux, _, _ = struct.unpack("!BBHIQQ", head)
    valid = kind in {int(k) for k in Kind} and (kind != Kind.FLOW or aux in (0, 1))
    try:
        decode(head, b"")
    except MalformedFrame:
        assert not valid
    else:
        assert valid


_GOOD = entry(Kind.MESSAGE, 0, 0, 256, [b"abc"])


@pytest.mark.parametrize(
    ("head", "body", "words"),
    [
        (b"", b"", "no record"),
        (_GOOD[:10], b"abc", "entry of 10 bytes"),
        (_GOOD[:-1], b"abc", "truncated"),
        (_GOOD + b"x", b"abc", "entry of 1 bytes"),
        (_GOOD, b"ab", "shorter"),
        (_GOOD, b"abcd", "1 bytes of the body"),
        (struct.pack("!BBHIQQ", 1, 3, 0, 0, 0, 0), b"", "version 1"),
        (struct.pack("!BBHIQQ", VERSION, 99, 0, 0, 0, 0), b"", "kind 99"),
        (struct.pack("!BBHIQQ", VERSION, int(Kind.FLOW), 0, 7, 1, 0), b"", "flow state 7"),
        (struct.pack("!BBHIQQII", VERSION, 3, 2, 0, 0, 0, 1, 5), b"abc", "shorter"),
        (_GOOD + struct.pack("!BBHIQQ", VERSION, 99, 0, 0, 0, 0), b"abc", "kind 99"),
    ],
    ids=[
        "empty",
        "truncated-entry",
        "truncated-lengths",
        "trailing-bytes",
        "short-body",
        "long-body",
        "old-version",
        "kind",
        "flow-state",
        "two-frames-short-body",
        "second-record-bad",
    ],
)
def test_each_bad_message_is_a_malformed_frame(head: bytes, body: bytes, words: str) -> None:
    with pytest.raises(MalformedFrame, match=words):
        decode(head, body)


@given(
    st.sampled_from([1, 2]),
    st.sampled_from(list(Kind)),
    st.integers(0, 1),
    st.binary(max_size=40),
    st.binary(max_size=40),
    st.sampled_from([None, "version", "kind", "count", "flow", "length"]),
    st.integers(1, 2**16 - 1),
)
def test_a_one_record_head_of_one_or_two_frames_decodes_exactly_when_valid(
    frames: int,
    kind: Kind,
    aux: int,
    first: bytes,
    second: bytes,
    broken: str | None,
    noise: int,
) -> None:
    # The 28- and 32-byte heads a lone request or reply has (the decoder's fast path):
    # a valid one, or one with one field made wrong; random bytes almost never make one
    # that is valid.
    payload = [first] if frames == 1 else [first, second]
    version, code, count = VERSION, int(kind), frames
    lengths = [len(frame) for frame in payload]
    if broken == "version":
        version = (VERSION + 1 + noise % 255) % 256  # any byte but VERSION
    elif broken == "kind":
        code = 10 + noise % 246  # none above NOTICE (10) is a kind
    elif broken == "count":
        count = (frames + noise) % 2**16
    elif broken == "flow":
        code, aux = int(Kind.FLOW), 2 + noise
    elif broken == "length":
        lengths[-1] += noise
    head = struct.pack(f"!BBHIQQ{frames}I", version, code, count, aux, 5, 6, *lengths)
    body = b"".join(payload)
    valid = broken is None or (broken == "kind" and code == 10)
    try:
        records = decode(head, body)
    except MalformedFrame:
        assert not valid
        return
    assert valid
    assert records == [(Kind(code), aux, 5, 6, payload)]
