"""What every part of a MeshNode shares, and its edge to the transport.

`NodeShared` is the context object: the node's identity and configuration, the one node
lock with its Condition, the Host clock, and the few fields that change (the transport
and the node's info, set once when it starts; the channel weights; draining; closed; the
lease's state), each through one method. `Link` is where the node talks to the transport
outside a call's own send: releasing a record's credit, notices, replies, and what a
peer sent that is dropped (counted, logged at a bounded rate). Transport errors become
`ZlinkError`s here and nowhere else: `Link` for notices and replies, `submit_error` and
`admission_error` for what a call submits.

Threads: every method may run on any thread. `lock` guards the peer table and the
counters; it is never held while a completion or a callback runs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final

import transports as t

from .._core.errors import (
    NotFoundError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    shutting_down,
)
from .._engine.kernel import Runtime
from .._engine.objects import ObjectKind
from .._engine.remote import node_key
from ..location.spi import LocationStore
from . import codec as wire
from .codec import Codec, Envelope
from .config import MeshConfig, NodeInfo
from .peers import Peer, unusable

__all__ = [
    "CHANNEL",
    "CLOSE_POLL",
    "DIAL_GRACE",
    "ENVELOPE_ROOM",
    "ERROR_TEXT",
    "HANDSHAKE_BASE",
    "HOLD_PER_PERMIT",
    "KINDS",
    "KIND_NAMES",
    "NODE",
    "POLL",
    "REDIAL_MAX",
    "WITHDRAW_WAIT",
    "Link",
    "NodeShared",
    "Route",
    "admission_error",
    "gone_error",
    "log",
    "lost_reason",
    "new_generation",
    "submit_error",
]

log = logging.getLogger("zlink_actors.mesh")

CHANNEL: Final = ObjectKind.CHANNEL
NODE: Final = ObjectKind.NODE
#: An envelope's `target_kind` -> its `ObjectKind`.
KINDS: Final = {kind.value: kind for kind in ObjectKind}
#: The envelope's `target_kind` of a route's kind (`ObjectKind.value` is a Python-level
#: property: two calls per message); None is the global objects' own request.
KIND_NAMES: Final[dict[ObjectKind | None, str]] = {kind: kind.value for kind in ObjectKind}
KIND_NAMES[None] = wire.OBJECTS
#: Handshake route ids live above every pending-table route id.
HANDSHAKE_BASE: Final = 1 << 63
#: How often discovery polls the Location Store (mesh.md: "about once a second").
POLL: Final = 1.0
#: A discovered node with a lower routing id dials us; we dial it ourselves only if it
#: has not after this long (so two nodes rarely dial each other at once).
DIAL_GRACE: Final = 3.0
#: Seconds shutdown waits for the descriptor to be withdrawn.
WITHDRAW_WAIT: Final = 2.0
#: The longest wait between two dials of a `peers=` endpoint that keeps failing.
REDIAL_MAX: Final = 30.0
#: The longest error message a reply carries (characters; the rest is cut).
ERROR_TEXT: Final = 16 * 1024
#: One-ways a fenced node holds (docs/mesh.md "One-ways to a fenced node"): at most this
#: many per inbound permit (16,384 with the default permits on 2 CPUs).
HOLD_PER_PERMIT: Final = 64
#: Seconds between looks at the credit still in use while the node closes.
CLOSE_POLL: Final = 0.002
#: Frames above the payload the transport must accept: the envelope and a margin.
ENVELOPE_ROOM: Final = 64 * 1024

_generation_lock = threading.Lock()
_last_generation = 0


def new_generation() -> int:
    """A node lifecycle generation: the wall clock in ns, and larger than every one this
    process made before (two Hosts made in one clock tick still differ)."""
    global _last_generation
    with _generation_lock:
        _last_generation = max(time.time_ns(), _last_generation + 1)
        return _last_generation


@dataclass(frozen=True, slots=True)
class Route:
    """A call's remote target: the peer, and the kind and target it names there."""

    peer: Peer
    kind: ObjectKind | None  # None: the global objects' own request (`wire.OBJECTS`)
    target: str


class NodeShared:
    """The context every part of one MeshNode is handed (see the module docstring).

    Immutable: `runtime`, `config`, `codec`, `routing_id`, `generation`, `node_key`,
    `location`, `object_types`, `has_node_handler`, `lock` and `changed` (the node lock
    and its Condition), `now` (the Host clock) and `real_time` (it is
    `time.monotonic()`). Changed, each by one method: `transport` and `info`
    (`attach`), `weights` (`set_weight`), `draining` (`begin_drain`), `closed`
    (`mark_closed`), `lease_state` (`set_lease_state`)."""

    __slots__ = (
        "changed",
        "closed",
        "codec",
        "config",
        "draining",
        "generation",
        "has_node_handler",
        "info",
        "lease_state",
        "location",
        "lock",
        "node_key",
        "now",
        "object_types",
        "real_time",
        "routing_id",
        "runtime",
        "transport",
        "weights",
    )

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
        self.runtime = runtime
        self.config = config
        self.codec = codec
        self.routing_id = routing_id
        self.generation = new_generation()
        self.node_key = node_key(config.name, routing_id)
        self.location = location
        self.object_types = tuple(object_types)
        self.has_node_handler = node_handler
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        #: The Host clock (deadlines), and whether it is the real `time.monotonic()`:
        #: then a request's deadline is read on its caller's clock.
        self.now: Callable[[], float] = runtime.timers._now
        self.real_time = runtime.real_time
        self.transport: t.Transport | None = None
        self.info: NodeInfo | None = None
        #: The channels this node serves, with their weights (`set_weight`).
        self.weights = dict(channels)
        self.draining = False
        self.closed = False
        #: What the owner lease keeper decided last (`MeshStatistics.lease_state`).
        self.lease_state = "none" if location is None else "acquiring"

    def attach(self, transport: t.Transport | None, info: NodeInfo | None = None) -> None:
        """The node's transport (None: it was closed before the node served) and, once
        bound, its info. Called by the node's start alone."""
        self.transport = transport
        self.info = info

    def set_weight(self, channel: str, weight: int) -> None:
        """Under `lock`: channel `channel` gets `weight` (`NotFoundError` when this node
        does not serve it)."""
        if channel not in self.weights:
            raise NotFoundError(f"this node serves no channel {channel!r}")
        self.weights[channel] = weight

    def begin_drain(self) -> bool:
        """Under `lock`: the node starts draining. False when it drains already or never
        started (nothing to drain)."""
        if self.draining or self.transport is None or self.info is None:
            return False
        self.draining = True
        return True

    def mark_closed(self) -> bool:
        """Under `lock`: the node closes. False when it was closed already."""
        if self.closed:
            return False
        self.closed = True
        return True

    def set_lease_state(self, state: str) -> None:
        """Under `lock`: what the lease keeper decided (`MeshStatistics.lease_state`)."""
        self.lease_state = state


class Link:
    """The node's edge to the transport (see the module docstring): credit, notices and
    replies, each sent quietly (a peer or node that is gone hears nothing, its caller
    learns of the loss elsewhere), and the records it drops.

    Counters (read under the node lock): `decode_errors`, received records that could not
    be used; `unavailable`, requests answered `UnavailableError`, by reason value."""

    __slots__ = (
        "_bad_log",
        "_bad_sweep",
        "_codec",
        "_lock",
        "_routing_id",
        "_runtime",
        "_shared",
        "decode_errors",
        "unavailable",
    )

    def __init__(self, shared: NodeShared, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._shared = shared
        self._lock = shared.lock
        self._runtime = shared.runtime
        self._codec = shared.codec
        self._routing_id = shared.routing_id
        self.decode_errors = 0
        self.unavailable: dict[str, int] = {}
        #: What peers send that we drop: counted each, logged at most once a second per
        #: (event, peer, reason) on `clock` (`warn_dropped`).
        self._bad_log = t.RateLimitedLog(log, clock=clock)
        #: A sweep of `_bad_log` is scheduled on the I/O loop (`warn_dropped`).
        self._bad_sweep = False

    # -- credit, notices --------------------------------------------------------------

    def release(self, rec: t.Inbound) -> None:
        """Give record `rec`'s credit back to its sender."""
        if rec.charge:
            transport = self._shared.transport
            if transport is not None:
                # Not `contextlib.suppress`: three frames more, on every received record.
                try:  # noqa: SIM105
                    transport.release(rec.peer, rec.charge)
                except t.TransportError:
                    pass

    def give_back(self, conn: bytes, nbytes: int) -> None:
        """Give `nbytes` of credit back to the sender on `conn` (none: nothing)."""
        transport = self._shared.transport
        if nbytes and transport is not None:
            with contextlib.suppress(t.TransportError):
                transport.release(conn, nbytes)

    def notify(self, conn: bytes, env: bytes, payload: bytes) -> None:
        """Send notice `env` (an encoded envelope) with `payload` on `conn`: it waits
        behind no credit and no PAUSED peer."""
        transport = self._shared.transport
        if transport is None:
            return
        with contextlib.suppress(t.TransportError):
            transport.notify(conn, [env, payload])

    def submit_quietly(self, conn: bytes, env: Envelope, payload: bytes) -> None:
        """Send one-way record `env` on `conn` under credit, best effort."""
        transport = self._shared.transport
        if transport is None:
            return
        with contextlib.suppress(t.TransportError):
            transport.submit(conn, [wire.encode_envelope(env), payload])

    def disconnect(self, conn: bytes) -> None:
        """Close connection `conn` (one already gone: nothing)."""
        transport = self._shared.transport
        if transport is not None:
            with contextlib.suppress(t.TransportError):
                transport.disconnect(conn)

    # -- replies ----------------------------------------------------------------------

    def reply_frames(self, conn: bytes, route: int, frames: list[bytes]) -> None:
        """Answer request `route` of `conn` with `frames`. A reply the transport refuses
        (too large) becomes a `ProtocolError` reply: its caller still hears."""
        transport = self._shared.transport
        if transport is None:
            return
        try:
            transport.reply(conn, route, frames)
        except (t.UnknownPeer, t.Closed):
            pass  # the peer (or this node) is gone: its caller hears of the loss
        except t.TransportError as exc:  # a reply too large: the caller must still hear
            log.warning("mesh %s: a reply could not be sent: %s", self._routing_id, exc)
            if len(frames) > 1:
                self.reply_error(conn, route, ProtocolError(f"the reply could not be sent: {exc}"))

    def reply_error(self, conn: bytes, route: int, exc: BaseException) -> None:
        """Answer request `route` of `conn` with error `exc`."""
        self.reply_frames(conn, route, self.error_frames(exc))

    def reply_value(self, conn: bytes, route: int, value: object) -> None:
        """Answer request `route` with `value` (`ProtocolError` if it cannot cross)."""
        try:
            type_name, data = self._codec.encode_payload(value)
        except ProtocolError as error:
            self.reply_error(conn, route, error)
            return
        self.reply_frames(conn, route, [wire.encode_fields(wire.REPLY, type_name=type_name), data])

    def error_frames(self, exc: BaseException) -> list[bytes]:
        """The frames of a reply that says `exc`: its message cut at `ERROR_TEXT`
        characters; an `UnavailableError` is counted by its reason (`unavailable`)."""
        kind, message = self._codec.encode_error(exc)
        if len(message) > ERROR_TEXT:  # an error message never outgrows a reply
            message = message[:ERROR_TEXT] + " [...]"
        reason = self._codec.encode_reason(exc)
        if reason:
            with self._lock:
                self.unavailable[reason] = self.unavailable.get(reason, 0) + 1
        return [wire.encode_fields(wire.REPLY, error_kind=kind, error=message, reason=reason)]

    # -- what is dropped --------------------------------------------------------------

    def count_bad(self) -> None:
        """One more received record that could not be used (`decode_errors`)."""
        with self._lock:
            self.decode_errors += 1

    def bad(self, rec: t.Inbound, why: str) -> None:
        """A record we cannot use: logged, counted, answered with ProtocolError when it
        was a request; its credit goes back."""
        self.count_bad()
        self.warn_dropped(
            "bad record", rec.peer, why, "mesh %s: a bad record from %r: %s", rec.peer, why
        )
        self.release(rec)
        if rec.kind is t.InboundKind.REQUEST:
            self.reply_error(rec.peer, rec.route_id, ProtocolError(why))

    def warn_dropped(
        self, event: str, peer: object, reason: object, msg: str, *args: object
    ) -> None:
        """Log something a peer sent that was dropped (already counted): `msg` gets this
        node's routing id, then `args`; at most once a second per (event, peer, reason).
        A line held back schedules a sweep a little over a second later, so the count of
        a flood that stopped is logged then, not at the next drop or at close."""
        bad = self._bad_log
        if bad.log(logging.WARNING, event, peer, reason, msg, self._routing_id, *args):
            return
        if self._bad_sweep or not bad.suppressed:  # one sweep at a time; nothing held
            return
        self._bad_sweep = True
        loop = self._runtime.io.loop
        with contextlib.suppress(RuntimeError):  # the loop has stopped: close flushes
            loop.call_soon_threadsafe(loop.call_later, 1.1 * bad.interval, self.sweep_dropped)

    def sweep_dropped(self) -> None:
        """On the I/O loop: log what the drop log's ended windows held back."""
        self._bad_sweep = False
        self._bad_log.tick()

    def flush(self) -> None:
        """Log what the drop log still holds back (the node closes)."""
        self._bad_log.flush()


def gone_error(peer: Peer, peer_expiry: float) -> UnavailableError:
    """The error of a call to a peer that is not connected: why it was lost
    (`PEER_PAUSED` when it went silent: it may come back and resume until `peer_expiry`
    seconds), `PEER_LOST` once it expired; one never connected is connecting."""
    reason = unusable(peer)
    if reason is UnavailableReason.CONNECTING:
        return UnavailableError(f"node {peer.routing_id!r} is not connected yet", reason=reason)
    if reason is UnavailableReason.PEER_PAUSED:
        return UnavailableError(
            f"node {peer.routing_id!r} is silent (paused or cut off; it may come back "
            f"within peer_expiry, {peer_expiry:g} s)",
            reason=reason,
        )
    return UnavailableError(f"node {peer.routing_id!r} is lost", reason=reason)


def submit_error(exc: t.TransportError, peer: Peer, peer_expiry: float) -> ZlinkError:
    """What a one-way to `peer` fails with when the transport refused to take it
    (`Transport.submit` raised `exc`): the peer's connection is unknown (`gone_error`),
    the transport closed (`ShuttingDownError`), or the frames are too large
    (`ProtocolError`)."""
    if isinstance(exc, t.UnknownPeer):
        return gone_error(peer, peer_expiry)
    if isinstance(exc, t.Closed):
        return shutting_down()
    return ProtocolError(str(exc))


def admission_error(done: Future[None], peer: Peer) -> BaseException | None:
    """Why a one-way or request whose admission `done` (the future of a call the
    transport parked for credit) failed ends so; None: admitted."""
    exc = done.exception()
    if exc is None:
        return None
    if isinstance(exc, ZlinkError):  # set by the node itself (`settle_wait`): as is
        return exc
    if isinstance(exc, t.Closed):
        return shutting_down()
    return UnavailableError(
        f"node {peer.routing_id!r} was lost while the call waited: {exc}",
        reason=lost_reason(exc),
    )


def lost_reason(exc: BaseException) -> UnavailableReason:
    """PEER_PAUSED for a transport `PeerLost` of a peer that went silent, else PEER_LOST."""
    if isinstance(exc, t.PeerLost) and exc.silent:
        return UnavailableReason.PEER_PAUSED
    return UnavailableReason.PEER_LOST
