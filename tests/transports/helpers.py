"""Shared pieces of the transport tests: a receiving owner that records what arrives,
a bounded wait that the tests assert, and a child process running a transport."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import transports as t

WAIT = 10.0  # the longest any bounded wait may take before the test fails
ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = t.TransportConfig(heartbeat_interval=0.1, heartbeat_timeout=0.6)


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll `predicate` until true or `timeout`; the caller asserts the result."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


class Owner:
    """The owner of a transport: records inbound records and events.

    With `auto_release`, it releases each record's credit as it arrives; `replies`
    answers each request with `b"re:" + first frame`.
    """

    def __init__(self, auto_release: bool = True, replies: bool = True) -> None:
        self.auto_release = auto_release
        self.replies = replies
        self.transport: t.Transport | None = None
        self.records: list[t.Inbound] = []
        self.events: list[t.PeerEvent] = []
        self.batches: list[int] = []
        self.changed = threading.Condition()

    def on_receive(self, batch: Sequence[t.Inbound]) -> None:
        assert self.transport is not None
        for record in batch:
            if self.auto_release and record.charge:
                self.transport.release(record.peer, record.charge)
            if self.replies and record.kind is t.InboundKind.REQUEST:
                answer = b"rejected" if record.rejected else b"re:" + record.frames[0]
                self.transport.reply(record.peer, record.route_id, [answer])
        with self.changed:
            self.records.extend(batch)
            self.batches.append(len(batch))
            self.changed.notify_all()

    def on_event(self, event: t.PeerEvent) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def of_kind(self, kind: t.InboundKind) -> list[t.Inbound]:
        with self.changed:
            return [r for r in self.records if r.kind is kind]

    def event_kinds(self, peer: bytes) -> list[t.PeerEventKind]:
        with self.changed:
            return [e.kind for e in self.events if e.peer == peer]


@contextmanager
def transport(name: bytes, owner: Owner, config: t.TransportConfig = FAST) -> Iterator[t.Transport]:
    """A transport whose callbacks go to `owner`; closed (and joined) at the end."""
    tr = t.Transport(name, owner.on_receive, on_event=owner.on_event, config=config)
    owner.transport = tr
    try:
        yield tr
    finally:
        tr.close()


def addresses(kind: str, tmp: pathlib.Path, tag: str) -> tuple[str, str]:
    if kind == "tcp":
        return "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"
    return f"ipc://{tmp}/{tag}-app", f"ipc://{tmp}/{tag}-comp"


@contextmanager
def pair(
    kind: str,
    tmp: pathlib.Path,
    a_config: t.TransportConfig = FAST,
    b_config: t.TransportConfig = FAST,
    b_owner: Owner | None = None,
) -> Iterator[tuple[t.Transport, Owner, t.Transport, Owner]]:
    """A connected to B (both in this process), READY on both sides, and each side's
    first heartbeat round trip done (each has the other's clock offset): nothing is
    queued for either I/O thread when the test begins."""
    a_owner, b_owner = Owner(), b_owner or Owner()
    with transport(b"A", a_owner, a_config) as a, transport(b"B", b_owner, b_config) as b:
        endpoints = b.bind(*addresses(kind, tmp, "b"))
        a.connect(b"B", endpoints)
        assert a_owner.wait(lambda: t.PeerEventKind.READY in a_owner.event_kinds(b"B"))
        assert b_owner.wait(lambda: t.PeerEventKind.READY in b_owner.event_kinds(b"A"))
        assert wait_until(
            lambda: a.clock_offset(b"B") is not None and b.clock_offset(b"A") is not None
        )
        yield a, a_owner, b, b_owner


@contextmanager
def child(mode: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], t.Endpoints]]:
    """Run tests/transports/child.py in its own process; SIGKILL it at the end."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "transports" / "child.py"), mode, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert len(line) == 2, f"the child did not report its endpoints: {line}"
        yield proc, t.Endpoints(line[0], line[1])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
