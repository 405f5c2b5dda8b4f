"""`Transport`: the public face of one transport (two ROUTERs and their I/O thread)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TypeVar

from ._clock import ClockOffset
from ._errors import Closed, TransportUsageError, UnknownPeer, Withdrawn
from ._io import EventCallback, IoThread, ReadBudget, ReceiveCallback
from ._state import DIRECT, Core, Parked, admit_all, fail_all
from ._types import (
    Endpoints,
    FlowState,
    PeerStatistics,
    SubmitResult,
    TransportConfig,
    TransportStatistics,
)
from ._wire import MAX_FRAMES, Kind

__all__ = ["Transport"]

T = TypeVar("T")
_SETUP_TIMEOUT = 10.0
_U64 = 2**64 - 1


_ONE_FRAME = (bytes, bytearray, memoryview, str)  # built once, not per call
# module constants: an enum member read through its class costs an attribute walk
_MESSAGE = Kind.MESSAGE
_REQUEST = Kind.REQUEST
_REPLY = Kind.REPLY


def _checked_frames(frames: Sequence[bytes]) -> tuple[tuple[bytes, ...], int]:
    """The frames as a tuple, and their total size; TransportUsageError for anything but
    a sequence of bytes frames. Once per submit: a list or tuple of exact `bytes` (the
    usual call) is checked by class, the general test runs for anything else."""
    if frames.__class__ is list or frames.__class__ is tuple:
        if len(frames) == 2:  # the mesh's (envelope, payload): no loop
            first, second = frames
            if first.__class__ is bytes and second.__class__ is bytes:
                # A tuple is kept as it is (the mesh keeps the same one until the peer
                # acknowledges it: one object, not two, per parked one-way).
                pair = frames if isinstance(frames, tuple) else (first, second)
                return pair, len(first) + len(second)
        checked = tuple(frames)
        size = 0
        for frame in checked:
            if frame.__class__ is not bytes:
                break
            size += len(frame)
        else:
            if len(checked) <= MAX_FRAMES:
                return checked, size
    if isinstance(frames, _ONE_FRAME):
        raise TransportUsageError("frames must be a sequence of bytes frames, not one frame")
    checked = tuple(frames)
    size = 0
    for frame in checked:
        if not isinstance(frame, bytes):
            raise TransportUsageError(f"a frame must be bytes, got {type(frame).__name__}")
        size += len(frame)
    if len(checked) > MAX_FRAMES:
        raise TransportUsageError(f"{len(checked)} frames: a message carries at most {MAX_FRAMES}")
    return checked, size


def _check_route_id(route_id: int) -> None:
    if route_id.__class__ is int and 0 <= route_id <= _U64:
        return  # the common case, without the isinstance calls below
    if not isinstance(route_id, int) or isinstance(route_id, bool) or not 0 <= route_id <= _U64:
        raise TransportUsageError(f"route_id must be an int in 0..2**64-1, got {route_id!r}")


class Transport:
    """One network endpoint: an application ROUTER and a completion ROUTER, one I/O thread.

    Args:
        name: this transport's routing id (1..255 bytes, not starting with a zero byte);
            peers address it by this name.
        on_receive: called on the I/O thread with each batch (at most `config.batch`
            records from one socket). It must not block; it may call `submit`,
            `reply` and `release`.
        on_event: called on the I/O thread with each `PeerEvent`.
        config: the `TransportConfig`.
        read_budget: called on the I/O thread before it reads the application
            connection: how many records it may read now (the owner's free inbound
            permits). When it says 0 the owner must have set `FlowState.PAUSED`, which
            takes the connection out of the poll set until RUNNING.
        before_sleep: called on the I/O thread each time it is about to sleep in its
            poll, after every callback of that wake, and once more as the thread ends:
            where the owner makes the wakes its callbacks kept (a thread woken while the
            I/O thread still runs Python waits for the GIL; docs/transports.md, "The
            owner's controls"). It must not block; what it raises is logged.

    Every method is thread-safe: each posts a command to the I/O thread, except that a
    lone record submitted while the I/O thread sleeps is sent by the calling thread
    itself, under the I/O thread's socket lock (docs/transports.md, "Direct sends").
    Use as a context manager, or call `close()`.
    """

    def __init__(
        self,
        name: bytes,
        on_receive: ReceiveCallback,
        *,
        on_event: EventCallback | None = None,
        config: TransportConfig | None = None,
        read_budget: ReadBudget | None = None,
        before_sleep: Callable[[], None] | None = None,
    ) -> None:
        if not isinstance(name, bytes) or not 1 <= len(name) <= 255 or name[0] == 0:
            raise TransportUsageError("name must be 1..255 bytes not starting with b'\\x00'")
        self._core = Core(name, config or TransportConfig())
        self._io = IoThread(self._core, on_receive, on_event, read_budget, before_sleep)
        self._io.start()

    @property
    def name(self) -> bytes:
        return self._core.name

    @property
    def config(self) -> TransportConfig:
        return self._core.config

    def _call(self, function: Callable[[IoThread], T]) -> T:
        """Run `function` on the I/O thread and wait for its result (directly, when
        called from a callback on that thread)."""
        if threading.current_thread() is self._io:
            if self._core.closed:
                raise Closed("the transport is closed")
            return function(self._io)
        future: Future[T] = Future()
        with self._core.lock:
            if self._core.closed:
                raise Closed("the transport is closed")
            self._core.post(("call", function, future))
        return future.result(_SETUP_TIMEOUT)

    def bind(self, application: str, completion: str) -> Endpoints:
        """Bind both ROUTERs (`tcp://127.0.0.1:*` picks a port) and return the addresses.

        Raises:
            Closed: the transport is closed.
            zmq.ZMQError: libzmq refused the address.
        """
        app, comp = self._call(lambda io: io.bind(application, completion))
        curve = self._core.config.curve
        return Endpoints(app, comp, curve.public_key if curve is not None else None)

    def connect(self, peer: bytes, endpoints: Endpoints) -> None:
        """Connect both ROUTERs to a peer's `Endpoints`. Returns before the hello exchange
        completes: `submit` may be used at once (frames wait in libzmq). The peer is
        lost if the exchange does not complete within `heartbeat_timeout`.

        With CURVE configured, `endpoints.curve_public_key` is the peer's public key and
        our own public key must be among the peer's `accepted_keys` (else its ZAP handler
        refuses us and the peer is lost after the hello timeout).

        Raises:
            TransportUsageError: already connected to that peer, a bad name, or CURVE on
                one side only.
            Closed: the transport is closed.
        """
        if not isinstance(peer, bytes) or not 1 <= len(peer) <= 255 or peer[0] == 0:
            raise TransportUsageError("peer must be 1..255 bytes not starting with b'\\x00'")
        core = self._core
        server_key = endpoints.curve_public_key
        if (core.config.curve is None) != (server_key is None):
            raise TransportUsageError(
                "CURVE must be configured on both sides: this transport has "
                f"{'no' if core.config.curve is None else 'a'} CurveConfig and the "
                f"endpoints {'no' if server_key is None else 'a'} public key"
            )
        # The peer's state is made on the I/O thread, in the step that dials it: no frame
        # (a flow change, a submit) can reach a peer that is known but not yet dialled.
        self._call(lambda io: io.connect(peer, endpoints, server_key))

    def disconnect(self, peer: bytes) -> None:
        """Forget `peer` now, as if it were lost: its parked futures fail with `PeerLost`,
        `on_event` gets LOST, the connections we opened to it are closed. Returns once
        done.

        Raises:
            UnknownPeer: no such peer. Closed: the transport is closed.
        """
        with self._core.lock:
            if peer not in self._core.peers:
                raise UnknownPeer(f"no connection to peer {peer!r}")
        self._call(lambda io: io.lose(peer, "disconnected by its owner"))

    def submit(self, peer: bytes, frames: Sequence[bytes]) -> SubmitResult:
        """Submit a one-way message to `peer`.

        Completes when: at once. `OK` means admitted now; `BACKPRESSURED` carries the
        `admitted` future (the frames are parked, FIFO per peer). A parked message can
        wait forever if the peer never releases credit and stays alive.

        Raises:
            UnknownPeer: no connection to `peer` (nothing is sent or kept).
            PayloadTooLarge: above `config.max_message_size`.
            Closed: the transport is closed.
        """
        checked, size = _checked_frames(frames)
        return self._submit(peer, _MESSAGE, 0, checked, size, None)

    def submit_request(
        self,
        peer: bytes,
        route_id: int,
        frames: Sequence[bytes],
        *,
        refresh: Callable[[], Sequence[bytes]] | None = None,
    ) -> SubmitResult:
        """Submit a request that takes one of the peer's completion slots until its reply.

        `route_id` is opaque here: the peer's `reply` returns it, and the transport keeps
        no table of pending requests. With no free slot the result is BACKPRESSURED with
        `admitted` None (`result.no_slot`), and nothing was accepted.

        `refresh`, when the request is parked, is called at the moment it is admitted (on
        whichever thread returns the credit, under the transport's lock: it must be quick
        and must not call the transport) and returns the frames to send instead, of the
        same sizes: the request's envelope with the budget it has left by then.

        Raises: as `submit`, and TransportUsageError for a bad `route_id`.
        """
        if route_id.__class__ is not int or not 0 <= route_id <= _U64:
            _check_route_id(route_id)
        checked, size = _checked_frames(frames)
        return self._submit(peer, _REQUEST, route_id, checked, size, refresh)

    def _submit(
        self,
        peer: bytes,
        kind: Kind,
        route_id: int,
        frames: tuple[bytes, ...],
        size: int,
        refresh: Callable[[], Sequence[bytes]] | None,
    ) -> SubmitResult:
        """Admit, park or refuse (`Core.submit`). While the I/O thread sleeps, an admitted
        record with nothing queued before it is sent here, on the calling thread: that
        saves the wake of the I/O thread on its way (docs/transports.md, "Direct
        sends")."""
        core = self._core
        io = self._io
        sockets = io.sockets
        if not sockets.acquire(False):  # the I/O thread is awake: it sends
            return core.submit(peer, kind, route_id, frames, size, refresh)
        try:
            app = io.app
            result = core.submit(
                peer, kind, route_id, frames, size, refresh, io.can_send_direct(app)
            )
            if result is DIRECT:
                charge = size if size > core.min_charge else core.min_charge
                if not io.send_direct(app, peer, kind, route_id, charge, frames):
                    # the I/O thread meets the same refusal and loses the peer, or
                    # sends it
                    with core.lock:
                        core.requeue_first(("app", peer, kind, route_id, frames, charge))
        finally:
            sockets.release()
        return result

    def reply(self, peer: bytes, route_id: int, frames: Sequence[bytes]) -> None:
        """Send a reply on the completion connection: never charged, never parked.

        A peer lost meanwhile takes the reply with it (its requester sees LOST).

        Raises:
            UnknownPeer: no such peer. Closed: the transport is closed.
        """
        if route_id.__class__ is not int or not 0 <= route_id <= _U64:
            _check_route_id(route_id)
        self._post_completion(peer, _REPLY, route_id, frames)

    def set_peer_window(self, peer: bytes, nbytes: int) -> None:
        """Send at most `nbytes` of credit towards `peer` (what the peer grants, when it
        is less than `config.credit_window`; more is refused: the libzmq backstop is sized
        by the configured window). Parked frames that now fit are admitted.

        Raises:
            UnknownPeer: no such peer. TransportUsageError: `nbytes` is not an int in
                `min_charge..config.credit_window`.
        """
        core = self._core
        if (
            not isinstance(nbytes, int)
            or isinstance(nbytes, bool)
            or not core.config.min_charge <= nbytes <= core.config.credit_window
        ):
            raise TransportUsageError(
                f"a peer window must be an int in {core.config.min_charge}.."
                f"{core.config.credit_window}, got {nbytes!r}"
            )
        with core.lock:
            state = core.peers.get(peer)
            if state is None:
                raise UnknownPeer(f"no connection to peer {peer!r}")
            state.window = nbytes
            admitted = core.admit_parked_locked(state)
        admit_all(admitted)

    def withdraw(self, peer: bytes, admitted: Future[None]) -> bool:
        """Take back a parked message (its `admitted` future) before it is admitted: it is
        never sent, its future fails with `Withdrawn`, and a request's slot is free again.
        False when it was already admitted (or failed): then it goes, or went, as it was.
        """
        core = self._core
        with core.lock:
            state = core.peers.get(peer)
            found = None
            if state is not None:
                found = next((p for p in state.parked if p.future is admitted), None)
            if state is None or found is None:
                return False
            state.parked.remove(found)
            state.parked_bytes -= found.charge
            if found.kind is Kind.REQUEST:
                state.slots -= 1
            # What waited behind it may fit now (FIFO: nothing overtook it meanwhile).
            behind = core.admit_parked_locked(state)
        admitted.set_exception(Withdrawn("withdrawn by its owner before it was sent"))
        admit_all(behind)
        return True

    def withdraw_matching(
        self, peer: bytes, match: Callable[[Sequence[bytes]], bool]
    ) -> list[tuple[Sequence[bytes], Future[None]]]:
        """Take back, at once and in their order, every parked one-way message to `peer`
        whose frames `match` (called under the transport's lock: it must be quick and
        must not call the transport). They are never sent; their `admitted` futures are
        left pending, for the caller to complete (it may submit the frames again later).
        What waited behind them may be admitted now. An unknown peer has none.
        """
        core = self._core
        taken: list[tuple[Sequence[bytes], Future[None]]] = []
        with core.lock:
            state = core.peers.get(peer)
            if state is None or not state.parked:
                return taken
            kept: deque[Parked] = deque()
            for item in state.parked:
                if item.kind is _MESSAGE and match(item.frames):
                    taken.append((item.frames, item.future))
                    state.parked_bytes -= item.charge
                else:
                    kept.append(item)
            state.parked = kept
            behind = core.admit_parked_locked(state) if taken else []
        admit_all(behind)
        return taken

    def notify(self, peer: bytes, frames: Sequence[bytes]) -> None:
        """Send a one-way NOTICE on the completion connection: never charged, never parked,
        read even while we or the peer are PAUSED (for words that must not wait behind
        credit, such as "I am draining"). It takes no slot and gets no reply; the peer
        receives it as an `Inbound` of kind NOTICE. A peer lost meanwhile takes it along.

        Raises:
            UnknownPeer: no such peer. PayloadTooLarge. Closed: the transport is closed.
        """
        self._post_completion(peer, Kind.NOTICE, 0, frames)

    def _post_completion(
        self, peer: bytes, kind: Kind, route_id: int, frames: Sequence[bytes]
    ) -> None:
        """Queue a reply or a notice for the completion connection (no credit, no slot).

        Raises:
            TransportUsageError, PayloadTooLarge, Closed, UnknownPeer.
        """
        checked, size = _checked_frames(frames)
        core = self._core
        if size > core.config.max_message_size:
            core.charge_of(checked)  # raises PayloadTooLarge
        io = self._io
        direct = io.sockets.acquire(False)  # the I/O thread sleeps: send it here
        try:
            with core.lock:
                if core.closed:
                    raise Closed("the transport is closed")
                state = core.peers.get(peer)
                if state is None:
                    raise UnknownPeer(f"no connection to peer {peer!r}")
                alone = False  # a notice goes through the I/O thread (packed)
                if kind is _REPLY:
                    # sent here only when it answers the one open request: while more
                    # are open, more replies follow, and the I/O thread packs them
                    alone = state.open_requests <= 1
                    if state.open_requests:
                        state.open_requests -= 1
                if (
                    not direct
                    or not alone
                    or core.commands  # queued records go first
                    or not io.can_send_direct(io.comp)
                    or not (state.outbound or state.completion_seen)  # (its backlog)
                ):
                    core.post(("comp", peer, kind, route_id, checked))
                    return
                credit = core.take_owed_locked(state)  # carried back on this record
            if not io.send_direct(io.comp, peer, kind, route_id, credit, checked):
                # Refused (no route): the credit taken above is owed again; the I/O
                # thread meets the same refusal and loses the peer, or sends it.
                with core.lock:
                    if credit and core.peers.get(peer) is state:
                        core.owe_locked(state, credit)
                        core.credit_held += credit
                    core.requeue_first(("comp", peer, kind, route_id, checked))
        finally:
            if direct:
                io.sockets.release()

    def release(self, peer: bytes, nbytes: int) -> None:
        """Return `nbytes` of credit (the `charge` of consumed records) to `peer`.

        Raises:
            InvalidRelease: more than the peer's delivered, unreleased bytes.
        """
        self._core.release(peer, nbytes)

    def set_flow(self, state: FlowState) -> None:
        """Announce PAUSED or RUNNING to every sender (an absolute, epoch-tagged frame,
        sent only on a change). While PAUSED the application connection is not read;
        the completion connection (replies, credit, heartbeat) keeps flowing."""
        if not isinstance(state, FlowState):
            raise TransportUsageError(f"state must be a FlowState, got {state!r}")
        core = self._core
        with core.lock:
            if core.closed:
                raise Closed("the transport is closed")
            if core.flow is state:
                return  # never repeated
            core.flow = state
            core.flow_epoch += 1
            core.post(("flow",))

    def peers(self) -> tuple[bytes, ...]:
        """The names of the peers known now (connected or connecting)."""
        with self._core.lock:
            return tuple(self._core.peers)

    def statistics(self) -> TransportStatistics:
        """A frozen snapshot of the transport and each of its peers."""
        core = self._core
        with core.lock:
            per_peer = tuple(core.peer_statistics_locked(s) for s in core.peers.values())
            return TransportStatistics(
                name=core.name,
                flow=core.flow,
                peers=len(per_peer),
                lost_peers=core.lost_peers,
                dropped_frames=core.dropped_frames,
                parked_messages=sum(p.parked_messages for p in per_peer),
                parked_bytes=sum(p.parked_bytes for p in per_peer),
                credit_in_use=sum(p.credit_in_use for p in per_peer),
                sent_frames=core.sent_frames,
                sent_bytes=core.sent_bytes,
                received_frames=core.received_frames,
                received_bytes=core.received_bytes,
                per_peer=per_peer,
                sent_messages=core.sent_messages,
                received_messages=core.received_messages,
                direct_messages=core.direct_messages,
            )

    def clock_offset(self, peer: bytes) -> ClockOffset | None:
        """How far `peer`'s `time.monotonic()` is from ours (its clock minus ours), as
        the heartbeat's PING / PONG round trips bound it; None while no stamped PONG
        came (the first PING leaves as soon as the peer is ready; a peer of an older
        version stamps none) or for an unknown peer. No lock: cheap enough for every
        received request (docs/transports.md, "Clock offset")."""
        state = self._core.peers.get(peer)  # one dict read and one attribute: atomic
        return None if state is None else state.clock

    def peer_statistics(self, peer: bytes) -> PeerStatistics:
        """A frozen snapshot of one peer. Raises UnknownPeer."""
        with self._core.lock:
            state = self._core.peers.get(peer)
            if state is None:
                raise UnknownPeer(f"no connection to peer {peer!r}")
            return self._core.peer_statistics_locked(state)

    def close(self) -> None:
        """Fail every parked future with `Closed`, stop the I/O thread and join it
        (unless called on the I/O thread itself, from a callback). Idempotent."""
        core = self._core
        with core.lock:
            if core.closed:
                futures: list[Future[None]] = []
            else:
                futures = core.close_locked()
                core.post(("stop",))
        fail_all(futures, Closed, "the transport was closed")
        if threading.current_thread() is not self._io:
            self._io.join()

    def __enter__(self) -> Transport:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
