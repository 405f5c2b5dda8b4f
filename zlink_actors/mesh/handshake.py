"""The handshake and the life of peers: dialling, HELLO / ADMIT / REJECT, a peer's
second connection, UPDATE and BYE, and a lost connection (docs/mesh.md "Topology")."""

from __future__ import annotations

import logging
import time

import msgspec

import transports as t

from .._core.completion import Completion, CompletionSource
from .._core.errors import (
    AlreadyExistsError,
    InvalidOperationError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    shutting_down,
)
from .._core.state import HostState
from . import codec as wire
from .codec import Envelope
from .config import (
    PeerInfo,
    PeerState,
    completion_endpoint,
    parse_endpoint,
    split_key,
)
from .peers import Peer
from .shared import HANDSHAKE_BASE, log
from .state import (
    NodeState,
    _decode_hello,
    _Dial,
    _Hello,
    connection_name,
)

#: Duplicate refusals remembered for logging them once (cleared when full).
_DUPLICATES_KEPT = 1024
#: Seconds a refused dial stays open after the REJECT notice it carries (`_dial_failed`).
_CLOSE_DELAY = 0.1
#: The notices `Handshake._receive_notice` takes (the flow notices are read above it).
_NOTICES = frozenset((wire.UPDATE, wire.BYE, wire.ACK, wire.FIN, wire.REJECT, wire.DROPPED))

__all__ = ["Handshake"]


class Handshake(NodeState):
    """Handshake (see the module docstring)."""

    def _dial(
        self,
        endpoint: str,
        source: CompletionSource[PeerInfo] | None,
        *,
        expect: str | None = None,
    ) -> None:
        transport = self.shared.transport
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
            route = HANDSHAKE_BASE | next(self._handshakes)
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
            self._close_told(time.monotonic(), endpoint)
            transport.connect(alias, ends)
        except Exception as exc:
            with self._lock:
                self._dials.pop(alias, None)
            log.warning("mesh %s: cannot dial %s: %s", self.routing_id, endpoint, exc)
            if source is not None:
                source.set_exception(
                    UnavailableError(
                        f"cannot connect to {endpoint}: {exc}",
                        reason=UnavailableReason.UNREACHABLE,
                    )
                )

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
            self._conn_lost(event.peer, event.reason, event.silent)

    def _send_hello(self, alias: bytes, dial: _Dial) -> None:
        transport = self.shared.transport
        assert transport is not None
        env = Envelope(wire.HELLO, mesh=self.config.name, target=self.routing_id)
        dial.sent = time.monotonic()  # before it leaves: the ADMIT's clock sample
        try:
            transport.submit_request(
                alias, dial.route, [wire.encode_envelope(env), self._hello_bytes()]
            )
        except t.TransportError as exc:
            self._dial_failed(alias, f"the handshake could not be sent: {exc}")

    def _dial_failed(
        self, alias: bytes, why: str, refused: ZlinkError | None = None, *, told: bool = False
    ) -> None:
        """Our dial `alias` ends without a peer: its `connect_peer` calls fail with
        `refused` when it is an `AlreadyExistsError` (the peer, or this node, already
        knows a live node of that routing id), else with `UnavailableError`. `told`: a
        notice to the peer was just sent on it; its connection is closed a little later
        (`_close_told`: libzmq drops what a closed connection has not sent yet)."""
        with self._lock:
            dial = self._dials.pop(alias, None)
        if dial is None:
            return
        duplicate = isinstance(refused, AlreadyExistsError)
        level = logging.WARNING
        if duplicate and not self._refused_once(("", dial.endpoint)):
            level = logging.DEBUG
        log.log(level, "mesh %s: connection to %s failed: %s", self.routing_id, dial.endpoint, why)
        for record in dial.early:
            if record.kind is not t.InboundKind.NOTICE:  # a notice has nothing to answer
                self._bad(record, f"the connection's handshake failed: {why}")
        if told:
            with self._lock:
                self._closing.append((time.monotonic() + _CLOSE_DELAY, alias))
        else:
            self._disconnect(alias)
        for source in dial.sources:
            if duplicate:
                source.set_exception(AlreadyExistsError(f"cannot join {dial.endpoint}: {why}"))
            else:
                source.set_exception(
                    UnavailableError(
                        f"cannot join {dial.endpoint}: {why}",
                        reason=UnavailableReason.UNREACHABLE,
                    )
                )

    def _check_hello(self, env: Envelope, hello: _Hello) -> ZlinkError | None:
        """Why a peer's hello (or admit) is refused, or None.

        One routing id, one live node: a lifecycle (routing id and generation) other
        than the one READY or DRAINING here under that id is refused with
        `AlreadyExistsError`, whichever is newer, so the node already serving keeps
        serving. A lost (or never reached) one is replaced: a restart.
        """
        if env.mesh != self.config.name:
            return UnavailableError(
                f"mesh name {env.mesh!r} is not {self.config.name!r}",
                reason=UnavailableReason.UNREACHABLE,
            )
        rid = hello.routing_id
        if rid == self.routing_id:
            if hello.generation == self.generation:
                return UnavailableError(
                    f"routing id {rid!r} is this node itself", reason=UnavailableReason.UNREACHABLE
                )
            return AlreadyExistsError(
                f"duplicate routing id {rid!r}: a live node of mesh {self.config.name!r} "
                f"holds it (the node at {self.shared.info.endpoint if self.shared.info else '?'})"
            )
        with self._lock:
            old = self._peers.by_rid.get(rid)
        if (
            old is not None
            and old.generation != hello.generation
            and old.state in (PeerState.READY, PeerState.DRAINING)
        ):
            return AlreadyExistsError(
                f"duplicate routing id {rid!r}: a live node of mesh {self.config.name!r} "
                f"holds it (the node at {old.endpoint})"
            )
        return None

    def _close_told(self, now: float, endpoint: str | None = None) -> None:
        """Close the refused dials whose notice has had `_CLOSE_DELAY` to leave, and
        those to `endpoint` at once (before it is dialled again: two connections of one
        name to one node abort libzmq)."""
        if not self._closing:  # the common case: no lock taken
            return
        address = None if endpoint is None else endpoint.encode()
        with self._lock:
            if not self._closing or (address is None and self._closing[0][0] > now):
                return
            due = [
                alias
                for when, alias in self._closing
                if when <= now or alias.partition(b"|")[2] == address
            ]
            self._closing = [entry for entry in self._closing if entry[1] not in due]
        for alias in due:
            self._disconnect(alias)

    def _refused_once(self, key: tuple[str, object]) -> bool:
        """True the first time `key` (a routing id and a lifecycle or an endpoint) is
        refused as a duplicate: that refusal is logged as a warning, repeats only at
        debug level (a `peers=` keeper redials a refused endpoint with its back-off)."""
        with self._lock:
            if key in self._duplicates:
                return False
            if len(self._duplicates) >= _DUPLICATES_KEPT:
                self._duplicates.clear()
            self._duplicates.add(key)
            return True

    def _admit(self, conn: bytes, hello: _Hello, clock: t.ClockOffset | None = None) -> Peer:
        """Enter the peer (or another connection of it) as READY, with `clock`, a sample
        of its clock offset (None: none); a higher generation replaces an older run of
        the same routing id; the same generation after a loss resumes (`_resume`)."""
        replaced: Peer | None = None
        self._use_window(conn, hello.credit_window)  # before anything can be sent on it
        self._forget_told(conn)
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
                if clock is not None:
                    peer.clock = clock if peer.clock is None else peer.clock.merged(clock)
                self._changed.notify_all()
                return peer
            resumable = (
                peer is not None
                and peer.generation == hello.generation
                and peer.lost_at != 0.0
                and not peer.expired
            )
        if resumable:
            assert peer is not None
            resumed = self._resume(peer, conn, hello)
            if resumed:
                if clock is not None:
                    with self._lock:  # the band kept for this lifecycle goes on
                        peer.clock = clock if peer.clock is None else peer.clock.merged(clock)
                return peer
        elif peer is not None and peer.generation != hello.generation:
            # Counted before the new lifecycle is READY: whoever sees it READY sees the
            # old one's losses too.
            self.delivery.expire(peer, "restarted (a new lifecycle)")
        with self._lock:
            peer = self._peers.by_rid.get(hello.routing_id)
            if peer is not None and peer.state is not PeerState.CONNECTING:
                replaced = peer
                self._peers.mark_lost(peer)
                self._peers.drop_conns(peer)
            peer = Peer(hello.routing_id, hello.endpoint, hello.generation, conn)
            peer.clock = clock
            if replaced is not None and replaced.generation == hello.generation:
                # The same lifecycle after it expired here: the numbers go on (it may
                # not have expired us, and drops what is not above the last it saw).
                peer.out_seq = replaced.out_seq
                peer.in_seq = peer.acked_in = replaced.in_seq
                peer.req_numbers = replaced.req_numbers
                peer.req_in = replaced.req_in
                peer.req_missing = replaced.req_missing
            self._update_locked(peer, hello)
            self._peers.add(peer)
            self._changed.notify_all()
        if replaced is not None:
            self.outbound.fail_inflight(
                replaced, "restarted (another lifecycle generation)", UnavailableReason.PEER_LOST
            )
            if replaced.generation != hello.generation:
                self.delivery.expire(replaced, "restarted (a new lifecycle)")  # if it was not yet
        log.info("mesh %s: peer %s READY (%s)", self.routing_id, peer.routing_id, peer.endpoint)
        self._wake_peer_waiters()
        return peer

    def _resume(self, peer: Peer, conn: bytes, hello: _Hello) -> bool:
        """`peer` came back with the same lifecycle before it expired: it is READY again
        on `conn` (told our ACK and DROPPED totals again), and first of all it is sent
        again, in order, every one-way of ours it has not acknowledged, then those held for
        its full targets (`Delivery.resend`). New one-ways wait for the peer's `flow` lock,
        so they follow. Then our requests still pending for it go again
        (`Outbound.resend`). False when it expired meanwhile (then it is replaced)."""
        with peer.flow:
            with self._lock:
                if peer.expired or self._peers.by_rid.get(peer.routing_id) is not peer:
                    return False
                self._peers.drop_conns(peer)
                peer.conn = conn
                self._peers.add(peer)
                peer.state = PeerState.READY
                # Our ACK and DROPPED totals may have been lost with the connection that
                # closed under them (one it dialled keeps its name here, so a changed
                # `conn` does not show it): the ticker tells them again on this one.
                # Both are running totals: heard twice, they count once.
                peer.acked_in = 0
                peer.dropped_told = 0
                self._update_locked(peer, hello)
                self._changed.notify_all()
            self._wake_peer_waiters()
            resent, held = self.delivery.resend(peer, conn)
        self.delivery.settle_sent(held, peer)
        log.warning(
            "mesh %s: peer %s came back (same lifecycle): resumed, %d one-way message(s) "
            "sent again",
            self.routing_id,
            peer.routing_id,
            resent,
        )
        self.outbound.resend(peer, conn)
        return True

    def _conn_lost(self, conn: bytes, reason: str, silent: bool = False) -> None:
        self._forget_told(conn)
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
                    peer.lost_reason = (
                        UnavailableReason.PEER_PAUSED if silent else UnavailableReason.PEER_LOST
                    )
                    others = self._peers.drop_conns(peer)
                self._changed.notify_all()
        if dial is not None:
            self._dial_failed(conn, reason)
        if peer is None or not primary:
            return
        level = logging.INFO if self.shared.closed or was_lost else logging.WARNING
        log.log(
            level,
            "mesh %s: peer %s LOST (%s): %s",
            self.routing_id,
            peer.routing_id,
            peer.lost_reason.value,
            reason,
        )
        for other in others:
            self._disconnect(other)
        if not (silent and peer.resends):
            # Its connection closed (its process ended: within milliseconds), or an
            # older peer: what it had not answered fails now. One that went silent may
            # come back with the same lifecycle: our requests to it stay pending within
            # their own deadlines, and go again on resume (`Outbound.resend`); they end
            # `PEER_LOST` if it is gone for good (`_expire`).
            self.outbound.fail_inflight(peer, f"lost: {reason}", peer.lost_reason)
        self._wake_peer_waiters()

    def _receive_hello(self, rec: t.Inbound, env: Envelope) -> None:
        self._release(rec)
        try:
            hello = _decode_hello(rec.frames[1])
        except (msgspec.DecodeError, IndexError) as exc:
            self._bad_hello(rec, None, ProtocolError(f"an undecodable hello: {exc}"))
            return
        refused = self._check_hello(env, hello)
        # The connection is named by the lifecycle (`connection_name`); a node of an
        # older version names it by its routing id alone.
        if refused is None and rec.peer not in (
            connection_name(hello.routing_id, hello.generation),
            hello.routing_id.encode(),
        ):
            refused = ProtocolError("the routing id in the hello is not the connection's")
        if refused is not None:
            self._bad_hello(rec, hello, refused)
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

    def _bad_hello(self, rec: t.Inbound, hello: _Hello | None, refused: ZlinkError) -> None:
        """Answer REJECT, with the refusal's kind (a duplicate is `AlreadyExistsError`
        at the dialling node)."""
        if isinstance(refused, AlreadyExistsError):
            assert hello is not None
            level = logging.WARNING
            if not self._refused_once((hello.routing_id, hello.generation)):
                level = logging.DEBUG
            log.log(
                level,
                "mesh %s: refused a handshake from %r: %s",
                self.routing_id,
                rec.peer,
                refused,
            )
        else:
            self.link.count_bad()
            self._warn_dropped(
                "refused handshake",
                rec.peer,
                str(refused),
                "mesh %s: refused a handshake from %r: %s",
                rec.peer,
                refused,
            )
        self._reply_frames(rec.peer, rec.route_id, [self._reject_bytes(refused)])

    def _reject_bytes(self, refused: ZlinkError) -> bytes:
        """A REJECT envelope carrying `refused`."""
        kind, message = self.codec.encode_error(refused)
        env = Envelope(wire.REJECT, mesh=self.config.name, error_kind=kind, error=message)
        return wire.encode_envelope(env)

    def _refused_by(self, peer: Peer, env: Envelope) -> None:
        """`peer` dialled us, we admitted it, and it refused our ADMIT (REJECT notice):
        this node has the routing id of a live node it already has. Logged as a warning
        once per lifecycle of `peer` (at debug level when its `peers=` keeper dials
        again). `peer` is gone (LOST, expired: a redial is a new READY entry, not a
        resume), so the loss of its connection, which it closes, is no warning either."""
        level = logging.WARNING
        if not self._refused_once((peer.routing_id, ("refused us", peer.generation))):
            level = logging.DEBUG
        log.log(
            level,
            "mesh %s: peer %s refused this node: %s",
            self.routing_id,
            peer.routing_id,
            env.error,
        )
        with self._lock:
            self._peers.mark_lost(peer)
            self._changed.notify_all()
        self.delivery.expire(peer, "refused this node")

    def _receive_update(self, peer: Peer, rec: t.Inbound) -> None:
        try:
            hello = _decode_hello(rec.frames[1])
        except (msgspec.DecodeError, IndexError) as exc:
            self.link.count_bad()
            self._warn_dropped(
                "bad update",
                peer.routing_id,
                str(exc),
                "mesh %s: a bad update from %s: %s",
                peer.routing_id,
                exc,
            )
            return
        with self._lock:
            self._update_locked(peer, hello)
            self._changed.notify_all()
        if hello.draining:
            self.delivery.fin(peer)

    def _early_notice(self, rec: t.Inbound) -> bool:
        """A notice on a connection with no peer: True when it came on our dial before
        that dial's ADMIT was read, kept in `_Dial.early` and handled right after the
        ADMIT. The peer admitted us before it answered, and a notice another of its
        threads sent meanwhile (the ticker's ACK, a DROPPED total told again on a
        resume) may leave before the ADMIT. It comes from the node that admits us on
        that very connection, for the lifecycle the ADMIT names: ACK and DROPPED are
        that lifecycle's totals. A dial that fails drops them (`_dial_failed`)."""
        with self._lock:
            if rec.peer in self._peers.by_conn:
                return False
            dial = self._dials.get(rec.peer)
            if dial is None:
                return False
            dial.early.append(rec)
            return True

    def _receive_notice(self, rec: t.Inbound) -> None:
        """UPDATE (weights, draining), BYE, ACK, FIN or REJECT (`_refused_by`) on the
        completion connection."""
        peer = self._peers.by_conn.get(rec.peer)
        try:
            env = wire.decode_envelope(rec.frames[0]) if rec.frames else None
            if env is None or env.command not in _NOTICES:
                raise ProtocolError("a notice that is not UPDATE, BYE, ACK, FIN, REJECT or DROPPED")
        except ProtocolError as exc:
            self._bad(rec, str(exc))
            return
        if peer is None:
            return  # from a connection whose peer is gone: nothing to update
        if env.command == wire.REJECT:
            self._refused_by(peer, env)
            return
        if env.command == wire.UPDATE:
            self._receive_update(peer, rec)
            return
        if env.command == wire.ACK:
            self.delivery.acked(peer, env.route)
            return
        if env.command == wire.FIN:
            with self._lock:
                peer.fin_seq = env.route
            return
        if env.command == wire.DROPPED:
            self.delivery.dropped_there(peer, env.route)
            return
        with self._lock:
            self._peers.mark_lost(peer)
            self._changed.notify_all()
        log.info("mesh %s: peer %s left the mesh", self.routing_id, peer.routing_id)
        self.delivery.expire(peer, "left the mesh")

    def _receive_admit(self, rec: t.Inbound, env: Envelope) -> None:
        with self._lock:
            dial = self._dials.get(rec.peer)
        if dial is None or dial.route != rec.route_id:
            return
        if env.command != wire.ADMIT:
            refused = (
                self.codec.decode_error(env.error_kind, env.error)
                if env.error_kind >= 0
                else None  # an older peer: the text only
            )
            self._dial_failed(rec.peer, f"rejected: {env.error}", refused)
            return
        try:
            hello = _decode_hello(rec.frames[1])
        except (msgspec.DecodeError, IndexError) as exc:
            self._dial_failed(rec.peer, f"an undecodable admit: {exc}")
            return
        refused = self._check_hello(env, hello)
        if refused is not None:
            told = isinstance(refused, AlreadyExistsError)
            if told:
                # It admitted us: tell it why we leave, before the connection goes, so
                # it logs that once, not a lost peer at each redial (`_refused_by`).
                self._notify_quietly(rec.peer, self._reject_bytes(refused), b"")
            self._dial_failed(rec.peer, str(refused), refused, told=told)
            return
        clock = None
        if hello.clock and dial.sent:
            # The peer read its clock after our HELLO came and before its ADMIT left:
            # a band of its clock offset before its first request can arrive (the
            # heartbeat's first PONG may come after it: `Inbound._caller_clock`).
            clock = t.ClockOffset.sample(dial.sent, hello.clock, time.monotonic())
        peer = self._admit(rec.peer, hello, clock)
        with self._lock:
            self._dials.pop(rec.peer, None)
            self._dialled[dial.endpoint] = peer
            early, dial.early = dial.early, []
        for record in early:
            self._receive(record)
        for source in dial.sources:
            source.set_result(peer.info())
