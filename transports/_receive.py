"""The receiving half of the protocol: what each received record does to the peer table.

No socket lives here. The I/O thread (`_io.py`) reads messages, decodes each into its
records (`_wire.decode`) and hands them to `Receiver.handle_batch`, which runs the hello
exchange, counts credit, slots and flow state under the `Core` lock, and appends what the
owner gets to the batch; it returns what must happen after the lock is released (sends,
futures to complete).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from ._clock import ClockOffset, decode_stamp, encode_stamp
from ._errors import MalformedFrame, PayloadTooLarge
from ._state import Command, Core, PeerState, next_ping_locked
from ._types import FlowState, Inbound, InboundKind, PeerEvent, PeerEventKind, make_inbound
from ._wire import ENVELOPE_SIZE, Envelope, Kind, Record

__all__ = ["Item", "Receiver"]

#: One received record and the peer it came from.
Item = tuple[bytes, Record]

# module constants: an enum member read through its class costs an attribute walk
_HELLO = Kind.HELLO
_REPLY = Kind.REPLY
_REQUEST = Kind.REQUEST
_MESSAGE = Kind.MESSAGE


class Receiver:
    """Applies received records to one transport's `Core`; used by its I/O thread only."""

    def __init__(
        self, core: Core, events: list[PeerEvent], forget: Callable[[bytes], None]
    ) -> None:
        self.core = core
        self.events = events  # shared with the I/O thread, which emits them
        self.forget = forget  # drops what the I/O thread holds of a restarted peer
        self._restarted: list[Future[None]] = []  # parked for a restarted peer, to fail
        self._heartbeat_timeout = core.config.heartbeat_timeout
        self._max_message_size = core.config.max_message_size

    def handle_batch(
        self,
        items: list[Item],
        completion: bool,
        batch: list[Inbound],
        now: float,
        run: Callable[[bytes, list[Command], list[Future[None]], list[Future[None]]], None],
    ) -> list[tuple[bytes, str]]:
        """Apply received records in order; append what the owner gets to `batch`.

        The records are applied under one acquisition of the lock, until one of them
        leaves something to do outside it: commands to run (what a hello released),
        futures now admitted, futures to fail (a restarted peer's parked ones). Then
        `run(peer, commands, admitted, restarted)` is called with the lock released (a send
        may lose a peer) before the next record is applied, as if each record had been
        handled alone.

        Returns:
            The dropped records, as (peer, why), in order: the caller logs them (each a
            MalformedFrame, already counted in `dropped_frames`).
        """
        core = self.core
        dropped: list[tuple[bytes, str]] = []
        count = len(items)
        i = 0
        peer = b""
        while i < count:
            flush: list[Command] = []
            admitted: list[Future[None]] = []
            with core.lock:
                while i < count:
                    peer, record = items[i]
                    i += 1
                    try:
                        self._handle_locked(peer, record, completion, batch, now, flush, admitted)
                    except MalformedFrame as exc:
                        core.dropped_frames += 1
                        dropped.append((peer, str(exc)))
                    if flush or admitted or self._restarted:
                        break
            if flush or admitted or self._restarted:
                restarted, self._restarted = self._restarted, []
                run(peer, flush, admitted, restarted)
        return dropped

    def _handle_locked(
        self,
        peer: bytes,
        record: Record,
        completion: bool,
        batch: list[Inbound],
        now: float,
        flush: list[Command],
        admitted: list[Future[None]],
    ) -> None:
        """Apply one record (the lock is held).

        The hot path, once per received record: a request, a message and a reply are
        applied inline; every other kind goes the general way.

        Raises:
            MalformedFrame: the record is dropped (the caller counts it).
        """
        kind, aux, route_id, credit, payload = record
        if len(payload) == 2:  # the mesh's records (envelope, payload): no loop
            payload_size = len(payload[0]) + len(payload[1])
        else:
            payload_size = 0
            for frame in payload:
                payload_size += len(frame)
        size = ENVELOPE_SIZE + payload_size  # what the counters count of a record
        core = self.core
        core.received_frames += 1
        core.received_bytes += size
        state = core.peers.get(peer)
        if kind is _HELLO:
            state = self.hello_locked(peer, state, completion, now, flush, aux)
        if state is None:
            raise MalformedFrame(f"a {kind.name} record from a peer without a hello")
        state.received_frames += 1
        state.received_bytes += size
        state.deadline = now + self._heartbeat_timeout
        if kind is _HELLO:
            return
        if completion:
            if kind is _REPLY:  # completion_locked's REPLY branch, inline
                if credit:
                    in_use = state.in_use - credit
                    state.in_use = in_use if in_use > 0 else 0
                if state.slots:
                    state.slots -= 1
                batch.append(make_inbound(peer, InboundKind.REPLY, route_id, payload, 0))
            else:
                env = Envelope(kind, aux, route_id, credit)
                self.completion_locked(state, env, payload, batch, now)
            if state.parked:
                admitted.extend(core.admit_parked_locked(state))
        elif (kind is _REQUEST or kind is _MESSAGE) and payload_size <= self._max_message_size:
            # inbound_locked's common case, inline: the record holds its charge
            charge = credit if credit > 1 else 1
            state.unreleased += charge
            core.credit_held += charge
            if kind is _REQUEST:
                state.open_requests += 1
                inbound = InboundKind.REQUEST
            else:
                inbound = InboundKind.MESSAGE
            batch.append(make_inbound(peer, inbound, route_id, payload, charge))
        else:
            self.inbound_locked(
                state, Envelope(kind, aux, route_id, credit), payload, payload_size, batch
            )

    def inbound_locked(
        self, state: PeerState, env: Envelope, payload: list[bytes], size: int, batch: list[Inbound]
    ) -> None:
        """A frame on the application connection: a message or a request."""
        if env.kind is Kind.MESSAGE:
            kind = InboundKind.MESSAGE
        elif env.kind is Kind.REQUEST:
            kind = InboundKind.REQUEST
            state.open_requests += 1
        else:
            raise MalformedFrame(f"a {env.kind.name} record on the application connection")
        charge = max(env.credit, 1)
        if size > self._max_message_size:
            self.core.owe_locked(state, charge)  # rejected: its credit goes straight back
            self.core.credit_held += charge
            error = PayloadTooLarge(f"{size} bytes of payload refused")
            batch.append(make_inbound(state.name, kind, env.route_id, (), 0, error))
            return
        state.unreleased += charge
        self.core.credit_held += charge
        batch.append(make_inbound(state.name, kind, env.route_id, payload, charge))

    def completion_locked(
        self,
        state: PeerState,
        env: Envelope,
        payload: list[bytes],
        batch: list[Inbound],
        now: float,
    ) -> None:
        """A frame on the completion connection; any of them may return credit."""
        if env.kind in (Kind.MESSAGE, Kind.REQUEST):
            raise MalformedFrame(f"a {env.kind.name} record on the completion connection")
        if env.credit:
            state.in_use = max(0, state.in_use - env.credit)
        if env.kind is Kind.HELLO_ACK:
            state.pack_limit = self.core.pack_limit_for(env.aux)
            if not state.ready:
                state.ready = True
                state.next_ping = now + self.core.config.heartbeat_interval
                # A first PING at once: its PONG gives the peer's clock offset before
                # the owner's first request can arrive (`Transport.clock_offset`).
                self.core.post(("comp", state.name, Kind.PING, next_ping_locked(state, now), ()))
                self.events.append(PeerEvent(state.name, PeerEventKind.READY))
        elif env.kind is Kind.REPLY:
            state.slots = max(0, state.slots - 1)
            batch.append(make_inbound(state.name, InboundKind.REPLY, env.route_id, payload, 0))
        elif env.kind is Kind.NOTICE:
            batch.append(make_inbound(state.name, InboundKind.NOTICE, 0, payload, 0))
        elif env.kind is Kind.FLOW:
            if env.route_id > state.flow_epoch_seen:  # an older epoch is stale
                state.flow_epoch_seen = env.route_id
                state.paused_by_peer = env.aux == FlowState.PAUSED.value
        elif env.kind is Kind.PING:
            # Our clock, read after the PING came: the pinger's offset sample.
            stamp = (encode_stamp(time.monotonic()),)
            self.core.post(("comp", state.name, Kind.PONG, env.route_id, stamp))
        elif env.kind is Kind.PONG:
            sent = state.ping_sent.pop(env.route_id, None)
            remote = decode_stamp(payload)
            if sent is not None and remote is not None:
                sample = ClockOffset.sample(sent, remote, time.monotonic())
                clock = state.clock
                state.clock = sample if clock is None else clock.merged(sample)

    def hello_locked(
        self,
        peer: bytes,
        state: PeerState | None,
        completion: bool,
        now: float,
        flush: list[Command],
        cap: int = 0,
    ) -> PeerState:
        """A hello on one of the two connections; the completion one makes an inbound peer
        ready (its application hello may wait unread while we are paused). What was held
        back for the peer goes into `flush`, sent before any later command."""
        core = self.core
        seen = state is not None and (state.completion_seen if completion else state.app_seen)
        if state is not None and not state.outbound and seen:
            # a second hello on the same connection: the peer restarted under its name;
            # its old incarnation is lost (its parked futures fail)
            self._restarted.extend(core.drop_peer_locked(peer))
            self.forget(peer)
            self.events.append(PeerEvent(peer, PeerEventKind.LOST, "restarted"))
            state = None
        if state is None:
            state = PeerState(peer, outbound=False, deadline=now + core.config.heartbeat_timeout)
            core.peers[peer] = state
            self.events.append(PeerEvent(peer, PeerEventKind.CONNECTED))
        if state.outbound:
            return state
        state.pack_limit = core.pack_limit_for(cap)  # what the peer's hello says it accepts
        if completion and not state.completion_seen:
            state.completion_seen = True
            state.ready = True
            state.next_ping = now + core.config.heartbeat_interval
            flush.append(("comp", peer, Kind.HELLO_ACK, 0, (), core.advertised_cap))
            # A first PING at once (see `completion_locked`'s HELLO_ACK).
            flush.append(("comp", peer, Kind.PING, next_ping_locked(state, now), ()))
            if core.flow_epoch:
                flush.append(("comp", peer, Kind.FLOW, core.flow_epoch, (), core.flow.value))
            flush.extend(state.completion_backlog)
            state.completion_backlog.clear()
            self.events.append(PeerEvent(peer, PeerEventKind.READY))
        elif not completion and not state.app_seen:
            state.app_seen = True
            flush.extend(state.app_backlog)
            state.app_backlog.clear()
        return state
