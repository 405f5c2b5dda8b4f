"""Node descriptors: what a node publishes about itself for discovery, under its lease
TTL, and how peers find them by scan (docs/location.md "Node descriptors")."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgspec

from .._core.errors import ProtocolError
from .keys import node_key, node_prefix
from .spi import Committed, Delete, Found, LocationStore, Put, check_key

__all__ = ["NodeDescriptor", "NodeDescriptorState", "list_nodes", "publish_node", "withdraw_node"]


class NodeDescriptorState(enum.Enum):
    """What a descriptor says about its node."""

    READY = "ready"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class NodeDescriptor:
    """One node of a mesh: routing id, advertised endpoints, channels (name -> weight),
    state and the lease generation of the run that published it."""

    mesh: str
    routing_id: str
    endpoints: tuple[str, ...]
    lease_generation: int
    state: NodeDescriptorState = NodeDescriptorState.READY
    channels: dict[str, int] = field(default_factory=dict)


class _Stored(msgspec.Struct, array_like=True, frozen=True):
    mesh: str
    routing_id: str
    endpoints: list[str]
    lease_generation: int
    state: str
    channels: dict[str, int]


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(_Stored).decode


async def publish_node(store: LocationStore, node: NodeDescriptor, ttl: float) -> Committed:
    """Write (or refresh) `node`'s descriptor, expiring `ttl` seconds after the commit
    on the store's clock (the owner lease TTL). Unconditional: only the node itself
    writes its key."""
    key = node_key(node.mesh, node.routing_id)
    check_key(key, "descriptor key")
    value = _Stored(
        node.mesh,
        node.routing_id,
        list(node.endpoints),
        node.lease_generation,
        node.state.value,
        dict(node.channels),
    )
    done = await store.write([], [Put(key, _encode(value), ttl)])
    assert isinstance(done, Committed)  # no condition: it cannot conflict
    return done


async def withdraw_node(store: LocationStore, mesh: str, routing_id: str) -> None:
    """Remove a node's descriptor (a clean stop; an expired one is gone already)."""
    await store.write([], [Delete(node_key(mesh, routing_id))])


def _parse(found: Found) -> NodeDescriptor:
    try:
        stored = _decode(found.value)
        state = NodeDescriptorState(stored.state)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ProtocolError(f"an undecodable node descriptor: {exc}") from None
    return NodeDescriptor(
        stored.mesh,
        stored.routing_id,
        tuple(stored.endpoints),
        stored.lease_generation,
        state,
        dict(stored.channels),
    )


async def list_nodes(store: LocationStore, mesh: str) -> list[NodeDescriptor]:
    """Every live descriptor of `mesh`, by a full scan (restart it on
    `ScanExpiredError`)."""
    prefix = node_prefix(mesh)
    nodes: list[NodeDescriptor] = []
    cursor: str | None = None
    while True:
        page = await store.scan(prefix, cursor=cursor)
        nodes.extend(_parse(found) for _, found in page.items)
        if page.cursor is None:
            return nodes
        cursor = page.cursor
