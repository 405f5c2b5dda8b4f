"""The RouteMesh tier (design/mesh.md; docs/mesh.md): several Hosts, in one process or
many, as one mesh of nodes.

It imports `location`, `_calls`, `_engine`, `_core` and `transports`; nothing below the
Host imports it.
"""

from .config import (
    ChannelServer,
    CurveConfig,
    Endpoint,
    MeshConfig,
    NodeInfo,
    PeerInfo,
    PeerState,
    StateChange,
    StateChangeKind,
    advertised,
    completion_endpoint,
    parse_endpoint,
)
from .node import MeshNode, MeshStatistics

__all__ = [
    "ChannelServer",
    "CurveConfig",
    "Endpoint",
    "MeshConfig",
    "MeshNode",
    "MeshStatistics",
    "NodeInfo",
    "PeerInfo",
    "PeerState",
    "StateChange",
    "StateChangeKind",
    "advertised",
    "completion_endpoint",
    "parse_endpoint",
]
