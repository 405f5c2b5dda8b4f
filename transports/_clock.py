"""How far a peer's monotonic clock is from ours, bounded by the heartbeat.

Each PING carries nothing; the PONG that answers it carries the answering side's
`time.monotonic()`, read after the PING was received (one 8-byte frame). With our clock at
`t0` when the PING left and at `t2` when the PONG was read, the peer's clock read `t1` at
an instant between the two, so the offset (its clock minus ours) lies in
`[t1 - t2, t1 - t0]`: a band one round trip wide, whatever the delays in each direction.

Two monotonic clocks also drift apart (their rates differ), by at most `DRIFT` seconds per
second: a band measured at `at` widens by `DRIFT` per second on each side. Every sample
is kept only while it is tighter than the older one aged to its time, so the band in use
is the narrowest any sample gives (docs/transports.md, "Clock offset").
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

__all__ = ["DRIFT", "ClockOffset", "decode_stamp", "encode_stamp"]

#: The largest rate at which two peers' monotonic clocks drift apart (s/s): 500 ppm, the
#: most the Linux kernel slews a clock that NTP disciplines. A pair whose rates differ by
#: more voids the bound.
DRIFT = 5e-4

_STAMP = struct.Struct("!d")


def encode_stamp(now: float) -> bytes:
    """A PONG's frame: the answering side's monotonic clock, 8 bytes."""
    return _STAMP.pack(now)


def decode_stamp(frames: object) -> float | None:
    """The stamp a PONG's frames carry, or None (a peer that stamps nothing, or a frame
    that is not one finite 8-byte float)."""
    if not isinstance(frames, list | tuple) or len(frames) != 1:
        return None
    frame = frames[0]
    if len(frame) != _STAMP.size:
        return None
    (value,) = _STAMP.unpack(frame)
    if not math.isfinite(value):
        return None
    return float(value)


class ClockOffset(NamedTuple):
    """A peer's clock minus ours lies in `[low, high]` at our time `at` (seconds of
    `time.monotonic()`), and moves away from that band by at most `DRIFT` per second."""

    low: float
    high: float
    at: float

    @classmethod
    def sample(cls, sent: float, stamp: float, received: float) -> ClockOffset:
        """The band one PING / PONG gives: the PING left at our `sent`, the peer read
        `stamp` after it came, and its PONG was read here at `received`. It holds at the
        unknown instant of the stamp, so it is widened by the drift of one round trip to
        hold at `received`."""
        drift = DRIFT * (received - sent)
        return cls(stamp - received - drift, stamp - sent + drift, received)

    def bounds(self, now: float) -> tuple[float, float]:
        """(lowest, highest) offset possible at our time `now`."""
        widen = DRIFT * abs(now - self.at)
        return self.low - widen, self.high + widen

    def error(self, now: float) -> float:
        """The width of the band at our time `now` (seconds)."""
        low, high = self.bounds(now)
        return high - low

    def merged(self, newer: ClockOffset) -> ClockOffset:
        """The tighter band at `newer.at`: each side from whichever sample bounds it
        better once this one is aged to then."""
        low, high = self.bounds(newer.at)
        if newer.low >= low and newer.high <= high:
            return newer
        low, high = max(low, newer.low), min(high, newer.high)
        if low > high:  # the clocks drifted faster than DRIFT: the fresh sample alone
            return newer
        return ClockOffset(low, high, newer.at)

    def earliest(self, remote: float) -> float:
        """The earliest time of ours at which the peer's clock may read `remote`: before
        it, the peer's clock certainly reads less (the band aged to that moment)."""
        # Solved exactly for the moment itself: L + high + DRIFT * |L - at| = remote.
        local = remote - self.high
        if local >= self.at:
            return (local + DRIFT * self.at) / (1.0 + DRIFT)
        return (local - DRIFT * self.at) / (1.0 - DRIFT)
