"""A real `transports.Transport` pair for the unit tests of the mesh parts: ours ("A",
the part's) and a peer's ("B"), in this process over tcp loopback, each recording what
its callbacks hand over; and a node context (`NodeShared`) on a real Host's runtime."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import transports as t
from zlink_actors import MeshConfig
from zlink_actors.location.spi import LocationStore
from zlink_actors.mesh.codec import Codec, TypeRegistry
from zlink_actors.mesh.shared import Link, NodeShared
from zlink_actors.testing import WAIT, HostHarness

__all__ = ["FAST", "Side", "linked", "node_shared", "pair"]

FAST = t.TransportConfig(heartbeat_interval=0.1, heartbeat_timeout=5.0)


class Side:
    """One transport's records and events, as its callbacks hand them over."""

    def __init__(self) -> None:
        self.records: list[t.Inbound] = []
        self.events: list[t.PeerEvent] = []
        self.changed = threading.Condition()

    def on_receive(self, batch: Sequence[t.Inbound]) -> None:
        with self.changed:
            self.records.extend(batch)
            self.changed.notify_all()

    def on_event(self, event: t.PeerEvent) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def first(self, match: Callable[[t.Inbound], bool]) -> t.Inbound:
        """The first record `match` accepts, waited for (bounded, asserted)."""
        with self.changed:
            assert self.changed.wait_for(lambda: any(match(r) for r in self.records), WAIT)
            return next(r for r in self.records if match(r))


@contextmanager
def pair(
    a_config: t.TransportConfig = FAST,
) -> Iterator[tuple[t.Transport, Side, t.Transport, Side]]:
    """A (ours) connected to B, READY on both sides; both closed at the end."""
    ours, theirs = Side(), Side()
    a = t.Transport(b"A", ours.on_receive, on_event=ours.on_event, config=a_config)
    try:
        b = t.Transport(b"B", theirs.on_receive, on_event=theirs.on_event, config=FAST)
        try:
            ends = a.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
            b.connect(b"A", ends)
            for side, peer in ((ours, b"B"), (theirs, b"A")):
                with side.changed:
                    assert side.changed.wait_for(
                        lambda side=side, peer=peer: any(
                            e.peer == peer and e.kind is t.PeerEventKind.READY for e in side.events
                        ),
                        WAIT,
                    )
            yield a, ours, b, theirs
        finally:
            b.close()
    finally:
        a.close()


def node_shared(
    harness: HostHarness,
    *,
    config: MeshConfig | None = None,
    location: LocationStore | None = None,
    **channels: int,
) -> NodeShared:
    """A node context on a real Host's runtime (the Host's own node is not used), node
    "a" of mesh "m" unless `config` says otherwise."""
    runtime = harness.host()._runtime
    return NodeShared(
        runtime,
        config if config is not None else MeshConfig("m"),
        "a",
        Codec(TypeRegistry(), 1 << 20),
        channels=dict(channels),
        node_handler=False,
        object_types=(),
        location=location,
    )


@contextmanager
def linked(
    harness: HostHarness, config: t.TransportConfig = FAST
) -> Iterator[tuple[Link, t.Transport, Side, Side]]:
    """A `Link` on transport A of a new pair: (the link, B, A's records, B's)."""
    shared = node_shared(harness)
    link = Link(shared)
    with pair(config) as (a, ours, b, theirs):
        shared.attach(a)
        yield link, b, ours, theirs
