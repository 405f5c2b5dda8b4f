"""The Location Store SPI (docs/location.md, design/mesh.md §4): result types, conditions,
mutations, the two store errors, the `LocationStore` protocol and the limits every
provider enforces the same way.

Every limit is checked here, before a provider sends anything, so a violation is a
`ValueError` (a wrong type a `TypeError`) at the call and writes nothing.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from .._core.errors import DeadlineExceededError, UnavailableError, UnavailableReason

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_KEYS",
    "MAX_KEY_BYTES",
    "MAX_SCAN_LIMIT",
    "MAX_TTL",
    "MAX_VALUE_BYTES",
    "MAX_VERSION_BYTES",
    "Committed",
    "Condition",
    "Conflict",
    "Delete",
    "Found",
    "IfMissing",
    "IfVersion",
    "LocationStore",
    "Missing",
    "Mutation",
    "Put",
    "ScanExpiredError",
    "ScanPage",
    "WriteDeadlineExceededError",
    "WriteOutcomeUnknownError",
    "check_batch",
    "check_key",
    "check_limit",
    "check_prefix",
    "new_version",
]

#: A key is 1..1024 bytes once encoded as strict UTF-8.
MAX_KEY_BYTES: Final = 1024
#: A value is at most 1 MiB.
MAX_VALUE_BYTES: Final = 1 << 20
#: At most 2,048 unique keys per batch, conditions and mutations counted together.
MAX_BATCH_KEYS: Final = 2048
#: At most 4 MiB of values per batch (and per scan page, when more than one item).
MAX_BATCH_BYTES: Final = 4 << 20
#: A scan page holds 1..1000 items.
MAX_SCAN_LIMIT: Final = 1000
#: A `ttl` is at most 10^9 seconds (about 31 years): every provider can represent it.
MAX_TTL: Final = 1e9
#: A version is an opaque string of at most 4096 bytes (digest §6).
MAX_VERSION_BYTES: Final = 4096


class ScanExpiredError(UnavailableError):
    """The provider can no longer continue this scan cursor: restart the scan."""


class WriteOutcomeUnknownError(UnavailableError):
    """A write was sent but its result was lost: it may or may not have committed.

    `versions` maps every put key to the version the batch would have written; an exact
    `read` of one of them tells "committed" (that version is there) from "not committed".
    Never repeat the batch blindly (the provider never does).
    """

    def __init__(self, message: str, versions: Mapping[str, str]) -> None:
        super().__init__(message, reason=UnavailableReason.STORE_UNAVAILABLE)
        self.versions: dict[str, str] = dict(versions)


class WriteDeadlineExceededError(DeadlineExceededError, WriteOutcomeUnknownError):
    """A write that was sent ran past the provider's `operation_timeout`: both a
    `DeadlineExceededError` (its kind) and a `WriteOutcomeUnknownError` (`.versions`
    for the exact read that tells whether it committed)."""


@dataclass(frozen=True, slots=True)
class Found:
    """A live key: its value, version, expiry (epoch seconds, `None` = none) and the
    provider's clock at the read."""

    value: bytes
    version: str
    expires_at: float | None
    store_now: float


@dataclass(frozen=True, slots=True)
class Missing:
    """No live key (never written, deleted, or expired at or before `store_now`)."""

    store_now: float


@dataclass(frozen=True, slots=True)
class Committed:
    """A batch applied: `versions` maps every put key to its new version."""

    store_now: float
    versions: dict[str, str]


@dataclass(frozen=True, slots=True)
class Conflict:
    """A condition failed: nothing changed. It carries no detail on purpose."""

    store_now: float


@dataclass(frozen=True, slots=True)
class ScanPage:
    """One page of a scan: `(key, Found)` in key order; `cursor=None` on the last page."""

    items: list[tuple[str, Found]]
    cursor: str | None
    store_now: float


@dataclass(frozen=True, slots=True)
class IfMissing:
    """Condition: `key` has no live value."""

    key: str


@dataclass(frozen=True, slots=True)
class IfVersion:
    """Condition: `key` is live at exactly `version`."""

    key: str
    version: str


@dataclass(frozen=True, slots=True)
class Put:
    """Mutation: store `value` at `key`, expiring `ttl` seconds after the commit on the
    provider's clock (`None` = never, which clears an earlier expiry)."""

    key: str
    value: bytes
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Mutation: remove `key` (a missing key is no error)."""

    key: str


Condition = IfMissing | IfVersion
Mutation = Put | Delete


@runtime_checkable
class LocationStore(Protocol):
    """What a Location Store provides (design/mesh.md §4). Async methods run on the I/O
    executor's loop; `close()` is plain and may be called from any thread."""

    async def read(self, key: str) -> Found | Missing:
        """An exact read of one key."""
        ...

    async def write(
        self, conditions: Sequence[IfMissing | IfVersion], mutations: Sequence[Put | Delete]
    ) -> Committed | Conflict:
        """Check every condition, then apply every mutation: all or nothing."""
        ...

    async def scan(self, prefix: str, *, cursor: str | None = None, limit: int = 1000) -> ScanPage:
        """One page of the keys under `prefix`, continuing at `cursor`."""
        ...

    def close(self) -> None:
        """Release every connection; afterwards every operation is `ShuttingDownError`."""
        ...


def new_version() -> str:
    """A fresh version: 128 random bits, generated before a batch is sent."""
    return os.urandom(16).hex()


def check_key(key: object, what: str = "key") -> bytes:
    """Validate a key and return its UTF-8 encoding.

    Raises:
        TypeError: `key` is not a `str`.
        ValueError: it is empty, over 1024 bytes, or has no strict UTF-8 encoding.
    """
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__}")
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid UTF-8 (a lone surrogate): {key!r}") from None
    if not 1 <= len(raw) <= MAX_KEY_BYTES:
        raise ValueError(f"{what} must be 1..{MAX_KEY_BYTES} UTF-8 bytes, got {len(raw)}")
    return raw


def check_prefix(prefix: object) -> bytes:
    """Validate a scan prefix (0..1024 UTF-8 bytes) and return its encoding."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix:
        return b""
    return check_key(prefix, "prefix")


def check_limit(limit: object) -> int:
    """Validate a scan page limit: an int in 1..1000."""
    if type(limit) is not int:
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if not 1 <= limit <= MAX_SCAN_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_SCAN_LIMIT}, got {limit}")
    return limit


def _check_ttl(ttl: object) -> float | None:
    if ttl is None:
        return None
    if type(ttl) is bool or not isinstance(ttl, numbers.Real):
        raise TypeError(f"ttl must be a number of seconds, got {type(ttl).__name__}")
    seconds = float(ttl)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TTL):
        raise ValueError(f"ttl must be a number of seconds in (0, {MAX_TTL:g}], got {ttl!r}")
    return seconds


def check_batch(conditions: object, mutations: object) -> None:
    """Check a batch against every limit of the SPI before anything is sent.

    Raises:
        TypeError: an item is not a condition or mutation, or a field has the wrong type.
        ValueError: a bad key, value, version or ttl (over 10^9 s included); a key
            repeated on one side; over 2,048 unique keys or 4 MiB of values.
    """
    if isinstance(conditions, (str, bytes)) or not isinstance(conditions, Sequence):
        raise TypeError("conditions must be a sequence of IfMissing / IfVersion")
    if isinstance(mutations, (str, bytes)) or not isinstance(mutations, Sequence):
        raise TypeError("mutations must be a sequence of Put / Delete")
    seen: set[str] = set()
    for cond in conditions:
        if not isinstance(cond, (IfMissing, IfVersion)):
            raise TypeError(f"a condition must be IfMissing or IfVersion, got {cond!r}")
        check_key(cond.key)
        if cond.key in seen:
            raise ValueError(f"key {cond.key!r} appears twice among the conditions")
        seen.add(cond.key)
        if isinstance(cond, IfVersion):
            if not isinstance(cond.version, str):
                raise TypeError(f"a version must be a str, got {type(cond.version).__name__}")
            try:
                size = len(cond.version.encode("utf-8"))
            except UnicodeEncodeError:
                raise ValueError("a version must be valid UTF-8") from None
            if not 1 <= size <= MAX_VERSION_BYTES:
                raise ValueError(f"a version must be 1..{MAX_VERSION_BYTES} UTF-8 bytes")
    keys = set(seen)
    put: set[str] = set()
    total = 0
    for mut in mutations:
        if not isinstance(mut, (Put, Delete)):
            raise TypeError(f"a mutation must be Put or Delete, got {mut!r}")
        check_key(mut.key)
        if mut.key in put:
            raise ValueError(f"key {mut.key!r} appears twice among the mutations")
        put.add(mut.key)
        keys.add(mut.key)
        if isinstance(mut, Put):
            if not isinstance(mut.value, bytes):
                raise TypeError(f"a value must be bytes, got {type(mut.value).__name__}")
            if len(mut.value) > MAX_VALUE_BYTES:
                raise ValueError(
                    f"the value of {mut.key!r} is {len(mut.value)} bytes, over {MAX_VALUE_BYTES}"
                )
            total += len(mut.value)
            _check_ttl(mut.ttl)
    if len(keys) > MAX_BATCH_KEYS:
        raise ValueError(f"a batch touches {len(keys)} keys, over {MAX_BATCH_KEYS}")
    if total > MAX_BATCH_BYTES:
        raise ValueError(f"a batch carries {total} bytes of values, over {MAX_BATCH_BYTES}")
