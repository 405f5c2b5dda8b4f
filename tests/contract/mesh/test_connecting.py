"""A node known from its descriptor but not connected is CONNECTING: listed by `peers()`,
and a call to it is `UnavailableError` (known, not READY), not `NotFoundError`."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.location import NodeDescriptor, publish_node, withdraw_node
from zlink_actors.testing import WAIT, HostHarness


class Ping(msgspec.Struct):
    n: int


@pytest.fixture
def harness() -> Iterator[HostHarness]:
    with HostHarness() as h:
        yield h


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens there once closed


def test_a_node_known_only_from_its_descriptor_is_connecting(harness: HostHarness) -> None:
    store = z.MemoryLocationStore()
    try:
        mesh = z.MeshConfig("c", liveness_interval=0.2, liveness_timeout=1.0)
        host = harness.host(mesh=mesh, location=store, message_types=[Ping])
        ghost = NodeDescriptor("c", "zz-ghost", (f"tcp://127.0.0.1:{_closed_port()}",), 1)
        asyncio.run(publish_node(store, ghost, 30.0))

        end = time.monotonic() + WAIT
        while {p.routing_id: p.state for p in host.peers()}.get("zz-ghost") is not (
            z.PeerState.CONNECTING
        ):
            assert time.monotonic() < end, "the descriptor was not seen within WAIT"
            time.sleep(0.02)
        with pytest.raises(z.UnavailableError, match="connecting") as caught:
            host.request_to_node("c", "zz-ghost", Ping(1)).submit_sync()
        assert caught.value.reason is z.UnavailableReason.CONNECTING
        with pytest.raises(z.NotFoundError):
            host.request_to_node("c", "zz-nobody", Ping(1)).submit_sync()
        assert host.wait_for_peers(0, timeout=WAIT) == []  # CONNECTING is not READY

        asyncio.run(withdraw_node(store, "c", "zz-ghost"))  # the descriptor goes: forgotten
        while any(p.routing_id == "zz-ghost" for p in host.peers()):
            assert time.monotonic() < end + WAIT, "the entry outlived its descriptor"
            time.sleep(0.02)
        with pytest.raises(z.NotFoundError):
            host.request_to_node("c", "zz-ghost", Ping(1)).submit_sync()
    finally:
        harness.close()
        store.close()
