"""The envelope: the first frame of every transport message, fixed size, own version.

A message on the wire is ``[envelope, *payload]`` (a ROUTER prepends the routing id).
The envelope travels in its own frame so that a receiver reads the kind and the
reply-route id before it looks at (or rejects) the payload. Layout, network order::

    version u8 | kind u8 | flags u16 | aux u32 | route_id u64 | credit u64   (24 bytes)

`aux` is the flow state for FLOW; `route_id` is the opaque reply-route id of a REQUEST
or REPLY, the epoch of a FLOW, the sequence of a PING/PONG; `credit` is the number of
bytes the sender of the frame returns to its peer (any completion-connection frame may
carry it).
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple, NoReturn

from ._errors import MalformedFrame

__all__ = [
    "ENVELOPE_SIZE",
    "KIND_OF",
    "VERSION",
    "Envelope",
    "Kind",
    "decode",
    "encode",
    "malformed",
    "pack_envelope",
    "unpack_envelope",
]

VERSION = 1
_STRUCT = struct.Struct("!BBHIQQ")
ENVELOPE_SIZE = _STRUCT.size
_U32 = 2**32 - 1
_U64 = 2**64 - 1


class Kind(enum.IntEnum):
    """What a frame is. Application connection: HELLO, MESSAGE, REQUEST. Completion
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
#: The `Kind` of each valid kind byte (for hot paths that unpack an envelope themselves).
KIND_OF = _BY_VALUE


class Envelope(NamedTuple):
    """A decoded envelope."""

    kind: Kind
    aux: int = 0
    route_id: int = 0
    credit: int = 0


_pack = _STRUCT.pack
_unpack = _STRUCT.unpack
#: The hot paths' envelope codec, without `encode`'s and `decode`'s call frames:
#: `pack_envelope(VERSION, kind, 0, aux, route_id, credit)`, and `unpack_envelope(frame)`
#: (a frame of exactly ENVELOPE_SIZE bytes) -> (version, kind, flags, aux, route_id,
#: credit), whose fields the caller must check as `decode` does (else call `decode`).
pack_envelope = _pack
unpack_envelope = _unpack
_FLOW = int(Kind.FLOW)
_new_tuple = tuple.__new__  # an Envelope without NamedTuple.__new__'s Python frame


def encode(kind: Kind, aux: int = 0, route_id: int = 0, credit: int = 0) -> bytes:
    """The envelope frame; the fields must fit their widths (checked by struct)."""
    return _pack(VERSION, kind, 0, aux, route_id, credit)


def decode(frame: bytes) -> Envelope:
    """Decode one envelope frame.

    Raises:
        MalformedFrame: wrong length, version, kind, flags or flow state.
    """
    if len(frame) == ENVELOPE_SIZE:
        version, kind, flags, aux, route_id, credit = _unpack(frame)
        known = _BY_VALUE.get(kind)
        # one test for the valid frame; the slow path below says what is wrong
        if version == VERSION and known is not None and not flags and (kind != _FLOW or aux < 2):
            return _new_tuple(Envelope, (known, aux, route_id, credit))
    malformed(frame)


def malformed(frame: bytes) -> NoReturn:
    """Raise the MalformedFrame that says what is wrong with an envelope frame that
    failed `decode`'s test."""
    if len(frame) != ENVELOPE_SIZE:
        raise MalformedFrame(f"envelope of {len(frame)} bytes, expected {ENVELOPE_SIZE}")
    version, kind, flags, aux, _, _ = _unpack(frame)
    if version != VERSION:
        raise MalformedFrame(f"envelope version {version}, this side speaks {VERSION}")
    if kind not in _BY_VALUE:
        raise MalformedFrame(f"unknown frame kind {kind}")
    if flags:
        raise MalformedFrame(f"unknown flags {flags:#x}")
    raise MalformedFrame(f"flow state {aux} is neither RUNNING (0) nor PAUSED (1)")
