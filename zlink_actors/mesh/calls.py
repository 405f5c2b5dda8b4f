"""Calls that leave this node (the engine's remote SPI: `route`, `send`, `request`) and
the replies that come back (docs/mesh.md "What each call waits for")."""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from typing import Any, Final

import transports as t

from .._core.cancellation import CancellationToken
from .._core.completion import Completion, _Cell, failed, settled
from .._core.errors import (
    CancelledError,
    NotFoundError,
    ProtocolError,
    UnavailableError,
    shutting_down,
)
from .._core.pending import operation_bytes
from .._core.validation import rule_type
from .._engine.objects import ObjectKind
from . import codec as wire
from .codec import Codec, Envelope
from .config import (
    PeerState,
)
from .handshake import Handshake
from .peers import LOCAL, Peer
from .state import (
    _CHANNEL,
    _HANDSHAKE_BASE,
    _NODE,
    _refuse_cancel,
    _Route,
    log,
)

__all__ = ["Calls"]

#: A request envelope's leading fields: command, op, route, target kind, target, mesh.
_Head = tuple[int, bytes, int, str, str, str]

#: The envelope's `target_kind` of a route's kind (`ObjectKind.value` is a Python-level
#: property: two calls per message); None is the global objects' own request.
_KIND_NAMES: Final[dict[ObjectKind | None, str]] = {kind: kind.value for kind in ObjectKind}
_KIND_NAMES[None] = wire.OBJECTS


class Calls(Handshake):
    """Calls (see the module docstring)."""

    def route(self, kind: ObjectKind, target: str) -> object:
        if kind is _CHANNEL:
            with self._lock:
                local = None if self._draining else self._weights.get(target)
                picked = self._peers.select(target, local)
            if picked is None:
                return failed(NotFoundError(f"no READY server of channel {target!r} in the mesh"))
            if picked is LOCAL:
                return None
            assert isinstance(picked, Peer)
            # One route object per peer and channel, made once (a frozen dataclass costs
            # a microsecond to build, on every call).
            route = picked.channel_routes.get(target)
            if route is None:
                route = picked.channel_routes[target] = _Route(picked, kind, target)
            return route
        if kind is _NODE:
            mesh, _, rid = target.partition("\x00")
            if mesh != self.config.name:
                return failed(
                    NotFoundError(
                        f"no node {rid!r} in mesh {mesh!r}: this node is in mesh "
                        f"{self.config.name!r} (no relay between meshes)"
                    )
                )
            if rid == self.routing_id:
                if not self.has_node_handler:
                    return failed(NotFoundError(f"node {rid!r} has no node_handler"))
                return None
            peer = self._peers.by_rid.get(rid)  # one dict read: atomic
            if peer is None:
                return failed(NotFoundError(f"no node {rid!r} in mesh {mesh!r}"))
            if peer.state is not PeerState.READY:
                return failed(UnavailableError(f"node {rid!r} is {peer.state.value}"))
            if not peer.has_node_handler:
                return failed(NotFoundError(f"node {rid!r} has no node_handler"))
            route = peer.node_route  # made once per peer, as the channel routes above
            if route is None:
                route = peer.node_route = _Route(peer, kind, rid)
            return route
        return None  # Spots and Actors: the global objects (routing.py) decide

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        assert isinstance(route, _Route)
        return self._send(route, payload, metadata, None)

    def _send(
        self,
        route: _Route,
        payload: object,
        metadata: dict[str, object] | None,
        intent: str | None,
    ) -> Completion[None]:
        """`send`, with the instance intent of a Spot message (None: none)."""
        try:
            type_name, data = self._encode(payload, route.peer)
            env = wire.encode_fields(
                wire.SEND,
                target_kind=_KIND_NAMES[route.kind],
                target=route.target,
                mesh=self.config.name,
                metadata=metadata,
                type_name=type_name,
                intent=intent,
            )
        except ProtocolError as exc:
            return failed(exc)
        frames = [env, data]
        transport = self._transport
        assert transport is not None
        peer = route.peer
        try:
            result = transport.submit(peer.conn, frames)
        except t.UnknownPeer:
            return failed(UnavailableError(f"node {peer.routing_id!r} is lost"))
        except t.Closed:
            return failed(shutting_down())
        except t.PayloadTooLarge as exc:
            return failed(ProtocolError(str(exc)))
        if result.status is t.SubmitStatus.OK:
            return settled(None)
        admitted = result.admitted
        assert admitted is not None
        cell: _Cell[None] = _Cell()
        admitted.add_done_callback(
            lambda done: cell.try_set(None, self._submit_failure(done, peer))
        )
        # SC §5/§7: a waiting send has no timeout and refuses caller cancellation.
        return Completion(cell, _refuse_cancel)

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        assert isinstance(route, _Route)
        return self._request(route, payload, metadata, reply, timeout, cancel, None, None)

    def _request(
        self,
        route: _Route,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
        intent: str | None,
        cache_key: object,
    ) -> Completion[Any]:
        """`request`, with the instance intent of a Spot message (None: none) and the
        route-cache entry an `UnavailableError` reply invalidates (None: none)."""
        peer = route.peer
        try:
            type_name, data = self._encode(payload, peer)
        except ProtocolError as exc:
            return failed(exc)
        runtime = self.runtime
        cell: _Cell[Any] = _Cell()
        entry = runtime.begin(cell, timeout, cancel)
        handle = Completion(cell, entry.cancel)  # `runtime.handle(entry)`, inlined
        route_id = entry.route_id
        if route_id is None:
            return handle
        out = _Outgoing(self, peer, route_id, cell, reply, cache_key)
        # Before it is entered below: whichever terminal wins from now on cleans up (a
        # partial: no frame of its own between the settle and the cleanup).
        entry.on_finish = partial(self._request_finished, peer, route_id, cell)
        with self._lock:
            live = peer.state is PeerState.READY and not self._closed
            if live:
                peer.inflight.add(route_id)
                self._calls[route_id] = out
        if not live:
            runtime.fail_entry(
                entry, UnavailableError(f"node {peer.routing_id!r} is {peer.state.value}")
            )
            return handle
        if route_id not in runtime.pending._entries:  # (not `in pending`: a Python call)
            # It ended meanwhile (deadline, cancellation, shutdown), maybe before its
            # `on_finish` was set: clean up here, and send nothing.
            self._request_finished(peer, route_id, cell)
            return handle
        transport = self._transport
        assert transport is not None
        fields: _Head = (
            wire.REQUEST,
            operation_bytes(route_id),
            route_id,
            _KIND_NAMES[route.kind],
            route.target,
            self.config.name,
        )
        try:
            frames = [
                wire.encode_fields(*fields, timeout, metadata, type_name, intent=intent),
                data,
            ]
        except ProtocolError as exc:  # metadata msgspec cannot encode: nothing is sent
            runtime.fail_entry(entry, exc)
            return handle
        # What a parked request sends once admitted (`_Outgoing.refresh`).
        out.resend = (fields, runtime.timers._now() + timeout, metadata, type_name, intent, data)
        refresh = out.refresh
        try:
            result = transport.submit_request(peer.conn, route_id, frames, refresh=refresh)
        except t.UnknownPeer:
            runtime.fail_entry(entry, UnavailableError(f"node {peer.routing_id!r} is lost"))
            return handle
        except t.Closed:
            runtime.fail_entry(entry, shutting_down())
            return handle
        except t.PayloadTooLarge as exc:
            runtime.fail_entry(entry, ProtocolError(str(exc)))
            return handle
        if result.no_slot:
            runtime.fail_entry(
                entry,
                UnavailableError(f"all completion slots towards {peer.routing_id!r} are in use"),
            )
        elif result.admitted is not None:
            parked = result.admitted

            def admitted(done: Future[None]) -> None:
                exc = self._submit_failure(done, peer)
                if exc is not None:
                    runtime.fail_entry(entry, exc)

            parked.add_done_callback(admitted)
            with self._lock:
                self._parked[route_id] = parked
            if route_id not in runtime.pending:  # it ended while we parked it
                self._withdraw(peer, route_id)
        return handle

    def _withdraw(self, peer: Peer, route_id: int) -> bool:
        """Take a request that ended (timeout, cancellation) back from the transport if
        it still waits for credit: then it is never sent. True if it was."""
        with self._lock:
            parked = self._parked.pop(route_id, None)
        return parked is not None and self._take_back(peer, parked)

    def _take_back(self, peer: Peer, parked: Future[None]) -> bool:
        transport = self._transport
        if parked.done() or transport is None:
            return False
        return transport.withdraw(peer.conn, parked)

    def _request_finished(self, peer: Peer, route_id: int, cell: _Cell[Any]) -> None:
        with self._lock:  # once (`_withdraw` inlined): this runs for every request
            peer.inflight.discard(route_id)
            self._calls.pop(route_id, None)
            parked = self._parked.pop(route_id, None)
        if parked is not None and self._take_back(peer, parked):
            return  # never sent: nothing to tell the peer
        if isinstance(cell._exc, CancelledError) and peer.state is PeerState.READY:
            # Best effort: the receiver skips the request if its handler has not started.
            self._submit_quietly(peer.conn, Envelope(wire.CANCEL, route=route_id), b"")

    def _submit_failure(self, done: Future[None], peer: Peer) -> BaseException | None:
        exc = done.exception()
        if exc is None:
            return None
        if isinstance(exc, t.Closed):
            return shutting_down()
        return UnavailableError(f"node {peer.routing_id!r} was lost while the call waited: {exc}")

    def _receive_reply(self, rec: t.Inbound) -> None:
        route = rec.route_id
        try:
            env = wire._ENVELOPE_DECODER.decode(rec.frames[0])  # as in `Inbound._receive`
        except Exception:
            env = None
        try:
            if env is None:
                env = wire.decode_envelope(rec.frames[0]) if rec.frames else None
            if env is None:
                raise ProtocolError("a reply with no envelope")
        except ProtocolError as bad:
            with self._lock:
                self.decode_errors += 1
                call = self._calls.get(route)
            log.warning("mesh %s: a bad reply from %r: %s", self.routing_id, rec.peer, bad)
            if call is not None:
                self.runtime.pending.finish(
                    route, exc=ProtocolError(f"an undecodable reply: {bad}")
                )
            return
        if route & _HANDSHAKE_BASE:
            self._receive_admit(rec, env)
            return
        call = self._calls.get(route)  # one dict read: atomic
        if call is None or rec.peer not in call.peer.conns:
            with self._lock:
                if call is None:
                    self.late_replies += 1
                else:  # another node answering our request: not its to answer
                    self.decode_errors += 1
            if call is not None:
                log.warning(
                    "mesh %s: a reply from %r to a request sent elsewhere",
                    self.routing_id,
                    rec.peer,
                )
            return
        value: object = None
        exc: BaseException | None = None
        if env.error_kind >= 0:
            exc = Codec.decode_error(env.error_kind, env.error)
            if call.cache_key is not None and isinstance(exc, UnavailableError):
                self._routes.pop(call.cache_key, None)  # a stale owner: resolve again next call
        else:
            reply = call.reply
            try:
                data = rec.frames[1] if len(rec.frames) > 1 else b""
                name = env.type_name
                if reply is None and name and name not in self.codec.registry:
                    name = ""  # no reply= and a type this Host does not know: plain values
                value = self.codec.decode_payload(
                    name, data, None if reply is None else rule_type(reply)
                )
                if reply is not None and not isinstance(value, reply):
                    raise ProtocolError(f"the reply is a {type(value).__name__}, not of reply=")
            except ProtocolError as error:
                exc = error
        if not self.runtime.pending.finish(route, value, exc):
            with self._lock:
                self.late_replies += 1


class _Outgoing:
    """One request of ours in flight (`NodeState._calls`): what its reply is checked
    against, and what a parked request sends once admitted. One object, where
    closures over the call's variables were three functions and a dozen cells."""

    __slots__ = ("cache_key", "cell", "node", "peer", "reply", "resend", "route_id")

    def __init__(
        self,
        node: Calls,
        peer: Peer,
        route_id: int,
        cell: _Cell[Any],
        reply: type | None,
        cache_key: object,
    ) -> None:
        self.node = node
        self.peer = peer
        self.route_id = route_id
        self.cell = cell
        #: The `reply=` rule, and the route-cache entry an `UnavailableError` reply drops.
        self.reply = reply
        self.cache_key = cache_key
        #: (the envelope's leading fields, due, metadata, type name, intent, payload).
        self.resend: (
            tuple[_Head, float, dict[str, object] | None, str, str | None, bytes] | None
        ) = None

    def refresh(self) -> list[bytes]:
        # Parked, then admitted: the budget it has left now travels (never 0, which
        # the receiver reads as "already late"; a request that ended was withdrawn).
        assert self.resend is not None
        fields, due, metadata, type_name, intent, data = self.resend
        budget = max(due - self.node.runtime.timers._now(), 1e-6)
        return [wire.encode_fields(*fields, budget, metadata, type_name, intent=intent), data]
