"""The remote SPI: how a call reaches a target that is not in this process.

The engine and the call builders know only this protocol; the RouteMesh tier implements
it and `_host.py` plugs it in. A Host without a mesh gets `LOCAL_ONLY`: no target is
remote, so a call to an id this Host does not hold ends with `NotFoundError`, as it
always has. The protocol stays this small until the RouteMesh issue shapes it.
"""

from __future__ import annotations

from typing import Final, Protocol

from .objects import ObjectKind

__all__ = ["LOCAL_ONLY", "LocalOnly", "RemoteRoutes"]


class RemoteRoutes(Protocol):
    """Where calls to targets this Host does not hold go."""

    def holds(self, kind: ObjectKind, target: str) -> bool:
        """True if `target` may live on another node (the call is then routed there)."""
        ...


class LocalOnly:
    """The routes of a Host without a mesh: nothing is remote."""

    __slots__ = ()

    def holds(self, kind: ObjectKind, target: str) -> bool:
        return False


LOCAL_ONLY: Final = LocalOnly()
