"""Fixtures shared by the unit tests of the timer service and what runs on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zlink_actors import ManualClock
from zlink_actors._core.clock import TimerService
from zlink_actors.testing import WAIT


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def service(clock: ManualClock) -> Iterator[TimerService]:
    """A timer service on `clock`, stopped (and checked stopped) at teardown."""
    timers = TimerService(clock, name="test-timer")
    yield timers
    assert timers.stop(WAIT)
