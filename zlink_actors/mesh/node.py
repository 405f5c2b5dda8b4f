"""`MeshNode`: a Host's place in a RouteMesh (docs/mesh.md).

It owns one `transports.Transport` (named by this node's routing id), runs the mesh
handshake over it, keeps the peer table, picks channel servers, and implements the
engine's remote SPI (`_engine/remote.py`): `route` / `send` / `request` for calls that
leave this Host, and the inbound side that turns received records into local calls
(`deliver_send` / `deliver_request`), so a remote call is admitted, waits and completes
by exactly the rules of a local one.

Threads: the transport's I/O thread runs `_on_receive` and `_on_event` (they never
block: local admission either decides at once or completes later through a callback);
application threads and handler turns run `route`, `send` and `request`; the I/O
executor's loop runs discovery through the Location Store. One lock guards the peer
table; it is never held while a transport method, a completion or a callback runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import zmq

import transports as t

from .._calls.messaging import deliver_request, deliver_send
from .._core.cancellation import CancellationToken
from .._core.completion import Completion, CompletionSource, _Cell, failed, settled
from .._core.errors import (
    CancelledError,
    CapacityExceededError,
    DeadlineExceededError,
    InvalidOperationError,
    NotFoundError,
    ProtocolError,
    ShuttingDownError,
    UnavailableError,
    ZlinkError,
    shutting_down,
)
from .._core.pending import PendingEntry, Request, operation_bytes
from .._core.state import HostState
from .._core.validation import rule_type
from .._engine.kernel import Runtime
from .._engine.objects import ObjectKind
from .._engine.remote import RemoteMetadata, node_key
from ..location.nodes import (
    NodeDescriptor,
    NodeDescriptorState,
    list_nodes,
    publish_node,
    withdraw_node,
)
from ..location.spi import LocationStore
from . import codec as wire
from .codec import Codec, Envelope
from .config import (
    MeshConfig,
    NodeInfo,
    PeerInfo,
    PeerState,
    advertised,
    completion_endpoint,
    parse_endpoint,
    split_key,
)
from .peers import LOCAL, Peer, PeerTable, Role

__all__ = ["MeshNode", "MeshStatistics"]

log = logging.getLogger("zlink_actors.mesh")

_CHANNEL: Final = ObjectKind.CHANNEL
_NODE: Final = ObjectKind.NODE
_KINDS: Final = {kind.value: kind for kind in ObjectKind}
#: Handshake route ids live above every pending-table route id.
_HANDSHAKE_BASE: Final = 1 << 63
#: How often discovery polls the Location Store (mesh.md: "about once a second").
_POLL = 1.0
#: A discovered node with a lower routing id dials us; we dial it ourselves only if it
#: has not after this long (so two nodes rarely dial each other at once).
_DIAL_GRACE = 3.0
#: Seconds shutdown waits for the descriptor to be withdrawn.
_WITHDRAW_WAIT = 2.0
#: The longest wait between two dials of a `peers=` endpoint that keeps failing.
_REDIAL_MAX = 30.0
#: The longest error message a reply carries (characters; the rest is cut).
_ERROR_TEXT = 16 * 1024
#: Seconds between looks at the credit still in use while the node closes.
_CLOSE_POLL = 0.002
#: Frames above the payload the transport must accept: the envelope and a margin.
_ENVELOPE_ROOM = 64 * 1024


class _Hello(msgspec.Struct, array_like=True, frozen=True):
    """What a node tells a peer about itself in HELLO / ADMIT and UPDATE."""

    routing_id: str
    generation: int
    endpoint: str
    channels: dict[str, int]
    role: str
    types: list[str]
    node_handler: bool
    draining: bool = False
    #: The credit this node grants each sender (0: unknown, an older peer).
    credit_window: int = 0
    #: The largest payload this node accepts (0: unknown).
    max_message_size: int = 0


_encode_hello = msgspec.msgpack.Encoder().encode
_decode_hello = msgspec.msgpack.Decoder(_Hello).decode


@dataclass(frozen=True, slots=True)
class MeshStatistics:
    """The mesh section of `HostStatistics` (a snapshot; do not construct it).

    Attributes:
        routing_id: this node's routing id.
        peers: peers known now, by `PeerState` value (`"ready"`, ...).
        lost_peers: peers lost since the node started.
        credit_in_use: bytes we have in flight to peers, under their credit.
        parked_sends: messages waiting for credit (or for a PAUSED peer).
        paused: True while this node tells its senders PAUSED.
        permits_in_use: inbound records received whose handler has not started.
        permits: the inbound permits (`MeshConfig.inbound_permits`).
        frames_in / frames_out: transport frames received / sent.
        decode_errors: received records that could not be decoded (logged, counted).
        dropped_messages: received one-way messages that reached no handler (logged).
        late_replies: replies that found their request already finished (dropped).
    """

    routing_id: str
    peers: dict[str, int]
    lost_peers: int
    credit_in_use: int
    parked_sends: int
    paused: bool
    permits_in_use: int
    permits: int
    frames_in: int
    frames_out: int
    decode_errors: int
    dropped_messages: int
    late_replies: int


@dataclass(slots=True)
class _Dial:
    """A connection we opened whose handshake has not finished."""

    endpoint: str
    route: int
    #: The `connect_peer` calls waiting for this dial.
    sources: list[CompletionSource[PeerInfo]]
    #: The routing id a descriptor named for this endpoint (its CONNECTING entry).
    expect: str | None = None
    #: Records the peer sent on this connection before its ADMIT was read (the ADMIT
    #: travels on the completion connection, which is read after the application one):
    #: handled, in order, once it is.
    early: list[t.Inbound] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Route:
    """A call's remote target: the peer, and the kind and target it names there."""

    peer: Peer
    kind: ObjectKind
    target: str


class _ScannedEntry(PendingEntry):
    """A remote request on the Host's default timeout: `DeadlineScan` expires it."""

    __slots__ = ("expires",)


def _refuse_cancel() -> bool:
    return False


class MeshNode:
    """One Host's node of a RouteMesh; built by `Host(mesh=...)`."""

    def __init__(
        self,
        runtime: Runtime,
        config: MeshConfig,
        routing_id: str,
        codec: Codec,
        *,
        channels: dict[str, int],
        node_handler: bool,
        object_types: Sequence[str],
        location: LocationStore | None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.routing_id = routing_id
        self.codec = codec
        self.location = location
        self.first = frozenset({_CHANNEL, _NODE})
        self.node_key = node_key(config.name, routing_id)
        self.generation = time.time_ns()
        self.has_node_handler = node_handler
        self.object_types = tuple(object_types)
        self._weights = dict(channels)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._peers = PeerTable()
        self._dials: dict[bytes, _Dial] = {}
        self._dial_numbers = itertools.count(1)
        self._handshakes = itertools.count(1)
        #: Our requests in flight: route id -> (peer, reply rule).
        self._calls: dict[int, tuple[Peer, type | None]] = {}
        #: Those of them still parked for credit: route id -> their `admitted` future.
        self._parked: dict[int, Future[None]] = {}
        #: Requests we serve: (sender routing id, route id) -> the local request.
        self._serving: dict[tuple[str, int], Request] = {}
        self._permits = config.permits()
        self._permits_in_use = 0
        self._pause_at = max(1, (self._permits * 8) // 10)
        self._resume_at = (self._permits * 6) // 10
        self._paused = False
        #: Serialises flow decisions with the `set_flow` calls that apply them.
        self._flow_lock = threading.Lock()
        self._draining = False
        self._closed = False
        self.decode_errors = 0
        self.dropped_messages = 0
        self.late_replies = 0
        self._first_seen: dict[str, float] = {}
        self._discovery_stop = threading.Event()
        self._discovery: Future[None] | None = None
        self._keeper: threading.Thread | None = None
        #: The peer each endpoint we dialled led to (its advertised endpoint may be
        #: spelt otherwise): the keeper dials an endpoint again only once that peer is lost.
        self._dialled: dict[str, Peer] = {}
        self._info: NodeInfo | None = None
        self._transport: t.Transport | None = None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def info(self) -> NodeInfo | None:
        return self._info

    def start(self) -> None:
        """Bind the two endpoints, then dial `peers=` and start discovery. Runs before
        the runtime serves, so bind errors surface from `Host.start()`."""
        config = self.config
        transport_config = t.TransportConfig(
            credit_window=config.credit_window,
            min_charge=min(256, config.credit_window),
            max_message_size=config.max_message_size + _ENVELOPE_ROOM,
            heartbeat_interval=config.liveness_interval,
            heartbeat_timeout=config.liveness_timeout,
            curve=self._curve(),
        )
        self._transport = t.Transport(
            self.routing_id.encode(),
            self._on_receive,
            on_event=self._on_event,
            config=transport_config,
            read_budget=self._free_permits,
        )
        try:
            application = self._bind(self._transport)
        except BaseException:
            self._transport.close()
            self._transport = None  # nothing to drain or close: the Host never served
            raise
        endpoint = advertised(application, config.advertise_host)
        if config.curve is not None:  # a dialling peer needs our public key
            endpoint = f"{endpoint}|{config.curve.public_z85()}"
        self._info = NodeInfo(config.name, self.routing_id, endpoint)

    def _curve(self) -> t.CurveConfig | None:
        curve = self.config.curve
        if curve is None:
            return None
        return t.CurveConfig(curve.public_key, curve.secret_key, frozenset(curve.authorized_keys))

    def _bind(self, transport: t.Transport) -> str:
        listen = parse_endpoint(self.config.listen, allow_any_port=True)
        if listen.scheme == "ipc":
            return _bind_pair(transport, self.config.listen)
        host = "0.0.0.0" if listen.host == "*" else listen.host
        if listen.port:
            return _bind_pair(transport, f"tcp://{host}:{listen.port}")
        last: Exception | None = None
        for _ in range(32):
            port = _free_port_pair(host)
            app = f"tcp://{host}:{port}"
            try:
                return transport.bind(app, completion_endpoint(app)).application
            except Exception as exc:  # taken meanwhile: another pair
                last = exc
        raise UnavailableError(f"no free pair of ports on {host}: {last}")

    def serve(self) -> None:
        """The runtime serves: dial `peers=`, keep them dialled, start discovery."""
        for endpoint in self.config.peers:
            self._dial(endpoint, None)
        if self.config.peers:
            self._keeper = threading.Thread(
                target=self._keep_peers, name=f"zlink-mesh-{self.routing_id}", daemon=True
            )
            self._keeper.start()
        if self.location is not None:
            self._discovery = asyncio.run_coroutine_threadsafe(
                self._discover(self.location), self.runtime.io.loop
            )

    def begin_drain(self) -> None:
        """Shutdown begins: tell peers we drain (never selected again) and withdraw the
        descriptor."""
        with self._lock:
            if self._draining or self._transport is None or self._info is None:
                return
            self._draining = True
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
        update = self._hello_bytes()
        for peer in peers:  # a notice: it must not wait behind credit or a PAUSED peer
            self._notify_quietly(peer.conn, wire.encode_fields(wire.UPDATE), update)
        self._discovery_stop.set()
        if self._keeper is not None:
            self._keeper.join(_WITHDRAW_WAIT)
        if self._discovery is not None:
            with contextlib.suppress(Exception):
                self._discovery.result(_WITHDRAW_WAIT)

    def close(self, seconds: float) -> None:
        """The runtime stopped: wait (at most `seconds`) until every peer has admitted
        what we sent it (its credit came back), say BYE, then close the transport (what
        is still parked fails, and its calls end with `ShuttingDownError`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            transport = self._transport
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
        if transport is None:
            return
        end = time.monotonic() + seconds
        # Bounded, shutdown only: the transport has no event for "all credit returned".
        while transport.statistics().credit_in_use and time.monotonic() < end:
            time.sleep(_CLOSE_POLL)
        for peer in peers:
            self._notify_quietly(peer.conn, wire.encode_fields(wire.BYE), b"")
        transport.close()
        with self._lock:
            calls = list(self._calls)
            self._changed.notify_all()
        for route in calls:
            self.runtime.pending.finish(route, exc=shutting_down("the call finished"))

    # -- the remote SPI ------------------------------------------------------------------

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
            return _Route(picked, kind, target)
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
            return _Route(peer, kind, rid)
        return None  # Spots and Actors stay local until global objects exist

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        assert isinstance(route, _Route)
        try:
            type_name, data = self._encode(payload, route.peer)
            env = wire.encode_fields(
                wire.SEND,
                target_kind=route.kind.value,
                target=route.target,
                mesh=self.config.name,
                metadata=metadata,
                type_name=type_name,
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
        peer = route.peer
        try:
            type_name, data = self._encode(payload, peer)
        except ProtocolError as exc:
            return failed(exc)
        runtime = self.runtime
        cell: _Cell[Any] = _Cell()
        entry = self._register(cell, timeout, cancel)
        handle = runtime.handle(entry)
        route_id = entry.route_id
        if route_id is None:
            return handle
        # Before it is entered below: whichever terminal wins from now on cleans up.
        entry.on_finish = lambda: self._request_finished(peer, route_id, cell)
        with self._lock:
            live = peer.state is PeerState.READY and not self._closed
            if live:
                peer.inflight.add(route_id)
                self._calls[route_id] = (peer, reply)
        if not live:
            runtime.fail_entry(
                entry, UnavailableError(f"node {peer.routing_id!r} is {peer.state.value}")
            )
            return handle
        if route_id not in runtime.pending:
            # It ended meanwhile (deadline, cancellation, shutdown), maybe before its
            # `on_finish` was set: clean up here, and send nothing.
            self._request_finished(peer, route_id, cell)
            return handle
        transport = self._transport
        assert transport is not None
        due = runtime.timers._now() + timeout
        kind_name = route.kind.value

        def envelope(budget: float) -> bytes:
            return wire.encode_fields(
                wire.REQUEST,
                op=operation_bytes(route_id),
                route=route_id,
                target_kind=kind_name,
                target=route.target,
                mesh=self.config.name,
                deadline=budget,
                metadata=metadata,
                type_name=type_name,
            )

        def refresh() -> list[bytes]:
            # Parked, then admitted: the budget it has left now travels (never 0, which
            # the receiver reads as "already late"; a request that ended was withdrawn).
            return [envelope(max(due - runtime.timers._now(), 1e-6)), data]

        try:
            frames = [envelope(timeout), data]
        except ProtocolError as exc:  # metadata msgspec cannot encode: nothing is sent
            runtime.fail_entry(entry, exc)
            return handle
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

    def _register(
        self, cell: _Cell[Any], timeout: float, cancel: CancellationToken | None
    ) -> PendingEntry:
        """The request's pending entry, registered (SC §10) with its deadline. On the
        Host's default timeout it joins the one deadline scan the local requests use (no
        timer entry, and no timer-thread wake, per request)."""
        runtime = self.runtime
        if timeout != runtime.default_request_timeout:
            return runtime.begin(cell, timeout, cancel)
        entry = _ScannedEntry(cell)
        entry.expires = expires = runtime.timers._now() + timeout
        if runtime.register(entry, cancel) and runtime.deadlines.at == math.inf:
            runtime.deadlines.arm(expires)  # read after registering: the scan's invariant
        return entry

    def _withdraw(self, peer: Peer, route_id: int) -> bool:
        """Take a request that ended (timeout, cancellation) back from the transport if
        it still waits for credit: then it is never sent. True if it was."""
        with self._lock:
            parked = self._parked.pop(route_id, None)
        transport = self._transport
        if parked is None or parked.done() or transport is None:
            return False
        return transport.withdraw(peer.conn, parked)

    def _request_finished(self, peer: Peer, route_id: int, cell: _Cell[Any]) -> None:
        with self._lock:
            peer.inflight.discard(route_id)
            self._calls.pop(route_id, None)
        if self._withdraw(peer, route_id):
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

    def _encode(self, payload: object, peer: Peer) -> tuple[str, bytes]:
        """The payload's type name and bytes; `ProtocolError` (nothing sent) when it
        cannot be encoded or is larger than this node or the peer accepts."""
        type_name, data = self.codec.encode_payload(payload)
        limit = peer.max_message_size
        if limit and len(data) > limit:
            raise ProtocolError(
                f"a {type(payload).__qualname__} payload is {len(data)} bytes encoded, more "
                f"than node {peer.routing_id!r} accepts (its max_message_size, {limit})"
            )
        return type_name, data

    def _notify_quietly(self, conn: bytes, env: bytes, payload: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        with contextlib.suppress(t.TransportError):
            transport.notify(conn, [env, payload])

    def _submit_quietly(self, conn: bytes, env: Envelope, payload: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        with contextlib.suppress(t.TransportError):
            transport.submit(conn, [wire.encode_envelope(env), payload])

    # -- handshake and peers ---------------------------------------------------------

    def _hello_bytes(self) -> bytes:
        assert self._info is not None
        with self._lock:
            channels = dict(self._weights)
            draining = self._draining
        return _encode_hello(
            _Hello(
                self.routing_id,
                self.generation,
                self._info.endpoint,
                channels,
                Role.OBJECT_SERVER if self.object_types else Role.OBJECT_CLIENT,
                list(self.object_types),
                self.has_node_handler,
                draining,
                self.config.credit_window,
                self.config.max_message_size,
            )
        )

    def _dial(
        self,
        endpoint: str,
        source: CompletionSource[PeerInfo] | None,
        *,
        expect: str | None = None,
    ) -> None:
        transport = self._transport
        if transport is None:
            raise InvalidOperationError("the node is not started")
        with self._lock:
            known = self._peers.by_endpoint(endpoint)
            info = known.info() if known is not None else None
        if info is not None:  # already a peer: one connection per pair is enough
            if source is not None:
                source.set_result(info)
            return
        with self._lock:
            for pending in self._dials.values():
                if pending.endpoint == endpoint:  # join the dial in progress
                    if source is not None:
                        pending.sources.append(source)
                    return
            alias = b"\x01dial-%d|" % next(self._dial_numbers) + endpoint.encode()
            route = _HANDSHAKE_BASE | next(self._handshakes)
            self._dials[alias] = _Dial(
                endpoint, route, [] if source is None else [source], expect=expect
            )
        try:
            address, key = split_key(endpoint)
            if (key is None) != (self.config.curve is None):
                raise InvalidOperationError(
                    "with MeshConfig(curve=...) a peer endpoint carries the peer's public "
                    "key, tcp://host:port|<Z85 key> (its host.node.endpoint); without "
                    "CURVE it carries none"
                )
            ends = t.Endpoints(address, completion_endpoint(address), key)
            transport.connect(alias, ends)
        except Exception as exc:
            with self._lock:
                self._dials.pop(alias, None)
            log.warning("mesh %s: cannot dial %s: %s", self.routing_id, endpoint, exc)
            if source is not None:
                source.set_exception(UnavailableError(f"cannot connect to {endpoint}: {exc}"))

    def connect_peer(self, endpoint: str) -> Completion[PeerInfo]:
        parse_endpoint(endpoint, allow_any_port=False)
        source: CompletionSource[PeerInfo] = CompletionSource()
        if self.runtime.state is not HostState.SERVING:
            source.set_exception(
                shutting_down()
                if self.runtime.state is not HostState.PREPARING
                else InvalidOperationError("the Host is not started")
            )
            return source.completion
        self._dial(endpoint, source)
        return source.completion

    def _on_event(self, event: t.PeerEvent) -> None:
        if event.kind is t.PeerEventKind.READY:
            with self._lock:
                dial = self._dials.get(event.peer)
            if dial is not None:
                self._send_hello(event.peer, dial)
        elif event.kind is t.PeerEventKind.LOST:
            self._conn_lost(event.peer, event.reason)

    def _send_hello(self, alias: bytes, dial: _Dial) -> None:
        transport = self._transport
        assert transport is not None
        env = Envelope(wire.HELLO, mesh=self.config.name, target=self.routing_id)
        try:
            transport.submit_request(
                alias, dial.route, [wire.encode_envelope(env), self._hello_bytes()]
            )
        except t.TransportError as exc:
            self._dial_failed(alias, f"the handshake could not be sent: {exc}")

    def _dial_failed(self, alias: bytes, why: str) -> None:
        with self._lock:
            dial = self._dials.pop(alias, None)
        if dial is None:
            return
        log.warning("mesh %s: connection to %s failed: %s", self.routing_id, dial.endpoint, why)
        for record in dial.early:
            self._bad(record, f"the connection's handshake failed: {why}")
        transport = self._transport
        if transport is not None:
            with contextlib.suppress(t.TransportError):
                transport.disconnect(alias)
        for source in dial.sources:
            source.set_exception(UnavailableError(f"cannot join {dial.endpoint}: {why}"))

    def _check_hello(self, env: Envelope, hello: _Hello) -> str | None:
        """Why a peer's hello is refused, or None."""
        if env.mesh != self.config.name:
            return f"mesh name {env.mesh!r} is not {self.config.name!r}"
        if hello.routing_id == self.routing_id:
            return f"duplicate routing id {hello.routing_id!r} (it is this node's own)"
        with self._lock:
            old = self._peers.by_rid.get(hello.routing_id)
        if old is not None and old.generation > hello.generation:
            return f"duplicate routing id {hello.routing_id!r} (a newer node holds it)"
        return None

    def _admit(self, conn: bytes, hello: _Hello) -> Peer:
        """Enter the peer (or another connection of it) as READY; a higher generation
        replaces an older run of the same routing id."""
        replaced: Peer | None = None
        self._use_window(conn, hello.credit_window)  # before anything can be sent on it
        with self._lock:
            peer = self._peers.by_rid.get(hello.routing_id)
            if (
                peer is not None
                and peer.generation == hello.generation
                and peer.state is not PeerState.LOST
                and peer.state is not PeerState.CONNECTING
            ):
                self._peers.add_conn(peer, conn)
                self._update_locked(peer, hello)
                self._changed.notify_all()
                return peer
            if peer is not None and peer.state is not PeerState.CONNECTING:
                replaced = peer
                self._peers.mark_lost(peer)
                self._peers.drop_conns(peer)
            peer = Peer(hello.routing_id, hello.endpoint, hello.generation, conn)
            self._update_locked(peer, hello)
            self._peers.add(peer)
            self._changed.notify_all()
        if replaced is not None:
            self._fail_inflight(replaced, "restarted (a higher lifecycle generation)")
        log.info("mesh %s: peer %s READY (%s)", self.routing_id, peer.routing_id, peer.endpoint)
        return peer

    def _use_window(self, conn: bytes, granted: int) -> None:
        """The receiver's credit window bounds what we send it (ours bounds it too: the
        transport's libzmq backstop is sized by our own window)."""
        transport = self._transport
        own = self.config.credit_window
        if transport is None or not 0 < granted < own:
            return
        with contextlib.suppress(t.TransportError):
            transport.set_peer_window(conn, max(granted, transport.config.min_charge))

    @staticmethod
    def _update_locked(peer: Peer, hello: _Hello) -> None:
        peer.channels = dict(hello.channels)
        peer.role = hello.role
        peer.types = tuple(hello.types)
        peer.has_node_handler = hello.node_handler
        peer.max_message_size = hello.max_message_size
        if peer.state is not PeerState.LOST:
            peer.state = PeerState.DRAINING if hello.draining else PeerState.READY

    def _conn_lost(self, conn: bytes, reason: str) -> None:
        with self._lock:
            dial = self._dials.get(conn)
            peer = self._peers.by_conn.pop(conn, None)
            primary = peer is not None and peer.conn == conn
            was_lost = peer is not None and peer.state is PeerState.LOST  # it said BYE
            others: set[bytes] = set()
            if peer is not None:
                peer.conns.discard(conn)
                if primary:
                    self._peers.mark_lost(peer)
                    others = self._peers.drop_conns(peer)
                self._changed.notify_all()
        if dial is not None:
            self._dial_failed(conn, reason)
        if peer is None or not primary:
            return
        level = logging.INFO if self._closed or was_lost else logging.WARNING
        log.log(level, "mesh %s: peer %s LOST: %s", self.routing_id, peer.routing_id, reason)
        transport = self._transport
        for other in others:
            if transport is not None:
                with contextlib.suppress(t.TransportError):
                    transport.disconnect(other)
        self._fail_inflight(peer, f"lost: {reason}")

    def _fail_inflight(self, peer: Peer, why: str) -> None:
        with self._lock:
            routes = list(peer.inflight)
            peer.inflight.clear()
        for route in routes:
            self.runtime.pending.finish(
                route, exc=UnavailableError(f"node {peer.routing_id!r} {why}")
            )

    # -- application-facing views ---------------------------------------------------

    def peers(self) -> list[PeerInfo]:
        with self._lock:
            self._peers.purge(time.monotonic())
            return [peer.info() for peer in self._peers.by_rid.values()]

    def wait_for_peers(self, count: int, timeout: float) -> list[PeerInfo]:
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                ready = [
                    p.info() for p in self._peers.by_rid.values() if p.state is PeerState.READY
                ]
                if len(ready) >= count:
                    return ready
                if self._closed or self._draining:
                    raise shutting_down()
                left = end - time.monotonic()
                if left <= 0:
                    raise DeadlineExceededError(
                        f"{len(ready)} of {count} peers READY after {timeout:g} s"
                    )
                self._changed.wait(left)

    def set_channel_weight(self, channel: str, weight: int) -> None:
        with self._lock:
            if channel not in self._weights:
                raise NotFoundError(f"this node serves no channel {channel!r}")
            self._weights[channel] = weight
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
        if self._info is None:
            return  # not started: the handshake will carry the weight
        update = self._hello_bytes()
        for peer in peers:
            self._notify_quietly(peer.conn, wire.encode_fields(wire.UPDATE), update)

    def statistics(self) -> MeshStatistics:
        transport = self._transport
        stats = transport.statistics() if transport is not None else None
        with self._lock:
            counts = {state.value: n for state, n in self._peers.counts().items()}
            return MeshStatistics(
                routing_id=self.routing_id,
                peers=counts,
                lost_peers=self._peers.lost_peers,
                credit_in_use=stats.credit_in_use if stats else 0,
                parked_sends=stats.parked_messages if stats else 0,
                paused=self._paused,
                permits_in_use=self._permits_in_use,
                permits=self._permits,
                frames_in=stats.received_frames if stats else 0,
                frames_out=stats.sent_frames if stats else 0,
                decode_errors=self.decode_errors + (stats.dropped_frames if stats else 0),
                dropped_messages=self.dropped_messages,
                late_replies=self.late_replies,
            )

    # -- inbound (on the transport's I/O thread) ---------------------------------------

    def _on_receive(self, batch: Sequence[t.Inbound]) -> None:
        for rec in batch:
            try:
                self._receive(rec)
            except Exception:
                log.exception(
                    "mesh %s: handling a record from %r failed", self.routing_id, rec.peer
                )

    def _receive(self, rec: t.Inbound) -> None:
        if rec.kind is t.InboundKind.REPLY:
            self._receive_reply(rec)
            return
        if rec.kind is t.InboundKind.NOTICE:
            self._receive_notice(rec)
            return
        if rec.rejected is not None:
            self._bad(rec, f"refused by the transport: {rec.rejected}")
            return
        try:
            env = wire.decode_envelope(rec.frames[0]) if rec.frames else None
            if env is None:
                raise ProtocolError("a record with no envelope")
        except ProtocolError as exc:
            self._bad(rec, str(exc))
            return
        command = env.command
        if command == wire.HELLO and rec.kind is t.InboundKind.REQUEST:
            self._receive_hello(rec, env)
            return
        peer = self._peers.by_conn.get(rec.peer)  # one dict read: atomic
        if peer is None:
            with self._lock:
                peer = self._peers.by_conn.get(rec.peer)
                dial = self._dials.get(rec.peer) if peer is None else None
                if dial is not None:
                    dial.early.append(rec)
                    return
        if peer is None:
            self._bad(rec, "a record before the handshake")
            return
        if command == wire.SEND:
            self._receive_send(rec, env, peer)
        elif command == wire.REQUEST and rec.kind is t.InboundKind.REQUEST:
            self._receive_request(rec, env, peer)
        elif command == wire.CANCEL:
            self._release(rec)
            with self._lock:
                serving = self._serving.get((peer.routing_id, env.route))
            if serving is not None:
                serving.cancel()
        elif command == wire.UPDATE:
            self._release(rec)
            self._receive_update(peer, rec)
        elif command == wire.BYE:
            self._release(rec)
            with self._lock:
                self._peers.mark_lost(peer)
                self._changed.notify_all()
            log.info("mesh %s: peer %s left the mesh", self.routing_id, peer.routing_id)
        else:
            self._bad(rec, f"an unknown command {command}")

    def _receive_notice(self, rec: t.Inbound) -> None:
        """UPDATE (weights, draining) or BYE on the completion connection."""
        peer = self._peers.by_conn.get(rec.peer)
        try:
            env = wire.decode_envelope(rec.frames[0]) if rec.frames else None
            if env is None or env.command not in (wire.UPDATE, wire.BYE):
                raise ProtocolError("a notice that is neither UPDATE nor BYE")
        except ProtocolError as exc:
            self._bad(rec, str(exc))
            return
        if peer is None:
            return  # from a connection whose peer is gone: nothing to update
        if env.command == wire.UPDATE:
            self._receive_update(peer, rec)
            return
        with self._lock:
            self._peers.mark_lost(peer)
            self._changed.notify_all()
        log.info("mesh %s: peer %s left the mesh", self.routing_id, peer.routing_id)

    def _release(self, rec: t.Inbound) -> None:
        if rec.charge:
            transport = self._transport
            if transport is not None:
                with contextlib.suppress(t.TransportError):
                    transport.release(rec.peer, rec.charge)

    def _bad(self, rec: t.Inbound, why: str) -> None:
        """A record we cannot use: logged, counted, answered with ProtocolError when it
        was a request; its credit goes back."""
        with self._lock:
            self.decode_errors += 1
        log.warning("mesh %s: a bad record from %r: %s", self.routing_id, rec.peer, why)
        self._release(rec)
        if rec.kind is t.InboundKind.REQUEST:
            self._reply_error(rec.peer, rec.route_id, ProtocolError(why))

    def _receive_hello(self, rec: t.Inbound, env: Envelope) -> None:
        self._release(rec)
        try:
            hello = _decode_hello(rec.frames[1])
        except (msgspec.DecodeError, IndexError) as exc:
            self._bad_hello(rec, f"an undecodable hello: {exc}")
            return
        why = self._check_hello(env, hello)
        if why is None and hello.routing_id.encode() != rec.peer:
            why = "the routing id in the hello is not the connection's"
        if why is not None:
            self._bad_hello(rec, why)
            return
        self._admit(rec.peer, hello)
        self._reply_frames(
            rec.peer,
            rec.route_id,
            [
                wire.encode_envelope(Envelope(wire.ADMIT, mesh=self.config.name)),
                self._hello_bytes(),
            ],
        )

    def _bad_hello(self, rec: t.Inbound, why: str) -> None:
        with self._lock:
            self.decode_errors += 1
        log.warning("mesh %s: refused a handshake from %r: %s", self.routing_id, rec.peer, why)
        env = Envelope(wire.REJECT, mesh=self.config.name, error=why)
        self._reply_frames(rec.peer, rec.route_id, [wire.encode_envelope(env)])

    def _receive_update(self, peer: Peer, rec: t.Inbound) -> None:
        try:
            hello = _decode_hello(rec.frames[1])
        except (msgspec.DecodeError, IndexError) as exc:
            with self._lock:
                self.decode_errors += 1
            log.warning("mesh %s: a bad update from %s: %s", self.routing_id, peer.routing_id, exc)
            return
        with self._lock:
            self._update_locked(peer, hello)
            self._changed.notify_all()

    def _receive_reply(self, rec: t.Inbound) -> None:
        route = rec.route_id
        try:
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
        if call is None or rec.peer not in call[0].conns:
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
        else:
            reply = call[1]
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

    def _receive_admit(self, rec: t.Inbound, env: Envelope) -> None:
        with self._lock:
            dial = self._dials.get(rec.peer)
        if dial is None or dial.route != rec.route_id:
            return
        if env.command != wire.ADMIT:
            self._dial_failed(rec.peer, f"rejected: {env.error}")
            return
        try:
            hello = _decode_hello(rec.frames[1])
        except (msgspec.DecodeError, IndexError) as exc:
            self._dial_failed(rec.peer, f"an undecodable admit: {exc}")
            return
        why = self._check_hello(env, hello)
        if why is not None:
            self._dial_failed(rec.peer, why)
            return
        peer = self._admit(rec.peer, hello)
        with self._lock:
            self._dials.pop(rec.peer, None)
            self._dialled[dial.endpoint] = peer
            early, dial.early = dial.early, []
        for record in early:
            self._receive(record)
        for source in dial.sources:
            source.set_result(peer.info())

    # -- inbound calls -------------------------------------------------------------

    def _local_target(self, env: Envelope) -> tuple[ObjectKind, str] | ZlinkError:
        kind = _KINDS.get(env.target_kind)
        if kind is None:
            return ProtocolError(f"an unknown target kind {env.target_kind!r}")
        if kind is _NODE:
            if env.mesh != self.config.name or env.target != self.routing_id:
                return NotFoundError(f"no node {env.target!r} in mesh {env.mesh!r} here")
            if not self.has_node_handler:
                return NotFoundError(f"node {self.routing_id!r} has no node_handler")
            return kind, self.node_key
        return kind, env.target

    def _free_permits(self) -> int:
        """How many more records the transport may read now (never more than M held)."""
        return self._permits - self._permits_in_use

    def _permit(self) -> Callable[[], None]:
        """Take an inbound permit; returns its release (PAUSED at 80%, RUNNING at 60%)."""
        with self._lock:
            self._permits_in_use += 1
            change = not self._paused and self._permits_in_use >= self._pause_at
        if change:
            self._apply_flow()
        return self._release_permit

    def _release_permit(self) -> None:
        with self._lock:
            self._permits_in_use -= 1
            change = self._paused and self._permits_in_use <= self._resume_at
        if change:
            self._apply_flow()

    def _apply_flow(self) -> None:
        """Decide PAUSED / RUNNING from the count as it is now and tell the transport, one
        decision at a time (the I/O thread takes permits, pool threads release them: two
        decisions applied out of order could leave the transport paused for good)."""
        with self._flow_lock:
            with self._lock:
                used = self._permits_in_use
                if self._paused and used <= self._resume_at:
                    self._paused = False
                elif not self._paused and used >= self._pause_at:
                    self._paused = True
                paused = self._paused
            transport = self._transport
            if transport is not None:
                state = t.FlowState.PAUSED if paused else t.FlowState.RUNNING
                with contextlib.suppress(t.TransportError):
                    transport.set_flow(state)  # a leaf call: it takes only its own lock

    def _receive_send(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        where = self._local_target(env)
        try:
            if isinstance(where, ZlinkError):
                raise where
            payload = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
        except ZlinkError as exc:
            self._drop_message(rec, peer, str(exc), decode=isinstance(exc, ProtocolError))
            return
        meta = RemoteMetadata(env.metadata or {}, peer.routing_id, self._permit())
        done = deliver_send(self.runtime, where[0], where[1], payload, meta)
        if done.done():
            self._sent(rec, peer, meta, done)
        else:
            done.add_done_callback(lambda c: self._sent(rec, peer, meta, c))

    def _sent(
        self, rec: t.Inbound, peer: Peer, meta: RemoteMetadata, done: Completion[None]
    ) -> None:
        """A received one-way message was admitted here (or refused): its credit goes
        back now, so a full queue here makes its sender wait."""
        self._release(rec)
        exc = done.exception()
        if exc is not None:
            meta.started()
            if not isinstance(exc, ShuttingDownError):
                with self._lock:
                    self.dropped_messages += 1
                log.warning(
                    "mesh %s: a message from %s reached no handler: %s",
                    self.routing_id,
                    peer.routing_id,
                    exc,
                )

    def _drop_message(self, rec: t.Inbound, peer: Peer, why: str, *, decode: bool) -> None:
        with self._lock:
            if decode:
                self.decode_errors += 1
            else:
                self.dropped_messages += 1
        log.warning("mesh %s: dropped a message from %s: %s", self.routing_id, peer.routing_id, why)
        self._release(rec)

    def _receive_request(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        route = rec.route_id
        where = self._local_target(env)
        try:
            if isinstance(where, ZlinkError):
                raise where
            payload = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
        except ZlinkError as exc:
            self._release(rec)
            if isinstance(exc, ProtocolError):
                with self._lock:
                    self.decode_errors += 1
                log.warning(
                    "mesh %s: a bad request from %s: %s", self.routing_id, peer.routing_id, exc
                )
            self._reply_error(rec.peer, route, exc)
            return
        remaining = env.deadline
        if not remaining > 0:
            self._release(rec)
            self._reply_error(
                rec.peer,
                route,
                DeadlineExceededError("the request's deadline passed before it arrived"),
            )
            return
        key = (peer.routing_id, route)
        meta = RemoteMetadata(env.metadata or {}, peer.routing_id, self._permit())
        served = _Served(self, rec.peer, key, meta)
        # On a 10 ms grid, rounded up: never before the caller's deadline, and requests
        # with about the same budget share one timer FIFO (no timer entry of their own).
        timeout = min(math.ceil(remaining * 100.0) / 100.0, threading.TIMEOUT_MAX)
        queued = deliver_request(self.runtime, where[0], where[1], payload, meta, timeout, served)
        self._release(rec)  # admitted into the target's queue, or refused: decided now
        if isinstance(queued, Completion):  # ended before it was queued
            if queued.done():
                failure = queued.exception()
                served(None if failure is not None else queued.result(), failure)
            return
        # A CANCEL notice cancels the request itself (`ctx.cancellation` follows).
        with self._lock:
            if not served.sent:  # else it settled meanwhile, and nothing is left to cancel
                self._serving[key] = queued

    def _served(
        self,
        conn: bytes,
        key: tuple[str, int],
        meta: RemoteMetadata,
        value: object,
        exc: BaseException | None,
    ) -> None:
        """Answer a request we served (on the thread that settled it)."""
        never_ran = meta._on_start is not None
        meta.started()
        with self._lock:
            self._serving.pop(key, None)
        route = key[1]
        if exc is not None:
            if never_ran and isinstance(exc, CapacityExceededError):
                exc = UnavailableError(f"the target's queue on node {self.routing_id!r} is full")
            self._reply_error(conn, route, exc)
            return
        try:
            type_name, data = self.codec.encode_payload(value)
        except ProtocolError as error:
            self._reply_error(conn, route, error)
            return
        self._reply_frames(conn, route, [wire.encode_fields(wire.REPLY, type_name=type_name), data])

    def _reply_error(self, conn: bytes, route: int, exc: BaseException) -> None:
        kind, message = self.codec.encode_error(exc)
        if len(message) > _ERROR_TEXT:  # an error message never outgrows a reply
            message = message[:_ERROR_TEXT] + " [...]"
        self._reply_frames(
            conn, route, [wire.encode_fields(wire.REPLY, error_kind=kind, error=message)]
        )

    def _reply_frames(self, conn: bytes, route: int, frames: list[bytes]) -> None:
        transport = self._transport
        if transport is None:
            return
        try:
            transport.reply(conn, route, frames)
        except (t.UnknownPeer, t.Closed):
            pass  # the peer (or this node) is gone: its caller hears of the loss
        except t.TransportError as exc:  # a reply too large: the caller must still hear
            log.warning("mesh %s: a reply could not be sent: %s", self.routing_id, exc)
            if len(frames) > 1:
                self._reply_error(conn, route, ProtocolError(f"the reply could not be sent: {exc}"))

    def _keep_peers(self) -> None:
        """Every liveness interval, dial again each `peers=` endpoint no live peer and
        no dial in progress has (a peer restarted at a fixed address rejoins)."""
        stop = self._discovery_stop
        interval = self.config.liveness_interval
        backoff = {endpoint: (0.0, interval) for endpoint in self.config.peers}
        while not stop.wait(interval):
            now = time.monotonic()
            for endpoint in self.config.peers:
                with self._lock:
                    self._peers.purge(now)
                    peer = self._dialled.get(endpoint)
                    live = peer is not None and peer.state is not PeerState.LOST
                due, delay = backoff[endpoint]
                if live:
                    backoff[endpoint] = (0.0, interval)
                elif now >= due and not stop.is_set():
                    # Again and again while it fails, each time later (up to 30 s): a
                    # peer that refuses us is not asked five times a second.
                    backoff[endpoint] = (now + delay, min(delay * 2, _REDIAL_MAX))
                    self._dial(endpoint, None)

    # -- discovery (on the I/O executor's loop) ----------------------------------------

    def _descriptor(self, state: NodeDescriptorState) -> NodeDescriptor:
        assert self._info is not None
        with self._lock:
            channels = dict(self._weights)
        return NodeDescriptor(
            self.config.name,
            self.routing_id,
            (self._info.endpoint,),
            self.generation,
            state,
            channels,
        )

    async def _discover(self, store: LocationStore) -> None:
        lease = self.config.lease
        next_publish = 0.0
        stop = self._discovery_stop
        while not stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_publish:
                    await publish_node(
                        store, self._descriptor(NodeDescriptorState.READY), lease.ttl
                    )
                    next_publish = now + lease.renew_interval
                with self._lock:
                    self._peers.purge(now)
                nodes = await list_nodes(store, self.config.name)
                # Off the loop: a dial waits for the transport's I/O thread, and this loop
                # also runs the store's and the HTTP clients' work.
                await asyncio.to_thread(self._discover_all, nodes, now)
            except Exception as exc:  # the store is down: keep serving, try again
                log.warning("mesh %s: discovery: %s", self.routing_id, exc)
            await asyncio.sleep(_POLL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                withdraw_node(store, self.config.name, self.routing_id), _WITHDRAW_WAIT
            )

    def _discover_all(self, nodes: list[NodeDescriptor], now: float) -> None:
        for node in nodes:
            self._discovered(node, now)
        self._forget_connecting({node.routing_id for node in nodes})

    def _forget_connecting(self, listed: set[str]) -> None:
        """A CONNECTING entry whose descriptor is gone (expired, withdrawn) is forgotten:
        calls to it are `NotFoundError` again. One still listed stays, and is dialled
        again after a failed dial."""
        with self._lock:
            for rid, peer in list(self._peers.by_rid.items()):
                if peer.state is PeerState.CONNECTING and rid not in listed:
                    if peer.lost_at:
                        peer.state = PeerState.LOST  # it was lost: known for the retention
                    else:
                        del self._peers.by_rid[rid]
                    self._changed.notify_all()

    def _discovered(self, node: NodeDescriptor, now: float) -> None:
        rid = node.routing_id
        if (
            rid == self.routing_id
            or not node.endpoints
            or node.state is not NodeDescriptorState.READY
        ):
            return
        endpoint = node.endpoints[0]
        with self._lock:
            peer = self._peers.by_rid.get(rid)
            if peer is not None and peer.state in (PeerState.READY, PeerState.DRAINING):
                return  # connected (a LOST one still listed is dialled again: a broken link)
            if any(d.endpoint == endpoint for d in self._dials.values()):
                return
            if peer is not None and peer.state is PeerState.LOST:
                peer.state = PeerState.CONNECTING  # dialled again; LOST again if it goes
                self._changed.notify_all()
            elif peer is None:
                # Known from its descriptor, not connected yet: calls to it are
                # UnavailableError, not NotFoundError, until it is READY.
                self._peers.by_rid[rid] = Peer(
                    rid,
                    endpoint,
                    node.lease_generation,
                    b"",
                    state=PeerState.CONNECTING,
                    channels=dict(node.channels),
                )
                self._changed.notify_all()
            first = self._first_seen.setdefault(rid, now)
        if rid < self.routing_id and now - first < _DIAL_GRACE:
            return  # it dials us; we only step in if it does not
        self._dial(endpoint, None, expect=rid)


class _Served:
    """The one answer to a request we serve: whichever of the settle hook and the
    refusal path comes first sends it."""

    __slots__ = ("conn", "key", "meta", "node", "sent")

    def __init__(
        self, node: MeshNode, conn: bytes, key: tuple[str, int], meta: RemoteMetadata
    ) -> None:
        self.node = node
        self.conn = conn
        self.key = key
        self.meta = meta
        self.sent = False

    def __call__(self, value: object, exc: BaseException | None) -> None:
        if self.sent:
            return
        self.sent = True
        self.node._served(self.conn, self.key, self.meta, value, exc)


def _bind_pair(transport: t.Transport, application: str) -> str:
    """Bind the application endpoint and its completion one; `UnavailableError` when the
    system refuses (an address in use, a path that cannot be made)."""
    completion = completion_endpoint(application)
    try:
        return transport.bind(application, completion).application
    except zmq.ZMQError as exc:
        raise UnavailableError(f"cannot listen on {application} and {completion}: {exc}") from None


def _free_port_pair(host: str) -> int:
    """A port P with P and P+1 free on `host` now (bound, then released)."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first:
            first.bind((host, 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
            return int(port)
    raise UnavailableError(f"no free pair of ports on {host}")
