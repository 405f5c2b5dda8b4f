"""Fixtures for the object-model contract tests."""

import threading
from collections.abc import Iterator

import pytest

from zlink_actors import Host, HostState, ShutdownOutcome

from ._support import WAIT


class HeldJob:
    """A worker body that reports when it starts and returns `value` once released."""

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


class Harness:
    """Starts Hosts and hands out latches and held jobs, and cleans all of it up.

    At teardown every latch and job is released first, so no handler or worker is left
    blocked, and only then is every Host still serving shut down; such a Host must stop
    cleanly. A test that shuts its Host down itself owns that outcome.
    """

    def __init__(self) -> None:
        self._hosts: list[Host] = []
        self._latches: list[threading.Event] = []
        self._jobs: list[HeldJob] = []

    def host(self, **options: object) -> Host:
        """A started Host; four pool threads unless told, so held handlers leave room."""
        options.setdefault("app_threads", 4)
        host = Host(**options).start()  # type: ignore[arg-type]
        self._hosts.append(host)
        return host

    def latch(self) -> threading.Event:
        """An Event the test sets to release a handler; set at teardown regardless."""
        latch = threading.Event()
        self._latches.append(latch)
        return latch

    def job(self, value: object = None) -> HeldJob:
        """A worker body that blocks until released; released at teardown regardless."""
        job = HeldJob(value)
        self._jobs.append(job)
        return job

    def close(self) -> None:
        for latch in self._latches:
            latch.set()
        for job in self._jobs:
            job.release()
        for host in self._hosts:
            if host.state is HostState.SERVING:
                result = host.shutdown(deadline=WAIT)
                assert result.outcome is ShutdownOutcome.STOPPED, result


@pytest.fixture
def harness() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()
