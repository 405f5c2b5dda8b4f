"""Shared fixtures for the foundation tests.

Concurrency in these tests is ordered by `threading.Event`, `threading.Barrier` and
`CompletionSource`, never by sleeping; every bounded wait asserts its result. Deadlines are
driven by a `ManualClock` wherever the runtime reads its clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import TracebackType

import pytest

from zlink_actors import (
    CompletionSource,
    Host,
    HostState,
    ManualClock,
    ShutdownOutcome,
    completion_dispatcher,
)

#: Upper bound for every wait that is expected to succeed.
WAIT = 5.0


class DispatcherBlocker:
    """Holds the process-shared completion dispatcher inside one callback.

    While it is held, nothing posted to the dispatcher runs, so a test can check that a
    callback was *queued* rather than run inline. Leaving the `with` block releases it.
    """

    def __init__(self) -> None:
        self._started = threading.Event()
        self._release = threading.Event()

    def __enter__(self) -> DispatcherBlocker:
        source: CompletionSource[None] = CompletionSource()
        source.set_result(None)
        source.completion.add_done_callback(self._hold)
        assert self._started.wait(WAIT), "the dispatcher never ran the blocking callback"
        return self

    def _hold(self, _: object) -> None:
        self._started.set()
        self._release.wait(30)

    def release(self) -> None:
        self._release.set()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._release.set()


class HeldJob:
    """A worker body that reports when it starts and returns `value` once released.

    Stands for slow user code whose end the test decides.
    """

    def __init__(self, value: object = None) -> None:
        self.value = value
        self.started = threading.Event()
        self._release = threading.Event()

    def __call__(self, *args: object) -> object:
        self.started.set()
        if not self._release.wait(30):
            raise TimeoutError("HeldJob was never released")
        return self.value

    def release(self) -> None:
        self._release.set()


@pytest.fixture(autouse=True)
def _drain_dispatcher_after_each_test() -> Iterator[None]:
    """Callbacks posted by one test never run during the next one."""
    yield
    assert completion_dispatcher().drain(WAIT), "the completion dispatcher did not drain"


@pytest.fixture
def block_dispatcher() -> Callable[[], DispatcherBlocker]:
    """A factory of `DispatcherBlocker` context managers."""
    return DispatcherBlocker


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_host() -> Iterator[Callable[..., Host]]:
    """Start Hosts for a test; any still serving at teardown must stop cleanly.

    A test that shuts its Host down itself (to observe draining or a forced stop) owns the
    outcome; the fixture only checks Hosts the test left serving.
    """
    hosts: list[Host] = []

    def make(**options: object) -> Host:
        host = Host(**options).start()  # type: ignore[arg-type]  # options are Host's
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        if host.state is HostState.SERVING:
            result = host.shutdown(deadline=WAIT)
            assert result.outcome is ShutdownOutcome.STOPPED, result


@pytest.fixture
def held(make_host: Callable[..., Host]) -> Iterator[Callable[..., HeldJob]]:
    """A factory of `HeldJob`s; all are released before any Host of the test stops."""
    jobs: list[HeldJob] = []

    def make(value: object = None) -> HeldJob:
        job = HeldJob(value)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.release()


@pytest.fixture
def host(make_host: Callable[..., Host]) -> Host:
    """A started Host with two CPU workers and the real clock."""
    return make_host(cpu_workers=2)


@pytest.fixture
def clocked_host(make_host: Callable[..., Host], manual_clock: ManualClock) -> Host:
    """A started Host with one CPU worker whose deadlines follow `manual_clock`."""
    return make_host(cpu_workers=1, clock=manual_clock)
