"""The layout of the framework's own keys in a Location Store (documented in
docs/location.md; a provider sees them as opaque UTF-8 keys).

Each variable part is written as `<byte length>:<percent-encoded text>`, so no id can
forge another's key or reach under another's prefix.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["authority_key", "generation_key", "lease_counter_key", "lease_key", "node_key",
           "node_prefix", "part"]  # fmt: skip


def part(text: str) -> str:
    """One variable part of a key: its UTF-8 length, a colon, its percent-encoding."""
    return f"{len(text.encode('utf-8'))}:{quote(text, safe='')}"


def authority_key(kind: str, object_id: str) -> str:
    """The authority record of one Spot or Actor."""
    return f"zla1:a:{kind}:{part(object_id)}"


def generation_key(kind: str, object_id: str) -> str:
    """The last object generation issued for one id (kept after a delete)."""
    return f"zla1:g:{kind}:{part(object_id)}"


def lease_key(owner: str) -> str:
    """The live lease of one owner (a node's routing id), under the lease TTL."""
    return f"zla1:l:{part(owner)}"


def lease_counter_key(owner: str) -> str:
    """The last lease generation issued to one owner id."""
    return f"zla1:lg:{part(owner)}"


def node_prefix(mesh: str) -> str:
    """The scan prefix of every node descriptor of one mesh."""
    return f"zla1:n:{part(mesh)}:"


def node_key(mesh: str, routing_id: str) -> str:
    """The descriptor of one node of one mesh."""
    return node_prefix(mesh) + part(routing_id)
