"""What a parked one-way costs its sender (issue 26 item 8): `python -m benchmarks.parked
[--count N] [--traced M]`.

Two Hosts in this process on tcp loopback. The receiver's handler blocks (a node handler,
and a global Spot on a `MemoryLocationStore`), so its inbound permits fill, it tells the
sender PAUSED, and every further one-way waits at the sender for credit (a parked send:
`statistics().mesh.parked_sends`). For each target it parks `count` one-ways (the
completions dropped, as a fire-and-forget sender does) and prints the sender's resident
set before and after (the process's RSS: both Hosts, but the receiver reads nothing while
paused), then parks `traced` more under `tracemalloc` and prints the bytes allocated per
parked message. Not a timed test; `make test` has the bound (tests/contract/mesh/
test_flow.py, < 512 bytes each over 10,000). docs/mesh.md, "Backpressure", has the figures.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
import tracemalloc
from collections.abc import Callable

import msgspec

import zlink_actors as z

MESH = "parked"
WAIT = 30.0
release = threading.Event()


class Note(msgspec.Struct, frozen=True):
    n: int


class Held(z.NodeHandler):
    @z.handler
    def note(self, ctx: z.NodeContext, msg: Note) -> None:
        release.wait(WAIT)


class HeldSpot(z.Spot):
    @z.handler
    def note(self, ctx: z.SpotContext, msg: Note) -> None:
        release.wait(WAIT)


def _rss() -> int:
    """The resident set of this process now, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


_PAGE = 4096


def _parked(host: z.Host) -> int:
    stats = host.statistics().mesh
    assert stats is not None
    return stats.parked_sends


def _wait_parking(sender: z.Host, send: Callable[[int], z.Completion[None]]) -> int:
    """Send until a send parks (the receiver has paused us); the number sent."""
    end = time.monotonic() + WAIT
    sent = 0
    while time.monotonic() < end:
        sent += 1
        if not send(sent).done() and _parked(sender):
            return sent
    raise RuntimeError("no send parked: the receiver never paused")


def measure(
    label: str, sender: z.Host, send: Callable[[int], z.Completion[None]], args: argparse.Namespace
) -> None:
    start = _wait_parking(sender, send)
    gc.collect()
    parked0, rss0 = _parked(sender), _rss()
    for i in range(args.count):
        send(start + i)
    gc.collect()
    parked1, rss1 = _parked(sender), _rss()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(args.traced):
            send(start + args.count + i)
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    parked2 = _parked(sender)
    n = parked1 - parked0
    print(
        f"{label}: {n:,} parked: RSS {rss0 / 2**20:.0f} MB -> {rss1 / 2**20:.0f} MB "
        f"({(rss1 - rss0) / max(n, 1):.0f} B each); traced "
        f"{traced / max(parked2 - parked1, 1):.0f} B each over {parked2 - parked1:,} more"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.parked")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--traced", type=int, default=20_000)
    parser.add_argument(
        "--target",
        choices=("node", "spot"),
        action="append",
        help="one case only (each case alone gives the cleaner RSS figure)",
    )
    args = parser.parse_args()
    for target in args.target or ("node", "spot"):
        release.clear()
        _case(target, args)


def _case(target: str, args: argparse.Namespace) -> None:
    """Park one-ways to a held node handler, or to a held global Spot, on a new pair."""
    config = {"liveness_interval": 1.0, "liveness_timeout": 60.0, "peer_expiry": 120.0}
    store = z.MemoryLocationStore()
    receiver = z.Host(
        mesh=z.MeshConfig(MESH, inbound_permits=4, **config),
        node_handler=Held,
        spots=[HeldSpot],
        location=store,
    )
    receiver.start()
    sender = z.Host(
        mesh=z.MeshConfig(MESH, peers=(receiver.node.endpoint,), **config),
        location=store,
        message_types=(Note,),
    )
    sender.start()
    try:
        sender.wait_for_peers(1, timeout=WAIT)
        if target == "node":
            rid = receiver.node.routing_id
            measure(
                "one-way to a node handler",
                sender,
                lambda i: sender.send_to_node(MESH, rid, Note(i)).submit(),
                args,
            )
        else:
            receiver.spots.get_or_create("room", HeldSpot).submit_sync()
            measure(
                "one-way to a global Spot",
                sender,
                lambda i: sender.send_to_spot("room", Note(i)).submit(),
                args,
            )
    finally:
        release.set()
        sender.shutdown(WAIT)
        receiver.shutdown(WAIT)
        store.close()


if __name__ == "__main__":
    main()
