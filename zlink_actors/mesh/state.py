"""The state of one MeshNode while it is still one class built in layers: it builds the
parts every layer shares (`shared.NodeShared`, the context; `shared.Link`, the edge to
the transport; `delivery.Delivery`, the one-ways it sends; `outbound.Outbound`, the
calls it sends and their replies) and keeps aliases of their immutable members and of
the methods the layers call most, plus the peer table, the handshake payload and the
counters not moved to a part yet (docs/mesh.md). The layers
build on it in one line, each module importing the one before: `state` -> `handshake`
-> `calls` -> `inbound` -> `routing` -> `ownership` -> `objects` -> `node` (the last
three with `operations`: the global objects; a contract in pyproject.toml keeps the
order).

Threads: the transport's I/O thread runs the receiving side; application threads and
handler turns run the calls; the I/O executor's loop runs discovery. `_lock` (the shared
lock) guards the peer table and the counters; it is never held while a completion or a
callback runs, and the only transport method called under a lock is `set_flow`
(`inbound.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec

import transports as t

from .._core.completion import CompletionSource
from .._core.errors import UnavailableReason
from .._engine.kernel import Runtime
from .._engine.objects import ObjectKind
from ..location.spi import LocationStore
from . import codec as wire
from .codec import Codec
from .config import (
    MeshConfig,
    NodeInfo,
    PeerInfo,
    PeerState,
)
from .delivery import Delivery
from .outbound import Outbound
from .peers import Peer, PeerTable, Role
from .shared import HOLD_PER_PERMIT, Link, NodeShared

__all__ = [
    "MeshStatistics",
    "NodeState",
    "_Dial",
    "_Hello",
    "_decode_hello",
    "connection_name",
]

#: The longest libzmq routing id (ZMTP 3: one length byte).
_NAME_MAX = 255


def connection_name(routing_id: str, generation: int) -> bytes:
    """The transport name of one node lifecycle: its routing id and its generation, so
    two live nodes given one routing id never share a name on a peer's ROUTER. A shared
    name would make that ROUTER hand the first node's connection over to the second
    (`ROUTER_HANDOVER`): the first is cut off, and with traffic in flight libzmq aborts
    the process (`Assertion failed: !_io_error`; docs/decisions.md). A routing id too
    long for the suffix keeps its first bytes and a digest of the whole."""
    rid = routing_id.encode()
    suffix = b"@%x" % generation
    if len(rid) + len(suffix) <= _NAME_MAX:
        return rid + suffix
    digest = hashlib.blake2b(rid, digest_size=8).hexdigest().encode()
    return rid[: _NAME_MAX - len(suffix) - len(digest) - 1] + b"~" + digest + suffix


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
    #: Its `MeshConfig.placement_weight` (-1: unknown, an older peer: the default).
    placement_weight: int = -1
    #: Its owner lease stopped admitting (lost or lapsed) and has not recovered yet.
    fenced: bool = False
    #: Its `time.monotonic()` as it made this hello (0.0: an older peer). In an ADMIT,
    #: read after the HELLO came: the dialling node's first sample of its clock offset.
    clock: float = 0.0
    #: It numbers its requests and answers `REQUEST_AGAIN` (False: an older peer): a
    #: request to it stays pending while it is silent (docs/mesh.md "Requests across a
    #: pause").
    resends: bool = False


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
        parked_sends: messages waiting for credit, for a PAUSED peer or for a full
            target (`target_waits`).
        paused: True while this node tells its senders PAUSED.
        permits_in_use: inbound records received whose handler has not started.
        permits: the inbound permits (`MeshConfig.inbound_permits`).
        target_permits: the most of them records for one target hold
            (`MeshConfig.target_cap()`); records beyond it are admitted without one.
        full_targets: targets whose records hold `target_permits` permits now.
        unpermitted_records: records admitted without a permit since the node started
            (their target held its share: docs/mesh.md "One full target").
        target_waits: of `parked_sends`, the one-ways waiting here because their target
            on a peer said FULL.
        frames_in / frames_out: transport frames received / sent.
        decode_errors: received records that could not be decoded (logged, counted).
        dropped_messages: received one-way messages that were acknowledged here and
            never handled: refused by their target or dropped unrun when it closed,
            held while fenced for a target claimed elsewhere, on a stale route with no
            owner to go on to (logged; each one's sender is told: DROPPED).
        late_replies: replies that found their request already finished (dropped).
        lease_admitting: with `location=`, True while this node's owner lease admits
            work (False before it is acquired and once its admission deadline passed).
        lease_state: `"none"` (no `location=`), `"acquiring"` (not admitting yet since
            the start), `"admitting"`, `"fenced"` (it was admitting and is not now: it
            recovers by itself, or shuts down with `on_lease_lost="shutdown"`) or
            `"released"` (shutdown released it).
        lease_generation: the generation of the owner lease held now (0: none).
        lease_recoveries: times the node admitted again after being fenced.
        objects_reclaimed: records this node claimed again for a new lease (or after
            the store lost them) while recovering.
        ownership_lost: objects closed here with `CloseReason.OWNERSHIP_LOST` because
            another node claimed their id while this node's lease was lost.
        owned_objects: global Spots and Actors whose Ready record names this node.
        route_cache_hits / route_cache_misses: calls to global objects held elsewhere
            that found a fresh route in the cache / had to read the Location Store.
        route_cache_size: routes cached now (expired ones are purged about every
            `route_cache_max_age`).
        dropped_after_admission: one-way messages that completed here (admitted for a
            peer) and that were never handled there: the peer went for good before it
            received them (a new lifecycle, BYE, or silent past `peer_expiry`), or it
            received them and lost them (its `dropped_messages`: it says so, a DROPPED
            notice); each loss is logged (once per lost peer with its count; at most
            once a second per peer for the others).
        dropped_by_peer: the same, by the peer's routing id (kept across its lifecycles).
        duplicate_messages: one-ways a peer sent again after a pause that had reached
            this node already (dropped, not handled twice).
        held_while_fenced: one-ways from peers that arrived while this node's owner
            lease was fenced (refused by their global target): held, and handed to their
            target once it admits again (docs/mesh.md "One-ways to a fenced node").
        forwarded_messages: one-ways from peers that reached this node on a stale route
            (it does not hold their target) and went on to the owner the Location Store
            names (one that fails there is lost, counted by its sender).
        replies_lost: requests a peer sent again after it found this node silent and it
            resumed (`REQUEST_AGAIN`) whose first copy had reached this node and been
            answered on the old connection, the answer not kept: answered
            `UnavailableError` (`peer_paused`: it may have run). Rare: an answer sent
            early in a partition (docs/mesh.md "Requests across a pause").
        unavailable: requests from peers this node answered with `UnavailableError`,
            by `UnavailableReason` value (`"queue_full"`, `"not_owner"`, ...; a reason
            never given is absent; an unspecified one is not counted).
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
    lease_admitting: bool = False
    lease_state: str = "none"
    lease_generation: int = 0
    lease_recoveries: int = 0
    objects_reclaimed: int = 0
    ownership_lost: int = 0
    owned_objects: int = 0
    route_cache_hits: int = 0
    route_cache_misses: int = 0
    route_cache_size: int = 0
    dropped_after_admission: int = 0
    dropped_by_peer: dict[str, int] = field(default_factory=dict)
    duplicate_messages: int = 0
    held_while_fenced: int = 0
    forwarded_messages: int = 0
    unavailable: dict[str, int] = field(default_factory=dict)
    target_permits: int = 0
    full_targets: int = 0
    unpermitted_records: int = 0
    target_waits: int = 0
    replies_lost: int = 0


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
    #: travels on the completion connection, which is read after the application one),
    #: and its notices that came before the ADMIT (it admitted us first, and a notice
    #: of another of its threads can leave before the ADMIT: an ACK or DROPPED total
    #: on a resume): handled, in order, once it is (`Handshake._early_notice`).
    early: list[t.Inbound] = field(default_factory=list)
    #: Our `time.monotonic()` before the HELLO was submitted (0.0: not yet).
    sent: float = 0.0


class NodeState:
    """What every part of a MeshNode shares (see the module docstring)."""

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
        #: The parts every other one is handed (`shared.py`).
        self.shared = shared = NodeShared(
            runtime,
            config,
            routing_id,
            codec,
            channels=channels,
            node_handler=node_handler,
            object_types=object_types,
            location=location,
        )
        self.link = link = Link(shared)
        # Aliases of the same objects, while the node is still one class: its methods
        # read them as before (each of them is immutable; what changes is read from
        # `shared` and `link`, its one home).
        self.config = config
        self.runtime = runtime
        self.routing_id = routing_id
        self.codec = codec
        self.location = location
        self.node_key = shared.node_key
        self.generation = shared.generation
        self.has_node_handler = node_handler
        self.object_types = shared.object_types
        self._lock = shared.lock
        self._changed = shared.changed
        self._release = link.release
        self._give_back = link.give_back
        self._notify_quietly = link.notify
        self._submit_quietly = link.submit_quietly
        self._disconnect = link.disconnect
        self._bad = link.bad
        self._warn_dropped = link.warn_dropped
        self._reply_frames = link.reply_frames
        self._reply_error = link.reply_error
        self._reply_value = link.reply_value
        self._error_frames = link.error_frames
        self._peers = peers = PeerTable()
        #: Sender-side one-ways (`delivery.py`); what a peer gone for good leaves of
        #: our requests fails with them (`Outbound.fail_inflight`).
        self.delivery = delivery = Delivery(shared, link, self._fail_requests)
        self._encode = delivery.encode
        self._send = delivery.send
        #: The calls this node sends and their replies (`outbound.py`): the engine's
        #: remote SPI (`runtime.remote`).
        self.outbound = Outbound(shared, link, peers, delivery)
        self._dials: dict[bytes, _Dial] = {}
        self._dial_numbers = itertools.count(1)
        self._handshakes = itertools.count(1)
        #: The route cache of global objects ((kind, id) -> entry; `objects.py`).
        self._routes: dict[object, object] = {}
        #: Requests we serve: (sender routing id, route id) -> its answer
        #: (`inbound._Served`: the local request, the connection its reply goes on).
        self._serving: dict[tuple[str, int], Any] = {}
        #: The envelope of a value's reply, by the value's type name (`inbound._Served`).
        self._reply_heads: dict[str, bytes] = {}
        #: While `_on_receive` runs (on the transport's I/O thread, the only caller of
        #: `_receive` as well): the credit its admitted requests owe, by connection.
        self._batch_owed: dict[bytes, int] | None = None
        #: The Host clock (deadlines), and whether it is the real `time.monotonic()`:
        #: then a request's deadline is read on its caller's clock (`Inbound._caller_due`).
        self._now = shared.now
        self._real_time = shared.real_time
        self._permits = config.permits()
        self._permits_in_use = 0
        self._pause_at = max(1, (self._permits * 8) // 10)
        self._resume_at = (self._permits * 6) // 10
        self._paused = False
        #: The most permits records for one target hold (`MeshConfig.target_cap`), and
        #: what they hold now, by (kind, target) (`inbound._TargetPermits`).
        self._target_cap = config.target_cap()
        self._target_held: dict[tuple[ObjectKind, str], Any] = {}
        self.unpermitted_records = 0
        #: Serialises flow decisions with the `set_flow` calls that apply them.
        self._flow_lock = threading.Lock()
        self.objects_reclaimed = 0
        self.ownership_lost = 0
        #: (objects claimed again, objects lost) since the node was last fenced.
        self._episode = (0, 0)
        self.dropped_messages = 0
        #: One-ways a peer sent again after a pause that had reached us already.
        self.duplicate_messages = 0
        #: Records read from the old connection of a peer found silent (it resends), and
        #: requests that reached us twice (sent again on resume): dropped unhandled.
        self.late_records = 0
        #: Requests a peer sent again after a pause whose first copy we had answered and
        #: whose answer was not kept: answered `UnavailableError` (they may have run).
        self.replies_lost = 0
        #: A served request answered more than this long after its caller sent it has
        #: its reply kept for a resend (`inbound.Inbound._answer_served`).
        self._keep_after = config.liveness_interval
        #: Received one-ways waiting for admission here (a full lane).
        self._sends_waiting = 0
        #: One-ways refused here because the owner lease was fenced, and those that
        #: arrived behind them: held in arrival order until it admits again, as (record
        #: with no credit left, its peer) (`Inbound._hold`, `_deliver_held`); None when
        #: none is held (the one check on the path of every received one-way).
        self._fence_held: deque[tuple[t.Inbound, Peer]] | None = None
        #: Past this many held, the newest is lost (its sender told).
        self._hold_max = HOLD_PER_PERMIT * self._permits
        self.held_while_fenced = 0
        #: One-ways that reached this node on a stale route and went on to the owner.
        self.forwarded_messages = 0
        self._first_seen: dict[str, float] = {}
        #: Duplicate routing ids refused (or refused to us), logged once each (`handshake`).
        self._duplicates: set[tuple[str, object]] = set()
        #: Refused dials to close once their REJECT notice left: (when, alias), in order.
        self._closing: list[tuple[float, bytes]] = []
        #: Calls on the I/O loop waiting for a peer's connection (`routing`): woken when
        #: a peer becomes READY or is lost (under `_lock`).
        self._peer_waiters: list[asyncio.Future[None]] = []
        self._discovery_stop = threading.Event()
        #: Set (on the I/O loop) with `_discovery_stop`: wakes discovery.
        self._stopping = asyncio.Event()
        self._discovery: Future[None] | None = None
        self._keeper: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        #: The peer each endpoint we dialled led to (its advertised endpoint may be
        #: spelt otherwise): the keeper dials an endpoint again only once that peer is lost.
        self._dialled: dict[str, Peer] = {}

    @property
    def info(self) -> NodeInfo | None:
        """This node's info once it is bound (`start`); None before."""
        return self.shared.info

    def _hello_bytes(self) -> bytes:
        shared = self.shared
        info = shared.info
        assert info is not None
        with self._lock:
            channels = dict(shared.weights)
            draining = shared.draining
            fenced = shared.lease_state == "fenced"
        return _encode_hello(
            _Hello(
                self.routing_id,
                self.generation,
                info.endpoint,
                channels,
                Role.OBJECT_SERVER if self.object_types else Role.OBJECT_CLIENT,
                list(self.object_types),
                self.has_node_handler,
                draining,
                self.config.credit_window,
                self.config.max_message_size,
                self.config.placement_weight,
                fenced,
                time.monotonic(),
                True,
            )
        )

    def _tell_update(self) -> None:
        """Tell every live peer this node's state now (an UPDATE notice carrying its
        hello: weights, draining, fenced); a notice waits behind no credit and no
        PAUSED peer."""
        with self._lock:
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
        update = self._hello_bytes()
        for peer in peers:
            self._notify_quietly(peer.conn, wire.encode_fields(wire.UPDATE), update)

    def _use_window(self, conn: bytes, granted: int) -> None:
        """The receiver's credit window bounds what we send it (ours bounds it too: the
        transport's libzmq backstop is sized by our own window)."""
        transport = self.shared.transport
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
        peer.placement_weight = 100 if hello.placement_weight < 0 else hello.placement_weight
        peer.fenced = hello.fenced
        peer.resends = hello.resends
        if peer.state is not PeerState.LOST:
            peer.state = PeerState.DRAINING if hello.draining else PeerState.READY

    def _ack(self, peer: Peer) -> None:
        """Tell `peer` which of its one-ways reached us (an ACK notice), if any are new."""
        seq = peer.in_seq
        if seq <= peer.acked_in or peer.state is PeerState.LOST:
            return
        peer.acked_in = seq
        self._notify_quietly(peer.conn, wire.encode_fields(wire.ACK, route=seq), b"")

    def _wake_peer_waiters(self) -> None:
        """A peer became READY or was lost: the calls waiting for a connection look
        again (from any thread)."""
        if not self._peer_waiters:  # one list read: the common case takes no lock
            return
        with self._lock:
            waiters, self._peer_waiters = self._peer_waiters, []

        def wake() -> None:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

        with contextlib.suppress(RuntimeError):  # the loop has stopped: nobody waits
            self.runtime.io.loop.call_soon_threadsafe(wake)

    def _fail_requests(self, peer: Peer, why: str, reason: UnavailableReason) -> None:
        """`Delivery`'s hook for a peer gone for good: our requests to it fail too (the
        requests' part is built after the one-ways' part, which it sends through)."""
        self.outbound.fail_inflight(peer, why, reason)

    def _forget_told(self, conn: bytes) -> None:
        """Connection `conn` was lost, or a handshake (re)starts on it (a resumed peer
        comes back under the same connection name): the FULL its sender was told is
        forgotten (it holds nothing back for us now, and is told FULL again if its
        one-ways must wait), and the credit still owed to it goes back if its transport
        connection still counts it (a new one does not: then nothing is owed)."""
        owed = 0
        with self._lock:
            for held in self._target_held.values():
                told = held.told
                if told:
                    n = told.pop(conn, None)
                    if n is not None and n > 0:
                        owed += n
        self._give_back(conn, owed)

    def _receive(self, rec: t.Inbound) -> None:
        """Handle one received record (`inbound.py`)."""
        raise NotImplementedError
