"""The test fixture's redis-server: it attaches only to the server it started."""

from __future__ import annotations

import time

import pytest

from ._redis_server import RedisServer, redis_server_binary


def test_start_never_attaches_to_a_server_it_did_not_start() -> None:
    binary = redis_server_binary()
    assert binary is not None
    foreign = RedisServer(binary)
    foreign.start()
    mine = RedisServer(binary)
    mine.port = foreign.port  # a restart on a port that another server now holds
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="did not start"):
            mine.start(attempts=2)
        assert time.monotonic() - started < 25.0
        assert mine.process is not None
        assert mine.process.poll() is not None  # ours could not bind, and is gone
    finally:
        mine.stop()
        foreign.stop()
