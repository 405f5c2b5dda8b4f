"""Fixtures shared by the mesh contract tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._global import GlobalMesh


@pytest.fixture
def mesh() -> Iterator[GlobalMesh]:
    """Hosts sharing one in-memory Location Store (`GlobalMesh`), shut down at the end."""
    with GlobalMesh() as m:
        yield m
