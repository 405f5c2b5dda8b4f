"""The wire: what one zmq message of the transport carries, with its own version.

A message on the wire is ``[head, body]`` (a ROUTER prepends the routing id) and carries
one or more records: the I/O thread packs what it sends to one peer in one wake into as
few messages as it can (at most `RECORDS_PER_MESSAGE` records and `BODY_BYTES` of
payload each; a larger payload travels alone). The head holds each record's envelope,
in order; the body holds every payload frame of every record, back to back. So a
receiver reads every record's kind and reply-route id before it looks at (or rejects)
a payload, and reads two frames per message however many records it carries.

One record's entry in the head, network order::

    version u8 | kind u8 | frames u16 | aux u32 | route_id u64 | credit u64   (24 bytes)
    then `frames` x u32: the length of each of the record's payload frames in the body

`aux` is the flow state for FLOW, and for HELLO and HELLO_ACK the largest frame the
sender of the record accepts (its libzmq `MAXMSGSIZE`, at most 2**32 - 1): a peer packs
no message towards it with a head or a body above that (and packs nothing before it
knows); `route_id` is the opaque reply-route id of a REQUEST
or REPLY, the epoch of a FLOW, the sequence of a PING/PONG; `credit` is the charge of a
MESSAGE or REQUEST, and on the completion connection the number of bytes the sender of
the record returns to its peer.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

from ._errors import MalformedFrame

__all__ = [
    "BODY_BYTES",
    "ENVELOPE_SIZE",
    "RECORDS_PER_MESSAGE",
    "VERSION",
    "Envelope",
    "MAX_FRAMES",
    "MAX_MESSAGE_SIZE",
    "Kind",
    "Record",
    "decode",
    "encode",
    "entry",
    "pack_pair",
    "pack_single",
]

VERSION = 2
_HEAD = struct.Struct("!BBHIQQ")
_ONE = struct.Struct("!BBHIQQI")  # the entry of a record with one payload frame
_TWO = struct.Struct("!BBHIQQII")  # ... with two (the mesh's: its envelope, a payload)
_LENGTHS2 = struct.Struct("!II")
_LENGTH = struct.Struct("!I")
ENVELOPE_SIZE = _HEAD.size
#: The most records one message carries (the receiver's own `batch` bounds what it
#: hands its owner per wake; a message's surplus waits for the next wake).
RECORDS_PER_MESSAGE = 64
#: The most payload bytes packed into one body with other records: a larger record
#: travels in a message of its own, so its payload is never copied into a body.
BODY_BYTES = 256 * 1024
MAX_FRAMES = 2**16 - 1  # a record's payload frames (u16)
MAX_MESSAGE_SIZE = 2**32 - 1  # the largest payload: its frames' lengths are u32


class Kind(enum.IntEnum):
    """What a record is. Application connection: HELLO, MESSAGE, REQUEST. Completion
    connection: HELLO, HELLO_ACK, REPLY, CREDIT, FLOW, PING, PONG, NOTICE (the owner's
    one-way word that must not wait for credit)."""

    HELLO = 1
    HELLO_ACK = 2
    MESSAGE = 3
    REQUEST = 4
    REPLY = 5
    CREDIT = 6
    FLOW = 7
    PING = 8
    PONG = 9
    NOTICE = 10


_BY_VALUE: dict[int, Kind] = {int(k): k for k in Kind}
_FLOW = Kind.FLOW


class Envelope(NamedTuple):
    """A record's envelope, without its payload."""

    kind: Kind
    aux: int = 0
    route_id: int = 0
    credit: int = 0


#: A decoded record: (kind, aux, route_id, credit, payload frames).
Record = tuple[Kind, int, int, int, list[bytes]]

_pack_one = _ONE.pack
#: `entry` of a record with one payload frame, for the sender's hot path:
#: `pack_single(VERSION, kind, 1, aux, route_id, credit, len(frame))`.
pack_single = _pack_one
#: The same for a record with two payload frames (the mesh's):
#: `pack_pair(VERSION, kind, 2, aux, route_id, credit, len(first), len(second))`.
pack_pair = _TWO.pack
_pack_head = _HEAD.pack
_head_from = _HEAD.unpack_from
_length_from = _LENGTH.unpack_from
_lengths2_from = _LENGTHS2.unpack_from
_one_unpack = _ONE.unpack
_two_unpack = _TWO.unpack
_ONE_SIZE = _ONE.size
_TWO_SIZE = _TWO.size


def entry(kind: Kind, aux: int, route_id: int, credit: int, frames: Sequence[bytes]) -> bytes:
    """One record's entry in a head; its frames go into the body, in order. The fields
    must fit their widths (struct checks), the frames `MAX_FRAMES` and their size
    `MAX_MESSAGE_SIZE` (the submit and the configuration check)."""
    count = len(frames)
    if count == 1:  # the usual record
        return _pack_one(VERSION, kind, 1, aux, route_id, credit, len(frames[0]))
    if count == 2:  # the mesh's: no format string built per record
        return pack_pair(VERSION, kind, 2, aux, route_id, credit, len(frames[0]), len(frames[1]))
    head = _pack_head(VERSION, kind, count, aux, route_id, credit)
    if count:
        head += struct.pack(f"!{count}I", *[len(frame) for frame in frames])
    return head


def encode(
    kind: Kind, aux: int = 0, route_id: int = 0, credit: int = 0, frames: Sequence[bytes] = ()
) -> list[bytes]:
    """One record as a whole message, `[head, body]`."""
    return [entry(kind, aux, route_id, credit, frames), b"".join(frames)]


def decode(head: bytes, body: bytes) -> list[Record]:
    """The records of one message, in order; the whole message or nothing.

    Raises:
        MalformedFrame: no record, more than RECORDS_PER_MESSAGE, a truncated entry, a
            wrong version, an unknown kind, a bad flow state, or a body that is not
            exactly the frames the head lists.
    """
    end = len(head)
    # A message of one record with one or two frames (a request or a reply that went
    # alone: every sequential call) is decoded in one unpack; anything these checks do
    # not accept goes the general way below, which says what is wrong with it.
    if end in (_TWO_SIZE, _ONE_SIZE):
        if end == _TWO_SIZE:
            version, code, count, aux, route_id, credit, first, second = _two_unpack(head)
            lone = count == 2 and first + second == len(body)
        else:
            version, code, count, aux, route_id, credit, first = _one_unpack(head)
            lone = count == 1 and first == len(body)
        kind = _BY_VALUE.get(code)
        if lone and version == VERSION and kind is not None and (kind is not _FLOW or aux <= 1):
            frames = [body] if count == 1 else [body[:first], body[first:]]
            return [(kind, aux, route_id, credit, frames)]
    if not end:
        raise MalformedFrame("a message with no record in its head")
    size = len(body)
    records: list[Record] = []
    pos = offset = 0
    while pos < end:
        if end - pos < ENVELOPE_SIZE:
            raise MalformedFrame(
                f"a head entry of {end - pos} bytes, expected at least {ENVELOPE_SIZE}"
            )
        version, code, count, aux, route_id, credit = _head_from(head, pos)
        kind = _BY_VALUE.get(code)
        if version != VERSION or kind is None or (kind is _FLOW and aux > 1):
            _bad_envelope(version, code, aux)
        pos += ENVELOPE_SIZE
        if end - pos < 4 * count:
            raise MalformedFrame(f"a head entry lists {count} frames but is truncated")
        if count == 1:  # the usual record: one frame
            stop = offset + _length_from(head, pos)[0]
            pos += 4
            if stop > size:
                raise MalformedFrame("the body is shorter than its head says")
            frames = [body[offset:stop]]  # the whole body: the same bytes, no copy
            offset = stop
        elif count == 2:  # the mesh's records: its envelope and a payload
            first, second = _lengths2_from(head, pos)
            pos += 8
            middle = offset + first
            stop = middle + second
            if stop > size:
                raise MalformedFrame("the body is shorter than its head says")
            frames = [body[offset:middle], body[middle:stop]]
            offset = stop
        else:
            frames = []
            for length in struct.unpack_from(f"!{count}I", head, pos):
                stop = offset + length
                if stop > size:
                    raise MalformedFrame("the body is shorter than its head says")
                frames.append(body[offset:stop])
                offset = stop
            pos += 4 * count
        records.append((kind, aux, route_id, credit, frames))
        if len(records) > RECORDS_PER_MESSAGE:
            raise MalformedFrame(f"more than {RECORDS_PER_MESSAGE} records in one message")
    if offset != size:
        raise MalformedFrame(f"{size - offset} bytes of the body belong to no record")
    return records


def _bad_envelope(version: int, code: int, aux: int) -> NoReturn:
    if version != VERSION:
        raise MalformedFrame(f"envelope version {version}, this side speaks {VERSION}")
    if code not in _BY_VALUE:
        raise MalformedFrame(f"unknown record kind {code}")
    raise MalformedFrame(f"flow state {aux} is neither RUNNING (0) nor PAUSED (1)")
