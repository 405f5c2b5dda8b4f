"""Fixtures of the multi-process mesh tests: the node processes of a test (every one
stopped and checked gone at its end, also when the test fails), a private directory for
ipc endpoints (removed at the end), and the session's real redis-server, the Location
Store suite's own fixture."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from tests.contract.location.conftest import redis_server  # noqa: F401 - the shared fixture

from .nodes import NodeProcesses


@pytest.fixture
def nodes() -> Iterator[NodeProcesses]:
    started = NodeProcesses()
    try:
        yield started
    finally:
        left = started.close()
        assert not left, f"node processes still running: {[n.pid for n in left]}"


@pytest.fixture
def ipc_dir() -> Iterator[pathlib.Path]:
    """A short directory under /tmp for `ipc://` paths (a socket path has ~107 bytes)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"zlm-{uuid.uuid4().hex[:8]}-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        assert not path.exists()
