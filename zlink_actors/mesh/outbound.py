"""Calls that leave this node and the replies that come back (docs/mesh.md "What each
call waits for"): `Outbound` is the engine's remote SPI (`RemoteRoutes`, the Host's
`runtime.remote`).

A node's or channel's route is decided here; a Spot's or Actor's by the route cache the
node registers (`ObjectRoutes`, `route_objects`), and without one it stays local. A
one-way goes to `Delivery`. A request is one `_Outgoing`, registered in the pending
table before anything is sent (`pending.begin`, or `pending.block` for a caller blocked
in `request_sync`), kept here by route id while it is in flight (`Peer.inflight` too),
parked with the transport while it waits for credit, sent again when its peer resumes
after a pause (`resend`), and ended by its reply (`receive_reply`), by its peer's loss
(`fail_inflight`) or by the node's close (`fail_all`).

Threads: the calls run on the caller's thread; the replies on the transport's I/O
thread. The node lock guards the tables; it is never held while a completion or a
callback runs.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future
from typing import Any, Final, Protocol

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
from .._core.validation import STRUCT_META, rule_type
from .._engine.objects import ObjectKind
from . import codec as wire
from .codec import Codec, Envelope
from .config import PeerState
from .delivery import Delivery
from .peers import LOCAL, Peer, PeerTable, unusable
from .shared import (
    CHANNEL,
    KIND_NAMES,
    NODE,
    Link,
    NodeShared,
    Route,
    admission_error,
    log,
)

__all__ = ["ObjectRoutes", "Outbound"]

#: A request envelope's leading fields: command, op, route, target kind, target, mesh.
_Head = tuple[int, bytes, int, str, str, str]

_SPOT: Final = ObjectKind.SPOT
_ACTOR: Final = ObjectKind.ACTOR
#: Read on every request (an Enum member read from its class costs about 0.1 us more
#: than a module constant on Python 3.11).
_READY: Final = PeerState.READY
#: The longest timed lock wait the platform accepts; a longer deadline takes the timer.
_WAIT_MAX: Final = threading.TIMEOUT_MAX


class ObjectRoutes(Protocol):
    """Where calls to Spots and Actors go (the route cache of a node with a Location
    Store), registered with `Outbound.route_objects`."""

    def route(self, kind: ObjectKind, target: str) -> object:
        """As `RemoteRoutes.route`, for a Spot or an Actor (`kind`)."""
        ...

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        """A one-way along a route `route` gave that is not a `Route` (to be resolved)."""
        ...

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A request along a route `route` gave that is not a `Route` (to be resolved)."""
        ...

    def forget(self, key: object) -> None:
        """Drop the cached route `key` (its owner answered `UnavailableError`)."""
        ...


class Outbound:
    """The calls this node sends and their replies (see the module docstring).

    Counter (read under the node lock): `late_replies`, replies that found their request
    finished already (dropped)."""

    def __init__(
        self, shared: NodeShared, link: Link, peers: PeerTable, delivery: Delivery
    ) -> None:
        """`peers`: the node's peer table (read here, changed by the handshake);
        `delivery`: where one-ways go, and the payload encoder."""
        #: `RemoteRoutes.first`: the kinds routed before the local table is looked at.
        self.first = frozenset({CHANNEL, NODE})
        self.late_replies = 0
        self._shared = shared
        self._runtime = shared.runtime
        self._pending = shared.runtime.pending
        self._codec: Codec = shared.codec
        self._mesh = shared.config.name
        self._routing_id = shared.routing_id
        self._lock = shared.lock
        #: The Host clock (deadlines), and whether it is the real `time.monotonic()`.
        self._now = shared.now
        self._real_time = shared.real_time
        self._peers = peers
        self._link = link
        self._warn_dropped = link.warn_dropped
        self._submit_quietly = link.submit_quietly
        self._encode = delivery.encode
        self._send = delivery.send
        #: Our requests in flight: route id -> its `_Outgoing` (peer, reply rule, the
        #: route-cache key an `UnavailableError` reply drops).
        self._calls: dict[int, _Outgoing] = {}
        #: Those of them still parked for credit: route id -> their `admitted` future.
        self._parked: dict[int, Future[None]] = {}
        #: The route cache, for Spots and Actors (`route_objects`; None: they stay local).
        self._objects: ObjectRoutes | None = None

    def route_objects(self, routes: ObjectRoutes) -> None:
        """Calls to Spots and Actors go to `routes` from now on (the node registers its
        route cache once, as it is built)."""
        self._objects = routes

    def route(self, kind: ObjectKind, target: str) -> object:
        """A node's or channel's route, decided here; a Spot's or Actor's, by the route
        cache registered with `route_objects` (None without one: it stays local)."""
        if kind is CHANNEL:
            shared = self._shared
            with self._lock:
                local = None if shared.draining else shared.weights.get(target)
                picked = self._peers.select(target, local, shared.lease_state == "fenced")
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
            if mesh != self._mesh:
                return failed(
                    NotFoundError(
                        f"no node {rid!r} in mesh {mesh!r}: this node is in mesh "
                        f"{self._mesh!r} (no relay between meshes)"
                    )
                )
            if rid == self._routing_id:
                if not self._shared.has_node_handler:
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
        objects = self._objects
        # Spots and Actors: the route cache decides (without one they stay local).
        return None if objects is None else objects.route(kind, target)

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        """A one-way along `route`: a `Route` goes to `Delivery`; one to be resolved,
        to the route cache."""
        if type(route) is Route:
            return self._send(route, payload, metadata, None)
        objects = self._objects
        assert objects is not None
        return objects.send(route, payload, metadata)

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A request along `route`: a `Route` is sent from here (one to a Spot or Actor
        names the route-cache entry its owner's `UnavailableError` reply drops); one to
        be resolved goes to the route cache."""
        if type(route) is Route:
            kind = route.kind
            key = (kind, route.target) if kind is _SPOT or kind is _ACTOR else None
            return self.request_to(route, payload, metadata, reply, timeout, cancel, None, key)
        objects = self._objects
        assert objects is not None
        return objects.request(route, payload, metadata, reply, timeout, cancel)

    def request_to(
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
        due = self._now() + timeout
        out = _Outgoing(self, peer, reply, cache_key, self._pending)
        sent = due if due < caller_due else caller_due
        args = (out, route, data, type_name, metadata, timeout, sent, intent)
        begin(self._runtime, out, timeout, due, cancel, self._launch, args)
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
        if type(route) is not Route or not self._real_time or timeout > _WAIT_MAX:
            # Not a node's or channel's route, or only the timer can keep this deadline.
            done = self.request(route, payload, metadata, reply, timeout, None)
            return result_or_cancel(done)
        peer = route.peer
        type_name, data = self._encode(payload, peer)  # ProtocolError: nothing was sent
        due = self._now() + timeout
        out = _Outgoing(self, peer, reply, None, self._pending)
        args = (out, route, data, type_name, metadata, timeout, due, None)
        return block(self._runtime, out, timeout, self._launch, args)

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
        pending = self._pending
        with self._lock:
            live = peer.state is _READY and not self._shared.closed
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
        fields: _Head = (
            wire.REQUEST,
            OPERATION_HIGH_BYTES + route_id.to_bytes(8, "big"),  # `operation_bytes`, inline
            route_id,
            KIND_NAMES[route.kind],
            route.target,
            self._mesh,
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
        pending = self._pending
        transport = self._shared.transport
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
        silent, may resume, and is sent it again then (`resend`)."""
        peer = out.peer
        if not peer.resends or peer.expired:
            return False
        if done is None:
            # The loss is (or will be) handled by `Handshake._conn_lost`, which decides for every
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

    def resend(self, peer: Peer, conn: bytes) -> int:
        """`peer` resumed on `conn`: send it again (`REQUEST_AGAIN`), oldest first, each
        request of ours still pending for it, with the budget it has left; it runs one
        only if the first never reached it (docs/mesh.md "Requests across a pause").
        Returns how many went (logged when any did)."""
        with self._lock:
            outs = [self._calls.get(route) for route in peer.inflight]
        again = sorted(
            (out for out in outs if out is not None and out.resend is not None),
            key=lambda out: out.resend[6] if out.resend is not None else 0,
        )
        for out in again:
            resend = out.resend
            assert resend is not None
            if out.route_id not in self._pending._entries:
                continue  # it ended meanwhile
            fields = (wire.REQUEST_AGAIN, *resend[0][1:])
            out.resend = (fields, *resend[1:])
            try:
                frames = out.refresh()
            except ProtocolError as exc:  # (it encoded the first time)
                self._pending.finish(out.route_id, exc=exc)
                continue
            self._submit_request(out, conn, frames)
        if again:
            log.info(
                "mesh %s: peer %s resumed: %d request(s) in flight to it sent again",
                self._routing_id,
                peer.routing_id,
                len(again),
            )
        return len(again)

    def _withdraw(self, peer: Peer, route_id: int) -> bool:
        """Take a request that ended (timeout, cancellation) back from the transport if
        it still waits for credit: then it is never sent. True if it was."""
        with self._lock:
            parked = self._parked.pop(route_id, None)
        return parked is not None and self._take_back(peer, parked)

    def _take_back(self, peer: Peer, parked: Future[None]) -> bool:
        transport = self._shared.transport
        if parked.done() or transport is None:
            return False
        return transport.withdraw(peer.conn, parked)

    def bad_reply(self, rec: t.Inbound, why: str) -> None:
        """A reply whose envelope could not be decoded (`why`): counted and logged; the
        request it answers, if it is ours and pending, ends with a `ProtocolError`."""
        route = rec.route_id
        self._link.count_bad()
        call = self._calls.get(route)  # one dict read: atomic
        self._warn_dropped(
            "bad reply", rec.peer, why, "mesh %s: a bad reply from %r: %s", rec.peer, why
        )
        if call is not None:
            self._pending.finish(route, exc=ProtocolError(f"an undecodable reply: {why}"))

    def receive_reply(self, rec: t.Inbound, env: Envelope) -> None:
        """The reply `rec` (its envelope `env`, decoded by the dispatcher) to a request
        of ours: it ends the request with its value or error, unless it ended already
        (counted: `late_replies`) or came from another peer's connection (dropped and
        counted as a decode error). A stale owner's `UnavailableError` drops the route
        it was sent on (`ObjectRoutes.forget`)."""
        route = rec.route_id
        call = self._calls.get(route)  # one dict read: atomic
        if call is None or rec.peer not in call.peer.conns:
            if call is None:
                with self._lock:
                    self.late_replies += 1
            else:  # another node answering our request: not its to answer
                self._link.count_bad()
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
                objects = self._objects  # a stale owner: resolve again next call
                if objects is not None:
                    objects.forget(call.cache_key)
        else:
            reply = call.reply
            try:
                data = rec.frames[1] if len(rec.frames) > 1 else b""
                name = env.type_name
                if reply is None and name and name not in self._codec.registry:
                    name = ""  # no reply= and a type this Host does not know: plain values
                # `rule_type`'s frame only for a rule that is not a class itself (as in
                # `_MessageCall.__init__`): a plain class or a Struct class is its own.
                into: object = reply
                if reply is not None and type(reply) is not type and type(reply) is not STRUCT_META:
                    into = rule_type(reply)
                value = self._codec.decode_payload(name, data, into)
                if reply is not None and not isinstance(value, reply):
                    raise ProtocolError(f"the reply is a {type(value).__name__}, not of reply=")
            except ProtocolError as error:
                exc = error
        if not self._pending.finish(route, value, exc):
            with self._lock:
                self.late_replies += 1

    def fail_inflight(self, peer: Peer, why: str, reason: UnavailableReason) -> None:
        """`peer` was lost (or replaced by another lifecycle): our requests in flight to
        it end with `UnavailableError(f"node ... {why}", reason=reason)`."""
        with self._lock:
            routes = list(peer.inflight)
            peer.inflight.clear()
        for route in routes:
            self._pending.finish(
                route, exc=UnavailableError(f"node {peer.routing_id!r} {why}", reason=reason)
            )
        # The one-ways waiting here for a full target of it were never sent. It may come
        # back with the same lifecycle and resume (a frozen peer's connection may close
        # too, on the transport's heartbeat): they stay, and go then (`Delivery.resend`),
        # or fail when it is gone for good (`Delivery.expire`: a new lifecycle, BYE,
        # expiry).

    def fail_all(self) -> None:
        """The node closed: every request of ours still in flight ends with
        `ShuttingDownError`."""
        with self._lock:
            routes = list(self._calls)
        for route in routes:
            self._pending.finish(route, exc=shutting_down("the call finished"))


class _Outgoing(PendingCell):
    """One request of ours in flight, in one object: its result cell, its pending entry,
    its caller's canceller, what its reply is checked against (`Outbound._calls`), and
    what it sends once admitted if it was parked. `pending.begin` (or `block`, for a
    caller blocked in `request_sync`) registers it and decides how it ends."""

    __slots__ = ("cache_key", "outbound", "peer", "reply", "resend")

    def __init__(
        self,
        outbound: Outbound,
        peer: Peer,
        reply: type | None,
        cache_key: object,
        table: PendingTable,
    ) -> None:
        super().__init__(table.cell_lock)
        self.outbound = outbound
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
        outbound tables, and a parked one is taken back; a cancelled one that was sent is
        told to the peer."""
        outbound, peer, route_id = self.outbound, self.peer, self.route_id
        # No lock (this runs for every request, on the thread that settled it, while
        # callers take `_lock` in `_launch`): each removal is one atomic set or dict
        # operation, and whichever order it runs in with `_launch`'s entering (under
        # the lock) and parking, `_launch` looks at the pending table after each and
        # cleans up itself if the request ended; `_withdraw` pops `_parked` atomically
        # too, so one of the two gets a parked request back.
        peer.inflight.discard(route_id)
        outbound._calls.pop(route_id, None)
        parked = outbound._parked.pop(route_id, None)
        if parked is not None and outbound._take_back(peer, parked):
            return  # never sent: nothing to tell the peer
        if isinstance(exc, CancelledError) and peer.state is PeerState.READY:
            # Best effort: the receiver skips the request if its handler has not started.
            outbound._submit_quietly(peer.conn, Envelope(wire.CANCEL, route=route_id), b"")

    def refresh(self) -> list[bytes]:
        # Parked, then admitted: the budget it has left now travels (never 0, which
        # the receiver reads as "already late"; a request that ended was withdrawn).
        assert self.resend is not None
        fields, due, metadata, type_name, intent, data, seq = self.resend
        outbound = self.outbound
        budget = max(due - outbound._now(), 1e-6)
        wire_due = due if outbound._real_time else 0.0
        return [
            wire.encode_request(fields, budget, metadata, type_name, intent, wire_due, seq),
            data,
        ]
