"""Meshed Hosts in one process for the contract tests of remote calls, flow control, the
wire and shutdown (issue 15 items 5-8; design/mesh.md §2).

`Nodes` starts Hosts through the suite's `HostHarness` (so every Host is shut down when
the test ends, also when it fails), each listening on tcp loopback with a free port and
the short liveness timings of `_mesh.py`, and joins each new Host to every Host started
before it: `add()` returns only once both sides of every pair see each other READY. It
differs from `_mesh.mesh_hosts` in taking each Host's options as it is added, so a test
reads "A, then B with a small queue".

The payload types shared by these tests live here too; a test that needs a handler with
state of its own defines the handler class in the test (its `__qualname__` is its type
name on the wire, the same on both sides because both sides register the same class).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec

from zlink_actors import (
    Host,
    MeshStatistics,
    NodeContext,
    NodeHandler,
    PeerState,
    UnavailableError,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness, HostOptions, wait_until

from ._mesh import mesh_config, peer_state

__all__ = [
    "MESH",
    "Blob",
    "Hold",
    "Nodes",
    "Note",
    "Ping",
    "Pong",
    "Probe",
    "Recorder",
    "SHARED",
    "Work",
    "mesh_stats",
    "peer_state",
    "ready",
    "held_gate",
    "recording_gate",
]

#: The mesh name of every Host these tests start.
MESH = "calls"


class Ping(msgspec.Struct, frozen=True):
    n: int = 0


class Pong(msgspec.Struct, frozen=True):
    n: int = 0


class Hold(msgspec.Struct, frozen=True):
    """Makes a test handler block until the test releases it."""

    tag: str = ""


class Note(msgspec.Struct, frozen=True):
    """A numbered one-way message; `pad` makes it as large as a test needs."""

    n: int
    pad: bytes = b""


class Work(msgspec.Struct, frozen=True):
    n: int = 0


class Probe(msgspec.Struct, frozen=True):
    """A FIFO probe: handled after everything the same sender sent the same node before."""


class Blob(msgspec.Struct, frozen=True):
    data: bytes


#: The payload types above: every Host `Nodes` starts knows them unless told otherwise.
SHARED: tuple[type, ...] = (Ping, Pong, Hold, Note, Work, Probe, Blob)


class Nodes:
    """Meshed Hosts of one test, started through `harness` (which shuts them down).

    Args:
        harness: the test's `HostHarness`.
    """

    def __init__(self, harness: HostHarness) -> None:
        self.harness = harness
        self.hosts: list[Host] = []

    def add(self, mesh: dict[str, Any] | None = None, **options: Any) -> Host:
        """Start a meshed Host dialling every Host added before; return it once all of
        them and it see each other READY.

        Args:
            mesh: `MeshConfig` options over `_mesh.mesh_config()`'s (not `peers`).
            **options: `Host` options; `message_types` defaults to `SHARED` (a Host
                encodes only the types it knows: docs/mesh-codec.md).
        """
        options.setdefault("message_types", SHARED)
        earlier = list(self.hosts)
        config = mesh_config(MESH, peers=tuple(h.node.endpoint for h in earlier), **(mesh or {}))
        host_options: HostOptions = {"mesh": config, **options}  # type: ignore[typeddict-item]
        host = self.harness.host(**host_options)
        self.hosts.append(host)
        host.wait_for_peers(len(earlier), timeout=WAIT)
        rid = host.node.routing_id
        for other in earlier:
            assert wait_until(lambda other=other: ready(other, rid)), (
                f"{other.node.routing_id} never saw {rid} READY"
            )
        return host


def mesh_stats(host: Host) -> MeshStatistics:
    """`host.statistics().mesh`, which a meshed Host always has."""
    stats = host.statistics().mesh
    assert stats is not None
    return stats


def ready(host: Host, routing_id: str) -> bool:
    """True when `host` lists `routing_id` as a READY peer."""
    return any(p.routing_id == routing_id and p.state is PeerState.READY for p in host.peers())


class Recorder:
    """What a test's node handler saw, in order, and the latch that holds `Hold`."""

    def __init__(self, harness: HostHarness) -> None:
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.seen: list[object] = []
        self.lock = threading.Lock()

    def note(self, item: object) -> None:
        with self.lock:
            self.seen.append(item)

    def snapshot(self) -> list[object]:
        with self.lock:
            return list(self.seen)


def recording_gate(rec: Recorder) -> type[NodeHandler]:
    """A node handler that records every message; `Hold` blocks until `rec.latch`."""

    class Gate(NodeHandler):
        @handler
        def hold(self, ctx: NodeContext, msg: Hold) -> str:
            rec.note("hold")
            rec.entered.set()
            assert rec.latch.wait(WAIT + 5)
            return "held"

        @handler
        def note(self, ctx: NodeContext, msg: Note) -> None:
            rec.note(msg.n)

        @handler
        def work(self, ctx: NodeContext, msg: Work) -> int:
            rec.note(f"work{msg.n}")
            return msg.n

        @handler
        def probe(self, ctx: NodeContext, msg: Probe) -> list[object]:
            return rec.snapshot()

    return Gate


def probe(host: Host, routing_id: str) -> list[object]:
    """What the recording gate of `routing_id` has seen, asked once its queue has room: a
    request to a full queue fails at once (`UnavailableError`, it never waits), and the
    one-ways ahead of it may still be filling a small lane. A bounded retry, asserted."""
    end = time.monotonic() + WAIT
    while True:
        try:
            seen: list[object] = host.request_to_node(
                MESH, routing_id, Probe(), reply=list
            ).submit_sync()
        except UnavailableError:
            assert time.monotonic() < end, "the queue had no room within WAIT"
            time.sleep(0.01)
            continue
        return seen


def held_gate(harness: HostHarness, nodes: Nodes) -> tuple[Recorder, Host, Host]:
    """(recorder, A, B): B's recording gate is inside a `Hold` from A (until
    `recorder.latch` is set), so what A sends B next waits in B's queue."""
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    a.send_to_node(MESH, b.node.routing_id, Hold()).submit_sync()
    assert rec.entered.wait(WAIT)
    return rec, a, b
