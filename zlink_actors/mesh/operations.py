"""What the global objects' layers share (docs/mesh.md "Global Spots and Actors"): the
requests nodes send each other for them (target kind `wire.OBJECTS`), the small records
the layers keep, and the helpers that bridge engine `Completion`s and the I/O loop.

The layers build on the node in one line, each module importing the one before:
`inbound` -> `routing` (the route cache, resolution, sends and requests to objects held
elsewhere) -> `ownership` (owner lease, create, get-or-create, close) -> `objects`
(instance activation, publish, the requests other nodes send) -> `node`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar, Final, TypeVar

import msgspec

from .._core.cancellation import CancellationToken
from .._core.errors import (
    AlreadyExistsError,
    ProtocolError,
    TypeMismatchError,
    UnavailableError,
    UnavailableReason,
)
from .._core.validation import check_id
from .._engine.objects import (
    ActorRef,
    Existing,
    ObjectKind,
    SpotRef,
)
from .._engine.registry import Activation
from ..location.authority import (
    AuthorityKind,
    AuthorityRecord,
)

__all__ = [
    "ATTEMPTS",
    "ATTEMPT_BOUND",
    "AUTHORITY_KIND",
    "KIND_OF",
    "OPERATION_TYPES",
    "RELEASE_WAIT",
    "CloseOp",
    "CreateOp",
    "CreateReply",
    "PublishOp",
    "_HERE",
    "_RETRY",
    "_Cached",
    "_Inflight",
    "_Intent",
    "_Resolve",
    "_Spec",
    "_existing",
    "_mismatch",
    "_ref",
    "_wire_id",
]

T = TypeVar("T")

_SPOT: Final = ObjectKind.SPOT
_ACTOR: Final = ObjectKind.ACTOR
AUTHORITY_KIND: Final = {_SPOT: AuthorityKind.SPOT, _ACTOR: AuthorityKind.ACTOR}
#: How often one call reads the record again after a compare-and-set conflict.
ATTEMPTS: Final = 8
#: The local attempt's own bound (the callers' deadlines are their own).
ATTEMPT_BOUND: Final = 24 * 3600.0
#: Seconds a graceful shutdown waits for the records of its objects to be deleted.
RELEASE_WAIT: Final = 2.0


# -- the requests the nodes send each other (target kind `wire.OBJECTS`) ---------------


class CreateOp(msgspec.Struct, array_like=True, frozen=True):
    """Create or get-or-create `object_id` on the receiving node (or join its attempt)."""

    type_name: ClassVar[str] = "zla.CreateOp"
    kind: str
    object_id: str
    object_type: str
    exclusive: bool
    fresh: bool
    request_type: str
    request: bytes


class CreateReply(msgspec.Struct, array_like=True, frozen=True):
    type_name: ClassVar[str] = "zla.CreateReply"
    outcome: str  # "created" | "existing" | "rejected"
    routing_id: str
    generation: int
    reply_type: str
    reply: bytes
    #: "created" by the answering node: its owner generation and lease generation, so
    #: the caller can cache the route at once (0: not given).
    owner_generation: int = 0
    lease_generation: int = 0


class CloseOp(msgspec.Struct, array_like=True, frozen=True):
    type_name: ClassVar[str] = "zla.CloseOp"
    kind: str
    object_id: str


class PublishOp(msgspec.Struct, array_like=True, frozen=True):
    type_name: ClassVar[str] = "zla.PublishOp"
    channel: str
    topic: str
    payload_type: str
    payload: bytes


#: Every type the global objects send between nodes.
OPERATION_TYPES: Final = (CreateOp, CreateReply, CloseOp, PublishOp)
KIND_OF: Final = {kind.value: kind for kind in (_SPOT, _ACTOR)}


@dataclass(slots=True)
class _Cached:
    """A resolved Ready owner."""

    owner: str
    generation: int
    owner_generation: int
    lease_generation: int  # valid while the owner's lease of this generation holds
    expires: float  # local monotonic: `route_cache_max_age` after it was resolved


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a create or get-or-create asks for."""

    kind: ObjectKind
    obj_id: str
    type_name: str
    exclusive: bool
    fresh: bool  # `spots.create`'s unique id: no generation counter is kept for it


@dataclass(frozen=True, slots=True)
class _Intent:
    """A message with instance intent on its way: its target, payload and answer."""

    spot_id: str
    type_name: str | None  # the InstanceSpot type's name (None: the only one there is)
    payload: object
    metadata: dict[str, object] | None
    reply: type | None
    due: float | None  # the request's deadline on the Host clock; None: a one-way
    token: CancellationToken | None


@dataclass(slots=True)
class _Inflight:
    """A creation or activation this node runs for an id it reserved."""

    type_name: str
    done: asyncio.Future[object]


class _Retry:
    """An attempt lost its reservation race: its joiners read the record again."""


_RETRY: Final = _Retry()


@dataclass(frozen=True, slots=True)
class _Resolve:
    """A route still to be resolved through the Location Store."""

    kind: ObjectKind
    target: str


class _Here:
    """A resolution that found the owner to be this node."""


_HERE: Final = _Here()


def _wire_id(value: str) -> None:
    """A Spot or Actor id that came from another node: `ProtocolError` unless valid."""
    try:
        check_id("id", value)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"a bad object id from the network: {exc}") from None


def _ref(record: AuthorityRecord) -> SpotRef | ActorRef:
    if record.kind is AuthorityKind.SPOT:
        return SpotRef(record.object_id, record.generation, record.owner.node)
    return ActorRef(record.object_id, record.generation, record.owner.node)


def _mismatch(kind: ObjectKind, obj_id: str, actual: str, wanted: str) -> TypeMismatchError:
    return TypeMismatchError(f"{kind} {obj_id!r} is a {actual}, not a {wanted}")


def _existing(
    act: Activation, kind: ObjectKind, obj_id: str, type_name: str, exclusive: bool
) -> Existing:
    if exclusive:
        raise AlreadyExistsError(f"{kind} {obj_id!r} already exists")
    if act.type.name != type_name:
        raise _mismatch(kind, obj_id, act.type.name, type_name)
    if act.closing is not None:
        raise UnavailableError(f"{kind} {obj_id!r} is closing", reason=UnavailableReason.CLOSED)
    return Existing(act.ref())
