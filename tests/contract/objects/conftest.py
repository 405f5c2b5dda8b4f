"""Fixtures for the object-model contract tests: the engine suite's harness, with four
pool threads by default so that handlers held on latches leave room for the rest."""

from collections.abc import Iterator

import pytest
from engine.conftest import Harness as EngineHarness

from zlink_actors import Host


class Harness(EngineHarness):
    def host(self, **options: object) -> Host:
        """A started Host; four pool threads unless told, so held handlers leave room."""
        options.setdefault("app_threads", 4)
        return super().host(**options)


@pytest.fixture
def harness() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()
