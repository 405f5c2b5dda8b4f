"""Creating Spots and Actors: `spots.create / get_or_create`, `actors.create / get_or_create`.

Results are typed values: `Created(ref, reply)` or `Existing(ref)`. Concurrent
get-or-create of one id runs the constructor once; callers that joined that attempt
observe the same terminal. An existing id of another type is `TypeMismatchError`;
`create` of an existing id is `AlreadyExistsError`; a constructor that raises is
`InternalFailureError` and leaves the id free.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ._call import YieldableCall, failed, settled
from ._cancellation import CancellationToken
from ._completion import Completion, _Cell
from ._errors import (
    AlreadyExistsError,
    InternalFailureError,
    NotConfiguredError,
    TypeMismatchError,
)
from ._objects import Created, Existing, check_id

if TYPE_CHECKING:
    from ._engine import Activation, TypeInfo
    from ._runtime import Runtime

__all__ = ["ActorManager", "CreateCall", "SpotManager"]


class CreateCall(YieldableCall[Any]):
    """A create or get-or-create call. Created by `spots` / `actors`; not constructed by
    users. Completes with `Created(ref, reply)` or `Existing(ref)`."""

    __slots__ = ("_exclusive", "_id", "_info", "_kind")

    def __init__(
        self, runtime: Runtime, kind: str, obj_id: str, info: TypeInfo, exclusive: bool
    ) -> None:
        super().__init__(runtime)
        self._kind = kind
        self._id = obj_id
        self._info = info
        self._exclusive = exclusive

    def _start(self, cancel: CancellationToken | None) -> Completion[Any]:
        runtime = self._runtime
        early = runtime.admission_failure() or self._pre_cancelled(cancel)
        if early is not None:
            return early
        engine = runtime.engine
        table = engine.spots if self._kind == "spot" else engine.actors
        creating = runtime.creating
        key = (self._kind, self._id)
        with engine.lock:
            act = table.get(self._id)
            if act is not None and not act.closed:
                return self._existing(act)
            attempt = creating.get(key)
            if attempt is not None:
                if self._exclusive:
                    return failed(AlreadyExistsError(f"{self._kind} {self._id!r} exists"))
                if attempt[1] is not self._info:
                    return failed(self._mismatch(attempt[1]))
                return attempt[0].handle()
            cell: _Cell[Any] = _Cell()
            creating[key] = (cell, self._info)
        try:
            instance = self._info.cls()
        except Exception as exc:
            with engine.lock:
                creating.pop(key, None)
            failure = InternalFailureError(f"{self._info.name}() raised {type(exc).__name__}")
            failure.__cause__ = exc
            cell.set_exception(failure)
            return cell.handle()
        if self._kind == "spot":
            act = engine.new_spot(self._id, self._info, instance)
        else:
            act = engine.new_actor(self._id, self._info, instance)
        with engine.lock:
            table[self._id] = act
            creating.pop(key, None)
        cell.set_result(Created(act.ref(), None))
        return cell.handle()

    def _existing(self, act: Activation) -> Completion[Any]:
        if self._exclusive:
            return failed(AlreadyExistsError(f"{self._kind} {self._id!r} already exists"))
        if act.type is not self._info:
            return failed(self._mismatch(act.type))
        return settled(Existing(act.ref()))

    def _mismatch(self, other: TypeInfo) -> TypeMismatchError:
        return TypeMismatchError(
            f"{self._kind} {self._id!r} is a {other.name}, not a {self._info.name}"
        )


def _type_info(runtime: Runtime, cls: object, kind: str) -> TypeInfo:
    info = runtime.engine.by_class.get(cls) if isinstance(cls, type) else None
    if info is None or info.kind != kind:
        name = getattr(cls, "__qualname__", repr(cls))
        raise NotConfiguredError(
            f"{name} is not a registered {kind} type of this Host; pass it to Host({kind}s=[...])"
        )
    return info


class SpotManager:
    """`host.spots` / `ctx.spots`. Created by the runtime."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def create(self, spot_type: type) -> CreateCall:
        """Create a new Spot of `spot_type` under a fresh id."""
        info = _type_info(self._runtime, spot_type, "spot")
        return CreateCall(self._runtime, "spot", f"{info.name}-{uuid.uuid4().hex}", info, True)

    def get_or_create(self, spot_id: str, spot_type: type) -> CreateCall:
        """Get Spot `spot_id`, creating it as a `spot_type` if it does not exist."""
        check_id("spot_id", spot_id)
        info = _type_info(self._runtime, spot_type, "spot")
        return CreateCall(self._runtime, "spot", spot_id, info, False)


class ActorManager:
    """`host.actors` / `ctx.actors`. Created by the runtime."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def create(self, actor_id: str, actor_type: type) -> CreateCall:
        """Create Actor `actor_id`; `AlreadyExistsError` if it exists."""
        check_id("actor_id", actor_id)
        info = _type_info(self._runtime, actor_type, "actor")
        return CreateCall(self._runtime, "actor", actor_id, info, True)

    def get_or_create(self, actor_id: str, actor_type: type) -> CreateCall:
        """Get Actor `actor_id`, creating it as an `actor_type` (in the Entry Spot)."""
        check_id("actor_id", actor_id)
        info = _type_info(self._runtime, actor_type, "actor")
        return CreateCall(self._runtime, "actor", actor_id, info, False)
