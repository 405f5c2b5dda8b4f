"""Fixtures shared by the whole suite, built on the public test kit `zlink_actors.testing`.

Concurrency in these tests is ordered by `threading.Event`, `threading.Barrier` and
`CompletionSource`, never by sleeping; every bounded wait asserts its result. Deadlines are
driven by a `ManualClock` wherever the runtime reads its clock.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from zlink_actors import Host, ManualClock, completion_dispatcher
from zlink_actors.testing import WAIT, DispatcherBlocker, HeldJob, HostHarness


@pytest.fixture(autouse=True)
def _drain_dispatcher_after_each_test() -> Iterator[None]:
    """Callbacks posted by one test never run during the next one."""
    yield
    assert completion_dispatcher().drain(WAIT), "the completion dispatcher did not drain"


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    """Starts Hosts and hands out held work for a test; at teardown it releases all held
    work first, then shuts down every Host still serving, which must stop cleanly.

    A test that shuts its Host down itself (to observe draining or a forced stop) owns the
    outcome; the harness only checks Hosts the test left serving.
    """
    with HostHarness() as harness:
        yield harness


@pytest.fixture
def make_host(harness: HostHarness) -> Callable[..., Host]:
    """Start a Host with the given options (`harness.host`)."""
    return harness.host


@pytest.fixture
def held(harness: HostHarness) -> Callable[..., HeldJob[object]]:
    """A factory of `HeldJob`s (`harness.job`); all are released before any Host stops."""
    return harness.job


@pytest.fixture
def block_dispatcher() -> Callable[[], DispatcherBlocker]:
    """A factory of `DispatcherBlocker` context managers."""
    return DispatcherBlocker


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def host(make_host: Callable[..., Host]) -> Host:
    """A started Host with two CPU workers and the real clock."""
    return make_host(cpu_workers=2)


@pytest.fixture
def clocked_host(make_host: Callable[..., Host], manual_clock: ManualClock) -> Host:
    """A started Host with one CPU worker whose deadlines follow `manual_clock`."""
    return make_host(cpu_workers=1, clock=manual_clock)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Ctrl-C raises `KeyboardInterrupt` in the main thread while the test runs, however
    the test run was started (a run started in the background ignores SIGINT)."""
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
