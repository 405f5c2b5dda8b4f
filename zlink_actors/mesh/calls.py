"""Calls that leave this node (the engine's remote SPI: `route`, `send`, `request`) and
the replies that come back (docs/mesh.md "What each call waits for")."""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future
from typing import Any, Final

import transports as t

from .._core.cancellation import CancellationToken
from .._core.completion import Completion, failed
from .._core.errors import (
    CancelledError,
    NotFoundError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
from .._core.pending import (
    OPERATION_HIGH_BYTES,
    PendingCell,
    PendingTable,
    begin,
    block,
    result_or_cancel,
)
from .._core.state import HostState
from .._core.validation import STRUCT_META, rule_type
from .._engine.objects import ObjectKind
from . import codec as wire
from .codec import Codec, Envelope
from .config import (
    PeerState,
)
from .handshake import Handshake
from .peers import LOCAL, Peer, unusable
from .shared import (
    CHANNEL,
    HANDSHAKE_BASE,
    KIND_NAMES,
    NODE,
    Route,
    admission_error,
    log,
)

__all__ = ["Calls"]

#: A request envelope's leading fields: command, op, route, target kind, target, mesh.
_Head = tuple[int, bytes, int, str, str, str]

_SERVING: Final = HostState.SERVING
#: Read on every request (an Enum member read from its class costs about 0.1 us more
#: than a module constant on Python 3.11).
_READY: Final = PeerState.READY
#: The longest timed lock wait the platform accepts; a longer deadline takes the timer.
_WAIT_MAX: Final = threading.TIMEOUT_MAX


class Calls(Handshake):
    """Calls (see the module docstring)."""

    def route(self, kind: ObjectKind, target: str) -> object:
        if kind is CHANNEL:
            with self._lock:
                local = None if self.shared.draining else self.shared.weights.get(target)
                picked = self._peers.select(target, local, self.shared.lease_state == "fenced")
            if picked is None:
                return failed(NotFoundError(f"no READY server of channel {target!r} in the mesh"))
            if picked is LOCAL:
                return None
            assert isinstance(picked, Peer)
            # One route object per peer and channel, made once (a frozen dataclass costs
            # a microsecond to build, on every call).
            route = picked.channel_routes.get(target)
            if route is None:
                route = picked.channel_routes[target] = Route(picked, kind, target)
            return route
        if kind is NODE:
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
            if peer.state is not _READY:
                return failed(
                    UnavailableError(f"node {rid!r} is {peer.state.value}", reason=unusable(peer))
                )
            if not peer.has_node_handler:
                return failed(NotFoundError(f"node {rid!r} has no node_handler"))
            route = peer.node_route  # made once per peer, as the channel routes above
            if route is None:
                route = peer.node_route = Route(peer, kind, rid)
            return route
        return None  # Spots and Actors: the global objects (routing.py) decide

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        assert isinstance(route, Route)
        return self.delivery.send(route, payload, metadata, None)

    def _receive_notice(self, rec: t.Inbound) -> None:
        """FULL and OPEN of a target of the peer; the other notices as `Handshake`'s."""
        try:
            env = wire._ENVELOPE_DECODER.decode(rec.frames[0])
        except Exception:  # `Handshake._receive_notice` decodes it again and says why
            env = None
        if env is None or env.command not in (wire.FULL, wire.OPEN):
            super()._receive_notice(rec)
            return
        peer = self._peers.by_conn.get(rec.peer)
        if peer is None:
            return  # from a connection whose peer is gone: nothing waits for it
        if env.command == wire.OPEN:
            self.delivery.open(peer, (env.target_kind, env.target), env.route)
        else:
            self.delivery.full(rec.peer, env, peer)

    def _resume(self, peer: Peer, conn: bytes, hello: Any) -> bool:
        """`Handshake._resume` (its one-ways go again), then our requests still pending
        for it are sent again (`_resend`)."""
        if not super()._resume(peer, conn, hello):
            return False
        again = self._resend(peer, conn)
        if again:
            log.info(
                "mesh %s: peer %s resumed: %d request(s) in flight to it sent again",
                self.routing_id,
                peer.routing_id,
                again,
            )
        return True

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        assert isinstance(route, Route)
        return self._request(route, payload, metadata, reply, timeout, cancel, None, None)

    def _request(
        self,
        route: Route,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
        intent: str | None,
        cache_key: object,
        caller_due: float = math.inf,
    ) -> Completion[Any]:
        """`request`, with the instance intent of a Spot message (None: none), the
        route-cache entry an `UnavailableError` reply invalidates (None: none) and the
        deadline of the call this request is a step of (Host clock; `timeout` is what was
        left of it, rounded up: the receiver is told the earlier of the two)."""
        peer = route.peer
        try:
            type_name, data = self._encode(payload, peer)
        except ProtocolError as exc:
            return failed(exc)
        runtime = self.runtime
        due = runtime.timers._now() + timeout
        out = _Outgoing(self, peer, reply, cache_key, runtime.pending)
        sent = due if due < caller_due else caller_due
        args = (out, route, data, type_name, metadata, timeout, sent, intent)
        begin(runtime, out, timeout, due, cancel, self._launch, args)
        return Completion(out, out)

    def request_sync(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
    ) -> Any:
        """`request(...)` with no token, for an application thread that blocks for its
        result (`submit_sync()`): the caller keeps the deadline in its own timed wait (no
        handle, no deadline scan or timer entry) and races for the terminal like any
        other path when it passes, as a local `submit_sync()` does
        `RequestCall._request_sync` (both `pending.block`)."""
        runtime = self.runtime
        if type(route) is not Route or not runtime.real_time or timeout > _WAIT_MAX:
            # Not a node's or channel's route, or only the timer can keep this deadline.
            done = self.request(route, payload, metadata, reply, timeout, None)
            return result_or_cancel(done)
        peer = route.peer
        type_name, data = self._encode(payload, peer)  # ProtocolError: nothing was sent
        due = runtime.timers._now() + timeout
        out = _Outgoing(self, peer, reply, None, runtime.pending)
        args = (out, route, data, type_name, metadata, timeout, due, None)
        return block(runtime, out, timeout, self._launch, args)

    def _launch(
        self,
        out: _Outgoing,
        route: Route,
        data: bytes,
        type_name: str,
        metadata: dict[str, object] | None,
        timeout: float,
        due: float,
        intent: str | None,
    ) -> None:
        """Send registered request `out` (its terminal ends it in every failure); `due`
        is its caller's deadline on the Host clock, which travels when that is the real
        one (docs/mesh.md "Deadlines across nodes")."""
        peer = route.peer
        route_id = out.route_id
        pending = self.runtime.pending
        with self._lock:
            live = peer.state is _READY and not self.shared.closed
            if live:
                peer.inflight.add(route_id)
                self._calls[route_id] = out
        if not live:
            pending.finish(
                route_id,
                exc=UnavailableError(
                    f"node {peer.routing_id!r} is {peer.state.value}", reason=unusable(peer)
                ),
            )
            return
        if route_id not in pending._entries:  # (not `in pending`: a Python call)
            # It ended meanwhile (deadline, cancellation, shutdown), maybe before it was
            # entered above: clean up here, and send nothing.
            out.on_settled(*out.outcome())
            return
        transport = self.shared.transport
        assert transport is not None
        fields: _Head = (
            wire.REQUEST,
            OPERATION_HIGH_BYTES + route_id.to_bytes(8, "big"),  # `operation_bytes`, inline
            route_id,
            KIND_NAMES[route.kind],
            route.target,
            self.config.name,
        )
        # Its number among our requests to this lifecycle of the peer (`Envelope.seq`):
        # the receiver runs a request sent again after a pause only if this one never
        # reached it. Taken atomically; two callers' may cross on the way (it copes).
        seq = next(peer.req_numbers)
        try:
            wire_due = due if self._real_time else 0.0
            frames = [
                wire.encode_request(fields, timeout, metadata, type_name, intent, wire_due, seq),
                data,
            ]
        except ProtocolError as exc:  # metadata msgspec cannot encode: nothing is sent
            pending.finish(route_id, exc=exc)
            return
        # What a parked request sends once admitted, or on resume (`_Outgoing.refresh`).
        out.resend = (fields, due, metadata, type_name, intent, data, seq)
        self._submit_request(out, peer.conn, frames)

    def _submit_request(self, out: _Outgoing, conn: bytes, frames: list[bytes]) -> None:
        """Hand request `out`'s `frames` to the transport on connection `conn`; every
        failure ends it (a silent peer's loss while it is parked keeps it pending, for
        the resume: `_lost_while_parked`)."""
        peer = out.peer
        route_id = out.route_id
        pending = self.runtime.pending
        transport = self.shared.transport
        if transport is None:
            pending.finish(route_id, exc=shutting_down())
            return
        try:
            result = transport.submit_request(conn, route_id, frames, refresh=out.refresh)
        except t.UnknownPeer:
            if peer.state is _READY and peer.conn != conn:
                # It resumed on another connection meanwhile, and this was not sent.
                self._submit_request(out, peer.conn, frames)
                return
            if self._lost_while_parked(out, None):
                return  # lost meanwhile, silent: it goes again on resume
            pending.finish(
                route_id,
                exc=UnavailableError(
                    f"node {peer.routing_id!r} is lost", reason=UnavailableReason.PEER_LOST
                ),
            )
            return
        except t.Closed:
            pending.finish(route_id, exc=shutting_down())
            return
        except t.PayloadTooLarge as exc:
            pending.finish(route_id, exc=ProtocolError(str(exc)))
            return
        if result.no_slot:
            full = f"all completion slots towards {peer.routing_id!r} are in use"
            pending.finish(
                route_id, exc=UnavailableError(full, reason=UnavailableReason.QUEUE_FULL)
            )
        elif result.admitted is not None:
            parked = result.admitted

            def admitted(done: Future[None]) -> None:
                exc = admission_error(done, peer)
                if exc is not None and not self._lost_while_parked(out, done):
                    pending.finish(route_id, exc=exc)

            parked.add_done_callback(admitted)
            with self._lock:
                self._parked[route_id] = parked
            if route_id not in pending:  # it ended while we parked it
                self._withdraw(peer, route_id)

    def _lost_while_parked(self, out: _Outgoing, done: Future[None] | None) -> bool:
        """True when request `out` stays pending although the transport gave it back
        (its admission `done` failed, or None: its connection was unknown): its peer went
        silent, may resume, and is sent it again then (`_resend`)."""
        peer = out.peer
        if not peer.resends or peer.expired:
            return False
        if done is None:
            # The loss is (or will be) handled by `_conn_lost`, which decides for every
            # request in flight: unless it was found closed, not silent.
            return not (
                peer.state is PeerState.LOST and peer.lost_reason is UnavailableReason.PEER_LOST
            )
        exc = done.exception()
        if not (isinstance(exc, t.PeerLost) and exc.silent):
            return False
        with self._lock:
            self._parked.pop(out.route_id, None)
        return True

    def _resend(self, peer: Peer, conn: bytes) -> int:
        """`peer` resumed on `conn`: send it again (`REQUEST_AGAIN`), oldest first, each
        request of ours still pending for it, with the budget it has left; it runs one
        only if the first never reached it (docs/mesh.md "Requests across a pause").
        Returns how many went."""
        with self._lock:
            outs = [self._calls.get(route) for route in peer.inflight]
        again = sorted(
            (out for out in outs if out is not None and out.resend is not None),
            key=lambda out: out.resend[6] if out.resend is not None else 0,
        )
        for out in again:
            resend = out.resend
            assert resend is not None
            if out.route_id not in self.runtime.pending._entries:
                continue  # it ended meanwhile
            fields = (wire.REQUEST_AGAIN, *resend[0][1:])
            out.resend = (fields, *resend[1:])
            try:
                frames = out.refresh()
            except ProtocolError as exc:  # (it encoded the first time)
                self.runtime.pending.finish(out.route_id, exc=exc)
                continue
            self._submit_request(out, conn, frames)
        return len(again)

    def _withdraw(self, peer: Peer, route_id: int) -> bool:
        """Take a request that ended (timeout, cancellation) back from the transport if
        it still waits for credit: then it is never sent. True if it was."""
        with self._lock:
            parked = self._parked.pop(route_id, None)
        return parked is not None and self._take_back(peer, parked)

    def _take_back(self, peer: Peer, parked: Future[None]) -> bool:
        transport = self.shared.transport
        if parked.done() or transport is None:
            return False
        return transport.withdraw(peer.conn, parked)

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
                self.link.decode_errors += 1  # (under `_lock`, the link's)
                call = self._calls.get(route)
            self._warn_dropped(
                "bad reply", rec.peer, str(bad), "mesh %s: a bad reply from %r: %s", rec.peer, bad
            )
            if call is not None:
                self.runtime.pending.finish(
                    route, exc=ProtocolError(f"an undecodable reply: {bad}")
                )
            return
        if route & HANDSHAKE_BASE:
            self._receive_admit(rec, env)
            return
        call = self._calls.get(route)  # one dict read: atomic
        if call is None or rec.peer not in call.peer.conns:
            with self._lock:
                if call is None:
                    self.late_replies += 1
                else:  # another node answering our request: not its to answer
                    self.link.decode_errors += 1  # (under `_lock`, the link's)
            if call is not None:
                self._warn_dropped(
                    "misrouted reply",
                    rec.peer,
                    None,
                    "mesh %s: a reply from %r to a request sent elsewhere",
                    rec.peer,
                )
            return
        value: object = None
        exc: BaseException | None = None
        if env.error_kind >= 0:
            exc = Codec.decode_error(env.error_kind, env.error, env.reason)
            if call.cache_key is not None and isinstance(exc, UnavailableError):
                self._routes.pop(call.cache_key, None)  # a stale owner: resolve again next call
        else:
            reply = call.reply
            try:
                data = rec.frames[1] if len(rec.frames) > 1 else b""
                name = env.type_name
                if reply is None and name and name not in self.codec.registry:
                    name = ""  # no reply= and a type this Host does not know: plain values
                # `rule_type`'s frame only for a rule that is not a class itself (as in
                # `_MessageCall.__init__`): a plain class or a Struct class is its own.
                into: object = reply
                if reply is not None and type(reply) is not type and type(reply) is not STRUCT_META:
                    into = rule_type(reply)
                value = self.codec.decode_payload(name, data, into)
                if reply is not None and not isinstance(value, reply):
                    raise ProtocolError(f"the reply is a {type(value).__name__}, not of reply=")
            except ProtocolError as error:
                exc = error
        if not self.runtime.pending.finish(route, value, exc):
            with self._lock:
                self.late_replies += 1


class _Outgoing(PendingCell):
    """One request of ours in flight, in one object: its result cell, its pending entry,
    its caller's canceller, what its reply is checked against (`NodeState._calls`), and
    what it sends once admitted if it was parked. `pending.begin` (or `block`, for a
    caller blocked in `request_sync`) registers it and decides how it ends."""

    __slots__ = ("cache_key", "node", "peer", "reply", "resend")

    def __init__(
        self, node: Calls, peer: Peer, reply: type | None, cache_key: object, table: PendingTable
    ) -> None:
        super().__init__(table.cell_lock)
        self.node = node
        self.peer = peer
        #: The `reply=` rule, and the route-cache entry an `UnavailableError` reply drops.
        self.reply = reply
        self.cache_key = cache_key
        #: (the envelope's leading fields, due, metadata, type name, intent, payload,
        #: its request number).
        self.resend: (
            tuple[_Head, float, dict[str, object] | None, str, str | None, bytes, int] | None
        ) = None

    def on_settled(self, value: object, exc: BaseException | None) -> None:
        """It ended (its winner calls this after completing its caller): it leaves the
        node's tables, and a parked one is taken back; a cancelled one that was sent is
        told to the peer."""
        node, peer, route_id = self.node, self.peer, self.route_id
        # No lock (this runs for every request, on the thread that settled it, while
        # callers take `_lock` in `_launch`): each removal is one atomic set or dict
        # operation, and whichever order it runs in with `_launch`'s entering (under
        # the lock) and parking, `_launch` looks at the pending table after each and
        # cleans up itself if the request ended; `_withdraw` pops `_parked` atomically
        # too, so one of the two gets a parked request back.
        peer.inflight.discard(route_id)
        node._calls.pop(route_id, None)
        parked = node._parked.pop(route_id, None)
        if parked is not None and node._take_back(peer, parked):
            return  # never sent: nothing to tell the peer
        if isinstance(exc, CancelledError) and peer.state is PeerState.READY:
            # Best effort: the receiver skips the request if its handler has not started.
            node._submit_quietly(peer.conn, Envelope(wire.CANCEL, route=route_id), b"")

    def refresh(self) -> list[bytes]:
        # Parked, then admitted: the budget it has left now travels (never 0, which
        # the receiver reads as "already late"; a request that ended was withdrawn).
        assert self.resend is not None
        fields, due, metadata, type_name, intent, data, seq = self.resend
        node = self.node
        budget = max(due - node._now(), 1e-6)
        wire_due = due if node._real_time else 0.0
        return [
            wire.encode_request(fields, budget, metadata, type_name, intent, wire_due, seq),
            data,
        ]
