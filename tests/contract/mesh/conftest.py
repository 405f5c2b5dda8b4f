"""Fixtures shared by the mesh contract tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zlink_actors.testing import HostHarness

from ._global import GlobalMesh
from ._nodes import Nodes


@pytest.fixture
def mesh() -> Iterator[GlobalMesh]:
    """Hosts sharing one in-memory Location Store (`GlobalMesh`), shut down at the end."""
    with GlobalMesh() as m:
        yield m


@pytest.fixture
def nodes(harness: HostHarness) -> Nodes:
    """Meshed Hosts added one by one (`_nodes.Nodes`), shut down by the harness."""
    return Nodes(harness)
