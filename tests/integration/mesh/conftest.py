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

import zlink_actors as z
from tests.contract.location._redis_server import RedisServer
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
def redis_store(
    redis_server: RedisServer,  # noqa: F811 - the shared fixture, imported above
) -> Iterator[tuple[z.RedisLocationStore, dict[str, str]]]:
    """A Redis store under a namespace of this test's own, and its node_main config."""
    prefix = f"zlm-{uuid.uuid4().hex}"
    store = z.RedisLocationStore(redis_server.url, key_prefix=prefix)
    try:
        yield store, {"url": redis_server.url, "key_prefix": prefix}
    finally:
        store.close()


@pytest.fixture
def ipc_dir() -> Iterator[pathlib.Path]:
    """A short directory under /tmp for `ipc://` paths (a socket path has ~107 bytes)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"zlm-{uuid.uuid4().hex[:8]}-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        assert not path.exists()
