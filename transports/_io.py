"""The I/O thread: the thread that owns every socket of a transport while it is awake
(while it sleeps, another thread may take `IoThread.sockets` and send a lone record:
`send_direct`).

It sleeps in one `select.poll` on the file descriptors of its sockets (the two ROUTERs,
their monitors, ZAP) and the waker (an eventfd other threads write when they queue a
command), never in a polling sleep. A socket's descriptor only signals that the socket
has new internal commands, and a send or a read on it may take that signal, so a socket
touched since its last look is asked for its events (EVENTS) before each sleep; an
untouched one is asked only when its descriptor signals. (`zmq.Poller` asks every
socket twice per sleep, and each ask is a syscall or two: 8 - 10 per wake here.) Each wake it runs
the queued commands in order, packing what they send to each peer into few wire
messages (`_wire`); hands the owner's callback at most `batch` records from each socket
in turn, the records held from an earlier wake first (paused: the application socket is
not read at all, so RCVHWM and TCP push back); returns released credit; and runs the
heartbeat. The lock of `Core` is never held while a callback runs or a future completes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from itertools import repeat
from typing import cast

import zmq
from zmq.utils.monitor import recv_monitor_message

from ._errors import Closed, MalformedFrame, PeerLost, TransportUsageError, _SilentPeerLost
from ._logs import RateLimitedLog
from ._receive import Item, Receiver
from ._state import (
    CREDIT_DELAY,
    Command,
    Core,
    PeerState,
    admit_all,
    fail_all,
    next_ping_locked,
)
from ._types import Endpoints, FlowState, Inbound, PeerEvent, PeerEventKind
from ._wire import (
    ENVELOPE_SIZE,
    RECORDS_PER_MESSAGE,
    VERSION,
    Kind,
    Record,
    decode,
    encode,
    entry,
    pack_pair,
    pack_single,
)

__all__ = ["IoThread"]

log = logging.getLogger("transports")
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_raw_send = zmq.backend.Socket.send  # what zmq.Socket.send calls when given no routing_id
_raw_recv = zmq.backend.Socket.recv  # the same, past the wrapper
# for EVENTS, an int option: typed once here, not by a `cast(Callable[[int], int], ...)`
# at the call, which builds a typing alias on every read
_raw_get = cast(Callable[[zmq.Socket[bytes], int], int], zmq.backend.Socket.get)


def _fd(sock: zmq.Socket[bytes]) -> int:
    """The descriptor that signals the socket's new internal commands (ZMQ_FD)."""
    return int(sock.getsockopt(zmq.FD))


_pack_one = pack_single

ReceiveCallback = Callable[[Sequence[Inbound]], None]
EventCallback = Callable[[PeerEvent], None]
ReadBudget = Callable[[], int]


class _Out:
    """The records one wake has for one peer on one socket, not sent yet: the entries of
    a head and the frames of a body (`_wire`)."""

    __slots__ = ("body", "body_bytes", "head", "head_bytes", "peer", "records", "sock", "state")

    def __init__(self, sock: zmq.Socket[bytes], peer: bytes, state: PeerState | None) -> None:
        self.sock = sock
        self.peer = peer
        self.state = state
        self.head: list[bytes] = []
        self.body: list[bytes] = []
        self.records = 0
        self.body_bytes = 0
        self.head_bytes = 0


class IoThread(threading.Thread):
    """Owns the zmq context and sockets of one transport; built by `Transport` only."""

    def __init__(
        self,
        core: Core,
        on_receive: ReceiveCallback,
        on_event: EventCallback | None,
        read_budget: ReadBudget | None = None,
        before_sleep: Callable[[], None] | None = None,
    ):
        super().__init__(name=f"transports-io-{core.name.decode(errors='replace')}", daemon=True)
        self.core = core
        self.on_receive = on_receive
        self.on_event = on_event
        self.read_budget = read_budget
        self.before_sleep = before_sleep
        #: What peers send that we drop (malformed frames, refused clients): counted each,
        #: logged at most once a second per (event, peer, reason)
        self.bad_log = RateLimitedLog(log)
        self.context = zmq.Context()
        self.app = self._router()
        self.comp = self._router()
        # replies and flow frames are exempt from credit: no HWM on the completion side
        self.comp.setsockopt(zmq.SNDHWM, 0)
        self.comp.setsockopt(zmq.RCVHWM, 0)
        # the monitors report each connection of the sockets we connected: a connect as
        # CONNECTED, a disconnect (the peer died, or dropped us for an oversize frame)
        # as the loss of that peer; the heartbeat covers what the monitors cannot see
        events = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        self.monitors = [self.app.get_monitor_socket(events), self.comp.get_monitor_socket(events)]
        self.poller = select.poll()
        #: the sockets other than the two ROUTERs, by descriptor: read when it signals
        self.others: dict[int, zmq.Socket[bytes]] = {}
        self.zap: zmq.Socket[bytes] | None = None
        curve = core.config.curve
        if curve is not None:
            # our own ZAP handler, on this thread: the accepted keys decide who connects
            self.accepted = curve.accepted_raw()
            self.zap = self.context.socket(zmq.ROUTER)
            self.zap.setsockopt(zmq.LINGER, 0)
            self.zap.bind("inproc://zeromq.zap.01")
            self._watch(self.zap)
            for sock in (self.app, self.comp):
                sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public_key)
                sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret_key)
                sock.setsockopt(zmq.ZAP_DOMAIN, b"transports")
        self.app_fd = _fd(self.app)
        self.comp_fd = _fd(self.comp)
        self.poller.register(self.comp_fd, select.POLLIN)
        self.poller.register(core.waker, select.POLLIN)
        for monitor in self.monitors:
            self._watch(monitor)
        #: touched (sent on, read from, connected...) since EVENTS was last read: EVENTS
        #: is read before the next sleep, since its descriptor may not signal again
        #: (all at first: a pipe attached without a command, as a connect's or the
        #: monitors' are, signals only once a read has found it empty)
        self.app_dirty = True
        self.comp_dirty = True
        #: other sockets whose last read stopped before `Again`: read again at once
        self._others_left: list[zmq.Socket[bytes]] = list(self.others.values())
        self.app_polled = False
        self._poll_app(True)
        #: Held by this thread while it is awake; free only while it sleeps in its poll.
        #: Another thread that takes it (without waiting) may send one record itself
        #: (`send_direct`): the record then skips a wake of this thread. Taken here, by
        #: the thread that builds us, and released by `run` (a Lock has no owner).
        self.sockets = threading.Lock()
        self.sockets.acquire()
        self._events: list[PeerEvent] = []
        self.receiver = Receiver(core, self._events, self._forget_held)
        self._stopping = False
        self._batch = core.config.batch
        # records received but not handed over yet: a message carries up to
        # RECORDS_PER_MESSAGE, and the owner takes at most `batch` (and, on the
        # application connection, its read budget) per wake; the rest wait here, first
        # in line for the next wake
        self._held_app: deque[Inbound] = deque()
        self._held_comp: deque[Inbound] = deque()
        #: messages an EVENTS ask read ahead into, read whole at once (`_ask`): taken
        #: before what the socket has (`_receive`), as (peer, its records or why it is
        #: malformed)
        self._stash_app: list[tuple[bytes, list[Record] | str]] = []
        self._stash_comp: list[tuple[bytes, list[Record] | str]] = []

    def _router(self) -> zmq.Socket[bytes]:
        cfg = self.core.config
        sock: zmq.Socket[bytes] = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTING_ID, self.core.name)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unknown peer is an error, not a drop
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a peer's new connection replaces its old
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, cfg.frame_cap)
        # the libzmq HWM is a backstop only: credit binds first (window / min charge)
        backstop = cfg.credit_window // cfg.min_charge + 1024
        sock.setsockopt(zmq.SNDHWM, backstop)
        sock.setsockopt(zmq.RCVHWM, backstop)
        # ZMTP heartbeats close half-open links; the application probe is ours (PING)
        ivl = max(1, int(cfg.heartbeat_interval * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(ivl, int(cfg.heartbeat_timeout * 1000)))
        sock.setsockopt(zmq.HEARTBEAT_TTL, max(ivl, int(cfg.heartbeat_timeout * 1000)))
        return sock

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        fd = _fd(sock)
        self.others[fd] = sock
        self.poller.register(fd, select.POLLIN)

    def _poll_app(self, on: bool) -> None:
        if on and not self.app_polled:
            self.poller.register(self.app_fd, select.POLLIN)
            # what arrived while paused may have taken its signal already: look first
            self.app_dirty = True
        elif not on and self.app_polled:
            self.poller.unregister(self.app_fd)
        self.app_polled = on

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> None:
        core = self.core
        tick = core.config.heartbeat_interval / 2
        waker = core.waker
        next_tick = time.monotonic() + tick
        try:
            credit_wait = 1  # ms; see below
            app, comp = self.app, self.comp
            app_fd, comp_fd = self.app_fd, self.comp_fd
            poll = self.poller.poll
            others = self.others
            sockets = self.sockets
            before_sleep = self.before_sleep
            while not self._stopping:
                timeout_ms = int(max(0.0, next_tick - time.monotonic()) * 1000) + 1
                if core.credit_held or (self._held_app and self.app_polled):
                    # our owner holds delivered bytes: a small release does not wake us
                    # (its reply usually carries the credit back), so look again soon:
                    # 1 ms after traffic, backing off to 64 ms while nothing moves; so
                    # too while held records wait for the owner's read budget
                    timeout_ms = min(timeout_ms, credit_wait)
                if self._held_comp:
                    timeout_ms = 0  # held replies are handed over at once
                # Before sleeping, ask each socket touched since its last look: a
                # message that arrived meanwhile may have no signal left to wake us.
                app_in = comp_in = False
                if self.app_dirty:
                    self.app_dirty = False
                    app_in = self.app_polled and self._ask(app, self._stash_app)
                if self.comp_dirty:
                    self.comp_dirty = False
                    comp_in = self._ask(comp, self._stash_comp)
                if (
                    app_in
                    or comp_in
                    or self._others_left
                    or self._stash_comp
                    or (self._stash_app and self.app_polled)
                ):
                    timeout_ms = 0
                woke = False
                ready = self._others_left
                self._others_left = []
                if before_sleep is not None:
                    # Last before the sleep: the owner wakes the threads its callbacks
                    # handed work or results to, which then find the GIL free.
                    self._before_sleep(before_sleep)
                sockets.release()  # while we sleep, another thread may send (`send_direct`)
                try:
                    signalled = poll(timeout_ms)
                finally:
                    sockets.acquire()
                for fd, _ in signalled:
                    # A ROUTER that signalled is read at once, without asking EVENTS
                    # first: a read that finds nothing processes the socket's commands
                    # itself (taking the signal) and raises Again, and the socket is
                    # then asked before the next sleep (`_read` marks it touched).
                    if fd == waker:
                        woke = True
                    elif fd == app_fd:
                        app_in = self.app_polled
                    elif fd == comp_fd:
                        comp_in = True
                    else:
                        sock = others.get(fd)
                        if sock is not None and sock not in ready:
                            ready.append(sock)
                if self._stash_app or self._stash_comp:  # (`_ask`)
                    app_in = app_in or (bool(self._stash_app) and self.app_polled)
                    comp_in = comp_in or bool(self._stash_comp)
                credit_wait = 1 if woke or app_in or comp_in or ready else min(credit_wait * 2, 64)
                # nothing queued and no wake: skip the lock (a wake written after the
                # poll returned is seen by the next poll)
                if (core.commands or woke) and not self._run_commands(core.take_commands()):
                    return
                if self.app_polled and (app_in or self._held_app):
                    self._read(app, False, app_in)
                if comp_in or self._held_comp:
                    self._read(comp, True, comp_in)
                for sock in ready:
                    if sock is self.zap:
                        self._answer_zap(sock)
                    else:
                        self._read_monitor(sock)
                now = time.monotonic()
                if core.credit_dirty and now >= core.credit_due:  # (no call when not due)
                    self._flush_credit(now)
                if now >= next_tick:
                    self._heartbeat(now)
                    self.bad_log.tick()
                    next_tick = now + tick
                if self._events:
                    self._emit()
        except Exception:  # a bug here must not leave futures hanging silently
            log.exception("transports I/O thread of %r failed", core.name)
            # Nothing more can be done through this transport: it is closed. What is
            # parked fails with Closed, and a setup call queued behind the failure hears
            # it now instead of waiting out its timeout.
            with core.lock:
                futures = core.close_locked()
            queued = core.take_commands()  # nothing is queued from now on: closed
            fail_all(futures, Closed, "the transport's I/O thread failed")
            for command in queued:
                if command[0] == "call" and not command[2].done():
                    command[2].set_exception(Closed("the transport's I/O thread failed"))
        finally:
            try:
                self._emit()
                self.bad_log.flush()
                for sock in (self.app, self.comp):
                    sock.disable_monitor()
                for monitor in self.monitors:
                    monitor.close(0)
                if self.zap is not None:
                    self.zap.close(0)
                self.app.close(0)
                self.comp.close(0)
                self.context.term()
                with self.core.lock:
                    self.core.waker_closed = True
                os.close(self.core.waker)
            finally:
                if self.before_sleep is not None:
                    # After the last callback, whatever failed before it.
                    self._before_sleep(self.before_sleep)

    def _before_sleep(self, before_sleep: Callable[[], None]) -> None:
        try:
            before_sleep()
        except Exception:
            log.exception("before_sleep callback of %r failed", self.core.name)

    def _emit(self) -> None:
        if not self._events or self.on_event is None:
            self._events.clear()
            return
        events = list(self._events)
        self._events.clear()  # the same list the receiver appends to
        for event in events:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback failed for %r", event)

    # -- commands ---------------------------------------------------------------------

    def _run_commands(self, commands: Sequence[Command]) -> bool:
        """Run queued commands in order; False once "stop" ran.

        The hot path. What is sent ("app": an admitted message or request; "comp": a
        reply or another completion record) is packed per peer and socket into as few
        messages as the wire allows (`_pack`), and those go out before any other
        command runs and at the end: each peer's records keep their order.
        """
        core = self.core
        peers = core.peers  # this thread alone adds and drops peers
        app_out: dict[bytes, _Out] = {}
        comp_out: dict[bytes, _Out] = {}
        for command in commands:
            op = command[0]
            if op == "app":
                _, peer, kind, route_id, frames, charge = command
                state = peers.get(peer)
                if state is not None and not (state.outbound or state.app_seen):
                    with core.lock:
                        # its application connection is not known to be up yet (we may
                        # be paused and not reading it): keep the order, send on its hello
                        state.app_backlog.append(command)
                    continue
                self._pack(app_out, self.app, peer, state, kind, 0, route_id, charge, frames)
            elif op == "comp":
                if len(command) == 5:  # no aux: unpacked without a starred list
                    _, peer, kind, route_id, frames = command
                    aux = 0
                else:
                    _, peer, kind, route_id, frames, aux = command
                taken = self._comp_credit(peer, kind, route_id, frames, aux)
                if taken is not None:
                    state, credit = taken
                    self._pack(
                        comp_out, self.comp, peer, state, kind, aux, route_id, credit, frames
                    )
            else:
                self._flush_all(app_out)  # what was queued before it goes first
                self._flush_all(comp_out)
                if not self._run_command(command):
                    return False
        self._flush_all(app_out)
        self._flush_all(comp_out)
        return True

    def _run_command(self, command: Command) -> bool:
        """Run one command that sends nothing itself; False for "stop"."""
        op = command[0]
        if op == "flow":
            self._send_flow()
        elif op == "call":
            _, function, future = command
            self.app_dirty = self.comp_dirty = True  # it may connect, bind, disconnect
            try:
                future.set_result(function(self))
            except Exception as exc:
                future.set_exception(exc)
        elif op == "stop":
            self._stopping = True
            return False
        return True

    # -- sending ----------------------------------------------------------------------

    def _pack(
        self,
        outs: dict[bytes, _Out],
        sock: zmq.Socket[bytes],
        peer: bytes,
        state: PeerState | None,
        kind: Kind,
        aux: int,
        route_id: int,
        credit: int,
        frames: Sequence[bytes],
    ) -> None:
        """Add one record to what goes to `peer` on `sock` (`outs`, one per socket). A
        message is sent when it is full: RECORDS_PER_MESSAGE records, or a head or a
        body at the peer's pack limit (what its hello said it accepts, within our own
        256 KiB); a record above the limit travels alone, and before the peer's hello
        every record does."""
        out = outs.get(peer)
        if out is None:
            out = outs[peer] = _Out(sock, peer, state)
        count = len(frames)
        if count == 1:  # the usual record: `entry` written out
            frame = frames[0]
            nbytes = len(frame)
            out_entry = _pack_one(VERSION, kind, 1, aux, route_id, credit, nbytes)
        elif count == 2:  # the mesh's (envelope, payload): the same
            first, second = len(frames[0]), len(frames[1])
            nbytes = first + second
            out_entry = pack_pair(VERSION, kind, 2, aux, route_id, credit, first, second)
        else:
            nbytes = 0
            for frame in frames:
                nbytes += len(frame)
            out_entry = entry(kind, aux, route_id, credit, frames)
        limit = state.pack_limit if state is not None else 0
        entry_bytes = len(out_entry)
        if out.records and (
            out.records >= RECORDS_PER_MESSAGE
            or out.body_bytes + nbytes > limit
            or out.head_bytes + entry_bytes > limit
        ):
            self._flush(out)
        out.head.append(out_entry)
        if count == 1:
            out.body.append(frame)
        else:
            out.body.extend(frames)
        out.records += 1
        out.body_bytes += nbytes
        out.head_bytes += entry_bytes
        if nbytes > limit or entry_bytes > limit:
            self._flush(out)

    def _flush_all(self, outs: dict[bytes, _Out]) -> None:
        if outs:
            for out in outs.values():
                self._flush(out)
            outs.clear()

    def _flush(self, out: _Out) -> None:
        """Send what `out` holds as one message, and count its records."""
        records = out.records
        if not records:
            return
        head = out.head[0] if records == 1 else b"".join(out.head)
        body = out.body[0] if len(out.body) == 1 else b"".join(out.body)
        size = records * ENVELOPE_SIZE + out.body_bytes
        out.head = []
        out.body = []
        out.records = out.body_bytes = out.head_bytes = 0
        if self._send_message(out.sock, out.peer, head, body):
            self._count_sent(out.peer, out.state, records, size)

    def send_direct(
        self,
        sock: zmq.Socket[bytes],
        peer: bytes,
        kind: Kind,
        route_id: int,
        credit: int,
        frames: Sequence[bytes],
    ) -> bool:
        """Send one record to `peer` as a message of its own, from another thread that
        holds `sockets` (this thread is asleep in its poll): what the loop would send for
        that record alone. False when libzmq refused it (no route, the HWM backstop):
        nothing was sent, and the caller queues it for this thread, which meets the same
        refusal and loses the peer (`_send_message`)."""
        head, body = encode(kind, 0, route_id, credit, frames)
        try:
            _raw_send(sock, peer, _MORE)
            _raw_send(sock, head, _MORE)
            _raw_send(sock, body, _LAST)
        except zmq.ZMQError:
            return False
        self.core.direct_messages += 1
        self._count_sent(peer, None, 1, ENVELOPE_SIZE + len(body))
        # The send may have taken the descriptor's signal of a message that arrived:
        # ask, as the loop does before it sleeps, and wake the loop to read it.
        comp = sock is self.comp
        if self._ask(sock, self._stash_comp if comp else self._stash_app):
            if comp:
                self.comp_dirty = True
            else:
                self.app_dirty = True
            os.eventfd_write(self.core.waker, 1)
        return True

    def _ask(self, sock: zmq.Socket[bytes], stash: list[tuple[bytes, list[Record] | str]]) -> bool:
        """Ask `sock` for EVENTS: whether a message waits. A yes has read ahead into that
        message (libzmq keeps its first part inside the socket), and a disconnect of its
        pipe before the rest is read aborts libzmq (fq.cpp:80) or leaves half a message
        to the next read: so the message is read whole now, into `stash`, which
        `_receive` takes before anything the socket still has."""
        if not _raw_get(sock, _EVENTS) & _POLLIN:
            return False
        try:
            peer = _raw_recv(sock, _NOBLOCK)
        except zmq.Again:  # (the ask said yes: not expected)
            return True
        self.core.received_messages += 1
        stash.append((peer, self._rest(sock)))
        return True

    def can_send_direct(self, sock: zmq.Socket[bytes]) -> bool:
        """Whether a thread holding `sockets` may send on `sock` now: not while a message
        read ahead waits (so a direct sender adds one at most), nor on the application
        connection while we are paused (it would be read, and held, against the pause)."""
        if sock is self.comp:
            return not self._stash_comp
        return self.app_polled and not self._stash_app

    def _send_one(
        self,
        sock: zmq.Socket[bytes],
        peer: bytes,
        kind: Kind,
        aux: int = 0,
        route_id: int = 0,
        credit: int = 0,
        frames: Sequence[bytes] = (),
        state: PeerState | None = None,
    ) -> None:
        """Send one record as a message of its own, now."""
        head, body = encode(kind, aux, route_id, credit, frames)
        if self._send_message(sock, peer, head, body):
            self._count_sent(peer, state, 1, ENVELOPE_SIZE + len(body))

    def _send_message(self, sock: zmq.Socket[bytes], peer: bytes, head: bytes, body: bytes) -> bool:
        """Send one wire message `[head, body]` to `peer`; False when the peer was lost."""
        if sock is self.comp:  # a send may take the descriptor's signal (see `run`)
            self.comp_dirty = True
        else:
            self.app_dirty = True
        try:
            # frame by frame with plain int flags: send_multipart's enum arithmetic
            # costs more than the sends of a small message; and the backend's send
            # itself, past the Python wrapper of zmq.Socket.send (routing_id, group)
            _raw_send(sock, peer, _MORE)
            _raw_send(sock, head, _MORE)
            _raw_send(sock, body, _LAST)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                self._lose_closed(peer, "no route to the peer (ROUTER_MANDATORY)")
            elif exc.errno == errno.EAGAIN:
                self.lose(peer, "the libzmq HWM backstop was reached")
            else:
                raise
            return False
        return True

    def _count_sent(self, peer: bytes, state: PeerState | None, records: int, size: int) -> None:
        # counters are written by this thread only; statistics() reads a snapshot
        core = self.core
        core.sent_messages += 1
        core.sent_frames += records
        core.sent_bytes += size
        if state is None:
            state = core.peers.get(peer)
        if state is not None:
            state.sent_frames += records
            state.sent_bytes += size

    def _comp_credit(
        self, peer: bytes, kind: Kind, route_id: int, frames: Sequence[bytes], aux: int
    ) -> tuple[PeerState, int] | None:
        """A completion record about to be sent: the peer's state and the credit owed to
        it, which the record carries back; None when it is not sent now (the peer is
        lost, or its completion connection is not up yet: then it waits in order)."""
        core = self.core
        state = core.peers.get(peer)  # this thread alone adds and drops peers
        if state is not None and (state.outbound or state.completion_seen) and not state.owed:
            # Nothing owed: no lock (once per reply). A release racing this read leaves
            # its credit owed, for the next record or the credit timer, as if it came
            # just after this record went.
            return state, 0
        with core.lock:
            state = core.peers.get(peer)
            if state is None:
                return None  # lost meanwhile: the reply goes with the peer
            if not (state.outbound or state.completion_seen):
                if kind is not Kind.CREDIT:  # owed credit stays owed and goes later
                    state.completion_backlog.append(("comp", peer, kind, route_id, frames, aux))
                return None
            credit = core.take_owed_locked(state)
        return state, credit

    def _send_comp(
        self, peer: bytes, kind: Kind, route_id: int, frames: Sequence[bytes], aux: int = 0
    ) -> None:
        """Send one record on the completion connection now, with the credit owed."""
        taken = self._comp_credit(peer, kind, route_id, frames, aux)
        if taken is not None:
            state, credit = taken
            self._send_one(self.comp, peer, kind, aux, route_id, credit, frames, state)

    def _send_flow(self) -> None:
        core = self.core
        with core.lock:
            state, epoch = core.flow, core.flow_epoch
            peers = [p for p, s in core.peers.items() if s.outbound or s.completion_seen]
        self._poll_app(state is FlowState.RUNNING)
        for peer in peers:
            self._send_comp(peer, Kind.FLOW, epoch, (), aux=state.value)

    def _flush_credit(self, now: float) -> None:
        """Return owed credit in CREDIT frames: at once when a large amount is owed, else
        after it has waited 1 ms (a reply to that peer usually carries it back first);
        and set when to look again (`Core.credit_due`). The loop calls this only when
        some credit is owed and due."""
        core = self.core
        due = now - CREDIT_DELAY
        dirty: list[bytes] = []
        with core.lock:
            later = math.inf
            for peer in core.credit_dirty:
                state = core.peers.get(peer)
                if state is None:
                    continue
                if state.owed >= core.wake_credit or state.owed_since <= due:
                    dirty.append(peer)
                elif state.owed_since + CREDIT_DELAY < later:
                    later = state.owed_since + CREDIT_DELAY
            core.credit_due = later
        for peer in dirty:
            self._send_comp(peer, Kind.CREDIT, 0, ())
        if dirty:
            with core.lock:
                if not core.credit_dirty.isdisjoint(dirty):
                    # Not sent (its completion connection is not up yet): it stays owed,
                    # and the next wake looks again.
                    core.credit_due = 0.0

    # -- setup (run on this thread through "call" commands) ----------------------------

    def bind(self, application: str, completion: str) -> tuple[str, str]:
        # libzmq reads the security options when an endpoint is bound or connected
        for sock in (self.app, self.comp):
            if self.zap is not None:
                sock.setsockopt(zmq.CURVE_SERVER, 1)
        self.app.bind(application)
        self.comp.bind(completion)
        app_end = self.app.getsockopt(zmq.LAST_ENDPOINT)
        comp_end = self.comp.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(app_end, bytes)
        assert isinstance(comp_end, bytes)
        return app_end.decode(), comp_end.decode()

    def connect(self, peer: bytes, endpoints: Endpoints, server_key: bytes | None) -> None:
        """Make `peer`'s state and dial it, then tell it our flow state if we ever set
        one."""
        core = self.core
        application, completion = endpoints.application, endpoints.completion
        with core.lock:
            if core.closed:
                raise Closed("the transport is closed")
            if peer in core.peers:
                raise TransportUsageError(f"already connected to peer {peer!r}")
            core.peers[peer] = PeerState(
                peer,
                outbound=True,
                addresses=(application, completion),
                deadline=time.monotonic() + core.config.heartbeat_timeout,
            )
        # A connect that libzmq refuses part-way leaves the peer known (a retry says
        # "already connected"; the hello timeout reports it LOST): a pipe it already
        # opened under this routing id may outlive a disconnect, and a second pipe with
        # the same id aborts libzmq (docs/transports.md, "Known limits").
        dialled: list[zmq.Socket[bytes]] = []
        for sock, address in ((self.app, application), (self.comp, completion)):
            sock.setsockopt(zmq.CONNECT_ROUTING_ID, peer)
            if server_key is not None:  # we are the CURVE client of this connection
                sock.setsockopt(zmq.CURVE_SERVER, 0)
                sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
            try:
                sock.connect(address)
            finally:
                if server_key is not None:
                    sock.setsockopt(zmq.CURVE_SERVER, 1)  # for a later bind
            dialled.append(sock)
        for sock in dialled:
            self._send_one(sock, peer, Kind.HELLO, core.advertised_cap)
        with core.lock:
            flow, epoch = core.flow, core.flow_epoch
        if epoch:  # a peer dialled after a flow change hears the current state
            self._send_comp(peer, Kind.FLOW, epoch, (), aux=flow.value)

    def _answer_zap(self, zap: zmq.Socket[bytes]) -> None:
        """ZAP (RFC 27): accept a CURVE client whose public key is in `accepted_keys`."""
        for _ in range(self.core.config.batch):
            try:
                request = zap.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            # [routing id, b"", version, request id, domain, address, identity,
            #  mechanism, client key]
            if len(request) < 8:
                self.bad_log.log(
                    logging.WARNING,
                    "malformed ZAP request",
                    None,
                    len(request),
                    "transports %r: a malformed ZAP request",
                    self.core.name,
                )
                continue
            rid, _, version, request_id = request[:4]
            mechanism, credentials = request[7], request[8:]
            ok = mechanism == b"CURVE" and credentials and credentials[0] in self.accepted
            if not ok:
                self.bad_log.log(
                    logging.WARNING,
                    "refused a client",
                    request[5],  # its address
                    mechanism,
                    "transports %r refused a %s client from %r",
                    self.core.name,
                    mechanism,
                    request[5],
                )
            status = (b"200", b"OK") if ok else (b"400", b"key not accepted")
            zap.send_multipart([rid, b"", version, request_id, *status, b"", b""])
        self._others_left.append(zap)  # more may wait, with no signal left: next wake

    def _read_monitor(self, monitor: zmq.Socket[bytes]) -> None:
        for _ in range(self.core.config.batch):
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            raw: object = event["endpoint"]
            address = raw.decode() if isinstance(raw, bytes) else str(raw)
            with self.core.lock:
                peer = next(
                    (s.name for s in self.core.peers.values() if address in s.addresses), None
                )
            if peer is None:
                continue  # a connection to our bound side: the heartbeat watches those
            if event["event"] == zmq.EVENT_CONNECTED:
                if monitor is self.monitors[0]:
                    self._events.append(PeerEvent(peer, PeerEventKind.CONNECTED))
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._lose_closed(peer, f"disconnected from {address}")
        self._others_left.append(monitor)  # more may wait, with no signal left: next wake

    # -- receiving --------------------------------------------------------------------

    def _read(self, sock: zmq.Socket[bytes], completion: bool, readable: bool) -> None:
        """Hand the owner at most `batch` records (on the application connection at most
        its read budget too): held records first, then what the socket has."""
        held = self._held_comp if completion else self._held_app
        count = self._batch
        if not completion and self.read_budget is not None:
            # The owner admits at most this many more records now (its inbound permits);
            # at 0 it has paused us, so the socket leaves the poll set next wake.
            count = min(count, max(0, self.read_budget()))
        batch: list[Inbound] = []
        while held and len(batch) < count:
            batch.append(held.popleft())
        clean = False  # an EVENTS ask after the last read said empty
        if readable and len(batch) < count:
            items, malformed, clean = self._receive(sock, count - len(batch))
            if malformed:
                with self.core.lock:
                    self.core.dropped_frames += len(malformed)
            if items:
                fresh: list[Inbound] = []
                malformed += self.receiver.handle_batch(
                    items, completion, fresh, time.monotonic(), self._after_handle
                )
                batch += fresh
                if len(batch) > count:  # the last message carried more than was wanted
                    held.extend(batch[count:])
                    del batch[count:]
            for peer, why in malformed:  # each counted in `dropped_frames`
                self.bad_log.log(
                    logging.WARNING,
                    "dropped a frame",
                    peer,
                    why,
                    "transports %r dropped a frame from %r: %s",
                    self.core.name,
                    peer,
                    why,
                )
        if readable and not clean:
            # read from (or left unread: held records filled the batch) since EVENTS
            # last said empty: look again before sleeping (see `run`)
            if completion:
                self.comp_dirty = True
            else:
                self.app_dirty = True
        if batch:
            try:
                self.on_receive(batch)
            except Exception:
                log.exception("on_receive callback failed on a batch of %d", len(batch))

    def _receive(
        self, sock: zmq.Socket[bytes], wanted: int
    ) -> tuple[list[Item], list[tuple[bytes, str]], bool]:
        """Read messages until they carry `wanted` records (or `batch` messages, or none
        is left); returns their records, the malformed messages, as (peer, why), and
        whether the read ended on an EVENTS ask that said the socket is empty."""
        items: list[Item] = []
        malformed: list[tuple[bytes, str]] = []
        clean = False
        stash = self._stash_comp if sock is self.comp else self._stash_app
        if stash:  # read whole by an ask (`_ask`), before anything the socket still has
            for peer, got in stash:
                if isinstance(got, str):
                    malformed.append((peer, got))
                else:
                    items += zip(repeat(peer), got, strict=False)
            stash.clear()
        for i in range(self._batch):
            if len(items) >= wanted:
                break
            # The first read usually finds a message (the socket signalled, or EVENTS
            # said so). Before the second, ask the socket (a getsockopt): a wake that
            # brought one message (a request/reply) then ends without libzmq raising
            # Again, which costs more than a small read; a batch reads on until Again.
            if i == 1 and not _raw_get(sock, _EVENTS) & _POLLIN:
                clean = True  # the socket needs no ask before the next sleep (`run`)
                break
            try:
                # The first frame is the routing id the ROUTER puts in front of every
                # message, so more frames always follow it (libzmq hands a message over
                # whole): it is read as bytes, the cheapest read. The head and the body
                # are read as frames, whose `more` tells where the message ends (a
                # getsockopt of RCVMORE costs more than a frame here).
                peer = _raw_recv(sock, _NOBLOCK)
            except zmq.Again:
                break
            self.core.received_messages += 1  # written by whoever holds `sockets`
            records = self._rest(sock)
            if isinstance(records, str):
                malformed.append((peer, records))
            elif len(records) == 1:
                items.append((peer, records[0]))
            else:
                items += zip(repeat(peer), records, strict=False)
        return items, malformed, clean

    @staticmethod
    def _rest(sock: zmq.Socket[bytes]) -> list[Record] | str:
        """The rest of a message whose routing id was read: its records, or why it is
        malformed (then the whole message has been read all the same)."""
        head = _raw_recv(sock, _NOBLOCK, False)
        if not head.more:
            return "a message of one frame: no body after its head"
        body = _raw_recv(sock, _NOBLOCK, False)
        if body.more:
            more: bool = True
            while more:  # the rest of this message
                more = _raw_recv(sock, _NOBLOCK, False).more
            return "a message of more than two frames"
        try:
            return decode(head.bytes, body.bytes)
        except MalformedFrame as exc:
            return str(exc)

    def _after_handle(
        self,
        peer: bytes,
        flush: list[Command],
        admitted: list[Future[None]],
        restarted: list[Future[None]],
    ) -> None:
        """What a received message left to do outside the lock, before the next one."""
        self._run_all(flush)
        admit_all(admitted)
        fail_all(restarted, PeerLost, f"peer {peer!r} restarted")

    def _run_all(self, commands: list[Command]) -> None:
        self._run_commands(commands)  # never "stop": what a hello released

    def _forget_held(self, peer: bytes) -> None:
        """Drop the held records of a peer that is lost or restarted: read before it went,
        not handed over yet (as if still unread; its credit went with the peer)."""
        for held in (self._held_app, self._held_comp):
            if any(record.peer == peer for record in held):
                kept = [record for record in held if record.peer != peer]
                held.clear()
                held.extend(kept)

    # -- liveness ---------------------------------------------------------------------

    def _heartbeat(self, now: float) -> None:
        core = self.core
        lost: list[tuple[bytes, str, bool]] = []
        pings: list[tuple[bytes, int]] = []
        with core.lock:
            for peer, state in core.peers.items():
                if now > state.deadline:
                    why = "silent" if state.ready else "no hello answered"
                    lost.append((peer, f"{why} for {core.config.heartbeat_timeout} s", state.ready))
                elif state.ready and now >= state.next_ping:
                    state.next_ping = now + core.config.heartbeat_interval
                    pings.append((peer, next_ping_locked(state, now)))
        for peer, reason, silent in lost:
            self.lose(peer, reason, silent=silent)
        for peer, seq in pings:
            self._send_comp(peer, Kind.PING, seq, ())

    def _lose_closed(self, peer: bytes, reason: str) -> None:
        """A connection of `peer` closed (its monitor said so, or a send found no route):
        its process ended, or libzmq's own ZMTP heartbeat gave up on a peer that stopped
        answering, a moment before our heartbeat would have (both wait
        `heartbeat_timeout`). The second is silence (`PeerEvent.silent`): told so when
        nothing was heard from the peer for more than half way from `heartbeat_interval`
        to `heartbeat_timeout` (a live peer is heard from every interval; one whose
        process ended is closed by its kernel at once, while it was still heard from)."""
        core = self.core
        config = core.config
        with core.lock:
            state = core.peers.get(peer)
            heard = None if state is None or not state.ready else state.deadline
        quiet = 0.0 if heard is None else time.monotonic() - (heard - config.heartbeat_timeout)
        limit = (config.heartbeat_interval + config.heartbeat_timeout) / 2
        self.lose(peer, reason, silent=quiet > limit)

    def lose(self, peer: bytes, reason: str, *, silent: bool = False) -> None:
        """Forget the peer, fail its parked futures with PeerLost, report LOST (`silent`:
        it went silent, see `PeerEvent.silent`)."""
        core = self.core
        with core.lock:
            state = core.peers.get(peer)
            futures = core.drop_peer_locked(peer)
        if state is None:
            return
        self._forget_held(peer)
        if state.outbound:
            # Read ahead, not handed over yet (`_ask`): dropped with the connections we
            # close, as their unread data is. A peer that dialled us keeps it, as libzmq
            # keeps its unread data: it may be a new connection's hello (and so on a
            # restart, `_forget_held`).
            for stash in (self._stash_app, self._stash_comp):
                if stash:
                    stash[:] = [entry for entry in stash if entry[0] != peer]
            self.app_dirty = self.comp_dirty = True
            for sock, address in zip((self.app, self.comp), state.addresses, strict=True):
                with contextlib.suppress(zmq.ZMQError):  # already gone
                    sock.disconnect(address)
        log.info("transports %r lost peer %r: %s", core.name, peer, reason)
        fail_all(futures, _SilentPeerLost if silent else PeerLost, f"peer {peer!r} lost: {reason}")
        self._events.append(PeerEvent(peer, PeerEventKind.LOST, reason, silent))
