"""Node processes for the tests: `NodeProcesses` starts `node_main.py` children, reads
each one's JSON line with a bounded wait, and always stops them (stdin closed, then
SIGTERM, then SIGKILL, each after a bound), also when the test fails; `gone()` checks a
process no longer exists."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pathlib
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from zlink_actors.testing import WAIT

__all__ = [
    "FAST",
    "START_WAIT",
    "STOP_WAIT",
    "NodeProcess",
    "NodeProcesses",
    "gone",
    "wait_until",
]

ROOT = pathlib.Path(__file__).resolve().parents[3]
#: Short liveness timings for every node of these tests.
FAST: dict[str, float] = {"liveness_interval": 0.2, "liveness_timeout": 1.0}
#: How long a child may take to start and print its line (Python, imports, bind).
START_WAIT = 3 * WAIT
#: How long a child may take to stop after its stdin closed (`Host.shutdown(5)` inside).
STOP_WAIT = 2 * WAIT


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), None if none."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass
class NodeProcess:
    """One running node_main child."""

    proc: subprocess.Popen[bytes]
    config: dict[str, Any]
    stderr: IO[str]
    started_at: str | None
    routing_id: str = ""
    endpoint: str = ""
    lines: list[str] = field(default_factory=list)
    #: The routing ids READY at the node when it reported joined.
    ready_peers: list[str] = field(default_factory=list)
    #: stderr's tail once the streams are closed.
    final_log: str | None = None
    _pending: bytes = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def gone(self) -> bool:
        """True once the process is reaped and no process with its pid and start time
        exists."""
        return self.proc.poll() is not None and gone(self.pid, self.started_at)

    def kill(self) -> None:
        """SIGKILL, and reap it (bounded)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)

    def stop(self) -> int:
        """Close stdin (the node shuts down cleanly) and wait for it (bounded); returns
        its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        status = self.proc.wait(STOP_WAIT)
        self._read_rest()  # its last line
        return status

    def log(self) -> str:
        """What the child wrote to stderr (for failure messages)."""
        if self.final_log is not None:
            return self.final_log
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()[-4000:]

    def _read_line(self, deadline: float) -> dict[str, Any]:
        """The next JSON line on the child's stdout, read unbuffered (a buffered reader
        could hold a second line where `select` cannot see it)."""
        stdout = self.proc.stdout
        assert stdout is not None
        while b"\n" not in self._pending:
            with selectors.DefaultSelector() as sel:
                sel.register(stdout, selectors.EVENT_READ)
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"node {self.pid} printed no line in time:\n{self.log()}")
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"node {self.pid} exited before its line:\n{self.log()}")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        text = line.decode()
        self.lines.append(text)
        value: dict[str, Any] = json.loads(text)
        return value

    def _read_rest(self) -> None:
        """Everything left on stdout, once the child exited."""
        stdout = self.proc.stdout
        if stdout is None or stdout.closed:
            return
        while chunk := os.read(stdout.fileno(), 65536):
            self._pending += chunk
        self.lines.extend(line.decode() for line in self._pending.split(b"\n") if line)
        self._pending = b""

    def _close_streams(self) -> None:
        if self.final_log is None:
            self.final_log = self.log()
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()


def gone(pid: int, started_at: str | None) -> bool:
    """No process `pid` started at `started_at` exists (the pid may have been reused)."""
    now = _start_time(pid)
    return now is None or now != started_at


class NodeProcesses:
    """Starts node processes for one test; `close()` stops every one of them and checks
    that each is gone.

    `start(...)` returns at once with the processes launched; `ready()` then reads each
    one's line, so several children start in parallel.
    """

    def __init__(self) -> None:
        self.started: list[NodeProcess] = []

    def launch(
        self,
        wrap: Sequence[str] = (),
        module: str = "tests.integration.mesh.node_main",
        stderr_to: str | None = None,
        **config: Any,
    ) -> NodeProcess:
        """Start a node with `config` (node_main's keys, FAST liveness unless given);
        `wrap` is an argv prefix, e.g. `Network.prefix(i)` to run it in a namespace;
        `module` is the `python -m` module to run (another node main, such as the chaos
        run's, that takes the same JSON argument and prints the same first line);
        `stderr_to`: a file its stderr is written to and kept (else a temporary one)."""
        config = {**FAST, **config}
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        stderr = (  # closed with the node
            tempfile.TemporaryFile("w+")  # noqa: SIM115
            if stderr_to is None
            else open(stderr_to, "w+")  # noqa: SIM115
        )
        proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", module, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            bufsize=0,
            cwd=ROOT,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, before exec
        )
        node = NodeProcess(proc, config, stderr, _start_time(proc.pid))
        self.started.append(node)
        return node

    def ready(self, *nodes: NodeProcess, timeout: float = START_WAIT) -> None:
        """Read each node's start line (all within `timeout`)."""
        deadline = time.monotonic() + timeout
        for node in nodes:
            line = node._read_line(deadline)
            node.routing_id = line["routing_id"]
            node.endpoint = line["endpoint"]

    def joined(self, *nodes: NodeProcess, timeout: float = START_WAIT) -> None:
        """Read each node's second line: its expected peers are READY there (as they
        are here only after the handshake's answer reached the dialling node)."""
        deadline = time.monotonic() + timeout
        for node in nodes:
            line = node._read_line(deadline)
            assert "ready" in line, (line, node.log())
            node.ready_peers = list(line["ready"])

    def start(self, wrap: Sequence[str] = (), **config: Any) -> NodeProcess:
        node = self.launch(wrap, **config)
        self.ready(node)
        return node

    def close(self) -> list[NodeProcess]:
        """Stop every node still running: stdin closed, then SIGTERM, then SIGKILL, each
        after a bound. Returns the nodes that are not gone afterwards (none, normally)."""
        for node in self.started:
            if node.proc.poll() is None and node.proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    node.proc.stdin.close()
        for node in self.started:
            for step in (None, signal.SIGTERM, signal.SIGKILL):
                if step is not None and node.proc.poll() is None:
                    node.proc.send_signal(step)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(STOP_WAIT if step is None else WAIT)
                    break
            node._close_streams()
        return [node for node in self.started if not node.gone()]


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll `predicate` until it is true or `timeout` passed; the caller asserts the
    result (for states only visible by looking, such as another process's peers)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True
