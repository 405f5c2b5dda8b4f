"""Messaging calls in one process: one-way sends and requests (SC §4-5, §9).

One-way `submit()` completes with `None` at admission into the target's queue. When the
target's application lane is full the send waits, with no time limit and no caller
cancellation, FIFO with the other sends waiting for that target; it ends only admitted,
with `UnavailableError` (the target closed) or with `ShuttingDownError`. A waiting send
keeps its own payload: there is no other backlog.

A request never waits for capacity: a full target queue is `CapacityExceededError` at
once. Its deadline (the call's `timeout()`, else the Host default) covers queue wait,
handler and reply; reply, timeout, cancellation and shutdown race for one terminal.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable
from time import monotonic as _monotonic
from typing import Any, Final, Generic, Literal, Self, TypeVar, overload

from .._core.cancellation import CancellationToken, check_token
from .._core.completion import Cell, Completion, failed
from .._core.context import runtime_var
from .._core.errors import (
    CapacityExceededError,
    InvalidOperationError,
    NotConfiguredError,
    NotFoundError,
    ProtocolError,
    TypeMismatchError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
from .._core.pending import Request, ServedRequest, SyncRequest, begin, block, result_or_cancel
from .._core.pool import ADMITTED, CLOSED, SEALED
from .._core.record import Message
from .._core.state import HostState
from .._core.validation import STRUCT_META, reply_rule, rule_type
from .._engine.driver import YieldAwaitable
from .._engine.handlers import HandlerInfo
from .._engine.instance import activate_instance
from .._engine.kernel import Runtime
from .._engine.objects import InstanceSpot, ObjectKind, spot_type_name
from .._engine.registry import Activation
from .._engine.turn import TurnContext, current_turn, require_yield_turn
from .call import Call

_SERVING = HostState.SERVING
_GLOBAL_KINDS: Final = frozenset({ObjectKind.SPOT, ObjectKind.ACTOR})
_NEVER = math.inf
#: The longest timed lock wait the platform accepts; a longer deadline takes the timer.
_WAIT_MAX = threading.TIMEOUT_MAX


__all__ = [
    "RequestCall",
    "SendCall",
    "activate_here",
    "deliver_request",
    "deliver_send",
    "local_request",
]

T = TypeVar("T")


class _Elsewhere(enum.Enum):
    #: `_target_handler` found no Spot, and the call carries instance intent.
    COLD = enum.auto()
    #: `_target_handler` found no local target, and the remote routes hold it.
    REMOTE = enum.auto()


class _Local(enum.Enum):
    #: The remote routes were asked and chose this Host (or the call came from one).
    LOCAL = enum.auto()


class _AnyInstance(enum.Enum):
    #: `activate()` with no type: the Host's only InstanceSpot type.
    ANY_INSTANCE = enum.auto()


_COLD: Final = _Elsewhere.COLD
_REMOTE: Final = _Elsewhere.REMOTE
_ANY_INSTANCE: Final = _AnyInstance.ANY_INSTANCE
_LOCAL: Final = _Local.LOCAL


class _MessageCall(Call[T]):
    __slots__ = ("_intent", "_kind", "_payload", "_reply", "_route", "_table", "_target")

    def __init__(
        self, runtime: Runtime, kind: ObjectKind, target: str, payload: object, reply: object = None
    ) -> None:
        # Flat on purpose: this runs once per message. `reply` is a request's reply type;
        # a plain class or a Struct class is its own rule (`isinstance`, which never
        # refuses them), anything else gets a rule made once (`reply_rule`).
        if reply is not None and type(reply) is not type and type(reply) is not STRUCT_META:
            reply = reply_rule(reply)
        self._runtime = runtime
        self._timeout: float | None = None
        self._used = False
        self._kind = kind
        self._table = runtime.engine.tables[kind]
        self._target = target
        self._payload = payload
        self._metadata: dict[str, object] | None = None
        self._intent: type | _AnyInstance | None = None
        self._reply: type | None = reply
        #: None until the remote routes decided; then `_LOCAL` or their route.
        self._route: object = None

    def activate(self, spot_type: type | None = None) -> Self:
        """Give the message instance intent: if Spot `spot_id` does not exist, activate an
        `InstanceSpot` for it, and this message is the first record it handles.

        With `spot_type` None the Host's only registered InstanceSpot type is used.

        Raises:
            InvalidOperationError: not a Spot call, set twice, or the call was submitted.
            NotConfiguredError: `spot_type` is not a registered InstanceSpot type.
        """
        self._check_open("activate()")
        if self._kind is not ObjectKind.SPOT:
            raise InvalidOperationError("activate() is for calls to Spots")
        if self._intent is not None:
            raise InvalidOperationError("activate() was already set on this call")
        if spot_type is not None:
            info = self._runtime.engine.by_class.get(spot_type)
            if info is None and self._runtime.objects is not None:
                # Global objects: a type registered on another node of the mesh.
                if not (isinstance(spot_type, type) and issubclass(spot_type, InstanceSpot)):
                    raise NotConfiguredError(f"{spot_type!r} is not an InstanceSpot type")
            elif info is None or not issubclass(info.cls, InstanceSpot):
                raise NotConfiguredError(f"{spot_type!r} is not a registered InstanceSpot type")
        self._intent = spot_type if spot_type is not None else _ANY_INSTANCE
        return self

    def _cold(
        self,
        admit: Callable[[Activation, HandlerInfo], Completion[Any]],
        timeout: float | None,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """No Spot `_target` here and the call has instance intent: activate it here, or,
        with global objects, wherever the mesh decides (`timeout` None: a one-way)."""
        explicit = None if self._intent is _ANY_INSTANCE else self._intent
        objects = self._runtime.objects
        if objects is not None:
            name = None if explicit is None else spot_type_name(explicit)
            return objects.activate(
                self._target, name, self._payload, self._metadata, self._reply, timeout, cancel
            )
        return activate_instance(self._runtime, self._target, explicit, self._payload, admit)

    def _routed(self) -> Completion[Any] | _Elsewhere | None:
        """Ask the remote routes (once per call): `_REMOTE`, a failed Completion, or None
        when the call stays here."""
        decided = self._runtime.remote.route(self._kind, self._target)
        if decided is None:
            self._route = _LOCAL
            return None
        if isinstance(decided, Completion):
            return decided
        self._route = decided
        return _REMOTE

    def _target_handler(self) -> tuple[Activation, HandlerInfo] | Completion[Any] | _Elsewhere:
        if self._route is None and self._kind in self._runtime.remote.first:
            routed = self._routed()
            if routed is not None:
                return routed
        act = self._table.get(self._target)
        if act is not None and self._runtime.fenced and self._kind in _GLOBAL_KINDS:
            return failed(
                UnavailableError(
                    f"{self._kind} {self._target!r}: this node's owner lease lapsed, it "
                    "admits no new messages",
                    reason=UnavailableReason.FENCED,
                )
            )
        if act is None or act.closed:
            if self._intent is not None and self._runtime.state is HostState.SERVING:
                return _COLD
            if self._runtime.state is not HostState.SERVING:
                # Shutdown closed every object after this call passed admission.
                return failed(shutting_down())
            if self._route is None:
                routed = self._routed()
                if routed is not None:
                    return routed
            return failed(NotFoundError(f"no {self._kind} {self._target!r}"))
        intent = self._intent
        if intent is not None:
            if not issubclass(act.type.cls, InstanceSpot):
                wanted = "an instance"
            elif intent is not _ANY_INSTANCE and act.type.cls is not intent:
                wanted = f"a {intent.__qualname__}"
            else:
                wanted = ""
            if wanted:
                return failed(
                    TypeMismatchError(f"Spot {self._target!r} is a {act.type.name}, not {wanted}")
                )
        info = act.type.table.find(type(self._payload))
        if info is None:
            return failed(
                NotFoundError(
                    f"{self._kind} {self._target!r} ({act.type.name}) has no handler for "
                    f"{type(self._payload).__qualname__}"
                )
            )
        return act, info

    def _fast_target(self) -> tuple[Activation, HandlerInfo] | None:
        """The common case, decided cheaply: a serving Host, an application thread, a live
        target with a handler. None when any of that fails (the full path decides)."""
        runtime = self._runtime
        if runtime.state is not _SERVING or runtime_var.get() is not None:
            return None
        fence = runtime.admission_deadline
        if fence is not None and _monotonic() >= fence:
            return None
        if self._route is not _LOCAL and self._kind in runtime.remote.first:
            return None
        if runtime.codec_check is not None:
            return None
        act = self._table.get(self._target)
        if act is None or act.closed:
            return None
        info = act.type.table.find(type(self._payload))
        return None if info is None else (act, info)

    def _codec_refused(self) -> Completion[Any] | None:
        """`Host(check_codec=True)`: the payload continues as the wire would carry it,
        or the call fails with `ProtocolError` as it would before anything is sent."""
        check = self._runtime.codec_check
        if check is None or self._route is not None:
            return None  # unchecked, or it came from the wire
        try:
            self._payload = check(self._payload, None)
        except ProtocolError as exc:
            return failed(exc)
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} to {self._kind} {self._target!r}>"


class SendCall(_MessageCall[None]):
    """A one-way send. Created by `send_to_*`; not constructed by users.

    Terminators: `submit()` and `submit_sync()`; no `yield_()` (nothing to wait for).
    """

    __slots__ = ()

    def timeout(self, seconds: float) -> Self:
        """Not offered: a one-way send has no time limit (docs/backpressure.md).

        Raises:
            InvalidOperationError: always. Use a request when the caller needs to know
                within a time whether the message arrived.
        """
        raise InvalidOperationError(
            "a one-way send has no timeout: it waits for admission without a time limit "
            "(SC §7); use a request to learn the outcome within a deadline"
        )

    def submit(self, cancel: CancellationToken | None = None) -> Completion[None]:
        """Send the message.

        Completes when: the message is admitted into the target's queue (value `None`).
        If the queue is full this waits for space with no time limit; `cancel=` counts
        only if already cancelled now, and `Completion.cancel()` returns False while it
        waits. A handler failure afterwards never changes the result (it is logged).
        Turn: `await` keeps the turn. A send to a target behind your own gate never waits.
        Raises (in the Completion): `NotFoundError` (no such target, or no handler for the
        payload type), `UnavailableError` (target closed while waiting),
        `ShuttingDownError`. A waiting send that fails while nothing observes its
        Completion is logged at debug level (logger `zlink_actors`).
        """
        if cancel is None and not self._used and self._intent is None:
            found = self._fast_target()
            if found is not None:
                self._used = True
                return self._admit(found[0], found[1], None)
        return super().submit(cancel)

    def submit_sync(self, cancel: CancellationToken | None = None) -> None:
        """Send from an application thread, blocking until admitted (see `submit()`).

        This can wait forever if the target never makes room.
        """
        return super().submit_sync(cancel)

    def _start(self, cancel: CancellationToken | None) -> Completion[None]:
        early = self._refused(cancel) or self._codec_refused()
        if early is not None:
            return early
        found = self._target_handler()
        if found is _COLD:
            return self._cold(self._admit_here, None, None)
        if found is _REMOTE:
            return self._runtime.remote.send(self._route, self._payload, self._metadata)
        if isinstance(found, Completion):
            return found
        return self._admit_here(*found)

    def _admit_here(self, act: Activation, info: HandlerInfo) -> Completion[None]:
        return self._admit(act, info, current_turn())

    def _admit(
        self, act: Activation, info: HandlerInfo, turn: TurnContext | None
    ) -> Completion[None]:
        """Admit or park the send; `turn` is the caller's turn (None on an application
        thread)."""
        box = act.box
        rec = Message(self._payload, self._metadata, info)
        pool = self._runtime.pool
        if turn is not None and turn._gate is box.gate:
            # Behind our own gate waiting could never end: append even past the limit.
            if pool.force(box, rec, reserve=True):
                return Completion(_ADMITTED)
            return failed(NotFoundError(f"{self._kind} {self._target!r} closed"))
        waiting = pool.send(box, rec, Cell)
        if waiting == ADMITTED:
            return Completion(_ADMITTED)
        if waiting == CLOSED:
            return failed(NotFoundError(f"{self._kind} {self._target!r} closed"))
        if waiting == SEALED:
            return failed(shutting_down())
        assert isinstance(waiting, Cell)
        # SC §5/§7: a waiting send has no timeout and refuses caller cancellation.
        return Completion(waiting, _refuse_cancel)


def _refuse_cancel() -> bool:
    return False


def _refusal(kind: ObjectKind, target: str, status: int) -> BaseException:
    """Why a lane did not admit a request (`pool.enqueue` gave `status`)."""
    if status == CLOSED:
        return NotFoundError(f"{kind} {target!r} closed")
    return CapacityExceededError(f"{kind} {target!r} queue is full")


def _codec_reply(
    done: Completion[Any], check: Callable[[object, object], object], reply: type | None
) -> Completion[Any]:
    """A local request's reply as the wire would carry it (`Host(check_codec=True)`)."""
    cell: Cell[Any] = Cell()

    def crossed(result: Completion[Any]) -> None:
        exc = result.exception()
        if exc is not None:
            cell.try_set(None, exc)
            return
        try:
            cell.try_set(check(result.result(), None if reply is None else rule_type(reply)), None)
        except ProtocolError as error:
            cell.try_set(None, error)

    # Not `add_done_callback`: in a turn that would queue behind the turn awaiting it.
    if done._add_listener(crossed, None):
        crossed(done)
    return Completion(cell, done.cancel)


#: The result every admitted send observes. Shared safely: it is settled, so no handle can
#: change it, and each call still gets a fresh `Completion` of its own (SC §2).
_ADMITTED: Cell[None] = Cell.settled(None, None)


class RequestCall(_MessageCall[T], Generic[T]):
    """A request that waits for one reply. Created by `request_to_*`; not constructed by
    users. Terminators: `submit()`, `submit_sync()`, `yield_()`."""

    __slots__ = ()

    def submit(self, cancel: CancellationToken | None = None) -> Completion[T]:
        """Send the request and return its `Completion`.

        Completes when: the reply arrives, or with exactly one error.
        Turn: `await` keeps the turn (the gate stays held); so a request to your own Spot,
        your own Actor or anything behind your own gate raises `InvalidOperationError`
        here, before anything is sent.
        Raises (in the Completion): `NotFoundError`, `CapacityExceededError` (the target's
        queue is full), `DeadlineExceededError`, `ProtocolError` (the reply does not
        conform to `reply=`), `InternalFailureError` (the handler raised a non-framework
        exception), the handler's own `ZlinkError`, `ShuttingDownError`,
        `CancelledError`.
        """
        if cancel is None and not self._used and self._intent is None:
            if self._route is None and self._kind in self._runtime.remote.first:
                runtime = self._runtime
                if runtime.state is _SERVING and runtime.codec_check is None:
                    return self._remote_first(False)
            else:
                found = self._fast_target()
                if found is not None:
                    self._used = True
                    return self._admit(found[0], found[1], None)
        return super().submit(cancel)

    @overload
    def _remote_first(self, sync: Literal[False]) -> Completion[T]: ...
    @overload
    def _remote_first(self, sync: Literal[True]) -> T: ...
    def _remote_first(self, sync: bool) -> Completion[T] | T:
        """`submit()` (`sync`: `submit_sync()`) with no token of a call not routed yet to
        a kind the remote routes decide first (a mesh's nodes and channels), on a serving
        Host without `check_codec=` (which checks the payload between routing and
        sending): the route (asked once), then the remote request, in one step; a call
        the routes keep here goes on through the full path. What the full path does for
        such a call, without its seven frames: its admission and cancellation checks
        pass, and the turn it reads matters only to a local target."""
        self._used = True
        done: Completion[T] | None = None
        budget = 0.0
        try:
            runtime = self._runtime
            decided = runtime.remote.route(self._kind, self._target)
            if decided is None:
                self._route = _LOCAL
                self._used = False
                done = Call.submit(self, None)
            elif isinstance(decided, Completion):
                done = decided
            else:
                self._route = decided
                timeout = self._timeout  # as `_remote`
                if timeout is None:
                    timeout = runtime.default_request_timeout
                budget = timeout
                if not sync:
                    done = runtime.remote.request(
                        decided, self._payload, self._metadata, self._reply, timeout, None
                    )
        except BaseException:
            # As `_start_claimed`: a usage error raised before anything was submitted.
            self._used = False
            raise
        if done is not None:
            return result_or_cancel(done) if sync else done
        # Blocks for the result, with no handle and no deadline entry (`request_sync`);
        # what it raises is the call's outcome, not a usage error.
        value: T = runtime.remote.request_sync(
            decided, self._payload, self._metadata, self._reply, budget
        )
        return value

    def submit_sync(self, cancel: CancellationToken | None = None) -> T:
        """Send from an application thread and block for the reply (see `submit()`)."""
        if cancel is None and not self._used and self._intent is None:
            if self._route is None and self._kind in self._runtime.remote.first:
                runtime = self._runtime
                if (
                    runtime.state is _SERVING
                    and runtime.codec_check is None
                    and runtime_var.get() is None
                ):
                    return self._remote_first(True)
                return super().submit_sync(cancel)
            found = self._fast_target()
            if found is not None:
                self._used = True
                runtime = self._runtime
                timeout = self._timeout
                if timeout is None:
                    timeout = runtime.default_request_timeout
                if runtime.real_time and timeout <= _WAIT_MAX:
                    return self._request_sync(found[0], found[1], timeout)
                return result_or_cancel(self._admit(found[0], found[1], None))
        return super().submit_sync(cancel)

    def _request_sync(self, act: Activation, info: HandlerInfo, timeout: float) -> T:
        """The blocking round trip with nothing between the caller and the reply: no
        handle, no timer; the caller keeps the deadline in its own timed wait (`block`)."""
        runtime = self._runtime
        entry = SyncRequest(
            self._payload,
            self._metadata,
            info,
            runtime.engine,
            self._reply,
            runtime.pending,
            _monotonic() + timeout,
        )
        value: T = block(
            runtime, entry, timeout, runtime.pool.enqueue, (act.box, entry), self._refusal
        )
        return value

    @staticmethod
    def _wait_sync(done: Completion[T]) -> T:
        # A request's `submit_sync()` on the general path: an interrupt ends it too.
        return result_or_cancel(done)

    def _new_request(self, info: HandlerInfo, due: float) -> Request:
        runtime = self._runtime
        return Request(
            self._payload, self._metadata, info, runtime.engine, self._reply, runtime.pending, due
        )

    def _refusal(self, status: int) -> BaseException:
        return _refusal(self._kind, self._target, status)

    def yield_(self, cancel: CancellationToken | None = None) -> YieldAwaitable[T]:
        """Send the request; `await` the result releases the Spot gate meanwhile.

        Completes when: as `submit()`.
        Turn: releases the gate (SpotWide or Instance Spot turns only; a member Actor
        keeps its queue claim). The continuation runs later as a new turn: re-read state.
        A request to your own Actor still raises `InvalidOperationError` (its claim is
        yours); to your own SpotWide Spot it is allowed.
        Raises: `InvalidOperationError` outside an eligible async turn, before sending.
        """
        token = check_token(cancel)
        turn = require_yield_turn("request")
        act = self._table.get(self._target)
        if act is not None and act is turn._act and act.kind is ObjectKind.ACTOR:
            raise InvalidOperationError(
                "a request to your own Actor can never be answered: its queue claim is held "
                "by this handler"
            )
        self._claim()
        return YieldAwaitable(self._start_claimed(token, self._begin_yielding))

    def _begin_yielding(self, cancel: CancellationToken | None) -> Completion[T]:
        return self._begin(cancel, yielding=True)

    def _start(self, cancel: CancellationToken | None) -> Completion[T]:
        return self._begin(cancel, yielding=False)

    def _begin(self, cancel: CancellationToken | None, yielding: bool) -> Completion[T]:
        found = self._target_handler()
        turn = current_turn()
        if (
            not yielding
            and turn is not None
            and found is not _COLD
            and found is not _REMOTE
            and not isinstance(found, Completion)
            and found[0].box.gate is turn._gate
        ):
            # digest §4 "Reentrancy": awaiting it would need the gate this turn holds.
            raise InvalidOperationError(
                f"a request to {self._kind} {self._target!r} needs the gate this turn "
                "holds (a request to yourself); send one-way, or use yield_() in a "
                "SpotWide Spot"
            )
        early = self._refused(cancel) or self._codec_refused()
        if early is not None:
            return early
        if found is not _REMOTE and self._runtime.codec_check is not None:
            return _codec_reply(
                self._dispatch(found, cancel), self._runtime.codec_check, self._reply
            )
        return self._dispatch(found, cancel)

    def _dispatch(
        self,
        found: tuple[Activation, HandlerInfo] | Completion[Any] | _Elsewhere,
        cancel: CancellationToken | None,
    ) -> Completion[T]:
        if found is _COLD:
            timeout = self._timeout
            if timeout is None:
                timeout = self._runtime.default_request_timeout
            return self._cold(lambda act, info: self._admit(act, info, cancel), timeout, cancel)
        if found is _REMOTE:
            return self._remote(cancel)
        if isinstance(found, Completion):
            return found
        return self._admit(found[0], found[1], cancel)

    def _remote(self, cancel: CancellationToken | None) -> Completion[T]:
        runtime = self._runtime
        timeout = self._timeout if self._timeout is not None else runtime.default_request_timeout
        return runtime.remote.request(
            self._route, self._payload, self._metadata, self._reply, timeout, cancel
        )

    def _admit(
        self, act: Activation, info: HandlerInfo, cancel: CancellationToken | None
    ) -> Completion[T]:
        runtime = self._runtime
        timeout = self._timeout
        if timeout is None:
            timeout = runtime.default_request_timeout
        due = runtime.timers._now() + timeout
        req = self._new_request(info, due)
        begin(
            runtime, req, timeout, due, cancel, runtime.pool.enqueue, (act.box, req), self._refusal
        )
        return Completion(req, req)


def deliver_send(
    runtime: Runtime,
    kind: ObjectKind,
    target: str,
    payload: object,
    metadata: dict[str, object] | None,
) -> Completion[None]:
    """A one-way send that stays on this Host (a record another node routed here): it is
    never routed again. Completes as `SendCall.submit()` does."""
    call = SendCall(runtime, kind, target, payload)
    call._route = _LOCAL
    call._metadata = metadata
    return call.submit()


class _ServedCall(RequestCall[Any]):
    """`deliver_request`'s call: its request reports its outcome as it settles."""

    __slots__ = ("_done", "_due")

    def __init__(
        self,
        runtime: Runtime,
        kind: ObjectKind,
        target: str,
        payload: object,
        done: Callable[[object, BaseException | None], None],
        due: float,
    ) -> None:
        super().__init__(runtime, kind, target, payload)
        self._done = done
        #: The caller's deadline on this Host's clock (`deliver_request`).
        self._due = due

    def _new_request(self, info: HandlerInfo, due: float) -> Request:
        runtime = self._runtime
        req = ServedRequest(
            self._payload,
            self._metadata,
            info,
            runtime.engine,
            None,
            runtime.pending,
            min(due, self._due),
        )
        req.on_settled = self._done
        return req


def deliver_request(
    runtime: Runtime,
    kind: ObjectKind,
    target: str,
    payload: object,
    metadata: dict[str, object] | None,
    timeout: float,
    done: Callable[[object, BaseException | None], None],
    due: float | None = None,
) -> Request | Completion[Any]:
    """A request that stays on this Host (another node routed it here), with the deadline
    its caller had left; it is never routed again.

    `timeout` arms its timer; `due` (this Host's clock, default: now + `timeout`) is
    the caller's deadline itself: `ctx.deadline`, and the moment from which its handler
    never starts (`RecordRunner.run_record`), also when the timer is late.

    `done(value, exc)` runs once, on the thread that settles the request, once it was
    registered. Returns the queued request (cancel it with `.cancel()`), or a Completion
    when the request ended before it was queued (`done` may then not have run).

    The common case, a live target with a handler on a serving Host, is one record and
    one pending entry, made here; anything else takes the full path of a local call.
    """
    act = runtime.engine.tables[kind].get(target)
    info = None
    if act is not None and not act.closed:
        table = act.type.table
        # The handler cache read first (`find`'s frame only for a type not seen yet).
        info = table._cache.get(type(payload)) or table.find(type(payload))
    fence = runtime.admission_deadline  # `runtime.fenced`, without the property's frame
    if (
        info is None
        or act is None
        or runtime.state is not _SERVING
        or (fence is not None and _monotonic() >= fence)
    ):
        if due is None:
            due = runtime.timers._now() + timeout
        call = _ServedCall(runtime, kind, target, payload, done, due)
        call._route = _LOCAL
        call._metadata = metadata
        call._timeout = timeout
        return call.submit()
    expires = runtime.timers._now() + timeout
    req = ServedRequest(
        payload,
        metadata,
        info,
        runtime.engine,
        None,
        runtime.pending,
        expires if due is None else due,
    )
    req.on_settled = done
    refused = lambda status: _refusal(kind, target, status)  # noqa: E731
    if not begin(
        runtime, req, timeout, expires, None, runtime.pool.enqueue, (act.box, req), refused
    ):
        return Completion(req)
    return req


def local_request(
    runtime: Runtime,
    kind: ObjectKind,
    target: str,
    payload: object,
    metadata: dict[str, object] | None,
    reply: type | None,
    timeout: float,
    cancel: CancellationToken | None,
) -> Completion[Any]:
    """A request that the mesh resolved to this Host: it is never routed again."""
    call: RequestCall[Any] = RequestCall(runtime, kind, target, payload, reply)
    call._route = _LOCAL
    call._metadata = metadata
    call._timeout = timeout
    return call.submit(cancel)


class _HereSend(SendCall):
    """A send with instance intent that activates its Spot on this Host, under the
    generation its authority record issued (`activate_here`)."""

    __slots__ = ("_generation",)
    _generation: int

    def _cold(
        self,
        admit: Callable[[Activation, HandlerInfo], Completion[Any]],
        timeout: float | None,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        explicit = None if self._intent is _ANY_INSTANCE else self._intent
        return activate_instance(
            self._runtime, self._target, explicit, self._payload, admit, self._generation
        )


class _HereRequest(RequestCall[Any]):
    """A request with instance intent that activates its Spot here (see `_HereSend`)."""

    __slots__ = ("_generation",)
    _generation: int

    _cold = _HereSend._cold


def activate_here(
    runtime: Runtime,
    spot_id: str,
    spot_type: type | None,
    payload: object,
    metadata: dict[str, object] | None,
    reply: type | None,
    timeout: float | None,
    cancel: CancellationToken | None,
    generation: int,
) -> Completion[Any]:
    """Deliver a message with instance intent on this Host, activating Spot `spot_id`
    here if it is missing (`timeout` None: a one-way send)."""
    call: _HereSend | _HereRequest
    if timeout is None:
        call = _HereSend(runtime, ObjectKind.SPOT, spot_id, payload)
    else:
        call = _HereRequest(runtime, ObjectKind.SPOT, spot_id, payload, reply)
        call._timeout = timeout
    call._generation = generation
    call._route = _LOCAL
    call._metadata = metadata
    call._intent = spot_type if spot_type is not None else _ANY_INSTANCE
    return call.submit(cancel)
