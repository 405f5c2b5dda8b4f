"""Opaque scan cursors, signed by the store that issued them.

A cursor carries the scan's prefix, the last key returned and the provider's epoch (a
token that changes when the provider lost what the scan walked, e.g. a Redis restart
without persistence). An HMAC with a secret of the issuing store object tells a cursor
that was never issued (`ValueError`) from one that can no longer be continued
(`ScanExpiredError`, decided by the provider from the epoch).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import msgspec

__all__ = ["CursorCodec", "ScanPosition"]

_TAG_BYTES = 16


class ScanPosition(msgspec.Struct, array_like=True, frozen=True):
    """Where a scan continues: strictly after `after` under `prefix`, in `epoch`."""

    prefix: str
    after: str
    epoch: str


class CursorCodec:
    """Encodes and checks the cursors of one store object."""

    __slots__ = ("_decoder", "_encoder", "_secret")

    def __init__(self) -> None:
        self._secret = os.urandom(32)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(ScanPosition)

    def encode(self, position: ScanPosition) -> str:
        body = self._encoder.encode(position)
        tag = hmac.digest(self._secret, body, hashlib.sha256)[:_TAG_BYTES]
        return base64.urlsafe_b64encode(tag + body).decode("ascii")

    def decode(self, cursor: object, prefix: str) -> ScanPosition:
        """The position of a cursor this codec issued for `prefix`.

        Raises:
            TypeError: `cursor` is not a str.
            ValueError: this store never issued it, or issued it for another prefix.
        """
        if not isinstance(cursor, str):
            raise TypeError(f"cursor must be a str or None, got {type(cursor).__name__}")
        try:
            raw = base64.urlsafe_b64decode(cursor.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raise ValueError("this scan cursor was never issued by this store") from None
        tag, body = raw[:_TAG_BYTES], raw[_TAG_BYTES:]
        expected = hmac.digest(self._secret, body, hashlib.sha256)[:_TAG_BYTES]
        if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, expected):
            raise ValueError("this scan cursor was never issued by this store")
        position = self._decoder.decode(body)
        if position.prefix != prefix:
            raise ValueError(
                f"this scan cursor belongs to prefix {position.prefix!r}, not {prefix!r}"
            )
        return position
