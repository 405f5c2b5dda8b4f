"""One-way messages this node sends to peers, from the send to the peer's acknowledgement
(docs/mesh.md "One-ways across a pause", "One full target").

`Delivery` numbers each one-way of a peer's lifecycle and keeps it (`Peer.unacked`) until
the peer acknowledges it (ACK); sends again, in order, what a peer that comes back after a
pause did not acknowledge; holds the one-ways to a target the peer said is FULL until it
says OPEN; tells a draining peer the last one it sent (FIN); and counts as lost, and logs,
what a peer that went for good never handled (`dropped_after_admission`).

Threads: `send` runs on the caller's thread; the notices (`acked`, `full`, `open`,
`dropped_there`) on the transport's I/O thread. One peer's numbering, its held one-ways
and its resend are serialised by the peer's `flow` lock; the node lock guards the
counters. Neither is held while a completion or a callback runs.
"""

from __future__ import annotations

import _thread
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Final

import transports as t

from .._core.completion import Cell, Completion, failed, settled
from .._core.errors import (
    ProtocolError,
    UnavailableError,
    UnavailableReason,
)
from . import codec as wire
from .codec import Envelope
from .config import PeerState
from .loop_calls import refuse_cancel
from .peers import Peer
from .shared import (
    CHANNEL,
    KIND_NAMES,
    NODE,
    Link,
    NodeShared,
    Route,
    admission_error,
    gone_error,
    log,
    submit_error,
)

__all__ = ["Delivery", "Settles", "settle_wait"]

#: The lock the cells of parked one-ways share (`_ParkedSend`): held for a few
#: instructions by whoever completes or waits for one, never while calling out.
_PARKED_LOCK: Final = _thread.allocate_lock()

#: One-ways that waited for their target and went to the transport: (what settles each:
#: its cell, or the transport's first `admitted` future its caller listens to; what the
#: transport said: None sent, the future of its admission, or why it failed).
Settles = list[tuple[Cell[None] | Future[None], Future[None] | BaseException | None]]


def settle_wait(settle: Cell[None] | Future[None], exc: BaseException | None) -> None:
    """End a one-way that waited for a full target (`Peer.full_targets`): admitted
    (`exc` None) or failed. `settle` is its result cell, or, for one the transport had
    parked and gave back, the transport's `admitted` future its caller listens to."""
    if isinstance(settle, Future):
        if not settle.done():
            if exc is None:
                settle.set_result(None)
            else:
                settle.set_exception(exc)
    else:
        settle.try_set(None, exc)


class Delivery:
    """Sender-side one-ways (see the module docstring).

    Counters (read under the node lock): `dropped_after_admission`, one-ways that
    completed here and were never handled at their peer; `dropped_by_peer`, the same by
    the peer's routing id."""

    __slots__ = (
        "_codec",
        "_config",
        "_fail_requests",
        "_lock",
        "_mesh",
        "_notify",
        "_shared",
        "_warn_dropped",
        "dropped_after_admission",
        "dropped_by_peer",
    )

    def __init__(
        self,
        shared: NodeShared,
        link: Link,
        fail_requests: Callable[[Peer, str, UnavailableReason], None],
    ) -> None:
        """`fail_requests(peer, why, reason)` ends our requests in flight to a peer that
        went for good (`expire`): the requests' part."""
        self._shared = shared
        self._config = shared.config
        self._mesh = shared.config.name
        self._codec = shared.codec
        self._lock = shared.lock
        self._notify = link.notify
        self._warn_dropped = link.warn_dropped
        self._fail_requests = fail_requests
        self.dropped_after_admission = 0
        self.dropped_by_peer: dict[str, int] = {}

    # -- sending ----------------------------------------------------------------------

    def encode(self, payload: object, peer: Peer) -> tuple[str, bytes]:
        """The payload's type name and bytes; `ProtocolError` (nothing sent) when it
        cannot be encoded or is larger than this node or the peer accepts."""
        type_name, data = self._codec.encode_payload(payload)
        limit = peer.max_message_size
        if limit and len(data) > limit:
            raise ProtocolError(
                f"a {type(payload).__qualname__} payload is {len(data)} bytes encoded, more "
                f"than node {peer.routing_id!r} accepts (its max_message_size, {limit})"
            )
        return type_name, data

    def send(
        self,
        route: Route,
        payload: object,
        metadata: dict[str, object] | None,
        intent: str | None,
    ) -> Completion[None]:
        """Send a one-way to `route`, with the instance intent of a Spot message (None:
        none).

        Each one-way to a peer carries the next sequence number of that peer's lifecycle
        (in `route`), given and submitted under the peer's `flow` lock so the numbers
        reach it in order; it is kept (`Peer.unacked`) until the peer acknowledges it,
        and sent again if the peer comes back after a pause (`resend`). One to a target
        that said FULL waits here, unnumbered, until OPEN (`open`)."""
        peer = route.peer
        try:
            type_name, data = self.encode(payload, peer)
        except ProtocolError as exc:
            return failed(exc)
        transport = self._shared.transport
        assert transport is not None
        kind = KIND_NAMES[route.kind]
        # One at a time per peer with what FULL and OPEN do and with the resend on
        # resume: a one-way never overtakes an older one to the same target, and the
        # numbers reach the peer in the order they are given.
        with peer.flow:
            if peer.state is PeerState.LOST or peer.state is PeerState.CONNECTING:
                return failed(self.gone_error(peer))
            if peer.fin_sent:
                return failed(
                    UnavailableError(
                        f"node {peer.routing_id!r} is draining",
                        reason=UnavailableReason.DRAINING,
                    )
                )
            if peer.fenced and route.kind is not NODE and route.kind is not CHANNEL:
                # Its objects admit nothing now: it would only hold this one.
                return failed(
                    UnavailableError(
                        f"{kind} {route.target!r}: its node {peer.routing_id!r} has a fenced "
                        "owner lease (it admits nothing until it recovers)",
                        reason=UnavailableReason.FENCED,
                    )
                )
            # A target of this peer that is full: its one-ways wait here, numbered only
            # when they go to the transport (`_submit_waited`).
            waiting = peer.full_targets.get((kind, route.target)) if peer.full_targets else None
            seq = 0 if waiting is not None else peer.out_seq + 1
            try:
                env = wire.encode_send(
                    seq, kind, route.target, self._mesh, metadata, type_name, intent
                )
            except ProtocolError as exc:
                return failed(exc)
            frames = (env, data)  # the tuple the transport keeps too (`_checked_frames`)
            if waiting is not None:
                held: Cell[None] = Cell(_PARKED_LOCK)
                waiting.append((frames, held))
                # SC §5/§7: a waiting send has no timeout, refuses caller cancellation.
                return Completion(held, refuse_cancel)
            try:
                result = transport.submit(peer.conn, frames)
            except (t.UnknownPeer, t.Closed, t.PayloadTooLarge) as exc:
                return failed(submit_error(exc, peer, self._config.peer_expiry))
            peer.out_seq = seq
            if result.status is t.SubmitStatus.OK:
                peer.unacked.append((seq, frames, None))
                if peer.acked_out >= seq:  # sent directly, and acknowledged before this
                    self.acked(peer, peer.acked_out)
                return settled(None)
            admitted = result.admitted
            assert admitted is not None
            cell = _ParkedSend(peer, frames, admitted)  # its unacked entry too
            peer.unacked.append(cell)
        admitted.add_done_callback(cell)
        # SC §5/§7: a waiting send has no timeout and refuses caller cancellation.
        return Completion(cell, refuse_cancel)

    def gone_error(self, peer: Peer) -> UnavailableError:
        """The error of a call to `peer`, which is not connected (`shared.gone_error`)."""
        return gone_error(peer, self._config.peer_expiry)

    # -- what the peer tells us -------------------------------------------------------

    def acked(self, peer: Peer, seq: int) -> None:
        """`peer` has every one-way of ours up to `seq`: we stop keeping them.

        Without the peer's `flow` lock (a sender in a loop holds it nearly always, and
        this runs on the transport's I/O thread): the deque's popleft and the senders'
        append are atomic, and the resume that rewrites it runs on this thread too."""
        peer.acked_out = max(peer.acked_out, seq)
        unacked = peer.unacked
        try:
            while unacked and unacked[0][0] <= seq:
                unacked.popleft()
        except IndexError:
            pass  # emptied meanwhile (the peer expired)

    def full(self, conn: bytes, env: Envelope, peer: Peer) -> None:
        """FULL from `peer` (on its connection `conn`): the target `env` names has no
        room. Our one-ways to it wait here from now on (with those the transport parked
        for it: taken back, in front), and the peer is told HELD."""
        key = (env.target_kind, env.target)
        transport = self._shared.transport
        with peer.flow:
            # After our FIN we send it nothing more: what is parked for the target is
            # below the FIN's number, and goes once the credit comes back.
            if not peer.fin_sent:
                waiting = peer.full_targets.get(key)
                if waiting is None:
                    waiting = peer.full_targets[key] = deque()
                if transport is not None:
                    self._take_back_for(transport, peer, key, waiting)
        # Now the credit of what waits there for the target may come back.
        held = wire.encode_fields(wire.HELD, target_kind=key[0], target=key[1], mesh=self._mesh)
        self._notify(conn, held, b"")

    def open(self, peer: Peer, key: tuple[str, str], room: int) -> None:
        """Target `key` of `peer` has room for `room` more records (OPEN): send that many
        of the one-ways waiting for it, oldest first. While more wait it stays full here,
        and a WAITING record behind those asks it for the next OPEN."""
        transport = self._shared.transport
        if transport is None:
            return
        sent: Settles = []
        with peer.flow:  # nothing else goes to the target meanwhile: FIFO
            waiting = peer.full_targets.get(key)
            if waiting is None:
                return
            while waiting and len(sent) < room:
                frames, cell = waiting.popleft()
                sent.append((cell, self._submit_waited(transport, peer, frames)))
            if not waiting:
                del peer.full_targets[key]
            else:
                ask = wire.encode_fields(
                    wire.WAITING, target_kind=key[0], target=key[1], mesh=self._mesh
                )
                self._submit_waited(transport, peer, [ask, b""], number=False)
        self.settle_sent(sent, peer)

    def dropped_there(self, peer: Peer, total: int) -> None:
        """DROPPED from `peer`: `total` of our one-ways it had acknowledged were never
        handled there, in all (their target closed before they ran or refused them, it
        held them while fenced and their target was gone when it admitted again, or it
        stopped first): what the total adds is counted and logged as lost."""
        with self._lock:
            lost = total - peer.dropped_seen
            if lost <= 0:
                return  # told again (its connection was replaced): counted already
            peer.dropped_seen = total
        self._count_lost(peer, lost)
        self._warn_dropped(
            "dropped there",
            peer.routing_id,
            "told",
            "mesh %s: %d one-way message(s) admitted for %s were never handled there "
            "(its log says why)",
            lost,
            peer.routing_id,
        )

    # -- a peer's life ----------------------------------------------------------------

    def resend(self, peer: Peer, conn: bytes) -> tuple[int, Settles]:
        """Under `peer.flow`, as `peer` is READY again on `conn` after a pause (the same
        lifecycle): send it again, in order, every one-way of ours it has not
        acknowledged (it drops those that had reached it: their sequence numbers are not
        above the last it saw), then those held back here for its full targets, numbered
        after them (it told FULL on the old connection, and tells it again on this one
        if the target is still full). Returns how many went again, and the held ones for
        `settle_sent`, to call once `peer.flow` is released."""
        transport = self._shared.transport
        kept = [
            entry
            for entry in peer.unacked
            if entry[2] is None or (entry[2].done() and entry[2].exception() is None)
        ]
        peer.unacked.clear()
        peer.unacked.extend((seq, frames, None) for seq, frames, _ in kept)
        if transport is not None:
            for _, frames, _ in kept:
                try:
                    transport.submit(conn, frames)
                except t.TransportError:
                    break  # lost again: kept, for the next resume or the expiry
        sent: Settles = []
        if transport is not None:
            for waiting in peer.full_targets.values():
                for frames, settle in waiting:
                    sent.append((settle, self._submit_waited(transport, peer, frames)))
            peer.full_targets.clear()
        return len(kept), sent

    def settle_sent(self, sent: Settles, peer: Peer) -> None:
        """Settle one-ways that waited for their target once they went to the transport
        (outside the peer's `flow` lock: a listener may send again)."""
        for settle, outcome in sent:
            if isinstance(outcome, Future):
                _settle_when_admitted(outcome, settle, peer)
            else:
                settle_wait(settle, outcome)

    def fin(self, peer: Peer) -> None:
        """`peer` drains: tell it (FIN) the last one-way we sent it, and send it no more
        (it handles every one up to that before it stops admitting them)."""
        with peer.flow:
            if peer.fin_sent:
                return
            peer.fin_sent = True
            # The last number handed to the transport that may not have reached it (a
            # number taken back for a full target never does): or all it acknowledged.
            try:
                seq = peer.unacked[-1][0]
            except IndexError:
                seq = peer.acked_out
            held = [settle for waiting in peer.full_targets.values() for _, settle in waiting]
            peer.full_targets.clear()
        self._notify(peer.conn, wire.encode_fields(wire.FIN, route=seq), b"")
        # Held back for a full target of it, never sent: they end as a call to a
        # draining node does.
        exc = UnavailableError(
            f"node {peer.routing_id!r} is draining", reason=UnavailableReason.DRAINING
        )
        for settle in held:
            settle_wait(settle, exc)

    def expire(self, peer: Peer, why: str) -> None:
        """`peer`'s lifecycle is gone for good: what it did not acknowledge is lost,
        counted and logged in one line (nothing is logged when nothing was lost); our
        requests in flight to it and the one-ways held for its full targets fail."""
        with peer.flow:
            if peer.expired:
                return
            peer.expired = True
            kept = list(peer.unacked)  # one C-level copy: an ACK may pop meanwhile
            peer.unacked.clear()
            peer.kept_replies = {}  # it never asks again
            lost = sum(
                1
                for _, _, admitted in kept
                if admitted is None or (admitted.done() and admitted.exception() is None)
            )
        # Our requests still pending for it (it went silent, they waited for a resume)
        # end now: it will not answer them.
        self._fail_requests(peer, why, UnavailableReason.PEER_LOST)
        # Held back for a full target of it: never sent, never completed; they fail (not
        # counted lost: their callers see why). Expired, it gets no more (`send`).
        self.fail_target_waits(
            peer,
            UnavailableError(f"node {peer.routing_id!r} {why}", reason=UnavailableReason.PEER_LOST),
        )
        if not lost:
            return
        self._count_lost(peer, lost)
        log.warning(
            "mesh %s: peer %s (generation %d) %s: %d one-way message(s) admitted for it "
            "were never delivered",
            self._shared.routing_id,
            peer.routing_id,
            peer.generation,
            why,
            lost,
        )

    def fail_target_waits(self, peer: Peer, exc: BaseException) -> None:
        """End every one-way waiting here for a full target of `peer` with `exc`."""
        with peer.flow:
            waits = list(peer.full_targets.values())
            peer.full_targets.clear()
        for waiting in waits:
            for _, settle in waiting:
                settle_wait(settle, exc)

    # -- inside -----------------------------------------------------------------------

    def _count_lost(self, peer: Peer, lost: int) -> None:
        """`lost` of our one-ways that completed here were never handled at `peer`
        (`MeshStatistics.dropped_after_admission`, `dropped_by_peer`)."""
        with self._lock:
            self.dropped_after_admission += lost
            rid = peer.routing_id
            self.dropped_by_peer[rid] = self.dropped_by_peer.get(rid, 0) + lost

    def _take_back_for(
        self, transport: t.Transport, peer: Peer, key: tuple[str, str], waiting: deque[Any]
    ) -> None:
        """Under `peer.flow`: its one-ways to target `key` that the transport parked (for
        credit) and whose callers still wait wait here too, in front (they are older):
        nothing for another target waits behind them. They leave `peer.unacked` (their
        numbers never reach the peer): each gets a new one when it goes again."""
        pending = {seq for seq, _, admitted in peer.unacked if admitted is not None}
        if not pending:
            return
        taken = transport.withdraw_matching(peer.conn, _SendsTo(key, pending))
        if not taken:
            return
        gone = {id(admitted) for _, admitted in taken}
        kept = [entry for entry in peer.unacked if id(entry[2]) not in gone]
        peer.unacked.clear()
        peer.unacked.extend(kept)
        waiting.extendleft(reversed(taken))

    def _submit_waited(
        self, transport: t.Transport, peer: Peer, frames: Sequence[bytes], number: bool = True
    ) -> Future[None] | BaseException | None:
        """Under `peer.flow`: hand a one-way that waited for its target to the transport
        with the next sequence number (`number`; False: a WAITING record): None (sent),
        the future of its admission (parked for credit), or why it failed."""
        seq = peer.out_seq + 1
        if number:
            frames = [wire.renumbered(frames[0], seq), *frames[1:]]
        try:
            result = transport.submit(peer.conn, frames)
        except (t.UnknownPeer, t.Closed, t.PayloadTooLarge) as exc:
            return submit_error(exc, peer, self._config.peer_expiry)
        admitted = result.admitted if result.status is not t.SubmitStatus.OK else None
        if number:
            peer.out_seq = seq
            peer.unacked.append((seq, tuple(frames), admitted))
        return admitted


def _settle_when_admitted(
    admitted: Future[None], settle: Cell[None] | Future[None], peer: Peer
) -> None:
    """Settle a one-way that waited for its target once the transport admits it."""
    if isinstance(settle, Future):  # its first admission's: that one's callback maps it
        admitted.add_done_callback(lambda done: settle_wait(settle, done.exception()))
    else:
        admitted.add_done_callback(lambda done: settle.try_set(None, admission_error(done, peer)))


class _ParkedSend(Cell[None]):
    """A one-way parked for credit, in one small object: its cell, the done-callback of
    its transport `admitted` future, and its `Peer.unacked` entry, which reads as the
    tuple (seq, frames, admitted) the others are (its sequence number read back from its
    envelope, not kept). No lock of its own, no closure: 100,000 parked one-ways stay
    cheap (docs/mesh.md, "What a parked one-way costs its sender")."""

    __slots__ = ("_peer", "admitted", "frames")

    def __init__(self, peer: Peer, frames: Sequence[bytes], admitted: Future[None]) -> None:
        super().__init__(_PARKED_LOCK)
        self._peer = peer
        self.frames = frames
        #: Its admission; None once it was sent again on resume (`Delivery.resend`).
        self.admitted: Future[None] | None = admitted

    def __call__(self, done: Future[None]) -> None:
        """The message was admitted (None) or failed: the send ends so."""
        self.try_set(None, admission_error(done, self._peer))

    # -- as a `Peer.unacked` entry ----------------------------------------------------

    def __getitem__(self, index: int) -> Any:
        if index == 0:
            return wire.route_of(self.frames[0])
        if index == 1:
            return self.frames
        if index == 2:
            return self.admitted
        raise IndexError(index)

    def __iter__(self) -> Iterator[Any]:
        return iter((self[0], self.frames, self.admitted))


class _SendsTo:
    """Matches the frames of a one-way to one target whose sequence number is one of
    `seqs` (`Transport.withdraw_matching`): one whose caller still waits for it, not one
    sent again on resume (it completed: it stays parked, and goes)."""

    __slots__ = ("key", "seqs")

    def __init__(self, key: tuple[str, str], seqs: set[int]) -> None:
        self.key = key
        self.seqs = seqs

    def __call__(self, frames: Sequence[bytes]) -> bool:
        try:
            env = wire.ENVELOPE_DECODER.decode(frames[0])
        except Exception:
            return False
        return (
            env.command == wire.SEND
            and (env.target_kind, env.target) == self.key
            and env.route in self.seqs
        )
