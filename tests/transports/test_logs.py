"""`RateLimitedLog` (issue 26 item 8): each (event, peer, reason) at most once per interval,
with the number held back; a bounded number of lines however many keys a flood has.

The clock is the test's own: nothing here waits.
"""

from __future__ import annotations

import logging

import pytest

import transports as t

NAME = "tests.ratelimited"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limited(clock: Clock) -> t.RateLimitedLog:
    return t.RateLimitedLog(logging.getLogger(NAME), interval=1.0, clock=clock, max_keys=3)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == NAME]


def _drop(limited: t.RateLimitedLog, peer: bytes = b"p", why: str = "junk") -> bool:
    return limited.log(logging.WARNING, "dropped", peer, why, "dropped from %r: %s", peer, why)


def test_one_key_is_logged_once_per_interval_and_the_rest_counted(
    caplog: pytest.LogCaptureFixture, clock: Clock, limited: t.RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, NAME)
    assert _drop(limited) is True
    assert [_drop(limited) for _ in range(999)] == [False] * 999
    clock.now += 0.999
    assert _drop(limited) is False
    assert _lines(caplog) == ["dropped from b'p': junk"]
    assert limited.suppressed == 1000

    clock.now += 0.001  # the window is over: the next one says how many were held back
    assert _drop(limited) is True
    assert _lines(caplog)[1:] == [
        "1000 more like this within 1.0 s were not logged one by one; dropped from b'p': junk"
    ]


def test_keys_differ_by_event_peer_and_reason(
    caplog: pytest.LogCaptureFixture, limited: t.RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, NAME)
    assert _drop(limited, b"p", "a") is True
    assert _drop(limited, b"q", "a") is True
    assert _drop(limited, b"p", "b") is True
    assert _drop(limited, b"p", "a") is False
    assert len(_lines(caplog)) == 3


def test_a_window_that_ended_is_reported_by_the_next_call_of_any_key_or_by_tick(
    caplog: pytest.LogCaptureFixture, clock: Clock, limited: t.RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, NAME)
    for _ in range(5):
        _drop(limited, b"p")
    clock.now += 1.5
    _drop(limited, b"other")
    assert _lines(caplog) == [
        "dropped from b'p': junk",
        "4 more like this within 1.0 s were not logged one by one; dropped from b'p': junk",
        "dropped from b'other': junk",
    ]
    for _ in range(2):
        _drop(limited, b"other")
    limited.tick()  # not due yet: the sweep above was less than an interval ago
    assert len(_lines(caplog)) == 3
    clock.now += 1.0
    limited.tick()
    assert _lines(caplog)[3:] == [
        "2 more like this within 1.0 s were not logged one by one; dropped from b'other': junk"
    ]
    limited.tick()  # nothing tracked any more: no line
    assert len(_lines(caplog)) == 4


def test_flush_reports_every_window_also_one_still_open(
    caplog: pytest.LogCaptureFixture, limited: t.RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, NAME)
    for _ in range(3):
        _drop(limited)
    limited.flush()
    assert _lines(caplog)[1:] == [
        "2 more like this within 1.0 s were not logged one by one; dropped from b'p': junk"
    ]
    limited.flush()
    assert len(_lines(caplog)) == 2


def test_a_flood_of_distinct_keys_writes_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture, clock: Clock, limited: t.RateLimitedLog
) -> None:
    caplog.set_level(logging.WARNING, NAME)
    for second in range(3):
        for i in range(1000):
            _drop(limited, f"peer-{second}-{i}".encode())
        clock.now += 1.0
    limited.flush()
    lines = _lines(caplog)
    # Per interval: max_keys lines, and one line counting the others.
    assert len(lines) == 3 * (3 + 1)
    others = [line for line in lines if "of other kinds" in line]
    assert len(others) == 3
    assert all(line.startswith("997 more lines of other kinds") for line in others)
    assert limited.suppressed == 3 * 997


def test_nothing_is_tracked_when_the_level_is_off(
    caplog: pytest.LogCaptureFixture, limited: t.RateLimitedLog
) -> None:
    caplog.set_level(logging.ERROR, NAME)
    assert _drop(limited) is False
    assert limited.suppressed == 0
    assert _lines(caplog) == []


@pytest.mark.parametrize("options", [{"interval": 0}, {"interval": -1.0}, {"max_keys": 0}])
def test_bad_settings_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(t.TransportUsageError, match="must be"):
        t.RateLimitedLog(logging.getLogger(NAME), **options)  # type: ignore[arg-type]
