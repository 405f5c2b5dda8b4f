"""The shared state of one transport: peers, credit, parked frames, the command queue.

Every field here is guarded by `Core.lock`. Application threads change it in `submit`,
`release` and `set_flow`; the I/O thread changes it when frames arrive. Neither calls a
callback or completes a future while holding the lock: the methods return what is to
be completed, and the caller completes it after releasing the lock. No socket lives
here: the I/O thread (`_io.py`) learns what to send from `Core.commands`, a FIFO that
also keeps the per-peer order of admitted frames, and `submit` says `DIRECT` when its
caller may send a lone record itself (docs/transports.md, "Direct sends").
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ._admission import Parked
from ._clock import ClockOffset
from ._errors import Closed, InvalidRelease, PayloadTooLarge, PeerLost, UnknownPeer
from ._types import FlowState, PeerStatistics, SubmitResult, SubmitStatus, TransportConfig
from ._wire import BODY_BYTES, Kind

__all__ = [
    "CREDIT_DELAY",
    "DIRECT",
    "PINGS_KEPT",
    "Command",
    "Core",
    "Parked",
    "PeerState",
    "next_ping_locked",
]

#: Seconds a small credit return may wait for a reply to carry it (docs/transports.md,
#: "Credit: what a window means").
CREDIT_DELAY = 0.001

#: How many recent PINGs per peer are remembered for their PONGs (`next_ping_locked`).
PINGS_KEPT = 8

#: A command for the I/O thread: (op, *args). Ops: "app" (peer, kind, route_id, frames,
#: charge),
#: "comp" (peer, kind, route_id, frames), "flow" (), "call" (function, future).
Command = tuple[Any, ...]


@dataclass
class PeerState:
    """What one transport knows of one peer (both directions)."""

    name: bytes
    outbound: bool  # True: we connected to it; False: it connected to us
    addresses: tuple[str, str] = ("", "")  # what we connected to (outbound only)
    ready: bool = False
    app_seen: bool = False
    completion_seen: bool = False
    # sending side: our frames to the peer
    in_use: int = 0
    window: int = 0  # the credit window towards this peer; 0: the configured one
    # the bytes of head or body one packed message to the peer may have: 0 until its
    # hello (or hello ack) said what frame it accepts, and then each record goes alone
    pack_limit: int = 0
    parked: deque[Parked] = field(default_factory=deque)
    parked_bytes: int = 0
    slots: int = 0
    paused_by_peer: bool = False
    flow_epoch_seen: int = 0
    # receiving side: the peer's frames to us
    owed: int = 0  # released by our owner, not yet returned in a frame
    owed_since: float = 0.0  # when `owed` last became non-zero
    unreleased: int = 0  # delivered to our owner, not yet released
    # requests delivered to our owner and not answered yet (a hint: a reply goes
    # directly only when it answers the one open request; `Transport._post_completion`)
    open_requests: int = 0
    completion_backlog: list[Command] = field(default_factory=list)
    app_backlog: list[Command] = field(default_factory=list)  # before its app hello is read
    # liveness
    deadline: float = 0.0  # lost if nothing is heard from the peer by then
    next_ping: float = 0.0
    ping_seq: int = 0
    #: When each recent PING was queued (our monotonic clock), by sequence: a PONG
    #: that comes after the next PING left still gives a sample.
    ping_sent: dict[int, float] = field(default_factory=dict)
    #: The peer's clock minus ours (`Transport.clock_offset`); None before a stamped PONG.
    #: Replaced whole (one reference: read without the lock).
    clock: ClockOffset | None = None
    # counters
    sent_frames: int = 0
    sent_bytes: int = 0
    received_frames: int = 0
    received_bytes: int = 0


def next_ping_locked(state: PeerState, now: float) -> int:
    """The sequence of the PING to `state`'s peer that leaves now (at `now`); the lock is
    held. The last `PINGS_KEPT` send times are kept for their PONGs."""
    seq = state.ping_seq = state.ping_seq + 1
    sent = state.ping_sent
    sent[seq] = now
    sent.pop(seq - PINGS_KEPT, None)
    return seq


class Core:
    """Peers, credit and the command queue of one transport (see the module docstring)."""

    def __init__(self, name: bytes, config: TransportConfig) -> None:
        self.name = name
        self.config = config
        self.lock = threading.Lock()
        self.peers: dict[bytes, PeerState] = {}
        self.commands: deque[Command] = deque()
        self.credit_dirty: set[bytes] = set()
        # bytes delivered to our owner and not yet returned to their senders (unreleased
        # or owed): while any are held, the I/O thread wakes at least every millisecond
        # to return released credit, so a release need not wake it for small amounts
        self.credit_held = 0
        self.wake_credit = max(config.min_charge, config.credit_window // 8)
        #: When the I/O thread must next look at `credit_dirty` (`IoThread._flush_credit`):
        #: at the earliest `owed_since + CREDIT_DELAY` of an owing peer, at once (0.0)
        #: for a large amount, never (inf) while nothing is owed. A record that carries a
        #: peer's credit back leaves it as it is while others still owe (one look too
        #: many, never one too few), and resets it once nothing is owed.
        self.credit_due = math.inf
        # read on every submit: plain attributes, not a walk through the config
        self._max_message_size = config.max_message_size
        self.min_charge = config.min_charge
        self._slots = config.slots
        self._credit_window = config.credit_window
        # what our hellos say we accept: the largest frame libzmq lets in here
        self.advertised_cap = min(config.frame_cap, _U32)
        self._pack_most = min(BODY_BYTES, config.max_message_size)
        self.flow = FlowState.RUNNING
        self.flow_epoch = 0
        self.closed = False
        self.lost_peers = 0
        self.dropped_frames = 0
        # totals over every peer, the lost ones included (the I/O thread counts them)
        self.sent_frames = 0
        self.sent_bytes = 0
        self.received_frames = 0
        self.received_bytes = 0
        self.sent_messages = 0  # wire messages, each carrying one or more records
        self.direct_messages = 0  # of those, sent by the submitting thread itself
        self.received_messages = 0
        self._wake_pending = False
        self.waker_closed = False  # set by the I/O thread before it closes the eventfd
        self.waker = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def pack_limit_for(self, peer_cap: int) -> int:
        """The pack limit towards a peer that accepts frames of `peer_cap` bytes (a
        margin below it; 0, every record alone, for a cap too small to pack under)."""
        return max(0, min(self._pack_most, peer_cap - _CAP_MARGIN))

    # -- the waker ------------------------------------------------------------------

    def post(self, command: Command) -> None:
        """Queue a command and wake the I/O thread. Call with the lock held."""
        self.commands.append(command)
        self.wake_locked()

    def requeue_first(self, command: Command) -> None:
        """Queue a record a direct send could not send, first in line (it was admitted
        with nothing queued, and the I/O thread took nothing while its sender held the
        sockets), and wake the I/O thread. Call with the lock held."""
        self.commands.appendleft(command)
        self.wake_locked()

    def wake_locked(self) -> None:
        if not self._wake_pending and not self.waker_closed:
            self._wake_pending = True
            os.eventfd_write(self.waker, 1)

    def take_commands(self) -> deque[Command]:
        """The I/O thread takes every queued command (in order) and re-arms the waker."""
        with self.lock:
            self._wake_pending = False
            try:  # noqa: SIM105 - suppress() costs a context manager on every wake
                os.eventfd_read(self.waker)
            except BlockingIOError:
                pass
            taken = self.commands
            self.commands = deque()
            return taken

    # -- submit ---------------------------------------------------------------------

    def charge_of(self, frames: Sequence[bytes]) -> int:
        size = 0
        for frame in frames:
            size += len(frame)
        if size > self._max_message_size:
            raise PayloadTooLarge(
                f"{size} bytes of frames, above max_message_size {self.config.max_message_size}"
            )
        return size if size > self.min_charge else self.min_charge

    def submit(
        self,
        peer: bytes,
        kind: Kind,
        route_id: int,
        frames: Sequence[bytes],
        size: int,
        refresh: Callable[[], Sequence[bytes]] | None = None,
        direct: bool = False,
    ) -> SubmitResult:
        """Admit now (OK), park (BACKPRESSURED + future) or refuse a request (no slot).

        `size` is the frames' total length (the caller summed it while checking them).
        The hot path of every send: `_fits` and `post` are written out in the admitted
        case. `direct`: the caller holds the I/O thread's sockets and may send an
        admitted record itself; the result is then `DIRECT` (and no command is queued)
        when nothing of ours is in flight to the peer, nothing queued goes before it,
        and the peer's connection is up.
        """
        if size > self._max_message_size:
            self.charge_of(frames)  # raises PayloadTooLarge
        charge = size if size > self.min_charge else self.min_charge
        with self.lock:
            if self.closed:
                raise Closed("the transport is closed")
            state = self.peers.get(peer)
            if state is None or not (state.outbound or state.ready):
                raise UnknownPeer(f"no connection to peer {peer!r}")
            if kind is _REQUEST:
                if state.slots >= self._slots:
                    return SubmitResult(SubmitStatus.BACKPRESSURED, None)
                state.slots += 1
            if not state.parked and not state.paused_by_peer:
                in_use = state.in_use
                # as _fits: within the window, or alone when nothing else is in flight
                if in_use + charge <= (state.window or self._credit_window) or not in_use:
                    state.in_use = in_use + charge
                    # sent here only alone: nothing in flight to the peer (else the
                    # I/O thread packs it with what follows), nothing queued before it
                    if (
                        direct
                        and not in_use
                        and not self.commands
                        and (state.outbound or state.app_seen)
                    ):
                        return DIRECT
                    self.commands.append(("app", peer, kind, route_id, frames, charge))
                    if not self._wake_pending and not self.waker_closed:
                        self._wake_pending = True
                        os.eventfd_write(self.waker, 1)
                    return _OK
            parked = Parked(kind, route_id, frames, charge, refresh)
            state.parked.append(parked)
            state.parked_bytes += charge
            return SubmitResult(SubmitStatus.BACKPRESSURED, parked)

    def _fits(self, state: PeerState, charge: int) -> bool:
        if state.paused_by_peer:
            return False
        # a message larger than the window goes alone, when nothing else is in flight
        window = state.window or self._credit_window
        return state.in_use + charge <= window or state.in_use == 0

    def admit_parked_locked(self, state: PeerState) -> list[Future[None]]:
        """Move parked frames that now fit into the command queue, in order."""
        admitted: list[Future[None]] = []
        while state.parked and self._fits(state, state.parked[0].charge):
            item = state.parked.popleft()
            state.parked_bytes -= item.charge
            state.in_use += item.charge
            frames = item.frames if item.refresh is None else item.refresh()
            item.frames, item.refresh = (), None  # its future may be kept: not its frames
            self.post(("app", state.name, item.kind, item.route_id, frames, item.charge))
            admitted.append(item.future)
        return admitted

    # -- the receiving side's credit ------------------------------------------------

    def release(self, peer: bytes, nbytes: int) -> None:
        if (
            nbytes.__class__ is not int  # the usual call passes an int: no isinstance walk
            and (not isinstance(nbytes, int) or isinstance(nbytes, bool))
        ) or nbytes < 0:
            raise InvalidRelease(f"release of {nbytes!r} bytes: a non-negative int is needed")
        with self.lock:
            state = self.peers.get(peer)
            if state is None:
                return  # the peer is gone: its credit went with it
            if nbytes > state.unreleased:
                raise InvalidRelease(
                    f"release of {nbytes} bytes, but only {state.unreleased} are "
                    f"delivered and unreleased for peer {peer!r}"
                )
            if nbytes == 0:
                return
            state.unreleased -= nbytes
            self.owe_locked(state, nbytes)

    def take_owed_locked(self, state: PeerState) -> int:
        """The credit owed to `state`'s peer, taken to travel back on a record that goes
        to it now (lock held)."""
        credit = state.owed
        if credit:
            state.owed = 0
            self.credit_held -= credit
            dirty = self.credit_dirty
            dirty.discard(state.name)
            if not dirty:
                self.credit_due = math.inf  # nothing left owed: no CREDIT frame to time
        return credit

    def owe_locked(self, state: PeerState, nbytes: int) -> None:
        """`nbytes` of credit are owed back to `state`'s peer (lock held): they go back
        with the next completion record to it, or in a CREDIT frame once due."""
        if not state.owed:
            state.owed_since = now = time.monotonic()
            self.credit_due = min(self.credit_due, now + CREDIT_DELAY)
        state.owed += nbytes
        self.credit_dirty.add(state.name)
        if state.owed >= self.wake_credit:
            self.credit_due = 0.0
            self.wake_locked()  # a large return goes at once, not at the next tick

    # -- loss and close -------------------------------------------------------------

    def drop_peer_locked(self, peer: bytes) -> list[Future[None]]:
        """Forget a peer; return its parked futures (to fail with PeerLost)."""
        state = self.peers.pop(peer, None)
        self.credit_dirty.discard(peer)
        if state is None:
            return []
        self.credit_held -= state.unreleased + state.owed
        self.lost_peers += 1
        return [item.future for item in state.parked]

    def close_locked(self) -> list[Future[None]]:
        self.closed = True
        futures = [item.future for state in self.peers.values() for item in state.parked]
        for state in self.peers.values():
            state.parked.clear()
            state.parked_bytes = 0
        return futures

    def peer_statistics_locked(self, state: PeerState) -> PeerStatistics:
        return PeerStatistics(
            peer=state.name,
            ready=state.ready,
            credit_window=state.window or self.config.credit_window,
            credit_in_use=state.in_use,
            credit_owed=state.owed,
            unreleased=state.unreleased,
            parked_messages=len(state.parked),
            parked_bytes=state.parked_bytes,
            slots_in_use=state.slots,
            paused_by_peer=state.paused_by_peer,
            sent_frames=state.sent_frames,
            sent_bytes=state.sent_bytes,
            received_frames=state.received_frames,
            received_bytes=state.received_bytes,
        )


_OK = SubmitResult(SubmitStatus.OK)
#: `submit`'s OK when the caller is to send the admitted record itself (`direct`)
DIRECT = SubmitResult(SubmitStatus.OK)
_U32 = 2**32 - 1
_CAP_MARGIN = 1024  # bytes a packed frame stays below the peer's cap
_REQUEST = Kind.REQUEST


def fail_all(
    futures: Sequence[Future[None]], error_type: type[PeerLost | Closed], text: str
) -> None:
    """Fail each future once (outside the lock)."""
    for future in futures:
        if not future.done():
            future.set_exception(error_type(text))


def admit_all(futures: Sequence[Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
