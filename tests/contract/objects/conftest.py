"""Fixtures for the object-model contract tests: the suite's harness, with four pool
threads by default so that handlers held on latches leave room for the rest."""

from collections.abc import Iterator

import pytest

from zlink_actors.testing import HostHarness


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    """A `HostHarness` whose Hosts have four pool threads unless told otherwise."""
    with HostHarness(app_threads=4) as harness:
        yield harness
