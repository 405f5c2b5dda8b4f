"""The peer table of one MeshNode: who is known, on which connection, in which state, and
the smooth weighted round robin that picks a channel server.

A peer is a routing id. It is reached over the first connection on which its handshake
completed (`conn`: our dial's alias, or the name its own dial has on our ROUTER); a
second connection (both sides dialled at once) is kept, read and answered, but never
used to send, so the messages of one Host to one peer keep one order. Everything here
runs under the node's lock; nothing touches the transport.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import transports as t

from .._core.errors import UnavailableReason
from .config import PeerInfo, PeerState

__all__ = ["LOCAL", "Peer", "PeerTable", "Role", "Unacked", "unusable"]

#: How long a LOST routing id stays known (design/mesh.md §2: at least 60 s).
LOST_RETENTION = 60.0


class Role:
    """What a peer hosts (from its handshake)."""

    OBJECT_SERVER = "object_server"
    OBJECT_CLIENT = "object_client"


class Unacked(Protocol):
    """A `Peer.unacked` entry: (seq, frames, admitted), a tuple or what reads as one."""

    def __getitem__(self, index: int, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


@dataclass(eq=False)
class Peer:
    """One peer node as this node knows it."""

    routing_id: str
    endpoint: str
    generation: int
    conn: bytes
    state: PeerState = PeerState.READY
    channels: dict[str, int] = field(default_factory=dict)
    role: str = Role.OBJECT_CLIENT
    types: tuple[str, ...] = ()
    has_node_handler: bool = False
    #: The largest payload it accepts (0: unknown): larger ones fail here, unsent.
    max_message_size: int = 0
    #: Its placement weight for global objects (0: never a placement target).
    placement_weight: int = 100
    #: Every connection of this peer (`conn` first).
    conns: set[bytes] = field(default_factory=set)
    #: Route ids of our requests in flight to it.
    inflight: set[int] = field(default_factory=set)
    lost_at: float = 0.0
    #: Why it is LOST: PEER_PAUSED when it went silent (it may come back), else PEER_LOST.
    lost_reason: UnavailableReason = UnavailableReason.PEER_LOST
    #: It said its owner lease is not admitting (HELLO / UPDATE): never placed on, and
    #: chosen for a channel only when no admitting server is.
    fenced: bool = False
    #: Its clock's offset from ours, as its connections' heartbeats last bounded it (one
    #: lifecycle is one process: one clock); `Inbound._caller_clock`.
    clock: t.ClockOffset | None = field(default=None, repr=False)
    #: The node calls' route to it, and its channels' (made on first use: `Calls.route`).
    node_route: object = field(default=None, repr=False)
    channel_routes: dict[str, object] = field(default_factory=dict, repr=False)
    #: Run when a one-way of it that we acknowledged is dropped unrun at its target
    #: (made on first use: `Inbound._drop_hook`); tells it so.
    dropped_unrun: Callable[[], None] | None = field(default=None, repr=False)
    #: Its targets that told us FULL, by (target kind, target): our one-ways to each
    #: that wait here until it says OPEN, oldest first, as (frames, how to settle it:
    #: `delivery.settle_wait`); docs/mesh.md "One full target".
    full_targets: dict[tuple[str, str], deque[Any]] = field(default_factory=dict, repr=False)
    #: Guards `full_targets` and the sequence fields below, and orders our one-ways to
    #: it with FULL and OPEN: a one-way's sequence number is given and it goes to the
    #: transport under it (so the numbers reach the peer in order); the resend on
    #: resume, FIN and the expiry take it too. Reentrant: a result settled under it may
    #: send again on the same thread.
    flow: threading.RLock = field(default_factory=threading.RLock, repr=False)
    # -- one-ways across a pause (docs/mesh.md "One-ways across a pause") --
    #: The sequence number of our last one-way to this lifecycle of the peer.
    out_seq: int = 0
    #: Our one-ways handed to the transport for it and not acknowledged yet, in
    #: sequence order: (seq, frames, the admission future of a send parked for credit,
    #: its caller's, or None: it completed). One held back for a full target is not
    #: here (it gets its number when it goes to the transport): it is in `full_targets`.
    #: A parked one-way's entry is its cell (`delivery._ParkedSend`), which reads as that
    #: tuple: one object less, and no sequence number kept, while it waits for credit.
    unacked: deque[Unacked] = field(default_factory=deque, repr=False)
    #: The highest number of ours it acknowledged.
    acked_out: int = 0
    #: The highest sequence number of its one-ways that reached this node.
    in_seq: int = 0
    #: The last `in_seq` we acknowledged to it.
    acked_in: int = 0
    #: Of its one-ways that we acknowledged: how many were never handled here, in all,
    #: and the total we last told it (DROPPED; a resume sets it to 0, so the ticker
    #: tells the total again: it may have been lost with the old connection).
    dropped_in: int = 0
    dropped_told: int = 0
    #: The DROPPED total it last told us (its notices carry running totals).
    dropped_seen: int = 0
    #: True once it is gone for good (a new lifecycle, BYE, or silent past
    #: `peer_expiry`): it never resumes, and what it had not acknowledged was counted.
    expired: bool = False
    #: We told it (FIN) that we learned of its drain: our one-ways to it end here.
    fin_sent: bool = False
    #: It told us (FIN) its last one-way to us, learning of our drain (None: not yet).
    fin_seq: int | None = None
    # -- requests across a pause (docs/mesh.md "Requests across a pause") --
    #: It said (HELLO) that it numbers requests and answers `REQUEST_AGAIN`: our requests
    #: in flight to it stay pending when it goes silent, and go again if it resumes.
    resends: bool = False
    #: The numbers of our requests to this lifecycle of it (`Envelope.seq`).
    req_numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    #: The highest number of its requests that reached this node (I/O thread only), and
    #: the numbers below it that have not (yet: two callers' requests may cross), oldest
    #: first, at most `inbound._MISSING_MAX` (past that the oldest is forgotten: taken
    #: as received, so a request sent again is never run twice, at worst answered as
    #: one that may have run).
    req_in: int = 0
    req_missing: OrderedDict[int, None] = field(default_factory=OrderedDict, repr=False)
    #: Replies to its requests that may not have reached it (sent late, or while its
    #: connection was gone), by route id: (until when its caller may still ask again, on
    #: our clock; the reply's frames). Answered from here if it sends the request again.
    kept_replies: dict[int, tuple[float, list[bytes]]] = field(default_factory=dict, repr=False)

    def info(self) -> PeerInfo:
        return PeerInfo(
            self.routing_id,
            self.endpoint,
            self.state,
            MappingProxyType(dict(self.channels)),
            self.fenced,
        )

    @property
    def selectable(self) -> bool:
        return self.state is PeerState.READY and not self.fenced


def unusable(peer: Peer | None) -> UnavailableReason:
    """Why a call cannot use `peer` (None: a routing id with no peer entry yet), which is
    not READY: CONNECTING, DRAINING, or its `lost_reason`."""
    if peer is None or peer.state is PeerState.CONNECTING:
        return UnavailableReason.CONNECTING
    if peer.state is PeerState.DRAINING:
        return UnavailableReason.DRAINING
    if peer.expired:
        return UnavailableReason.PEER_LOST  # past peer_expiry: it never resumes
    if not peer.lost_at:
        return UnavailableReason.CONNECTING
    return peer.lost_reason


class _Local:
    """This node, as a select-one candidate."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LOCAL"


LOCAL = _Local()


class PeerTable:
    """Peers by routing id and by connection, and the select-one state. Not locked: the
    node holds its lock around every call."""

    def __init__(self) -> None:
        self.by_rid: dict[str, Peer] = {}
        self.by_conn: dict[bytes, Peer] = {}
        #: Smooth weighted round robin: channel -> candidate -> current weight.
        self._current: dict[str, dict[object, int]] = {}
        self.lost_peers = 0

    def add(self, peer: Peer) -> None:
        self.by_rid[peer.routing_id] = peer
        peer.conns.add(peer.conn)
        self.by_conn[peer.conn] = peer

    def add_conn(self, peer: Peer, conn: bytes) -> None:
        peer.conns.add(conn)
        self.by_conn[conn] = peer

    def drop_conns(self, peer: Peer) -> set[bytes]:
        """Forget every connection of `peer`; returns them."""
        conns = set(peer.conns)
        for conn in conns:
            if self.by_conn.get(conn) is peer:
                del self.by_conn[conn]
        peer.conns.clear()
        return conns

    def mark_lost(self, peer: Peer) -> None:
        if peer.state is not PeerState.LOST:
            # `lost_at` first: a call reading the peer without the lock (`unusable`)
            # never sees it LOST with no time of loss (CONNECTING, its reason then).
            peer.lost_at = time.monotonic()
            peer.state = PeerState.LOST
            self.lost_peers += 1

    def purge(self, now: float) -> None:
        """Forget expired LOST peers older than the retention."""
        for rid, peer in list(self.by_rid.items()):
            if (
                peer.state is PeerState.LOST
                and peer.expired
                and now - peer.lost_at > LOST_RETENTION
            ):
                del self.by_rid[rid]

    def by_endpoint(self, endpoint: str) -> Peer | None:
        for peer in self.by_rid.values():
            if peer.endpoint == endpoint and peer.state in (PeerState.READY, PeerState.DRAINING):
                return peer
        return None

    def select(
        self, channel: str, local_weight: int | None, local_fenced: bool = False
    ) -> Peer | _Local | None:
        """Pick one server of `channel` by smooth weighted round robin among the READY
        peers that serve it with weight > 0 and this node (`local_weight`: None when it
        does not serve it, or drains). A server whose owner lease is not admitting
        (`local_fenced` for this node) is a candidate only when no other is. None when
        there is no candidate."""
        candidates: list[tuple[object, int]] = []
        fenced: list[tuple[object, int]] = []
        if local_weight:
            (fenced if local_fenced else candidates).append((LOCAL, local_weight))
        for peer in self.by_rid.values():
            weight = peer.channels.get(channel, 0)
            if weight > 0 and peer.state is PeerState.READY:
                (fenced if peer.fenced else candidates).append((peer, weight))
        return self.pick(channel, candidates or fenced)

    def place(self, type_name: str) -> Peer | None:
        """Pick a READY Object Server peer that registers `type_name` with placement
        weight > 0 and whose owner lease admits, by smooth weighted round robin (global
        objects); None if none."""
        candidates: list[tuple[object, int]] = [
            (peer, peer.placement_weight)
            for peer in self.by_rid.values()
            if peer.state is PeerState.READY
            and not peer.fenced
            and peer.placement_weight > 0
            and type_name in peer.types
        ]
        picked = self.pick("\x00place\x00" + type_name, candidates)
        assert picked is None or isinstance(picked, Peer)
        return picked

    def fenced_servers(self, type_name: str) -> int:
        """READY peers `place` left out only because their owner lease is not admitting."""
        return sum(
            1
            for peer in self.by_rid.values()
            if peer.state is PeerState.READY
            and peer.fenced
            and peer.placement_weight > 0
            and type_name in peer.types
        )

    def pick(self, name: str, candidates: list[tuple[object, int]]) -> Peer | _Local | None:
        """Smooth weighted round robin over `candidates` ((candidate, weight > 0)), with
        the running weights kept under `name`; None when there is no candidate."""
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0][0]  # type: ignore[return-value]
        current = self._current.setdefault(name, {})
        keys = {key for key, _ in candidates}
        for key in [k for k in current if k not in keys]:
            del current[key]  # a server that left starts again from zero if it returns
        total = 0
        best: object = None
        best_weight = 0
        for key, weight in candidates:
            value = current.get(key, 0) + weight
            current[key] = value
            total += weight
            if best is None or value > best_weight:
                best, best_weight = key, value
        current[best] -= total
        return best  # type: ignore[return-value]

    def counts(self) -> dict[PeerState, int]:
        counts = dict.fromkeys(PeerState, 0)
        for peer in self.by_rid.values():
            counts[peer.state] += 1
        return counts
