"""The remote SPI: how a call reaches a target that is not in this process.

The call builders know only this protocol; the RouteMesh tier implements it and
`_host.py` plugs it in. A send or request asks `route(kind, target)`:

- for the kinds in `first` (a mesh's channels and nodes: select-one picks among every
  server, this node's included) before it looks at the local table;
- for the other kinds only when no local target exists.

`route` answers None (the local answer stands: the local target, or `NotFoundError`),
a failed `Completion` (the call ends with it), or an opaque route that the call hands to
`send` or `request` after the same admission and cancellation checks as a local call. A
Host without a mesh gets `LOCAL_ONLY`: nothing is remote.

A record that came from another node carries `RemoteMetadata`: the caller's routing id
(`ctx.sender`) and a hook the runner calls once when its handler starts, or when it is
dropped unrun (the mesh's inbound permits are released there); a one-way's second hook
runs when it is dropped unrun (its sender, which saw it complete, is told there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

from .._core.cancellation import CancellationToken
from .._core.completion import Completion, failed
from .._core.errors import NotFoundError
from .objects import ObjectKind
from .registry import Activation, TypeInfo

__all__ = [
    "GlobalObjects",
    "LOCAL_ONLY",
    "LocalChannels",
    "LocalOnly",
    "RemoteMetadata",
    "RemoteRoutes",
    "dropped",
    "node_key",
    "started",
]


def node_key(mesh: str, routing_id: str) -> str:
    """The target string of a node call: the node's mesh name and routing id."""
    return f"{mesh}\x00{routing_id}"


class RemoteRoutes(Protocol):
    """Where calls to targets this Host does not hold go."""

    #: Kinds routed before the local table is looked at.
    first: frozenset[ObjectKind]

    def route(self, kind: ObjectKind, target: str) -> object:
        """None (local), a failed `Completion`, or a route for `send` / `request`."""
        ...

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        """A one-way send along `route`; completes as a local send does."""
        ...

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A request along `route`, with its whole deadline `timeout`."""
        ...

    def request_sync(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
    ) -> Any:
        """`request(route, ..., timeout, None).result()`, for an application thread that
        blocks for the result (`submit_sync()` with no token): the value, or the error
        raised."""
        ...


class GlobalObjects(Protocol):
    """Spots and Actors that are global across a mesh (a Host with `location=`): the
    calls the engine hands over instead of deciding them in this process alone.

    The mesh tier implements it (`mesh/objects.py`); a Host without `location=` has none.
    Sends and requests to objects held elsewhere go through `RemoteRoutes`."""

    def create(
        self,
        kind: ObjectKind,
        obj_id: str,
        type_name: str,
        info: TypeInfo | None,
        exclusive: bool,
        fresh: bool,
        request: object,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A create (`exclusive`) or get-or-create of `obj_id` somewhere in the mesh;
        `info` is this Host's registration of the type (None: it has none); `fresh`: the
        id was made unique for this call (`spots.create`)."""
        ...

    def close_object(
        self, kind: ObjectKind, obj_id: str, timeout: float, cancel: CancellationToken | None
    ) -> Completion[bool]:
        """Close `obj_id` wherever it lives; completes once its record is deleted."""
        ...

    def activate(
        self,
        spot_id: str,
        type_name: str | None,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float | None,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A message with instance intent to a Spot this Host does not hold (`timeout`
        None: a one-way send)."""
        ...

    def publish(
        self, channel: str, topic: str, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        """The remote part of a publish that committed here: one routed message per
        eligible remote node; completes once each was admitted by the transport."""
        ...

    def owner_of(self, kind: ObjectKind, obj_id: str) -> Completion[str | None]:
        """The routing id of the node whose Ready record holds `obj_id` (None: none)."""
        ...

    def removed(self, act: Activation) -> None:
        """`act` left this Host (closed, deactivated, or shut down): its record goes."""
        ...


class LocalOnly:
    """The routes of a Host without a mesh: nothing is remote."""

    __slots__ = ()

    first: frozenset[ObjectKind] = frozenset({ObjectKind.NODE})

    def route(self, kind: ObjectKind, target: str) -> object:
        if kind is ObjectKind.NODE:
            mesh, _, rid = target.partition("\x00")
            return failed(NotFoundError(f"no node {rid!r} in mesh {mesh!r}: this Host has no mesh"))
        return None

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        raise AssertionError("a local-only Host has no remote route")

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        raise AssertionError("a local-only Host has no remote route")

    def request_sync(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
    ) -> Any:
        raise AssertionError("a local-only Host has no remote route")


LOCAL_ONLY: Final = LocalOnly()


class LocalChannels(LocalOnly):
    """The routes of a Host without a mesh that has weight-0 channel servers: select-one
    among its own servers excludes them, as it would in a mesh."""

    __slots__ = ("_closed",)

    first: frozenset[ObjectKind] = frozenset({ObjectKind.NODE, ObjectKind.CHANNEL})

    def __init__(self, excluded: frozenset[str]) -> None:
        self._closed = excluded

    def route(self, kind: ObjectKind, target: str) -> object:
        if kind is ObjectKind.CHANNEL and target in self._closed:
            return failed(
                NotFoundError(f"channel {target!r} has weight 0: no server takes new calls")
            )
        return super().route(kind, target)


class RemoteMetadata(dict[str, object]):
    """The metadata of a record received from another node (see the module docstring)."""

    __slots__ = ("_on_drop", "_on_start", "sender")

    def __init__(
        self,
        items: dict[str, object],
        sender: str,
        on_start: Callable[[], None] | None,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        dict.__init__(self, items)  # not `super()`: one object less on every record
        self.sender = sender
        self._on_start = on_start
        self._on_drop = on_drop

    def started(self) -> None:
        """The record's handler starts, or the record ends unrun; runs the hook once."""
        fn, self._on_start = self._on_start, None
        if fn is not None:
            fn()

    def dropped(self) -> None:
        """The record ends unrun (its object closed first, or the Host stopped): runs
        `started`'s hook, then, once, the drop hook (a one-way's: its sender is told)."""
        self.started()
        fn, self._on_drop = self._on_drop, None
        if fn is not None:
            fn()


def started(metadata: dict[str, object] | None) -> None:
    """Tell a remote record's hook that its handler starts (a no-op for local records)."""
    if type(metadata) is RemoteMetadata:
        metadata.started()


def dropped(metadata: dict[str, object] | None) -> None:
    """Tell a remote record's hooks that it ends unrun (a no-op for local records)."""
    if type(metadata) is RemoteMetadata:
        metadata.dropped()
