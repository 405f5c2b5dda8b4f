"""Records other nodes send here: each becomes a local call by the local admission rules
(`deliver_send` / `deliver_request`), under the inbound permits and the flow state they
drive (docs/mesh.md "Backpressure and inbound flow control")."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import transports as t

from .._calls.messaging import deliver_request, deliver_send
from .._core.completion import Completion
from .._core.errors import (
    CapacityExceededError,
    DeadlineExceededError,
    NotFoundError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
)
from .._core.pending import Request
from .._engine.objects import ObjectKind
from .._engine.remote import RemoteMetadata
from . import codec as wire
from .calls import Calls
from .codec import Envelope
from .config import PeerState
from .peers import Peer
from .shared import HANDSHAKE_BASE, KINDS, NODE, log

__all__ = ["Inbound", "caller_deadline"]

_NODE_KIND: Final = NODE.value
_TIMEOUT_MAX: Final = threading.TIMEOUT_MAX
#: The record kinds, read for every record (an Enum member read from its class costs
#: about 0.1 us more than a module constant on Python 3.11).
_REPLY: Final = t.InboundKind.REPLY
_NOTICE: Final = t.InboundKind.NOTICE
_REQUEST: Final = t.InboundKind.REQUEST
#: A receiver acknowledges one-ways at least every this many (and the rest within
#: `_ACK_DELAY`, `node.py`), so a sender keeps at most about this many per peer beyond
#: what travels.
_ACK_EVERY: Final = 256
_FENCED: Final = UnavailableReason.FENCED
#: The reply-route id a held one-way's record carries (`_hold`): a one-way's is 0.
_HELD: Final = -1
#: The most request numbers of one peer remembered as missing (`Inbound._first_time`).
_MISSING_MAX: Final = 4096
#: The most replies kept for one peer's requests sent again (`Inbound._answer_served`).
_KEPT_MAX: Final = 4096


class Inbound(Calls):
    """Inbound (see the module docstring)."""

    def _on_receive(self, batch: Sequence[t.Inbound]) -> None:
        # The credit of the requests admitted in this batch goes back once per peer at
        # its end (`_receive_request`), not once per record: the transport sends credit
        # from this same thread after the callback, so its peers see no difference.
        owed: dict[bytes, int] = {}
        self._batch_owed = owed
        try:
            for rec in batch:
                try:
                    self._receive(rec)
                except Exception:
                    log.exception(
                        "mesh %s: handling a record from %r failed", self.routing_id, rec.peer
                    )
        finally:
            self._batch_owed = None
            transport = self.shared.transport
            if owed and transport is not None:
                for conn, charge in owed.items():
                    # Not `contextlib.suppress`: three frames more, once per batch.
                    try:  # noqa: SIM105
                        transport.release(conn, charge)
                    except t.TransportError:
                        pass

    def _receive(self, rec: t.Inbound) -> None:
        if rec.kind is _REPLY:
            try:
                env = wire.ENVELOPE_DECODER.decode(rec.frames[0])  # as below
            except Exception:
                try:
                    found = wire.decode_envelope(rec.frames[0]) if rec.frames else None
                    if found is None:
                        raise ProtocolError("a reply with no envelope") from None
                except ProtocolError as exc:
                    self.outbound.bad_reply(rec, str(exc))
                    return
                env = found
            if rec.route_id & HANDSHAKE_BASE:
                self._receive_admit(rec, env)
            else:
                # Looked up on each reply, not kept bound: a test may wrap it.
                self.outbound.receive_reply(rec, env)
            return
        if rec.kind is _NOTICE:
            if rec.peer in self._peers.by_conn or not self._early_notice(rec):
                self._receive_notice(rec)
            return
        if rec.rejected is not None:
            self._bad(rec, f"refused by the transport: {rec.rejected}")
            return
        try:
            # The decoder itself (`decode_envelope`'s frame saved, on every record);
            # whatever it refuses goes through `decode_envelope` for its ProtocolError.
            env = wire.ENVELOPE_DECODER.decode(rec.frames[0])
        except Exception:
            try:
                found = wire.decode_envelope(rec.frames[0]) if rec.frames else None
                if found is None:
                    raise ProtocolError("a record with no envelope") from None
            except ProtocolError as exc:
                self._bad(rec, str(exc))
                return
            env = found
        command = env.command
        if command == wire.HELLO and rec.kind is _REQUEST:
            self._receive_hello(rec, env)
            return
        peer = self._peers.by_conn.get(rec.peer)  # one dict read: atomic
        if peer is None:
            quiet = False
            with self._lock:
                peer = self._peers.by_conn.get(rec.peer)
                dial = self._dials.get(rec.peer) if peer is None else None
                if dial is not None:
                    dial.early.append(rec)
                    return
                # Read late from the connection of a peer found silent (a connection
                # it dialled is named `routing_id@generation`): it resends what we did
                # not acknowledge when it comes back, so this is dropped quietly.
                rid = rec.peer.rpartition(b"@")[0] or rec.peer
                late = self._peers.by_rid.get(rid.decode("utf-8", "replace"))
                if late is not None and late.state is not PeerState.READY:
                    self.late_records += 1
                    quiet = True
            if quiet:
                self._release(rec)
                return
        if peer is None:
            self._bad(rec, "a record before the handshake")
            return
        if command == wire.SEND:
            seq = env.route
            if seq:
                # One-ways of one sender lifecycle arrive in sequence order (one
                # connection, and a resend after a pause starts below what reached us):
                # a number not above the last one seen is a resent duplicate.
                if seq <= peer.in_seq:
                    self._release(rec)
                    with self._lock:
                        self.duplicate_messages += 1
                    return
                peer.in_seq = seq  # only this (the I/O) thread receives
                if seq - peer.acked_in >= _ACK_EVERY:
                    self._ack(peer)
            if self._fence_held is not None and self._hold(rec, peer, False):
                return  # behind those held while the lease was fenced
            self._receive_send(rec, env, peer)
        elif command == wire.REQUEST and rec.kind is _REQUEST:
            seq = env.seq
            if seq:
                # Its request number (`Envelope.seq`): the next one, the common case.
                if seq == peer.req_in + 1:
                    peer.req_in = seq
                elif not self._first_time(peer, seq):
                    # Already here once: sent again on resume and that copy came first,
                    # this one read late from the old connection. Not run twice.
                    self._release(rec)
                    with self._lock:
                        self.late_records += 1
                    return
            if env.target_kind == _NODE_KIND and env.intent is None:
                # A node call, the common request: past the global objects' override
                # (`objects.py`), which hands such a request on unchanged (a frame less).
                Inbound._receive_request(self, rec, env, peer)
            else:
                self._receive_request(rec, env, peer)
        elif command == wire.REQUEST_AGAIN and rec.kind is _REQUEST:
            self._receive_again(rec, env, peer)
        elif command == wire.CANCEL:
            self._release(rec)
            with self._lock:
                serving = self._serving.get((peer.routing_id, env.route))
            if serving is not None:
                serving.request.cancel()
        elif command == wire.UPDATE:
            self._release(rec)
            self._receive_update(peer, rec)
        elif command == wire.WAITING:
            self._release(rec)
            self._target_asked(rec.peer, env)
        elif command == wire.BYE:
            self._release(rec)
            with self._lock:
                self._peers.mark_lost(peer)
                self._changed.notify_all()
            log.info("mesh %s: peer %s left the mesh", self.routing_id, peer.routing_id)
            self.delivery.expire(peer, "left the mesh")
        elif command == wire.ACK:
            self._release(rec)
            self.delivery.acked(peer, env.route)
        else:
            self._bad(rec, f"an unknown command {command}")

    @staticmethod
    def _first_time(peer: Peer, seq: int) -> bool:
        """Request number `seq` of `peer` reaches us (on the I/O thread, out of order):
        True the first time, False if it (or its earlier copy) came before. A number
        skipped is remembered as missing until it comes (two callers' requests may
        cross on the way; one that ended before it was sent never comes), at most
        `_MISSING_MAX`: the oldest then counts as received (never run twice; if it
        comes after all, it is answered as one that may have run)."""
        top = peer.req_in
        missing = peer.req_missing
        if seq > top:
            if seq - top > _MISSING_MAX:
                missing.clear()
                top = seq - _MISSING_MAX
            for skipped in range(top + 1, seq):  # above every number in it: in order
                missing[skipped] = None
            while len(missing) > _MISSING_MAX:
                missing.popitem(last=False)  # the oldest
            peer.req_in = seq
            return True
        if seq in missing:
            del missing[seq]
            return True
        return False

    def _receive_again(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        """A request `peer` sends again after it found us silent and we resumed
        (`REQUEST_AGAIN`): run only if its first copy never reached us; else answered
        on this connection from what we know (docs/mesh.md "Requests across a pause")."""
        seq = env.seq
        if not seq or self._first_time(peer, seq):
            self._receive_request(rec, env, peer)
            return
        self._release(rec)
        route = rec.route_id
        served = self._serving.get((peer.routing_id, route))
        if served is not None:  # queued or running: its reply goes on this connection
            served.conn = rec.peer
            return
        with self._lock:
            kept = peer.kept_replies.pop(route, None)
        if kept is not None:
            self._reply_frames(rec.peer, route, kept[1])
            return
        # It reached us and was answered on the old connection, and the answer was not
        # kept (sent early, on a connection that seemed alive: a partition). Rare.
        with self._lock:
            self.replies_lost += 1
        self._reply_error(
            rec.peer,
            route,
            UnavailableError(
                f"the request reached node {self.routing_id!r} before the connection was "
                "lost and was answered there; the answer was lost: it may have run",
                reason=UnavailableReason.PEER_PAUSED,
            ),
        )

    def _caller_due(self, rec: t.Inbound, env: Envelope, peer: Peer, now: float) -> float:
        """When the caller's deadline of request `env` (record `rec` from `peer`) passes,
        on this Host's clock at `now` (docs/mesh.md "Deadlines across nodes").

        On the real clock, with the caller's own deadline (`env.due`) and a heartbeat
        sample of the caller's clock offset: the earliest moment the caller's clock may
        reach it. Otherwise (an injected clock on either side, no sample yet, an older
        peer): the budget the caller had left when it sent the request, counted from
        `now`. Never later than that budget.
        """
        due = env.due
        if due and self._real_time:
            return caller_deadline(now, env.deadline, due, self._caller_clock(rec.peer, peer))
        return now + env.deadline

    def _caller_clock(self, conn: bytes, peer: Peer) -> t.ClockOffset | None:
        """The clock offset of `peer` as the heartbeat of connection `conn` bounds it; while
        that connection has no sample yet, the last one another connection of the same
        lifecycle gave (the same process: the same clock)."""
        transport = self.shared.transport
        clock = None if transport is None else transport.clock_offset(conn)
        if clock is None:
            return peer.clock
        peer.clock = clock
        return clock

    def _local_target(self, env: Envelope) -> tuple[ObjectKind, str] | ZlinkError:
        kind = KINDS.get(env.target_kind)
        if kind is None:
            return ProtocolError(f"an unknown target kind {env.target_kind!r}")
        if kind is NODE:
            if env.mesh != self.config.name or env.target != self.routing_id:
                return NotFoundError(f"no node {env.target!r} in mesh {env.mesh!r} here")
            if not self.has_node_handler:
                return NotFoundError(f"node {self.routing_id!r} has no node_handler")
            return kind, self.node_key
        return kind, env.target

    def _free_permits(self) -> int:
        """How many more records the transport may read now (never more than M held)."""
        return self._permits - self._permits_in_use

    def _permit(self, kind: ObjectKind, target: str) -> Callable[[], None]:
        """Take an inbound permit for a record to `target`; returns its release (PAUSED
        at 80%, RUNNING at 60%). A target whose records hold `_target_cap` permits
        already gets none: the record is admitted without one (its release only counts
        it out of the target's queue)."""
        key = (kind, target)
        with self._lock:
            held = self._target_held.get(key)
            if held is None:
                held = self._target_held[key] = _TargetPermits(self, key)
            held.queued += 1
            if held.count >= self._target_cap:
                self.unpermitted_records += 1
                return held.release_unpermitted
            held.count += 1
            self._permits_in_use += 1
            change = not self._paused and self._permits_in_use >= self._pause_at
        if change:
            self._apply_flow()
        return held.release

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
            transport = self.shared.transport
            if transport is not None:
                state = t.FlowState.PAUSED if paused else t.FlowState.RUNNING
                with contextlib.suppress(t.TransportError):
                    transport.set_flow(state)  # a leaf call: it takes only its own lock

    def _receive_send(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        """A one-way from `peer`, in its order (`_receive` dropped duplicates), to a
        target here."""
        where = self._local_target(env)
        try:
            if isinstance(where, ZlinkError):
                raise where
            payload = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
        except ZlinkError as exc:
            if not self._refused(rec, peer, exc, released=False):
                self._drop_message(rec, peer, str(exc), decode=isinstance(exc, ProtocolError))
            return
        meta = RemoteMetadata(
            env.metadata or {},
            peer.routing_id,
            self._permit(*where),
            peer.dropped_unrun or self._drop_hook(peer),
        )
        done = deliver_send(self.runtime, where[0], where[1], payload, meta)
        if done.done():
            self._sent(rec, peer, meta, done)
        else:
            # When it waits for room in its target's queue, its sender, told FULL, sends
            # the target no more, and its credit goes back once the sender said HELD
            # (what the sender has for other targets never waits behind it).
            release = not self._target_full(where, env, rec)
            with self._lock:
                self._sends_waiting += 1  # a drain waits for it (`begin_drain`)
            done.add_done_callback(lambda c: self._sent_later(rec, peer, meta, c, release))

    def _sent_later(
        self,
        rec: t.Inbound,
        peer: Peer,
        meta: RemoteMetadata,
        done: Completion[None],
        release: bool,
    ) -> None:
        with self._lock:
            self._sends_waiting -= 1
        self._sent(rec, peer, meta, done, release)

    def _target_full(self, key: tuple[ObjectKind, str], env: Envelope, rec: t.Inbound) -> bool:
        """A one-way `rec` waits for room in target `key`: its sender is told FULL (once
        until OPEN) and keeps its next one-ways to the target until then. Its credit goes
        back once the sender said HELD (at once if it did already): credit sent before
        the sender held them back could send on what it has parked for the target.
        False when the record was admitted and started meanwhile."""
        conn = rec.peer
        with self._lock:
            held = self._target_held.get(key)
            if held is None:
                return False
            told = held.told
            if told is None:
                told = held.told = {}
            owed = told.get(conn)
            if owed is not None and owed >= 0:
                told[conn] = owed + rec.charge
                return True
            if owed is None:
                told[conn] = rec.charge
                held.names = (env.target_kind, env.target)
        if owed is not None:  # it said HELD already
            self._release(rec)
            return True
        full = wire.encode_fields(wire.FULL, target_kind=env.target_kind, target=env.target)
        self._notify_quietly(conn, full, b"")
        return True

    def _receive_notice(self, rec: t.Inbound) -> None:
        """HELD from a sender told FULL; the other notices as `Calls`'."""
        try:
            env = wire.ENVELOPE_DECODER.decode(rec.frames[0])
        except Exception:  # the next handler decodes it again and says why
            env = None
        if env is None or env.command != wire.HELD:
            super()._receive_notice(rec)
            return
        where = self._local_target(env)
        if isinstance(where, ZlinkError):
            return
        with self._lock:
            held = self._target_held.get(where)
            told = None if held is None else held.told
            owed = None if told is None else told.get(rec.peer)
            if told is None or owed is None or owed < 0:
                return
            told[rec.peer] = -1  # from now on, what waits from it releases at once
        self._give_back(rec.peer, owed)

    def _target_asked(self, conn: bytes, env: Envelope) -> None:
        """A WAITING record: `conn` holds more one-ways for the target it names. OPEN
        with the room there is now, or once its queue is down to half its lane."""
        where = self._local_target(env)
        lane = self.runtime.pool.lane_items
        room = lane
        if not isinstance(where, ZlinkError):
            with self._lock:
                held = self._target_held.get(where)
                if held is not None:
                    if held.queued > lane // 2:
                        told = held.told
                        if told is None:
                            told = held.told = {}
                        # It holds its one-ways back already (unless a FULL it has not
                        # answered yet is on its way: its HELD gives that credit back).
                        told.setdefault(conn, -1)
                        held.names = (env.target_kind, env.target)
                        return
                    room = lane - held.queued
        self._open((env.target_kind, env.target), {conn: -1}, room)

    def _open(self, names: tuple[str, str], told: dict[bytes, int], room: int) -> None:
        """Tell the senders `told` that target `names` has room for `room` records (the
        credit still owed to one that has not said HELD goes back with it)."""
        frame = wire.encode_fields(wire.OPEN, route=room, target_kind=names[0], target=names[1])
        for conn, owed in told.items():
            if owed > 0:
                self._give_back(conn, owed)
            self._notify_quietly(conn, frame, b"")

    def _sent(
        self,
        rec: t.Inbound,
        peer: Peer,
        meta: RemoteMetadata,
        done: Completion[None],
        release: bool = True,
    ) -> None:
        """A received one-way message was admitted here (or refused): its credit goes
        back now (`release`; else it went when its sender was told FULL)."""
        if release:
            self._release(rec)
        exc = done.exception()
        if exc is not None:
            meta.started()
            if not self._refused(rec, peer, exc, released=True):
                self._lost_here(peer, f"no handler: {exc}")

    def _drop_hook(self, peer: Peer) -> Callable[[], None]:
        """What a one-way from `peer` runs when its target drops it unrun (its object
        closed first, or this Host stopped): it is lost after its sender saw it
        acknowledged, and the sender is told (`_lost_here`). One per peer lifecycle."""
        hook = peer.dropped_unrun
        if hook is None:
            hook = peer.dropped_unrun = functools.partial(
                self._lost_here, peer, "its target closed before it ran"
            )
        return hook

    def _refused(self, rec: t.Inbound, peer: Peer, exc: BaseException, *, released: bool) -> bool:
        """A received one-way that its target refused with `exc` (its credit `released`
        already, or not yet): True when that is decided here. Refused because the owner
        lease is fenced, it is held until the lease admits again (`_hold`); one held
        before and refused now for another reason is lost after its sender saw it
        acknowledged: the sender is told (DROPPED)."""
        if isinstance(exc, UnavailableError) and exc.reason is _FENCED:
            if not released:
                self._release(rec)
            return self._hold(rec, peer, True)
        if not self._was_held(rec):
            return False
        self._lost_here(peer, str(exc))
        return True

    @staticmethod
    def _was_held(rec: t.Inbound) -> bool:
        """Whether one-way `rec` was held while the lease was fenced (`_hold`)."""
        return rec.route_id == _HELD

    def _hold(self, rec: t.Inbound, peer: Peer, refused: bool) -> bool:
        """Hold one-way `rec` from `peer` until the owner lease admits again, behind
        those held already (docs/mesh.md "One-ways to a fenced node"): one its target
        `refused` (fenced) starts the hold; one that merely arrives while others are
        held goes behind them (False when none is held any more: it is delivered now).
        Its credit goes back now: what waits here is bounded by `_hold_max` (past it,
        the newest is lost, and its sender told)."""
        first = False
        with self._lock:
            held = self._fence_held
            if held is None:
                if not refused:
                    return False
                held = self._fence_held = deque()
                first = True
            full = len(held) >= self._hold_max
            if not full:
                if rec.route_id == _HELD:  # held before, refused again: it stays first
                    held.appendleft((rec, peer))
                else:
                    held.append((dataclasses.replace(rec, charge=0, route_id=_HELD), peer))
                    self.held_while_fenced += 1
        if not refused:
            self._release(rec)  # a refused one's went back when it was admitted
        if full:
            self._lost_here(peer, f"more than {self._hold_max} held while fenced")
        elif first:
            log.warning(
                "mesh %s: holding one-way messages while the owner lease is fenced",
                self.routing_id,
            )
            if not self.runtime.fenced:  # it admits again already: deliver them
                with contextlib.suppress(RuntimeError):
                    self.runtime.io.loop.call_soon_threadsafe(self._deliver_held)
        return True

    def _deliver_held(self) -> None:
        """The owner lease admits again: the held one-ways go to their targets, one at a
        time in the order they came (what arrives meanwhile goes behind them); a target
        no longer here (another node claimed it meanwhile) refuses it, and its sender is
        told (`_refused`). Stops when the lease is fenced again."""
        delivered = 0
        while True:
            with self._lock:
                held = self._fence_held
                if held is None:
                    break
                if not held:
                    self._fence_held = None
                    break
                if self.runtime.fenced:
                    return
                rec, peer = held.popleft()
            delivered += 1
            # Decoded once already, when it arrived.
            self._receive_send(rec, wire.ENVELOPE_DECODER.decode(rec.frames[0]), peer)
        if delivered:
            log.warning(
                "mesh %s: owner lease admitting: %d one-way message(s) held while fenced "
                "handed to their targets",
                self.routing_id,
                delivered,
            )

    def _drop_held(self, why: str) -> None:
        """Shutdown while one-ways are held (fenced): they are lost; each sender is told
        how many of its own, in one DROPPED notice, before BYE."""
        with self._lock:
            held, self._fence_held = self._fence_held, None
        lost: dict[str, tuple[Peer, int]] = {}
        for _, peer in held or ():
            counted = lost.get(peer.routing_id)
            lost[peer.routing_id] = (peer, 1 if counted is None else counted[1] + 1)
        for peer, count in lost.values():
            self._lost_here(peer, why, count)

    def _lost_here(self, peer: Peer, why: str, count: int = 1) -> None:
        """`count` one-ways from `peer`, acknowledged, are never handled: counted,
        logged, and their sender told (DROPPED) so it counts them too."""
        with self._lock:
            self.dropped_messages += count
            peer.dropped_in += count
        self._warn_dropped(
            "lost after acknowledging",
            peer.routing_id,
            why,
            "mesh %s: %d one-way(s) from %s acknowledged and lost: %s",
            count,
            peer.routing_id,
            why,
        )
        self._tell_dropped(peer)

    def _tell_dropped(self, peer: Peer) -> None:
        """Tell `peer` how many of its one-ways we acknowledged were never handled here,
        in all (DROPPED: it counts what the total adds in `dropped_after_admission`).
        Not while it is LOST: the ticker tells it once it is back (`_dropped_untold`)."""
        with self._lock:
            total = peer.dropped_in
            if not total or peer.state is PeerState.LOST:
                return
            conn = peer.conn
            peer.dropped_told = total
        self._notify_quietly(conn, wire.encode_fields(wire.DROPPED, route=total), b"")

    @staticmethod
    def _dropped_untold(peer: Peer) -> bool:
        """Whether `peer` may not have heard our DROPPED total: it grew since we last told
        it, or the peer resumed since (`Handshake._resume` sets `dropped_told` to 0)."""
        return peer.dropped_in != peer.dropped_told

    def _drop_message(self, rec: t.Inbound, peer: Peer, why: str, *, decode: bool) -> None:
        """A one-way from `peer` that cannot be delivered (`why`): counted, logged and its
        credit given back; its sender, which saw it acknowledged, is told (DROPPED)."""
        if decode:
            self.link.count_bad()
        with self._lock:
            if not decode:
                self.dropped_messages += 1
            peer.dropped_in += 1
        self._warn_dropped(
            "dropped message",
            peer.routing_id,
            why,
            "mesh %s: dropped a message from %s: %s",
            peer.routing_id,
            why,
        )
        self._release(rec)
        self._tell_dropped(peer)

    def _receive_request(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        route = rec.route_id
        kind: ObjectKind
        try:
            if (
                env.target_kind == _NODE_KIND
                and env.target == self.routing_id
                and env.mesh == self.config.name
                and self.has_node_handler
            ):
                # This node's handler, the common case: what `_local_target` decides,
                # without its two frames (the global objects' override adds nothing here).
                kind, target = NODE, self.node_key
            else:
                where = self._local_target(env)
                if isinstance(where, ZlinkError):
                    raise where
                kind, target = where
            frames = rec.frames
            payload = self.codec.decode_payload(
                env.type_name, frames[1] if len(frames) > 1 else b""
            )
        except ZlinkError as exc:
            self._release(rec)
            if isinstance(exc, ProtocolError):
                self.link.count_bad()
                self._warn_dropped(
                    "bad request",
                    peer.routing_id,
                    str(exc),
                    "mesh %s: a bad request from %s: %s",
                    peer.routing_id,
                    exc,
                )
            self._reply_error(rec.peer, route, exc)
            return
        now = self._now()
        # `_caller_due` and `_caller_clock`, inlined: this runs for every request.
        due = env.due
        transport = self.shared.transport
        if due and self._real_time and transport is not None:
            clock = transport.clock_offset(rec.peer)
            if clock is None:
                clock = peer.clock
            else:
                peer.clock = clock
            due = caller_deadline(now, env.deadline, due, clock)
        else:
            due = now + env.deadline
        if not due > now:
            self._release(rec)
            self._reply_error(rec.peer, route, _late_on_arrival())
            return
        key = (peer.routing_id, route)
        # `_permit()`, inlined: this runs for every request.
        held_key = (kind, target)
        with self._lock:
            held = self._target_held.get(held_key)
            if held is None:
                held = self._target_held[held_key] = _TargetPermits(self, held_key)
            held.queued += 1
            if held.count < self._target_cap:
                held.count += 1
                self._permits_in_use += 1
                change = not self._paused and self._permits_in_use >= self._pause_at
                release: Callable[[], None] = held.release
            else:
                self.unpermitted_records += 1
                change = False
                release = held.release_unpermitted
        if change:
            self._apply_flow()
        meta = RemoteMetadata(env.metadata or {}, peer.routing_id, release)
        served = _Served()  # its slots filled here: see the class
        served.node = self
        served.conn = rec.peer
        served.key = key
        served.meta = meta
        served.sent = False
        served.peer = peer
        served.due = due
        # Answered later than this (the caller sent it `env.deadline` before `due`),
        # its reply is kept for a resend: the caller may have found us silent.
        served.keep_after = due - env.deadline + self._keep_after
        # The timer on a 10 ms grid, rounded up: requests with about the same budget
        # share one timer FIFO (no timer entry of their own); `due` itself is when the
        # handler no longer starts (`deliver_request`).
        timeout = min(math.ceil((due - now) * 100.0) / 100.0, _TIMEOUT_MAX)
        queued = deliver_request(self.runtime, kind, target, payload, meta, timeout, served, due)
        # Admitted into the target's queue, or refused: decided now, so its credit goes
        # back (with the batch's, when `_on_receive` is running this record).
        owed = self._batch_owed
        if owed is not None and rec.charge:
            owed[rec.peer] = owed.get(rec.peer, 0) + rec.charge
        else:
            self._release(rec)
        if isinstance(queued, Completion):  # ended before it was queued
            if queued.done():
                failure = queued.exception()
                served(None if failure is not None else queued.result(), failure)
            return
        # A CANCEL notice cancels the request itself (`ctx.cancellation` follows). No
        # lock (one per request saved): single dict operations are atomic, and the
        # settling thread sets `sent` before it removes the entry, so whichever order the
        # two threads run in, an entry of a settled request does not stay.
        served.request = queued
        self._serving[key] = served
        if served.sent:  # it settled meanwhile: nothing is left to cancel
            self._serving.pop(key, None)

    def _served(self, served: _Served, value: object, exc: BaseException | None) -> None:
        """Answer a request we served (on the thread that settled it): an error, or one
        answered late (`_answer_served`)."""
        meta = served.meta
        never_ran = meta._on_start is not None
        meta.started()
        self._serving.pop(served.key, None)  # no lock: see the end of `_receive_request`
        if exc is None:
            try:
                type_name, data = self.codec.encode_payload(value)
            except ProtocolError as error:
                exc = error
            else:
                envelope = wire.encode_fields(wire.REPLY, type_name=type_name)
                self._answer_served(served, [envelope, data])
                return
        if never_ran and isinstance(exc, CapacityExceededError):
            exc = UnavailableError(
                f"the target's queue on node {self.routing_id!r} is full",
                reason=UnavailableReason.QUEUE_FULL,
            )
        self._answer_served(served, self._error_frames(exc))

    def _answer_served(self, served: _Served, frames: list[bytes]) -> None:
        """Send a served request's reply. One answered late (its caller may have found us
        silent meanwhile) or whose connection is gone is kept too, until its caller's
        deadline, for the caller to ask again when it resumes (`_receive_again`); one
        whose connection is gone goes on the peer's connection now, if it resumed."""
        conn = served.conn
        route = served.key[1]
        gone = conn not in self._peers.by_conn
        if gone or self._now() > served.keep_after:
            peer = served.peer
            with self._lock:
                kept = peer.kept_replies
                if not peer.expired:
                    if len(kept) >= _KEPT_MAX:
                        del kept[next(iter(kept))]  # the oldest
                    kept[route] = (served.due, frames)
                if gone and peer.state is not PeerState.LOST:
                    conn = peer.conn
        self._reply_frames(conn, route, frames)

    def _forget_kept_replies(self, now: float) -> None:
        """Drop the kept replies whose callers' deadlines have passed (`node._tick`)."""
        with self._lock:
            for peer in self._peers.by_rid.values():
                kept = peer.kept_replies
                if kept:
                    for route in [r for r, (due, _) in kept.items() if due <= now]:
                        del kept[route]


class _TargetPermits:
    """What the records received for one target hold: `count` inbound permits (at most
    the node's `_target_cap`), `queued` records not started (with a permit or without);
    `told`, the senders told FULL and not yet OPEN, each with the credit owed back to
    it once it says HELD (-1: it did). The entry goes with the last record
    (docs/mesh.md "One full target")."""

    __slots__ = ("count", "key", "names", "node", "queued", "told")

    def __init__(self, node: Inbound, key: tuple[ObjectKind, str]) -> None:
        self.node = node
        self.key = key
        self.count = 0
        self.queued = 0
        self.told: dict[bytes, int] | None = None
        #: The target's `target_kind` and `target` on the wire (for FULL and OPEN).
        self.names = ("", "")

    def release(self) -> None:
        """A record with a permit started (or ended unrun): the permit goes back."""
        node = self.node
        with node._lock:
            self.count -= 1
            node._permits_in_use -= 1
            change = node._paused and node._permits_in_use <= node._resume_at
            opened = self._started_locked()
        if change:
            node._apply_flow()
        if opened is not None:
            node._open(self.names, *opened)

    def release_unpermitted(self) -> None:
        """A record admitted without a permit started (or ended unrun)."""
        node = self.node
        with node._lock:
            opened = self._started_locked()
        if opened is not None:
            node._open(self.names, *opened)

    def _started_locked(self) -> tuple[dict[bytes, int], int] | None:
        """One record fewer waits (the node's lock held): the senders to tell OPEN now
        and the room there is, once the queue is down to half the lane; None if none."""
        self.queued -= 1
        queued = self.queued
        opened = None
        told = self.told
        if told is not None:
            lane = self.node.runtime.pool.lane_items
            if queued <= lane // 2:
                self.told = None
                opened = (told, lane - queued)
        if not queued:
            held = self.node._target_held
            if held.get(self.key) is self:
                del held[self.key]
        return opened


def caller_deadline(now: float, budget: float, due: float, clock: t.ClockOffset | None) -> float:
    """The moment, on this node's real clock reading `now`, from which a request's
    caller may have given up: the earliest time the caller's clock may reach `due` (its
    deadline on that clock; 0.0: none) by `clock` (the caller's clock minus ours, as the
    heartbeat bounds it; None: no sample yet), and never later than `budget` (the seconds
    the caller had left when it sent the request) counted from `now`."""
    local = now + budget
    if due and clock is not None:
        judged = clock.earliest(due)
        if judged < local:
            return judged
    return local


def _late_on_arrival() -> DeadlineExceededError:
    return DeadlineExceededError("the request's deadline passed before it arrived")


class _Served:
    """The one answer to a request we serve: whichever of the settle hook and the
    refusal path comes first sends it.

    No `__init__`: its one maker, `_receive_request`, fills the slots (a frame less per
    request on the transport's I/O thread, the thread that saturates first)."""

    __slots__ = ("conn", "due", "keep_after", "key", "meta", "node", "peer", "request", "sent")

    node: Inbound
    #: The connection its reply goes on (a request sent again moves it: `_receive_again`).
    conn: bytes
    key: tuple[str, int]
    meta: RemoteMetadata
    #: The answer went (or is going) out: later calls do nothing.
    sent: bool
    #: Its caller, and the caller's deadline on the Host clock.
    peer: Peer
    due: float
    #: Answered after this (Host clock), its reply is kept too (`Inbound._answer_served`).
    keep_after: float
    #: The local request (a CANCEL cancels it).
    request: Request

    def __call__(self, value: object, exc: BaseException | None) -> None:
        if self.sent:
            return
        self.sent = True
        node = self.node
        if (
            exc is None
            and self.meta._on_start is None
            and self.conn in node._peers.by_conn
            and node._now() <= self.keep_after
        ):
            # The common answer, a value from a handler that ran: `_served` and
            # `_reply_value` in one frame (this runs for every request served).
            key = self.key
            node._serving.pop(key, None)  # no lock: see the end of `_receive_request`
            try:
                type_name, data = node.codec.encode_payload(value)
            except ProtocolError as error:
                node._reply_error(self.conn, key[1], error)
                return
            # A value's reply envelope depends on its type name alone: encoded once per
            # name (the names are the registry's, so the map stays that small).
            envelope = node._reply_heads.get(type_name)
            if envelope is None:
                envelope = node._reply_heads[type_name] = wire.encode_fields(
                    wire.REPLY, type_name=type_name
                )
            node._reply_frames(self.conn, key[1], [envelope, data])
            return
        node._served(self, value, exc)
