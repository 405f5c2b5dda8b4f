"""User classes (`Spot`, `Actor`, `ChannelHandler`), refs and creation results.

Instances are created by the framework, only when an object is activated, with a
no-argument constructor; a subclass may define `__init__(self)` and call
`super().__init__()`. Handlers are methods marked with `@handler`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

__all__ = [
    "Actor",
    "ActorRef",
    "ChannelHandler",
    "Created",
    "Existing",
    "Rejected",
    "Spot",
    "SpotMode",
    "SpotRef",
    "check_id",
]

R = TypeVar("R")

_MAX_ID_BYTES = 255


def check_id(what: str, value: object) -> str:
    """Validate a Spot/Actor id: a `str` of 1-255 UTF-8 bytes, taken as is."""
    if type(value) is str and 0 < len(value) <= 63:
        return value  # at most 4 UTF-8 bytes a character: always within 1-255 bytes
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= _MAX_ID_BYTES:
        raise ValueError(f"{what} must be 1-{_MAX_ID_BYTES} UTF-8 bytes, got {size}")
    return value


class SpotMode(enum.Enum):
    """How a User Spot gates its work; fixed at registration."""

    #: One gate for the Spot's handlers, every member Actor and every timer: no two of
    #: them ever overlap, and `yield_()` is allowed.
    SPOT_WIDE = "spot_wide"
    #: A gate per Actor, per timer and for the Spot's own work: they overlap; no `yield_()`.
    PER_ACTOR = "per_actor"


class Spot:
    """Base class for Spots: addressable, stateful objects (rooms, zones, matches).

    Class attributes:
        mode: `SpotMode.SPOT_WIDE` (default) or `SpotMode.PER_ACTOR`.
        type_name: the stable registered name; defaults to the class's qualified name.
    """

    mode: ClassVar[SpotMode] = SpotMode.SPOT_WIDE
    type_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        pass


class Actor:
    """Base class for Actors: addressable objects with their own queue (players, sessions).

    Class attributes:
        type_name: the stable registered name; defaults to the class's qualified name.
    """

    type_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        pass


class ChannelHandler:
    """Base class for handlers registered under a ChannelName (`Host(channels={...})`)."""

    type_name: ClassVar[str | None] = None

    def __init__(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SpotRef:
    """An immutable snapshot of a Spot's identity; never a message target."""

    spot_id: str
    generation: int


@dataclass(frozen=True, slots=True)
class ActorRef:
    """An immutable snapshot of an Actor's identity; never a message target."""

    actor_id: str
    generation: int


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
