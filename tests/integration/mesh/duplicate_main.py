"""Two nodes with one routing id in one process (run by `test_duplicate_routing_id.py` as
a child, so that a libzmq abort ends the child, not the test run).

Run as `python -m tests.integration.mesh.duplicate_main`. It starts a node P, a node A
with routing id "dup" dialling P, and, while P asks "dup" for its endpoint and A asks P
in a loop, a second node B with the same routing id dialling P. Once B's dial ended it
waits until P got 50 more answers from "dup", then prints one JSON line: B's error, P's
entry for "dup", A's and B's endpoints, which endpoints answered P after B's refusal and
the errors P saw then; exit status 0.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from typing import Any

import msgspec

import zlink_actors as z

MESH = "game"
#: Answers P must get from "dup" after B was refused.
AFTER = 50
WAIT = 10.0


class Who(msgspec.Struct, frozen=True):
    n: int


class Where(z.NodeHandler):
    @z.handler
    def who(self, ctx: z.NodeContext, msg: Who) -> str:
        info = ctx.node
        assert info is not None
        return str(info.endpoint)


def _mesh(**options: Any) -> z.MeshConfig:
    return z.MeshConfig(MESH, liveness_interval=0.2, liveness_timeout=1.0, **options)


def _host(**options: Any) -> z.Host:
    return z.Host(mesh=_mesh(**options), node_handler=Where, message_types=[Who]).start()


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    p = _host()
    a = _host(routing_id="dup", peers=(p.node.endpoint,))
    b: z.Host | None = None
    stop = threading.Event()
    refused = threading.Event()
    answers: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    lock = threading.Lock()

    def ask(src: z.Host, rid: str, count: bool) -> None:
        while not stop.is_set():
            try:
                got = src.request_to_node(MESH, rid, Who(1), reply=str).timeout(0.5).submit_sync()
            except z.ZlinkError as exc:
                if count and refused.is_set():
                    with lock:
                        errors[type(exc).__name__] += 1
                continue
            if count and refused.is_set():
                with lock:
                    answers[got] += 1

    threads = []
    try:
        a.wait_for_peers(1, timeout=WAIT)
        p.wait_for_peers(1, timeout=WAIT)
        threads = [
            threading.Thread(target=ask, args=(p, "dup", True)),
            threading.Thread(target=ask, args=(a, p.node.routing_id, False)),
        ]
        for thread in threads:
            thread.start()
        b = _host(routing_id="dup", peers=(p.node.endpoint,))
        error = ""
        try:
            b.connect_peer(p.node.endpoint).result(WAIT)
        except z.ZlinkError as exc:
            error = type(exc).__name__
        refused.set()
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            with lock:
                if sum(answers.values()) >= AFTER:
                    break
            stop.wait(0.01)
        stop.set()
        for thread in threads:
            thread.join(WAIT)
        entry = [(q.state.value, q.endpoint) for q in p.peers() if q.routing_id == "dup"]
        print(
            json.dumps(
                {
                    "b_error": error,
                    "p_dup": entry,
                    "a": a.node.endpoint,
                    "b": b.node.endpoint,
                    "answers": dict(answers),
                    "errors": dict(errors),
                }
            ),
            flush=True,
        )
    finally:
        stop.set()
        for host in (b, a, p):
            if host is not None:
                host.shutdown(5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
