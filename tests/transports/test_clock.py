"""The clock offset the heartbeat measures (docs/transports.md, "Clock offset"): the band
one PING / PONG gives holds the true offset whatever the delays each way, the tighter of
two samples is kept, `earliest()` is never after the moment the peer's clock really reads
the value (so a deadline judged with it errs only towards "passed"), and two transports
measure each other: on one machine, a band around 0 no wider than a round trip.

The clocks here are injected: a peer clock is a function of ours with a chosen offset
and drift, so each property is checked against the true answer."""

from __future__ import annotations

import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transports as t
from transports._clock import decode_stamp, encode_stamp

from .helpers import pair, wait_until

DRIFT = t.DRIFT


class PeerClock:
    """A peer's clock as a function of ours: `offset + (1 + rate) * ours`."""

    def __init__(self, offset: float, rate: float) -> None:
        self.offset = offset
        self.rate = rate

    def read(self, ours: float) -> float:
        return self.offset + (1.0 + self.rate) * ours

    def true_offset(self, ours: float) -> float:
        return self.read(ours) - ours

    def ours_when_it_reads(self, value: float) -> float:
        return (value - self.offset) / (1.0 + self.rate)


def ping(peer: PeerClock, sent: float, there: float, back: float) -> t.ClockOffset:
    """One round trip: the PING leaves at our `sent`, takes `there` seconds to reach the
    peer (which stamps it then), the PONG takes `back` seconds to come back."""
    stamp = peer.read(sent + there)
    return t.ClockOffset.sample(sent, stamp, sent + there + back)


offsets = st.floats(-1e6, 1e6, allow_nan=False)
rates = st.floats(-DRIFT, DRIFT, allow_nan=False)
delays = st.floats(0.0, 2.0, allow_nan=False)
moments = st.floats(0.0, 1e5, allow_nan=False)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(offset=offsets, rate=rates, sent=moments, there=delays, back=delays, later=moments)
def test_a_samples_band_holds_the_true_offset_then_and_later(
    offset: float, rate: float, sent: float, there: float, back: float, later: float
) -> None:
    peer = PeerClock(offset, rate)
    band = ping(peer, sent, there, back)
    # One round trip wide, and the drift over it.
    width = (there + back) * (1.0 + 2 * DRIFT)
    assert band.high - band.low == pytest.approx(width, abs=1e-6)
    for ours in (band.at, band.at + later):
        low, high = band.bounds(ours)
        true = peer.true_offset(ours)
        assert low - 1e-6 <= true <= high + 1e-6


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    offset=offsets,
    rate=rates,
    sent=moments,
    there=delays,
    back=delays,
    ahead=st.floats(-1e4, 1e4, allow_nan=False),
)
def test_earliest_is_never_after_the_peer_really_reads_the_value(
    offset: float, rate: float, sent: float, there: float, back: float, ahead: float
) -> None:
    """The judgement: a request's handler may start at our time L only if L is before
    `earliest(caller_due)`; then the caller's clock still reads less than its due."""
    peer = PeerClock(offset, rate)
    band = ping(peer, sent, there, back)
    remote = peer.read(band.at + ahead)  # a deadline before or after the sample
    local = band.earliest(remote)
    truly = peer.ours_when_it_reads(remote)
    assert local <= truly + 1e-6
    # ... and early by no more than the band's width then, and the drift until the
    # peer's clock reads it (the bound docs/mesh.md states)
    assert truly - local <= band.error(local) + DRIFT * (truly - local) + 1e-6


def test_earliest_with_a_known_offset_and_no_drift_by_hand() -> None:
    # The peer's clock is ours + 100 s; the PING took 1 ms each way.
    band = t.ClockOffset.sample(sent=10.0, stamp=110.001, received=10.002)
    rtt_drift = DRIFT * 0.002
    assert (band.low, band.high) == pytest.approx((99.999 - rtt_drift, 100.001 + rtt_drift))
    # The caller's deadline 130.0 (its clock) is our 30.0; we judge it passed from
    # 29.999 (one millisecond early: half the round trip) less the drift allowed
    # over the 20 s from the sample to that moment.
    local = 29.999 - rtt_drift
    expected = local - DRIFT * (local - 10.002) / (1.0 + DRIFT)
    assert band.earliest(130.0) == pytest.approx(expected, abs=1e-9)
    assert 29.98 < band.earliest(130.0) < 30.0


def test_the_tighter_sample_is_kept_each_side_on_its_own() -> None:
    peer = PeerClock(5.0, 0.0)
    wide = ping(peer, 0.0, 0.010, 0.010)  # a slow round trip: 20 ms wide
    tight = ping(peer, 1.0, 0.0005, 0.0005)  # 1 ms wide
    assert wide.merged(tight) == tight
    # An older tight sample stays better than a fresh wide one for a while (it widens
    # by DRIFT per second), and is replaced once it has aged past it.
    kept = tight.merged(ping(peer, 2.0, 0.010, 0.010))
    assert kept.error(kept.at) < 0.0025
    old = tight.merged(ping(peer, 1000.0, 0.010, 0.010))
    assert old.error(old.at) <= 0.020 * (1.0 + 2 * DRIFT) + 1e-9
    # One side from each: a sample tight below and loose above, and the other way.
    below = t.ClockOffset(4.999, 5.010, 3.0)
    above = t.ClockOffset(4.990, 5.001, 3.0)
    both = below.merged(above)
    assert (both.low, both.high) == pytest.approx((4.999, 5.001))


def test_a_fresh_sample_wins_when_the_old_band_no_longer_agrees() -> None:
    old = t.ClockOffset(0.0, 0.001, 0.0)
    moved = t.ClockOffset(1.0, 1.001, 1.0)  # the clocks moved 1 s in 1 s: not drift
    assert old.merged(moved) == moved


def test_a_pong_stamp_is_one_finite_8_byte_float_else_nothing() -> None:
    assert decode_stamp([encode_stamp(123.5)]) == 123.5
    assert decode_stamp((encode_stamp(0.0),)) == 0.0
    assert decode_stamp([]) is None  # an older peer's PONG: no frame
    assert decode_stamp(()) is None
    assert decode_stamp([b"1234567"]) is None
    assert decode_stamp([encode_stamp(1.0), b""]) is None
    assert decode_stamp([encode_stamp(math.nan)]) is None
    assert decode_stamp([encode_stamp(math.inf)]) is None


def test_two_transports_measure_each_others_clock_within_a_round_trip(
    tmp_path: pathlib.Path,
) -> None:
    """Both read the same `time.monotonic()`: the true offset is 0, and each side's band
    holds it and is no wider than a loopback heartbeat round trip on a loaded machine."""
    with pair("tcp", tmp_path) as (a, _, b, _b):
        for tr, peer in ((a, b"B"), (b, b"A")):
            assert wait_until(lambda tr=tr, peer=peer: tr.clock_offset(peer) is not None)
            band = tr.clock_offset(peer)
            assert band is not None
            assert band.low <= 0.0 <= band.high, band
            assert band.high - band.low < 0.5, band
        assert a.clock_offset(b"nobody") is None
