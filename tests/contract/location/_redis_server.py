"""A real `redis-server` on a free loopback port, for the Location Store tests: the test
kit's `RedisServer` (zlink_actors.testing, which also finds the binary), plus the faults
these tests inject (pause, resume) and what they measure (bytes queued at the server).
"""

from __future__ import annotations

import signal
import sys

from zlink_actors import testing
from zlink_actors.testing import redis_server_binary

__all__ = ["HOW_TO_INSTALL", "RedisServer", "redis_server_binary"]

HOW_TO_INSTALL = (
    "these tests need redis-server on the PATH: run `make test` as root (it installs "
    "Debian's redis-server) or `sudo apt-get install redis-server`"
)


class RedisServer(testing.RedisServer):
    """The kit's server, which a test may also pause and resume."""

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

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
