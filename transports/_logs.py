"""`RateLimitedLog`: one log line per kind of event a second, however many happen.

A peer that sends garbage (or a flood of anything we refuse) must not turn each of its
messages into a log line: the counters count every one, the log says what happened and
how often. Used by the transport's I/O thread and by the mesh node (which imports it from
here: `transports` never imports `zlink_actors`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

from ._errors import TransportUsageError

__all__ = ["RateLimitedLog"]

_Key = tuple[str, Hashable, Hashable]


class _Window:
    """One key's current window: when it ends, how many lines it held back, and the
    first line's level, format and arguments (to say what the held-back ones were)."""

    __slots__ = ("args", "level", "msg", "suppressed", "until")

    def __init__(self, until: float, level: int, msg: str, args: tuple[object, ...]) -> None:
        self.until = until
        self.suppressed = 0
        self.level = level
        self.msg = msg
        self.args = args


class RateLimitedLog:
    """Logs each (event, peer, reason) at most once per `interval` seconds.

    The first line of a key is logged at once; the same key again within `interval` of it
    is only counted. The count is logged once the window has ended: in front of the next
    line of that key, or on its own (the first line again, prefixed with the count) when
    the next call of any key, or `flush()`, finds the window over. At most `max_keys`
    keys are tracked at once: a line of a new key past that is counted as "other", and
    that count is logged once per interval, so a flood of distinct peers or reasons still
    writes a bounded number of lines.

    Thread-safe; never calls the logger while holding its lock.

    Args:
        logger: where the lines go.
        interval: seconds between two lines of one key (> 0).
        clock: monotonic seconds (`time.monotonic`); tests inject their own.
        max_keys: how many keys are tracked at once (>= 1).

    Raises:
        TransportUsageError: `interval` not > 0 or `max_keys` < 1.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100,
    ) -> None:
        if not interval > 0:
            raise TransportUsageError(f"interval must be > 0, got {interval!r}")
        if max_keys < 1:
            raise TransportUsageError(f"max_keys must be >= 1, got {max_keys!r}")
        self.logger = logger
        self.interval = interval
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[_Key, _Window] = {}
        self._next_sweep = -float("inf")
        self._other = 0  # lines of keys past `max_keys` in the current sweep interval
        self._other_since = 0.0
        #: Lines held back so far (every key; for tests and statistics).
        self.suppressed = 0

    def log(
        self,
        level: int,
        event: str,
        peer: Hashable,
        reason: Hashable,
        msg: str,
        *args: object,
    ) -> bool:
        """Log `msg % args` at `level` unless a line of (event, peer, reason) was logged
        less than `interval` ago; True when it was logged now."""
        if not self.logger.isEnabledFor(level):
            return False
        key = (event, peer, reason)
        now = self._clock()
        line: tuple[int, str, tuple[object, ...]] | None = None
        with self._lock:
            # What ended is swept first (its keys free again), except this key's own
            # window: what it held back goes along with its line
            lines = self._sweep_locked(now, key) if now >= self._next_sweep else []
            window = self._windows.get(key)
            if window is not None and now < window.until:
                window.suppressed += 1
                self.suppressed += 1
            elif window is None and len(self._windows) >= self.max_keys:
                if not self._other:
                    self._other_since = now
                self._other += 1
                self.suppressed += 1
            else:  # a new key, or one whose window ended: what it held back goes along
                held = window.suppressed if window is not None else 0
                self._windows[key] = _Window(now + self.interval, level, msg, args)
                line = _held(level, msg, args, held, self.interval) if held else (level, msg, args)
        if line is not None:
            lines.append(line)
        self._emit(lines)
        return line is not None

    def tick(self) -> None:
        """Log what the windows that ended held back, when a sweep is due (cheap when
        nothing is tracked): for a periodic caller, so the count of a flood that stopped
        is logged within about two intervals."""
        if not self._windows and not self._other:
            return
        now = self._clock()
        if now < self._next_sweep:
            return
        with self._lock:
            lines = self._sweep_locked(now)
        self._emit(lines)

    def flush(self) -> None:
        """Log what every ended window held back (all of them, at close)."""
        with self._lock:
            lines = self._sweep_locked(float("inf"))
        self._emit(lines)

    def _sweep_locked(
        self, now: float, keep: _Key | None = None
    ) -> list[tuple[int, str, tuple[object, ...]]]:
        """Drop the ended windows (but `keep`'s), returning the lines that report what
        they held back."""
        self._next_sweep = now + self.interval
        lines: list[tuple[int, str, tuple[object, ...]]] = []
        windows = self._windows
        ended = [key for key, window in windows.items() if window.until <= now and key != keep]
        for key in ended:
            window = windows.pop(key)
            if window.suppressed:
                lines.append(
                    _held(window.level, window.msg, window.args, window.suppressed, self.interval)
                )
        if self._other:
            seconds = self.interval if now == float("inf") else now - self._other_since
            lines.append(
                (
                    logging.WARNING,
                    "%d more lines of other kinds in %.1f s were not logged one by one",
                    (self._other, seconds),
                )
            )
            self._other = 0
        return lines

    def _emit(self, lines: list[tuple[int, str, tuple[object, ...]]]) -> None:
        for level, msg, args in lines:
            self.logger.log(level, msg, *args)


def _held(
    level: int, msg: str, args: tuple[object, ...], count: int, interval: float
) -> tuple[int, str, tuple[object, ...]]:
    """The line that says `count` more like `msg % args` were held back."""
    return (
        level,
        "%d more like this within %.1f s were not logged one by one; " + msg,
        (count, interval, *args),
    )
