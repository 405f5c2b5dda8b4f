"""Scenario 8: `transports` request/reply across two processes on tcp loopback, side by
side with a raw pyzmq DEALER->ROUTER echo (the physical floor) and with the same echo in
this design's thread shape (one I/O thread and a worker thread on each side).

`python -m benchmarks.transports serve raw|shape|transports` is the echo process: it
prints its endpoint(s) on one line and serves until its stdin closes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import zmq

import transports as t

from ._harness import Metric, Metrics, Scenario, in_flight

PAYLOAD = b"p" * 100
WINDOW = 64
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the thread shape, without transports: an I/O thread owns the socket -----------------


class ShapeIo(threading.Thread):
    """One I/O thread owning `sock`; other threads `post` frames, woken by an eventfd;
    every received message goes to `deliver` (a hand-off to another thread)."""

    def __init__(self, sock: zmq.Socket[bytes], deliver: Callable[[list[bytes]], None]):
        super().__init__(daemon=True)
        self.sock, self.deliver = sock, deliver
        self.outbox: deque[list[bytes]] = deque()
        self.lock = threading.Lock()
        self.waker = os.eventfd(0, os.EFD_NONBLOCK)
        self.stopping = False

    def post(self, frames: list[bytes]) -> None:
        with self.lock:
            self.outbox.append(frames)
        os.eventfd_write(self.waker, 1)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.waker, zmq.POLLIN)
        while not self.stopping:
            ready = dict(poller.poll(100))
            if self.waker in ready:
                os.eventfd_read(self.waker)
            with self.lock:
                out = list(self.outbox)
                self.outbox.clear()
            for frames in out:
                if frames:
                    self.sock.send_multipart(frames)
            for _ in range(64):
                try:
                    self.deliver(self.sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
        self.sock.close(0)


# -- the echo processes ----------------------------------------------------------------


def serve(mode: str) -> None:
    if mode == "transports":
        inbox: queue.SimpleQueue[t.Inbound] = queue.SimpleQueue()

        def on_receive(batch: Sequence[t.Inbound]) -> None:
            for record in batch:
                inbox.put(record)

        with t.Transport(b"echo", on_receive) as tr:
            ep = tr.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")

            def work() -> None:  # the worker thread: consume, release, reply
                while True:
                    record = inbox.get()
                    tr.release(record.peer, record.charge)
                    tr.reply(record.peer, record.route_id, record.frames)

            threading.Thread(target=work, daemon=True).start()
            print(ep.application, ep.completion, flush=True)
            sys.stdin.read()
        return
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", "-", flush=True)
    if mode == "raw":
        threading.Thread(target=_raw_echo, args=(sock,), daemon=True).start()
    else:
        jobs: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
        io = ShapeIo(sock, jobs.put)

        def work() -> None:
            while True:
                io.post(jobs.get())

        threading.Thread(target=work, daemon=True).start()
        io.start()
    sys.stdin.read()
    os._exit(0)


def _raw_echo(sock: zmq.Socket[bytes]) -> None:
    while True:
        sock.send_multipart(sock.recv_multipart())


@contextmanager
def server(
    mode: str,
    module: str = "benchmarks.transports",
    args: Sequence[str] = (),
    stop_wait: float = 0.0,
) -> Iterator[list[str]]:
    """Start `python -m <module> serve <mode> [args...]`; yields the words of its first
    line; at the end closes its stdin, gives it `stop_wait` seconds to exit, kills it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "serve", mode, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().split()
    finally:
        if stop_wait > 0 and proc.stdin is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                proc.stdin.close()  # a serving node then shuts down cleanly
                proc.wait(stop_wait)
        proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


# -- the three clients -------------------------------------------------------------------


def _measure(
    n: int,
    send: Callable[[int], None],
    wait_one: Callable[[], object],
    round_trip: Callable[[int], None] | None = None,
) -> Metrics:
    """`n` sequential round trips (`round_trip`, else `send` then `wait_one`), then `n`
    requests with `WINDOW` in flight."""
    if round_trip is None:

        def round_trip(i: int) -> None:
            send(i)
            wait_one()

    for i in range(200):  # warm the connection
        round_trip(i)
    start = time.perf_counter()
    for i in range(n):
        round_trip(i)
    sequential = (time.perf_counter() - start) / n * 1e6
    return {"round trip": sequential, "pipelined 64": n / in_flight(n, WINDOW, send, wait_one)}


def raw_case(n: int, payload: bytes = PAYLOAD) -> Metrics:
    with server("raw") as (address, _), zmq.Context() as ctx:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        try:
            return _measure(n, lambda i: sock.send(payload), sock.recv)
        finally:
            sock.close(0)


def shape_case(n: int, payload: bytes = PAYLOAD) -> Metrics:
    with server("shape") as (address, _), zmq.Context() as ctx:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        replies: queue.SimpleQueue[list[bytes]] = queue.SimpleQueue()
        io = ShapeIo(sock, replies.put)
        io.start()
        try:
            return _measure(n, lambda i: io.post([payload]), replies.get)
        finally:
            io.stopping = True
            io.post([])  # wakes it; the empty message is never sent (stopping)
            io.join(10)


def transports_case(n: int) -> Metrics:
    replies: queue.SimpleQueue[t.Inbound] = queue.SimpleQueue()

    def on_receive(batch: Sequence[t.Inbound]) -> None:
        for record in batch:
            replies.put(record)

    with server("transports") as (app, comp), t.Transport(b"client", on_receive) as tr:
        tr.connect(b"echo", t.Endpoints(app, comp))

        def send(i: int) -> None:
            result = tr.submit_request(b"echo", i, [PAYLOAD])
            if result.admitted is not None:
                result.admitted.result(10)

        return _measure(n, send, lambda: replies.get(timeout=10) and None)


def scenarios(quick: bool) -> list[Scenario]:
    n = 2_000 if quick else 20_000
    where = f"({n:,} sequential, then {n:,} with {WINDOW} in flight; 100 B, tcp loopback)"
    return [
        Scenario(
            title=f"8a. transports request/reply vs the same thread shape {where}",
            zlink=lambda: transports_case(n),
            peer=lambda: shape_case(n),
            peer_name="pyzmq DEALER->ROUTER echo, an I/O thread + a worker thread each side",
            metrics=[
                Metric("round trip", "us", higher_is_better=False, target=1.2),
                Metric("pipelined 64", "/s", higher_is_better=True),
            ],
        ),
        Scenario(
            title=f"8b. transports request/reply vs raw pyzmq {where}",
            zlink=lambda: transports_case(n),
            peer=lambda: raw_case(n),
            peer_name="raw pyzmq DEALER->ROUTER echo, no extra threads (the physical floor)",
            metrics=[
                Metric("round trip", "us", higher_is_better=False),
                Metric("pipelined 64", "/s", higher_is_better=True, target=0.8),
            ],
        ),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
