"""The test fixture's redis-server: it attaches only to the server it started."""

from __future__ import annotations

import pathlib
import socket
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


def _roundtrip(server: RedisServer, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as sock:
        sock.sendall(command)
        return sock.recv(65536)


def test_a_server_with_a_persist_dir_keeps_its_data_across_a_kill(tmp_path: pathlib.Path) -> None:
    binary = redis_server_binary()
    assert binary is not None
    server = RedisServer(binary, persist_dir=str(tmp_path))
    try:
        server.start()
        assert _roundtrip(server, b"SET k v\r\n") == b"+OK\r\n"
        server.kill()  # SIGKILL: only what the append-only file holds survives
        server.start()
        assert _roundtrip(server, b"GET k\r\n") == b"$1\r\nv\r\n"
        server.kill()
        for path in tmp_path.rglob("*"):  # a restart without its files: empty
            if path.is_file():
                path.unlink()
        server.start()
        assert _roundtrip(server, b"GET k\r\n") == b"$-1\r\n"
    finally:
        server.stop()
    assert any(tmp_path.iterdir())  # the files were in the directory given, not in /tmp
