"""User classes (`Spot`, `Actor`, `ChannelHandler`), refs and creation results.

Instances are created by the framework, only when an object is activated, with a
no-argument constructor; a subclass may define `__init__(self)` and call
`super().__init__()`. Handlers are methods marked with `@handler`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from .._core.validation import check_id

__all__ = [
    "Actor",
    "ActorRef",
    "ChannelHandler",
    "CloseReason",
    "Created",
    "Existing",
    "InstanceSpot",
    "JoinResult",
    "NodeHandler",
    "ObjectKind",
    "Rejected",
    "Spot",
    "SpotConfig",
    "SpotMode",
    "SpotRef",
    "check_id",
    "configure_spot",
    "spot_type_name",
    "_Lifecycle",
]

R = TypeVar("R")


class ObjectKind(enum.StrEnum):
    """What a live object is: the one spelling of the three kinds, inside the runtime and
    in messages ("no Spot 'lobby'"). A `StrEnum`, so it hashes and compares at C speed
    as a dict key."""

    SPOT = "Spot"
    ACTOR = "Actor"
    CHANNEL = "channel"
    NODE = "node"


class SpotMode(enum.Enum):
    """How a User Spot gates its work; fixed at registration."""

    #: One gate for the Spot's handlers, every member Actor and every timer: no two of
    #: them ever overlap, and `yield_()` is allowed.
    SPOT_WIDE = "spot_wide"
    #: A gate per Actor, per timer and for the Spot's own work: they overlap; no `yield_()`.
    PER_ACTOR = "per_actor"


class CloseReason(enum.Enum):
    """Why `on_closing` runs."""

    EXPLICIT_CLOSE = "explicit_close"
    HOST_SHUTDOWN = "host_shutdown"
    IDLE_EVICTED = "idle_evicted"
    #: A global Spot or Actor whose id another node claimed while this node's owner
    #: lease was lost (docs/mesh.md "Owner leases"): it never serves here again.
    OWNERSHIP_LOST = "ownership_lost"


class SpotConfig:
    """What `Spot.configure(cfg)` declares. Created by the runtime."""

    __slots__ = ("subscriptions",)

    def __init__(self) -> None:
        self.subscriptions: list[tuple[str, str]] = []

    def subscribe(self, channel: str, topic: str) -> None:
        """Receive Logical Multicast publishes to (`channel`, `topic`)."""
        for name, value in (("channel", channel), ("topic", topic)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if not value:
                raise ValueError(f"{name} must not be empty")
        if (channel, topic) not in self.subscriptions:
            self.subscriptions.append((channel, topic))


def spot_type_name(cls: type) -> str:
    """The name a Spot or Actor class is registered and known under across a mesh: its
    class attribute `type_name` when set, else its `__qualname__`."""
    name = getattr(cls, "type_name", None)
    return name if isinstance(name, str) and name else cls.__qualname__


def configure_spot(instance: Spot) -> list[tuple[str, str]] | tuple[()]:
    """Run `instance.configure(cfg)`; return the subscriptions it declared.

    A Spot that does not override `configure` declares none: no `SpotConfig` is made for
    it (the base method does nothing).
    """
    configure = instance.configure
    if getattr(configure, "__func__", None) is Spot.configure:
        return ()
    config = SpotConfig()
    configure(config)
    return config.subscriptions or ()


class _Lifecycle:
    """Hooks every object may override; each may be a plain or an `async def` method."""

    type_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        pass

    def on_create(self, ctx: Any, request: Any) -> object:
        """Runs once, when a create / get-or-create call creates this object, before it is
        Ready. Its return value is the `reply` of `Created`; return `Rejected(reply)` to
        decline (the id stays free). `request` is what the call passed to `.request()`."""
        return None

    def on_initialize(self, ctx: Any) -> object:
        """Runs when the object is activated, after `on_create`, before it is Ready."""
        return None

    def on_closing(self, ctx: Any, reason: CloseReason) -> object:
        """Runs under the object's gate before it closes (explicitly or at shutdown)."""
        return None


class Spot(_Lifecycle):
    """Base class for Spots: addressable, stateful objects (rooms, zones, matches).

    Class attributes:
        mode: `SpotMode.SPOT_WIDE` (default) or `SpotMode.PER_ACTOR`.
        type_name: the stable registered name; defaults to the class's qualified name.
    """

    mode: ClassVar[SpotMode] = SpotMode.SPOT_WIDE

    def configure(self, cfg: SpotConfig) -> None:
        """Declare subscriptions: `cfg.subscribe(channel, topic)`. Runs at activation."""

    def on_actor_join(self, ctx: Any, actor: ActorRef) -> bool:
        """Approve (True, the default) or decline an Actor's Join."""
        return True

    def on_actor_leave(self, ctx: Any, actor: ActorRef) -> object:
        """Runs after `actor` stopped being a member of this Spot: it left
        (`leave_spot().defer()`), joined another Spot, or closed.

        A lifecycle record under this Spot's gate, once per leave; `ctx.members` no longer
        lists `actor`. Not called once this Spot's own close has begun, nor for leaves
        after Host shutdown began. Plain or `async def`. An exception is logged and
        counted as a handler failure; it changes nothing else.
        """
        return None


class InstanceSpot(Spot):
    """A Spot with no Actors, cold-activated by the first direct message that carries
    instance intent (`send_to_spot(...).activate()`). Serialised as a whole under one gate;
    `yield_()` is allowed in its turns."""

    mode: ClassVar[SpotMode] = SpotMode.SPOT_WIDE


class Actor(_Lifecycle):
    """Base class for Actors: addressable objects with their own queue (players, sessions).

    Class attributes:
        type_name: the stable registered name; defaults to the class's qualified name.
    """

    def on_join_completed(self, ctx: Any, result: JoinResult) -> object:
        """Receives the outcome of a Join or Leave this Actor deferred."""
        return None


class ChannelHandler:
    """Base class for handlers registered under a ChannelName (`Host(channels={...})`)."""

    type_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        pass


class NodeHandler:
    """Base class of the handler given as `Host(node_handler=...)`: the target of
    `send_to_node` / `request_to_node` for this node, with a gate of its own."""

    type_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SpotRef:
    """An immutable snapshot of a Spot's identity; never a message target.

    `routing_id` is the owner node's routing id (None on a Host without a mesh)."""

    spot_id: str
    generation: int
    routing_id: str | None = None


@dataclass(frozen=True, slots=True)
class ActorRef:
    """An immutable snapshot of an Actor's identity; never a message target.

    `routing_id` is the owner node's routing id (None on a Host without a mesh)."""

    actor_id: str
    generation: int
    routing_id: str | None = None


@dataclass(frozen=True, slots=True)
class JoinResult:
    """The outcome of `join_spot(...).defer()` (or `leave_spot()`), delivered to the moved
    Actor's `on_join_completed`.

    Attributes:
        spot_id: the Spot the Actor asked to join.
        approved: True if the Actor is now its member.
        error: why the Join failed (`NotFoundError`, ...), or None.
    """

    spot_id: str
    approved: bool
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Created(Generic[R]):
    """The object was created by this call; `reply` is what its creation hook returned."""

    ref: Any
    reply: R | None = None


@dataclass(frozen=True, slots=True)
class Existing:
    """The object already existed (get-or-create)."""

    ref: Any


@dataclass(frozen=True, slots=True)
class Rejected(Generic[R]):
    """The creation hook declined; the id stays free. Not an error (and not
    `ErrorKind.REJECTED`)."""

    reply: R | None = None
