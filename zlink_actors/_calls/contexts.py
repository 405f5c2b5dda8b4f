"""The call surface shared by `Host` and the handler contexts (design/architecture.md §6).

From an application thread calls hang off `Host`; inside a handler off its context
(`SpotContext`, `ActorContext`, `ChannelContext`, `NodeContext`). The names and behaviour
are the same in both places: the runtime reads the turn from a context variable, so what matters is
where a call is made, not which object it was built from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar, overload

from .._core.cancellation import CancellationToken
from .._core.clock import Deadline
from .._core.errors import InvalidOperationError
from .._core.pending import turn_cancellation, turn_deadline
from .._core.validation import check_id
from .._engine.kernel import Runtime
from .._engine.objects import ActorRef, ObjectKind
from .._engine.remote import RemoteMetadata, node_key
from .._engine.services import ServiceKey
from .._engine.spot_timers import TimerSet, timers_for
from .._engine.turn import TurnContext
from .create import ActorManager, SpotManager
from .membership import JoinCall, LeaveCall, join_call, leave_call
from .messaging import RequestCall, SendCall
from .publish import PublishCall
from .workers import CpuWorkerCall, IoWorkerCall

__all__ = [
    "ACTOR_MANAGER",
    "HTTP_CLIENTS",
    "MESH_NODE",
    "SPOT_MANAGER",
    "ActorContext",
    "CallSurface",
    "ChannelContext",
    "HttpClientRegistry",
    "MeshAccess",
    "NodeContext",
    "SpotContext",
]

#: The Host's managers, provided by `_host.py` (one each: `SpotManager` caches type checks).
SPOT_MANAGER: ServiceKey[SpotManager] = ServiceKey("spots")
ACTOR_MANAGER: ServiceKey[ActorManager] = ServiceKey("actors")


class HttpClientRegistry(Protocol):
    """The Host's named HTTP clients as the contexts see them (`http/hosted.py`
    implements it): the call surface reaches them without importing the HTTP tier."""

    def client(self, name: str) -> Any:
        """The client named `name`; `NotConfiguredError` for an unknown name."""
        ...


#: The named HTTP clients, provided by `_host.py` (`Host(http_clients=...)`).
HTTP_CLIENTS: ServiceKey[HttpClientRegistry] = ServiceKey("http_clients")


class MeshAccess(Protocol):
    """The Host's RouteMesh node as the contexts see it (`mesh/node.py` implements it)."""

    @property
    def info(self) -> Any:
        """The `NodeInfo` of this node once it is started, else None."""
        ...


#: The RouteMesh node, provided by `_host.py` when `Host(mesh=...)` is given.
MESH_NODE: ServiceKey[MeshAccess] = ServiceKey("mesh")

T = TypeVar("T")
_EMPTY: Mapping[str, Any] = MappingProxyType({})
#: The kinds, read by every builder: an Enum member read from its class costs about
#: 0.1 us more than a module constant on Python 3.11 (the Enum metaclass's lookup).
_SPOT: Final = ObjectKind.SPOT
_ACTOR: Final = ObjectKind.ACTOR
_CHANNEL: Final = ObjectKind.CHANNEL
_NODE: Final = ObjectKind.NODE


def _check_channel(name: object) -> str:
    # A ChannelName follows the id rule: 1-255 bytes of strict UTF-8.
    return check_id("channel", name)


#: The targets of node calls already checked, by (mesh, routing id): a program calls
#: the same few nodes again and again, and their two checks and the key are three
#: frames a call. Bounded; plain `str` arguments only (what `check_id` passes as is).
_NODE_TARGETS: dict[tuple[str, str], str] = {}
_NODE_TARGETS_MAX: Final = 1024


def _node_target(mesh: object, routing_id: object) -> str:
    """The target of a node call (`node_key`) of checked ids (`check_id`'s errors)."""
    if type(mesh) is str and type(routing_id) is str:
        key = (mesh, routing_id)
        known = _NODE_TARGETS.get(key)
        if known is None:
            known = node_key(check_id("mesh", mesh), check_id("routing_id", routing_id))
            if len(_NODE_TARGETS) < _NODE_TARGETS_MAX:
                _NODE_TARGETS[key] = known
        return known
    return node_key(check_id("mesh", mesh), check_id("routing_id", routing_id))


class CallSurface:
    """Builders for every call; mixed into `Host` and the handler contexts."""

    __slots__ = ()
    _runtime: Runtime

    def send_to_spot(self, spot_id: str, payload: object) -> SendCall:
        """A one-way send to a Spot; finish it with `submit()` or `submit_sync()`."""
        return SendCall(self._runtime, _SPOT, check_id("spot_id", spot_id), payload)

    @overload
    def request_to_spot(self, spot_id: str, payload: object) -> RequestCall[Any]: ...
    @overload
    def request_to_spot(self, spot_id: str, payload: object, reply: type[T]) -> RequestCall[T]: ...
    @overload
    def request_to_spot(self, spot_id: str, payload: object, reply: object) -> RequestCall[Any]: ...
    def request_to_spot(
        self, spot_id: str, payload: object, reply: object = None
    ) -> RequestCall[Any]:
        """A request to a Spot; when `reply` is given the reply must conform to it.

        `reply` is a class (the reply must be an instance) or any type msgspec can
        validate (`int | None`, `list[int]`, ...: the reply must already conform, and is
        delivered as is); a mismatch completes the call with `ProtocolError`.

        Raises:
            TypeError: `spot_id` is not a str, or `reply` is not a type msgspec can handle.
            ValueError: `spot_id` is not 1-255 bytes of strict UTF-8.
        """
        return RequestCall(self._runtime, _SPOT, check_id("spot_id", spot_id), payload, reply)

    def send_to_actor(self, actor_id: str, payload: object) -> SendCall:
        """A one-way send to an Actor (always into the Actor's own queue)."""
        return SendCall(self._runtime, _ACTOR, check_id("actor_id", actor_id), payload)

    @overload
    def request_to_actor(self, actor_id: str, payload: object) -> RequestCall[Any]: ...
    @overload
    def request_to_actor(
        self, actor_id: str, payload: object, reply: type[T]
    ) -> RequestCall[T]: ...
    @overload
    def request_to_actor(
        self, actor_id: str, payload: object, reply: object
    ) -> RequestCall[Any]: ...
    def request_to_actor(
        self, actor_id: str, payload: object, reply: object = None
    ) -> RequestCall[Any]:
        """A request to an Actor; `reply` as for `request_to_spot`."""
        return RequestCall(self._runtime, _ACTOR, check_id("actor_id", actor_id), payload, reply)

    def send_to_channel(self, channel: str, payload: object) -> SendCall:
        """A one-way send to the handler registered under `channel`."""
        return SendCall(self._runtime, _CHANNEL, _check_channel(channel), payload)

    @overload
    def request_to_channel(self, channel: str, payload: object) -> RequestCall[Any]: ...
    @overload
    def request_to_channel(
        self, channel: str, payload: object, reply: type[T]
    ) -> RequestCall[T]: ...
    @overload
    def request_to_channel(
        self, channel: str, payload: object, reply: object
    ) -> RequestCall[Any]: ...
    def request_to_channel(
        self, channel: str, payload: object, reply: object = None
    ) -> RequestCall[Any]:
        """A request to the handler registered under `channel`; `reply` as for
        `request_to_spot`."""
        return RequestCall(self._runtime, _CHANNEL, _check_channel(channel), payload, reply)

    def send_to_node(self, mesh: str, routing_id: str, payload: object) -> SendCall:
        """A one-way send to the node handler of node `routing_id` of mesh `mesh`
        (docs/mesh.md): delivered here for this node's own routing id.

        Raises:
            TypeError / ValueError: `mesh` or `routing_id` is not 1-255 UTF-8 bytes.
        """
        return SendCall(self._runtime, _NODE, _node_target(mesh, routing_id), payload)

    @overload
    def request_to_node(self, mesh: str, routing_id: str, payload: object) -> RequestCall[Any]: ...
    @overload
    def request_to_node(
        self, mesh: str, routing_id: str, payload: object, reply: type[T]
    ) -> RequestCall[T]: ...
    @overload
    def request_to_node(
        self, mesh: str, routing_id: str, payload: object, reply: object
    ) -> RequestCall[Any]: ...
    def request_to_node(
        self, mesh: str, routing_id: str, payload: object, reply: object = None
    ) -> RequestCall[Any]:
        """A request to the node handler of node `routing_id` of mesh `mesh`; `reply` as
        for `request_to_spot`."""
        target = _node_target(mesh, routing_id)
        return RequestCall(self._runtime, _NODE, target, payload, reply)

    def publish(self, channel: str, topic: str, payload: object) -> PublishCall:
        """Logical Multicast to every Spot subscribed to (`channel`, `topic`)."""
        return PublishCall(self._runtime, channel, topic, payload)

    def run_cpu_worker(self, fn: Callable[..., T], *args: object) -> CpuWorkerCall[T]:
        """A call that runs `fn(*args)` on the CPU pool (a slot is held only while it runs).

        Raises:
            TypeError: `fn` is not callable, or is async (use `run_io_worker`).
        """
        return CpuWorkerCall(self._runtime, fn, args)

    def run_io_worker(
        self, async_fn: Callable[[CancellationToken], Awaitable[T]]
    ) -> IoWorkerCall[T]:
        """A call that runs `await async_fn(token)` on the I/O executor's event loop.

        Raises:
            TypeError: `async_fn` is not a coroutine function, a `functools.partial` of
                one, or an object with an `async def __call__` (use `run_cpu_worker`).
        """
        return IoWorkerCall(self._runtime, async_fn)

    def http(self, name: str) -> Any:
        """The HTTP client configured as `name` in `Host(http_clients=...)`
        (docs/http.md): `ctx.http("weather").get("/forecast").submit()`.

        Raises:
            NotConfiguredError: no client of that name is configured.
        """
        return self._runtime.services.get(HTTP_CLIENTS).client(name)

    @property
    def spots(self) -> SpotManager:
        """Create, get-or-create and close Spots."""
        return self._runtime.services.get(SPOT_MANAGER)

    @property
    def actors(self) -> ActorManager:
        """Create, get-or-create and close Actors."""
        return self._runtime.services.get(ACTOR_MANAGER)


class _HandlerContext(TurnContext, CallSurface):
    __slots__ = ()

    @property
    def node(self) -> Any:
        """The `NodeInfo` of the Host running this handler; None without a mesh."""
        services = self._runtime.services
        return services.get(MESH_NODE).info if MESH_NODE in services else None

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The metadata the message was sent with (read-only; empty if none)."""
        meta = self._metadata
        return _EMPTY if meta is None else MappingProxyType(meta)

    @property
    def deadline(self) -> Deadline:
        """The deadline of the call this turn handles: a request's (its `timeout()`, else
        the Host default, fixed when it was submitted); for a one-way message and for
        lifecycle, timer and callback turns, a deadline that never passes. Work the caller
        can no longer use is wasted once it passed: check `deadline.remaining()`."""
        return turn_deadline(self._rec, self._runtime.clock)

    @property
    def cancellation(self) -> CancellationToken:
        """A token cancelled once the request this turn handles ended without this
        handler's reply: its caller cancelled it, its deadline passed, or shutdown ended
        it. Never cancelled for one-way messages and other turns. Pass it on as
        `cancel=` to the calls the handler makes on the request's behalf."""
        return turn_cancellation(self._rec)

    @property
    def timers(self) -> TimerSet:
        """This object's timers: ticks run as records under its gate."""
        return timers_for(self._runtime, self._act)

    def join_spot(self, spot_id: str) -> JoinCall:
        """Move this Actor into Spot `spot_id` after this handler; finish with `defer()`.

        Raises:
            InvalidOperationError: not an Actor's handler (only Actors join Spots).
        """
        return join_call(self, spot_id)

    def leave_spot(self) -> LeaveCall:
        """Return this Actor to the Entry Spot after this handler; finish with `defer()`.

        Raises:
            InvalidOperationError: not an Actor's handler.
        """
        return leave_call(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._act.id!r}>"


class SpotContext(_HandlerContext):
    """The context of a Spot's handler turn. Created by the runtime."""

    __slots__ = ()

    @property
    def spot_id(self) -> str:
        """This Spot's id."""
        return self._act.id

    @property
    def members(self) -> tuple[ActorRef, ...]:
        """This Spot's member Actors, in join order: a snapshot taken now.

        An Actor is a member from the approval of its Join (so not yet in `on_actor_join`)
        until it leaves, joins another Spot or closes. An Instance Spot has none.

        Raises:
            InvalidOperationError: the Entry Spot, which keeps no member list.
        """
        act = self._act
        refs = act.member_refs
        if refs is None:
            engine = self._runtime.engine
            if act is engine.entry:
                raise InvalidOperationError("the Entry Spot keeps no member list")
            refs = engine.member_refs(act)
        return refs


class ActorContext(_HandlerContext):
    """The context of an Actor's handler turn. Created by the runtime."""

    __slots__ = ()

    @property
    def actor_id(self) -> str:
        """This Actor's id."""
        return self._act.id

    @property
    def spot_id(self) -> str:
        """The id of the Spot this Actor belongs to (the Entry Spot by default)."""
        return self._act.spot.id

    @property
    def spot(self) -> Any:
        """The SpotWide Spot this Actor is a member of (its instance: share its state).

        Raises:
            InvalidOperationError: the Actor is not a member of a SpotWide Spot, so its
                turns do not hold that Spot's gate.
        """
        spot = self._act.spot
        if spot is self._runtime.engine.entry or not self._gate.spotwide:
            raise InvalidOperationError(
                "ctx.spot is only reachable from a member of a SpotWide Spot (its turns "
                "share the Spot's gate); send the Spot a message instead"
            )
        return spot.instance


class ChannelContext(_HandlerContext):
    """The context of a channel handler's turn. Created by the runtime."""

    __slots__ = ()

    @property
    def channel(self) -> str:
        """The ChannelName this handler is registered under."""
        return self._act.id

    @property
    def sender(self) -> str | None:
        """The routing id of the node the message came from; None for a local call."""
        return _sender(self._metadata)


def _sender(metadata: dict[str, object] | None) -> str | None:
    return metadata.sender if type(metadata) is RemoteMetadata else None


class NodeContext(_HandlerContext):
    """The context of a node handler's turn (`Host(node_handler=...)`). Created by the
    runtime."""

    __slots__ = ()

    @property
    def sender(self) -> str | None:
        """The routing id of the node the message came from; None for a local call."""
        return _sender(self._metadata)
