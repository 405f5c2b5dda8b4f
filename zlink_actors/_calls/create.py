"""`spots` / `actors`: create, get-or-create and close (digest §3).

Results are typed values: `Created(ref, reply)`, `Existing(ref)` or `Rejected(reply)`.
Concurrent get-or-create of one id runs the factory and `on_create` once; callers that
joined that attempt observe the same terminal, and callers arriving after Ready get
`Existing`. An existing id of another type is `TypeMismatchError`; `create` of an existing
id is `AlreadyExistsError`; a factory or hook exception is `InternalFailureError` and
leaves the id free. One deadline (`timeout()`, else the Host's default request timeout)
covers the whole call.
"""

from __future__ import annotations

import uuid
from typing import Any, Final, Self

from .._core.cancellation import CancellationToken
from .._core.completion import CellLock, Completion, failed, settled
from .._core.errors import (
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    InvalidOperationError,
    NotConfiguredError,
    TypeMismatchError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
from .._core.pending import PendingCell
from .._core.state import HostState
from .._engine.kernel import Runtime
from .._engine.lifecycle import (
    Closing,
    close_by_id,
    create_now,
    has_hooks,
    start_attempt,
)
from .._engine.objects import (
    Actor,
    Existing,
    InstanceSpot,
    ObjectKind,
    Spot,
    check_id,
    spot_type_name,
)
from .._engine.registry import CLOSING, EXISTING, JOIN, OWN, Activation, Attempt, TypeInfo
from .._engine.turn import current_turn
from .call import Call, YieldableCall

__all__ = ["ActorManager", "CloseCall", "CreateCall", "SpotManager", "close_here", "create_here"]

#: `request()` was not called (None is a valid request payload).
_UNSET: Final = object()


class CreateCall(YieldableCall[Any]):
    """A create or get-or-create call. Created by `spots` / `actors`; not constructed by
    users. Completes with `Created(ref, reply)`, `Existing(ref)` or `Rejected(reply)`."""

    __slots__ = (
        "_exclusive",
        "_fresh",
        "_generation",
        "_id",
        "_info",
        "_kind",
        "_request",
        "_type_name",
    )

    def __init__(
        self,
        runtime: Runtime,
        kind: ObjectKind,
        obj_id: str,
        info: TypeInfo | None,
        exclusive: bool,
        type_name: str = "",
    ) -> None:
        # Flat on purpose (one per create): `Call.__init__`'s fields, then our own.
        self._runtime = runtime
        self._timeout: float | None = None
        self._used = False
        self._metadata: dict[str, object] | None = None
        self._kind = kind
        self._id = obj_id
        self._info = info
        self._exclusive = exclusive
        self._request: object = _UNSET
        #: The type's name across a mesh (`info` is None on a Host that does not
        #: register it: global objects place it on a node that does).
        self._type_name = type_name or (info.name if info is not None else "")
        #: Set by the global objects (`mesh/objects.py`) for the attempt it reserved: the
        #: object generation its authority record issued; 0 for an application's call.
        self._generation = 0
        #: `spots.create`: the id was made unique for this call.
        self._fresh = False

    def request(self, payload: object) -> Self:
        """Pass `payload` to the creation hook `on_create(ctx, request)`.

        Raises:
            InvalidOperationError: already set, or the call was submitted.
        """
        self._check_open("request()")
        if self._request is not _UNSET:
            raise InvalidOperationError("request() was already set on this call")
        self._request = payload
        return self

    def submit(self, cancel: CancellationToken | None = None) -> Completion[Any]:
        """Start the create (or get-or-create) and return its `Completion`.

        Completes when: the object is Ready (`Created(ref, reply)`), was already Ready
        (`Existing(ref)`), or its `on_create` declined (`Rejected(reply)`); or with
        exactly one error. For a class that overrides neither `on_create` nor
        `on_initialize` the object is Ready, and the `Completion` settled, when this
        returns. Callers that join an attempt in progress share its one result.
        Turn: `await` keeps the turn (the gate stays held).
        Raises (in the Completion): `AlreadyExistsError`, `TypeMismatchError`,
        `UnavailableError` (the object is closing), `InternalFailureError` (the
        constructor, `configure` or a creation hook raised), `DeadlineExceededError`,
        `ShuttingDownError`, `CancelledError`. Raises `InvalidOperationError` for a second
        terminator, or for a get-or-create of the object's own id from its own hook.
        """
        if cancel is None and not self._used:
            # The common call, without the generic terminator's checks of a token.
            self._used = True
            return self._start_claimed(None)
        return super().submit(cancel)

    def _start(self, cancel: CancellationToken | None) -> Completion[Any]:
        runtime = self._runtime
        if cancel is not None or runtime.state is not HostState.SERVING:
            early = self._refused(cancel)
            if early is not None:
                return early
        objects = runtime.objects
        if objects is not None and not self._generation:
            self._refuse_own_creation()
            timeout = self._timeout
            if timeout is None:
                timeout = runtime.default_request_timeout
            request = None if self._request is _UNSET else self._request
            return objects.create(
                self._kind,
                self._id,
                self._type_name,
                self._info,
                self._exclusive,
                self._fresh,
                request,
                timeout,
                cancel,
            )
        info = self._info
        assert info is not None  # only global objects create types registered elsewhere
        found, held = runtime.engine.claim(
            self._kind,
            self._id,
            info,
            runtime.pending.cell_lock,
            runtime.serving,
            self._generation,
        )
        if found is EXISTING:
            assert isinstance(held, Activation)
            return self._existing(held)
        if found is OWN:
            assert isinstance(held, Attempt)
            if not has_hooks(info.cls):
                # Nothing to run under the new object's gate: it is Ready when this returns.
                return create_now(runtime, held)
            return self._await(held, cancel, owner=True)
        if found is JOIN:
            assert isinstance(held, Attempt)
            # Its own creation hook: joining the attempt would wait for itself.
            self._refuse_own_creation()
            if self._exclusive:
                return failed(AlreadyExistsError(f"{self._kind} {self._id!r} is being created"))
            if held.info is not info:
                return failed(self._mismatch(held.info))
            return self._await(held, cancel, owner=False)
        if found is CLOSING:
            return failed(
                UnavailableError(
                    f"{self._kind} {self._id!r} is closing", reason=UnavailableReason.CLOSED
                )
            )
        # SEALED: shutdown began after the admission check.
        return failed(shutting_down())

    def _await(
        self, attempt: Attempt, cancel: CancellationToken | None, *, owner: bool
    ) -> Completion[Any]:
        """This caller's wait for `attempt`: its own deadline and cancellation over the
        shared attempt. The `owner` starts it (the factory, then the creation hooks)."""
        runtime = self._runtime
        entry = PendingCell(runtime.pending.cell_lock)
        timeout = self._timeout if self._timeout is not None else runtime.default_request_timeout
        runtime.begin(entry, timeout, cancel)
        route = entry.route_id
        pending = runtime.pending
        attempt.handle()._add_inline(
            lambda done: pending.finish(route, done._cell._value, done._cell._exc)
        )
        if owner:
            request = None if self._request is _UNSET else self._request
            start_attempt(runtime, attempt, request, hooks=True)
        return runtime.handle(entry)

    def _refuse_own_creation(self) -> None:
        """Raise if the caller's turn is the creation hook of the object this call names
        (its object is not Ready yet): waiting for that creation would wait for itself."""
        turn = current_turn()
        if turn is None:
            return
        act = turn._act
        if act.id != self._id or act.kind is not self._kind:
            return
        if self._runtime.engine.tables[self._kind].get(self._id) is not act:
            raise InvalidOperationError(
                f"{self._kind} {self._id!r} is being created by the hook that runs "
                "now; it cannot get or create itself"
            )

    def _existing(self, act: Activation) -> Completion[Any]:
        assert self._info is not None
        if self._exclusive:
            return failed(AlreadyExistsError(f"{self._kind} {self._id!r} already exists"))
        if act.type is not self._info:
            return failed(self._mismatch(act.type))
        return settled(Existing(act.ref()))

    def _mismatch(self, other: TypeInfo) -> TypeMismatchError:
        return TypeMismatchError(
            f"{self._kind} {self._id!r} is a {other.name}, not a {self._type_name}"
        )


class CloseCall(Call[bool]):
    """`spots.close(id)` / `actors.close(id)`. Created by the managers; not constructed by
    users. Completes with True once closed, or False for a User Spot that still has
    members.

    A close is a call like a request: its deadline (`timeout()`, else the Host's default
    request timeout) and its caller's cancellation end it with `DeadlineExceededError` /
    `CancelledError` if they win before `on_closing` began, and then the close does not
    happen (unless another caller still waits for it); once `on_closing` began, the close
    completes with True. A close of the object whose turn is running (or of anything
    behind that turn's gate) completes with True as soon as it is accepted:
    `on_closing` runs after the current turn ends, so awaiting it never deadlocks.
    """

    __slots__ = ("_here", "_id", "_kind")

    def __init__(
        self, runtime: Runtime, kind: ObjectKind, obj_id: str, *, here: bool = False
    ) -> None:
        super().__init__(runtime)
        self._kind = kind
        self._id = obj_id
        #: Close the object on this Host (the global objects decided it lives here).
        self._here = here

    def _start(self, cancel: CancellationToken | None) -> Completion[bool]:
        runtime = self._runtime
        early = self._refused(cancel)
        if early is not None:
            return early
        objects = runtime.objects
        if objects is not None and not self._here and not self._own_turn():
            timeout = self._timeout
            if timeout is None:
                timeout = runtime.default_request_timeout
            return objects.close_object(self._kind, self._id, timeout, cancel)
        turn = current_turn()
        closing = close_by_id(runtime, self._kind, self._id, None if turn is None else turn._gate)
        if isinstance(closing, BaseException):
            return failed(closing)
        if closing is True or closing is False:
            return settled(closing)
        entry = _CloseWait(runtime.pending.cell_lock, closing)
        timeout = self._timeout if self._timeout is not None else runtime.default_request_timeout
        if not runtime.begin(entry, timeout, cancel):
            closing.give_up(entry)
        route = entry.route_id
        pending = runtime.pending
        closing.cell.handle()._add_inline(
            lambda done: pending.finish(route, done._cell._value, done._cell._exc)
        )
        return runtime.handle(entry)

    def _own_turn(self) -> bool:
        """The caller's turn holds the gate of the object it closes: the close runs
        here (it completes once accepted), and its record goes when it is removed."""
        turn = current_turn()
        if turn is None:
            return False
        act = self._runtime.engine.tables[self._kind].get(self._id)
        return act is not None and not act.closed and turn._gate is act.box.gate


class _CloseWait(PendingCell):
    """One caller of a close: its deadline and cancellation end its wait only while
    `on_closing` has not begun (`Closing.give_up`)."""

    __slots__ = ("closing", "gave_up")

    def __init__(self, lock: CellLock, closing: Closing) -> None:
        super().__init__(lock)
        self.closing = closing
        #: Set once, under the engine lock, by the first of its deadline or cancellation.
        self.gave_up = False

    def expire(self) -> None:
        self._give_up(DeadlineExceededError("the close did not begin within its deadline"))

    def cancel(self) -> bool:
        return self._give_up(CancelledError())

    #: Its `Completion`'s canceller is its own `cancel`.
    __call__ = cancel

    def _give_up(self, exc: BaseException) -> bool:
        table, route = self.table, self.route_id
        if route not in table:
            return False
        if not self.closing.give_up(self):
            return False  # on_closing began (the close completes), or it already gave up
        return table.finish(route, exc=exc)


def _type_info(runtime: Runtime, cls: object, kind: ObjectKind) -> TypeInfo | None:
    """This Host's registration of `cls`; None for a class of the right kind that only
    other nodes register (global objects place it there)."""
    info = runtime.engine.by_class.get(cls) if isinstance(cls, type) else None
    if (
        info is None
        and runtime.objects is not None
        and isinstance(cls, type)
        and issubclass(cls, Spot if kind is ObjectKind.SPOT else Actor)
    ):
        return None
    if info is None or info.kind is not kind:
        name = getattr(cls, "__qualname__", repr(cls))
        option = kind.name.lower()
        raise NotConfiguredError(
            f"{name} is not a registered {kind} type of this Host; pass it to Host({option}s=[...])"
        )
    return info


class SpotManager:
    """`host.spots` / `ctx.spots`. Created by the runtime."""

    __slots__ = ("_runtime", "_user_spots")

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        #: Classes `_user_spot` accepted. Registration ends when the Host is made, so an
        #: answer never changes; the cache spares a create the lookups and checks.
        self._user_spots: dict[type, TypeInfo] = {}

    def create(self, spot_type: type) -> CreateCall:
        """Create a new Spot of `spot_type` under a fresh id."""
        info = self._user_spot(spot_type)
        name = info.name if info is not None else spot_type_name(spot_type)
        # 48 characters of the type name at most: the id stays within 255 UTF-8 bytes.
        spot_id = f"{name[:48]}-{uuid.uuid4().hex}"
        call = CreateCall(self._runtime, ObjectKind.SPOT, spot_id, info, True, name)
        call._fresh = True
        return call

    def get_or_create(self, spot_id: str, spot_type: type) -> CreateCall:
        """Get Spot `spot_id`, creating it as a `spot_type` if it does not exist."""
        check_id("spot_id", spot_id)
        info = self._user_spot(spot_type)
        name = info.name if info is not None else spot_type_name(spot_type)
        return CreateCall(self._runtime, ObjectKind.SPOT, spot_id, info, False, name)

    def close(self, spot_id: str) -> CloseCall:
        """Close Spot `spot_id`: True once closed, False while it still has members."""
        return CloseCall(self._runtime, ObjectKind.SPOT, check_id("spot_id", spot_id))

    def _user_spot(self, spot_type: type) -> TypeInfo | None:
        if isinstance(spot_type, type):
            info = self._user_spots.get(spot_type)
            if info is not None:
                return info
        info = _type_info(self._runtime, spot_type, ObjectKind.SPOT)
        if info is None:
            if issubclass(spot_type, InstanceSpot):
                raise InvalidOperationError(
                    f"{spot_type.__qualname__} is an InstanceSpot: it is activated by a "
                    "message with instance intent (send_to_spot(...).activate()), not created"
                )
            return None
        if issubclass(info.cls, InstanceSpot):
            raise InvalidOperationError(
                f"{info.name} is an InstanceSpot: it is activated by a message with "
                "instance intent (send_to_spot(...).activate()), not created"
            )
        self._user_spots[spot_type] = info
        return info


class ActorManager:
    """`host.actors` / `ctx.actors`. Created by the runtime."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def create(self, actor_id: str, actor_type: type) -> CreateCall:
        """Create Actor `actor_id` (in the Entry Spot); `AlreadyExistsError` if it exists."""
        check_id("actor_id", actor_id)
        info = _type_info(self._runtime, actor_type, ObjectKind.ACTOR)
        name = info.name if info is not None else spot_type_name(actor_type)
        return CreateCall(self._runtime, ObjectKind.ACTOR, actor_id, info, True, name)

    def get_or_create(self, actor_id: str, actor_type: type) -> CreateCall:
        """Get Actor `actor_id`, creating it as an `actor_type` (in the Entry Spot)."""
        check_id("actor_id", actor_id)
        info = _type_info(self._runtime, actor_type, ObjectKind.ACTOR)
        name = info.name if info is not None else spot_type_name(actor_type)
        return CreateCall(self._runtime, ObjectKind.ACTOR, actor_id, info, False, name)

    def close(self, actor_id: str) -> CloseCall:
        """Close Actor `actor_id`: True once closed."""
        return CloseCall(self._runtime, ObjectKind.ACTOR, check_id("actor_id", actor_id))


def create_here(
    runtime: Runtime,
    kind: ObjectKind,
    obj_id: str,
    info: TypeInfo,
    request: object,
    timeout: float,
    generation: int,
) -> Completion[Any]:
    """The global objects' attempt on this Host, for the id they reserved under
    `generation`: the factory and the creation hooks run here (a get-or-create, so a
    local object of that id is `Existing`)."""
    call = CreateCall(runtime, kind, obj_id, info, False)
    call._generation = generation
    call._timeout = timeout
    if request is not None:
        call._request = request
    return call.submit()


def close_here(
    runtime: Runtime,
    kind: ObjectKind,
    obj_id: str,
    timeout: float,
    cancel: CancellationToken | None,
) -> Completion[bool]:
    """Close `obj_id` on this Host (the global objects found it here)."""
    call = CloseCall(runtime, kind, obj_id, here=True)
    call._timeout = timeout
    return call.submit(cancel)
