"""`MemoryLocationStore`: the embedded Location Store of one process.

Several Hosts in one process may share one store. One lock makes every operation atomic
under callers from many threads and event loops; no operation awaits while holding it.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._core.errors import ShuttingDownError
from .cursors import CursorCodec, ScanPosition
from .spi import (
    MAX_BATCH_BYTES,
    Committed,
    Conflict,
    Delete,
    Found,
    IfMissing,
    IfVersion,
    Missing,
    Put,
    ScanPage,
    check_batch,
    check_key,
    check_limit,
    check_prefix,
    new_version,
)

__all__ = ["MemoryLocationStore"]

#: The memory store never loses what a scan walked, so its cursors never expire.
_EPOCH = "memory"


@dataclass(slots=True)
class _Entry:
    value: bytes
    version: str
    expires_at: float | None


class MemoryLocationStore:
    """A Location Store in this process's memory (design/mesh.md §4).

    Args:
        clock: a callable returning the store's time in seconds since the epoch (its
            `store_now`, which decides expiry); `None` = `time.time`. Tests inject one.

    A Host never closes a store it was given; `close()` ends the store for every user.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable or None, got {type(clock).__name__}")
        self._clock: Callable[[], float] = clock if clock is not None else time.time
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._keys: list[str] = []  # sorted; the scan order
        self._cursors = CursorCodec()
        self._closed = False

    def _now(self) -> float:
        now = self._clock()
        if type(now) is bool or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise TypeError(f"the store clock returned {now!r}, not a finite number")
        return float(now)

    def _check_open(self) -> None:
        if self._closed:
            raise ShuttingDownError("the location store is closed")

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at is not None and entry.expires_at <= now:
            self._remove(key)
            return None
        return entry

    def _remove(self, key: str) -> None:
        if self._entries.pop(key, None) is not None:
            index = bisect.bisect_left(self._keys, key)
            del self._keys[index]

    async def read(self, key: str) -> Found | Missing:
        """An exact read of `key` (see `LocationStore.read`)."""
        check_key(key)
        with self._lock:
            self._check_open()
            now = self._now()
            entry = self._live(key, now)
            if entry is None:
                return Missing(now)
            return Found(entry.value, entry.version, entry.expires_at, now)

    async def write(
        self, conditions: Sequence[IfMissing | IfVersion], mutations: Sequence[Put | Delete]
    ) -> Committed | Conflict:
        """Check every condition, then apply every mutation (see `LocationStore.write`)."""
        check_batch(conditions, mutations)
        versions = {m.key: new_version() for m in mutations if isinstance(m, Put)}
        with self._lock:
            self._check_open()
            now = self._now()
            for cond in conditions:
                entry = self._live(cond.key, now)
                if isinstance(cond, IfMissing):
                    if entry is not None:
                        return Conflict(now)
                elif entry is None or entry.version != cond.version:
                    return Conflict(now)
            for mut in mutations:
                if isinstance(mut, Delete):
                    self._remove(mut.key)
                    continue
                expires = None if mut.ttl is None else now + float(mut.ttl)
                entry = self._entries.get(mut.key)
                if entry is None:
                    bisect.insort(self._keys, mut.key)
                self._entries[mut.key] = _Entry(mut.value, versions[mut.key], expires)
            return Committed(now, versions)

    async def scan(self, prefix: str, *, cursor: str | None = None, limit: int = 1000) -> ScanPage:
        """One page of the keys under `prefix` in key order (see `LocationStore.scan`).

        The memory store can always continue a cursor it issued (it never raises
        `ScanExpiredError`); a key that lives for the whole scan appears exactly once.
        """
        check_prefix(prefix)
        check_limit(limit)
        after = None if cursor is None else self._cursors.decode(cursor, prefix).after
        with self._lock:
            self._check_open()
            now = self._now()
            keys = self._keys
            start = (
                bisect.bisect_left(keys, prefix)
                if after is None
                else bisect.bisect_right(keys, after)
            )
            items: list[tuple[str, Found]] = []
            size = 0
            index = start
            full = False
            while index < len(keys):
                key = keys[index]
                if not key.startswith(prefix):
                    break
                index += 1
                entry = self._entries[key]
                if entry.expires_at is not None and entry.expires_at <= now:
                    continue
                if items and size + len(entry.value) > MAX_BATCH_BYTES:
                    index -= 1
                    full = True
                    break
                items.append((key, Found(entry.value, entry.version, entry.expires_at, now)))
                size += len(entry.value)
                if len(items) == limit:
                    full = True
                    break
            more = full and index < len(keys) and keys[index].startswith(prefix)
            next_cursor = (
                self._cursors.encode(ScanPosition(prefix, items[-1][0], _EPOCH)) if more else None
            )
            return ScanPage(items, next_cursor, now)

    def close(self) -> None:
        """End the store: every later operation raises `ShuttingDownError`."""
        with self._lock:
            self._closed = True
            self._entries.clear()
            self._keys.clear()
