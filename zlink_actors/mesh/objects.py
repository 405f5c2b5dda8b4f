"""Global objects, third layer: Instance Spots across nodes, Logical Multicast across
nodes, and the requests other nodes send for global objects (docs/mesh.md "Global Spots
and Actors").

- **Instance Spots**: a message with instance intent to a Missing id activates it once
  in the mesh (reserve, activate, commit); a message that finds it Reserved or Ready
  elsewhere goes to that node with its intent, and is handled after the first one.
- **Publish**: after the local commit, one routed message per READY Object Server peer;
  each delivers to its own subscribed Spots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future
from typing import Any, Final

import transports as t

from .._calls.messaging import activate_here
from .._calls.publish import PublishCall
from .._core.cancellation import CancellationToken
from .._core.completion import Cell, Completion, failed
from .._core.errors import (
    DeadlineExceededError,
    InvalidOperationError,
    NotFoundError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
)
from .._engine.objects import (
    InstanceSpot,
    ObjectKind,
)
from .._engine.remote import RemoteMetadata
from ..location.authority import (
    AuthorityKind,
    AuthorityState,
)
from ..location.spi import Conflict
from . import codec as wire
from .codec import Envelope
from .config import PeerState
from .loop_calls import outcome, quietly, refuse_cancel, wait
from .operations import (
    _RETRY,
    ATTEMPTS,
    KIND_OF,
    CloseOp,
    CreateOp,
    PublishOp,
    _Inflight,
    _Intent,
    _Spec,
    _wire_id,
)
from .ownership import Ownership
from .peers import Peer, Role
from .shared import Route

__all__ = ["GlobalObjects"]

_SPOT: Final = ObjectKind.SPOT


class GlobalObjects(Ownership):
    """The global objects of one node (see the module docstring)."""

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
        forwarded = type(metadata) is RemoteMetadata  # a message another node sent here
        if timeout is None:
            one_way = _Intent(spot_id, type_name, payload, metadata, None, None, None)
            return self.loop_calls.one_way(self._activate(one_way, forwarded))

        def run(due: float, token: CancellationToken | None) -> Awaitable[object]:
            msg = _Intent(spot_id, type_name, payload, metadata, reply, due, token)
            return self._activate(msg, forwarded)

        return self.loop_calls.call(run, timeout, cancel)

    def publish(
        self, channel: str, topic: str, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        with self._lock:
            peers = [
                p
                for p in self._peers.by_rid.values()
                if p.state is PeerState.READY and p.role == Role.OBJECT_SERVER
            ]
        if not peers:
            return Completion(Cell.settled(None, None))
        cell: Cell[None] = Cell()
        left = [len(peers)]
        failure: list[BaseException] = []

        def sent(done: Completion[None]) -> None:
            exc = done._cell._exc
            if exc is not None and not isinstance(exc, UnavailableError):
                failure.append(exc)  # a peer that left meanwhile has no Spots to reach
            left[0] -= 1
            if not left[0]:
                cell.try_set(None, failure[0] if failure else None)

        ops = []
        for peer in peers:  # every one encoded before any is sent: all go, or none
            try:
                name, data = self._encode(payload, peer)
            except ProtocolError as exc:
                return failed(exc)
            ops.append((peer, PublishOp(channel, topic, name, data)))
        for peer, op in ops:
            self._send(Route(peer, None, ""), op, metadata, None)._add_inline(sent)
        return Completion(cell, refuse_cancel)

    async def _activate(self, msg: _Intent, forwarded: bool) -> object:
        authority = self.authority
        assert authority is not None
        spot_id = msg.spot_id
        key = (_SPOT, spot_id)
        spot_type = self._instance_type(msg.type_name)
        for _ in range(ATTEMPTS):
            joined = self._inflight.get(key)
            if joined is not None:
                await asyncio.shield(joined.done)  # the first message goes first
                continue
            if self._held(_SPOT, spot_id) is not None:
                return await wait(self._deliver(msg, spot_type, 0))
            cached = self._cached_owner(key)
            if cached is not None and cached != self.routing_id:
                return await self._send_with_intent(self._ready_peer(cached), msg)
            record = await authority.read(AuthorityKind.SPOT, spot_id)
            if record is not None:
                owner = record.owner.node
                if owner == self.routing_id:
                    if key not in self._inflight:
                        await self._own_leftover(key, record)
                    continue
                if record.state is AuthorityState.RESERVED and not await self._lease_live(
                    record.owner
                ):
                    await authority.take_over_stale(record)
                    continue
                # Ready or being activated there: the message goes there, with its intent
                # (once its connection is up, as for every call: `_connected_peer`).
                peer = await self._connected_peer(
                    owner,
                    self.runtime.default_request_timeout,
                    f"the owner {owner!r} of {spot_id!r}",
                )
                if record.state is AuthorityState.READY:
                    self._remember_record(record)
                return await self._send_with_intent(peer, msg)
            if spot_type is not None and (forwarded or msg.type_name is None or self._admitting()):
                result = await self._activate_here(msg, spot_type)
                if result is _RETRY:
                    continue
                return result
            if forwarded or msg.type_name is None:
                raise NotFoundError(
                    f"no Spot {spot_id!r} and no InstanceSpot type to activate it here"
                    + ("" if msg.type_name is not None else ": pass one to activate()")
                )
            # Never placed on a node whose lease does not admit (this one included).
            placed = self._place(_SPOT, msg.type_name, spot_type is not None)
            if placed is None:
                assert spot_type is not None
                result = await self._activate_here(msg, spot_type)  # refused: FENCED
                if result is _RETRY:
                    continue
                return result
            return await self._send_with_intent(placed, msg)
        raise UnavailableError(
            f"Spot {spot_id!r}: the record kept changing; try again",
            reason=UnavailableReason.CONTENDED,
        )

    def _instance_type(self, type_name: str | None) -> type | None:
        """This node's InstanceSpot type of that name (None: any one of this node's, if
        it has exactly one); None when this node cannot activate it."""
        types = [
            info.cls
            for info in self.runtime.engine.types.values()
            if issubclass(info.cls, InstanceSpot)
        ]
        if type_name is None:
            if len(types) > 1:
                names = ", ".join(sorted(cls.__qualname__ for cls in types))
                raise InvalidOperationError(
                    f"several InstanceSpot types are registered ({names}): pass one to activate()"
                )
            return types[0] if types else None
        info = self.runtime.engine.types.get(type_name)
        return info.cls if info is not None and info.cls in types else None

    async def _activate_here(self, msg: _Intent, spot_type: type) -> object:
        authority = self.authority
        assert authority is not None
        spot_id = msg.spot_id
        key = (_SPOT, spot_id)
        name = self.runtime.engine.by_class[spot_type].name
        fence = self._fence(f"activating Spot {spot_id!r}")
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inflight[key] = _Inflight(name, done)
        try:
            reserved = await authority.reserve(AuthorityKind.SPOT, spot_id, name, fence)
            if isinstance(reserved, Conflict):
                return _RETRY
            try:
                # Off the I/O loop: the activation runs the Spot's constructor (user code).
                delivered = await asyncio.to_thread(
                    self._deliver, msg, spot_type, reserved.generation
                )
            except BaseException:
                await quietly(authority.abort(reserved))
                raise
            if self._held(_SPOT, spot_id) is None:
                await quietly(authority.abort(reserved))  # refused before it activated
            else:
                await self._commit(reserved, _SPOT, spot_id, None)
        finally:
            del self._inflight[key]
            done.set_result(None)
        return await wait(delivered)

    def _deliver(self, msg: _Intent, spot_type: type | None, generation: int) -> Completion[Any]:
        due = msg.due
        left = None if due is None else max(due - self.runtime.timers._now(), 1e-3)
        return activate_here(
            self.runtime,
            msg.spot_id,
            spot_type,
            msg.payload,
            msg.metadata,
            msg.reply,
            left,
            msg.token,
            generation,
        )

    async def _send_with_intent(self, peer: Peer, msg: _Intent) -> object:
        route = Route(peer, _SPOT, msg.spot_id)
        intent = "" if msg.type_name is None else msg.type_name
        if msg.due is None:
            sent: Completion[Any] = self._send(route, msg.payload, msg.metadata, intent)
            return await wait(sent)
        left = self.loop_calls.left(msg.due)
        key = (_SPOT, msg.spot_id)
        asked = self.outbound.request_to(
            route, msg.payload, msg.metadata, msg.reply, left, msg.token, intent, key, msg.due
        )
        return await wait(asked)

    def _receive_send(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        if not self._received_global(rec, env, peer):
            super()._receive_send(rec, env, peer)

    def _receive_request(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        # `_received_global`'s test, here: the common request costs no frame more.
        if env.target_kind != wire.OBJECTS and env.intent is None:
            super()._receive_request(rec, env, peer)
        else:
            self._received_global(rec, env, peer)

    def _received_global(self, rec: t.Inbound, env: Envelope, peer: Peer) -> bool:
        """Take a record only the global objects handle (an operation between nodes, a
        message with instance intent); False for any other."""
        if env.target_kind == wire.OBJECTS:
            self._receive_operation(rec, env, peer)
        elif env.intent is not None:
            self._receive_intent(rec, env, peer)
        else:
            return False
        return True

    def _receive_intent(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        """A Spot message with instance intent: delivered, or activated here."""
        request = rec.kind is t.InboundKind.REQUEST
        try:
            if env.target_kind != _SPOT.value:
                raise ProtocolError(f"instance intent on a {env.target_kind or 'bare'} message")
            _wire_id(env.target)
            payload = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
        except ProtocolError as exc:
            if request:
                self._release(rec)
                self._reply_error(rec.peer, rec.route_id, exc)
            else:
                self._drop_message(rec, peer, str(exc), decode=True)
            return
        meta = RemoteMetadata(
            env.metadata or {},
            peer.routing_id,
            self._permit(_SPOT, env.target),
            None if request else self._drop_hook(peer),
        )
        name = env.intent or None
        if not request:
            # Its credit goes back once it was admitted here (or refused), as for a send;
            # its permit at the latest then too (it may have gone on to another node).
            sent = self.activate(env.target, name, payload, meta, None, None, None)

            def admitted(done: Completion[None]) -> None:
                self._sent(rec, peer, meta, done)
                meta.started()

            sent._add_inline(admitted)
            return
        self._release(rec)
        now = self._now()
        left = self._caller_due(rec, env, peer, now) - now
        if not left > 0:
            meta.started()
            late = DeadlineExceededError("the request's deadline passed before it arrived")
            self._reply_error(rec.peer, rec.route_id, late)
            return
        done = self.activate(env.target, name, payload, meta, None, left, None)
        route = rec.route_id

        def answer(c: Completion[Any]) -> None:
            meta.started()  # its permit, if its handler never ran
            self._answer(rec.peer, route, c)

        done._add_inline(answer)

    def _receive_operation(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        request = rec.kind is t.InboundKind.REQUEST
        route = rec.route_id
        if request:
            self._release(rec)  # a one-way's credit goes back on each path below
        try:
            op = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
            if self.authority is None:
                raise NotFoundError(f"node {self.routing_id!r} has no Location Store")
            if isinstance(op, CreateOp | CloseOp):
                _wire_id(op.object_id)
        except ZlinkError as exc:
            if request:
                self._reply_error(rec.peer, route, exc)
            else:
                self._drop_message(rec, peer, str(exc), decode=isinstance(exc, ProtocolError))
            return
        if isinstance(op, PublishOp):
            if request:
                self._reply_error(rec.peer, route, ProtocolError("a publish is one-way"))
            else:
                self._receive_publish(rec, op, env)
            return
        if not request:
            self._drop_message(rec, peer, f"a one-way {type(op).__name__}", decode=True)
            return
        now = self._now()
        due = max(self._caller_due(rec, env, peer, now), now + 1e-3)
        work: Coroutine[Any, Any, object]
        if isinstance(op, CreateOp) and op.kind in KIND_OF:
            kind = KIND_OF[op.kind]
            info = self.runtime.engine.types.get(op.object_type)
            if info is not None and info.kind is not kind:
                info = None
            try:
                request_value = self._decode_plain(op.request_type, op.request)
            except ProtocolError as exc:
                self._reply_error(rec.peer, route, exc)
                return
            spec = _Spec(kind, op.object_id, op.object_type, op.exclusive, op.fresh)
            work = self._served_create(spec, info, request_value, due)
        elif isinstance(op, CloseOp) and op.kind in KIND_OF:
            work = self._close(KIND_OF[op.kind], op.object_id, due, True)
        else:
            self._reply_error(rec.peer, route, ProtocolError(f"an unknown operation {op!r}"))
            return
        done = self.loop_calls.spawn(work)
        done.add_done_callback(lambda f: self._answer_future(rec.peer, route, f))

    def _receive_publish(self, rec: t.Inbound, op: PublishOp, env: Envelope) -> None:
        """Publish here; the record's credit goes back once the publish committed here
        (a publish waiting for a slot makes its sender wait, as a full queue does)."""
        try:
            payload = self._decode_plain(op.payload_type, op.payload)
            call = PublishCall(self.runtime, op.channel, op.topic, payload, here=True)
        except (ProtocolError, TypeError, ValueError) as exc:
            self.link.count_bad()
            self._warn_dropped(
                "bad publish",
                rec.peer,
                str(exc),
                "mesh %s: a bad publish from %r: %s",
                rec.peer,
                exc,
            )
            self._release(rec)
            return
        if self.runtime.fenced:
            self._release(rec)
            return
        call._metadata = env.metadata
        try:
            committed = call.submit()
        except ZlinkError:
            self._release(rec)
            return
        committed._add_inline(lambda _: self._release(rec))

    def _answer_future(self, conn: bytes, route: int, done: Future[object]) -> None:
        found = outcome(done)
        if isinstance(found, BaseException):
            self._reply_error(conn, route, found)
            return
        self._reply_value(conn, route, found)

    def _answer(self, conn: bytes, route: int, done: Completion[Any]) -> None:
        exc = done._cell._exc
        if exc is not None:
            self._reply_error(conn, route, exc)
        else:
            self._reply_value(conn, route, done._cell._value)
