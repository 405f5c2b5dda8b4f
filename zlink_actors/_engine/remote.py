"""The remote SPI: how a call reaches a target that is not in this process.

The call builders know only this protocol; the RouteMesh tier implements it and
`_host.py` plugs it in. When a send or request finds no local target, the builder asks
`holds(kind, target)`; if the routes claim the target, the call is handed to `send` or
`request` after the same admission and cancellation checks as a local call. A Host
without a mesh gets `LOCAL_ONLY`: no target is remote, so a call to an id this Host does
not hold ends with `NotFoundError`, as it always has. The protocol stays this small until
the RouteMesh issue shapes it.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from .._core.cancellation import CancellationToken
from .._core.completion import Completion
from .objects import ObjectKind

__all__ = ["LOCAL_ONLY", "LocalOnly", "RemoteRoutes"]


class RemoteRoutes(Protocol):
    """Where calls to targets this Host does not hold go."""

    def holds(self, kind: ObjectKind, target: str) -> bool:
        """True if `target` is reached through these routes (it is not local)."""
        ...

    def send(
        self, kind: ObjectKind, target: str, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        """A one-way send to a target `holds` claimed; completes as a local send does."""
        ...

    def request(
        self,
        kind: ObjectKind,
        target: str,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A request to a target `holds` claimed, with its whole deadline `timeout`."""
        ...


class LocalOnly:
    """The routes of a Host without a mesh: nothing is remote."""

    __slots__ = ()

    def holds(self, kind: ObjectKind, target: str) -> bool:
        return False

    def send(
        self, kind: ObjectKind, target: str, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        raise AssertionError("a local-only Host holds no remote target")

    def request(
        self,
        kind: ObjectKind,
        target: str,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        raise AssertionError("a local-only Host holds no remote target")


LOCAL_ONLY: Final = LocalOnly()
