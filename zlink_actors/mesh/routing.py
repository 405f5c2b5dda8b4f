"""Global objects, first layer: reaching a Spot or Actor this node does not hold
(docs/mesh.md "Reaching an object").

A call to an id this node does not hold resolves its Ready owner in the Location Store
and keeps it in the route cache: an entry lives at most `route_cache_max_age` and never
past the owner's lease as read from the store (minus the fencing margin); a larger
(object, owner) generation replaces it; a stale-owner answer, the owner's loss and a
close from this node drop it. Missing, errors and Reserved records are never cached.
The owner checks it still holds the object, and its lease, before it admits a record.

Threads: the coroutines run on the I/O executor's loop (the store's loop); the route
cache is changed under the node lock and read without it (one dict read is atomic).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Final, TypeVar

import transports as t

from .._calls.messaging import deliver_send, local_request
from .._core.cancellation import CancellationToken
from .._core.completion import Cell, Completion, failed
from .._core.errors import (
    NotFoundError,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    shutting_down,
)
from .._engine.kernel import Runtime
from .._engine.objects import (
    ObjectKind,
)
from .._engine.registry import Activation
from ..location.authority import (
    Authority,
    AuthorityKind,
    AuthorityRecord,
    AuthorityState,
    OwnerFence,
)
from ..location.keys import lease_key
from ..location.lease import decode_lease
from ..location.spi import Found, LocationStore
from . import codec as wire
from .codec import Codec, Envelope
from .config import MeshConfig, PeerState, StateChange
from .inbound import Inbound
from .lease import LeaseKeeper
from .loop_calls import LoopCalls, failure, outcome, wait
from .operations import (
    _HERE,
    AUTHORITY_KIND,
    OPERATION_TYPES,
    _Cached,
    _Inflight,
    _Resolve,
)
from .peers import Peer, unusable
from .shared import KINDS, Route, log

__all__ = ["Routing"]

#: Seconds between looks at a connecting peer's state besides the wakes (`_connected_peer`).
_CONNECT_POLL: Final = 0.1
_SPOT: Final = ObjectKind.SPOT
_ACTOR: Final = ObjectKind.ACTOR
T = TypeVar("T")


class Routing(Inbound):
    """Calls to global objects held elsewhere (see the module docstring)."""

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
        on_state_change: Callable[[StateChange], object] | None = None,
        shut_host_down: Callable[[], object] | None = None,
    ) -> None:
        """`on_state_change` and `shut_host_down`: the lease keeper's (`LeaseKeeper`)."""
        super().__init__(
            runtime,
            config,
            routing_id,
            codec,
            channels=channels,
            node_handler=node_handler,
            object_types=object_types,
            location=location,
        )
        store = location
        #: The global objects' steps on the I/O loop, each under one pending entry.
        self.loop_calls = LoopCalls(runtime)
        self.authority = Authority(store) if store is not None else None
        #: The owner lease's keeper (None without a Location Store); `lease` is its lease.
        self.lease_keeper = (
            LeaseKeeper(self.shared, on_state_change=on_state_change, shut_host_down=shut_host_down)
            if store is not None
            else None
        )
        self.lease = None if self.lease_keeper is None else self.lease_keeper.lease
        self._owned: dict[tuple[ObjectKind, str], AuthorityRecord] = {}
        self._deleting: dict[tuple[ObjectKind, str], Future[None]] = {}
        self._inflight: dict[tuple[ObjectKind, str], _Inflight] = {}
        #: Owner routing id -> (lease generation, local monotonic bound of its lease).
        self._owner_leases: dict[str, tuple[int, float]] = {}
        #: Calls waiting for the resolution of their target, in submission order:
        #: (kind, id) -> [(submit, finish)] (`_in_order`; under the lock).
        self._queued: dict[
            tuple[ObjectKind, str],
            list[
                tuple[
                    Callable[[object], Completion[Any]],
                    Callable[[Completion[Any] | BaseException], None],
                ]
            ],
        ] = {}
        #: (kind, id) -> the latest monotonic end of the waits of the calls in `_queued`
        #: (under the lock): the resolution waits for a connecting owner until then.
        self._queue_ends: dict[tuple[ObjectKind, str], float] = {}
        #: Lease reads in progress, by owner (the I/O loop only).
        self._lease_reads: dict[str, asyncio.Future[tuple[int, float] | None]] = {}
        #: Owners whose lease a background read refreshes now.
        self._refreshing: set[str] = set()
        #: A cached route whose owner's lease bound is nearer than this refreshes it.
        self._refresh_ahead = config.lease.renew_interval
        self.route_cache_hits = 0
        self.route_cache_misses = 0
        for cls in OPERATION_TYPES:
            self.codec.registry.add(cls)
        if store is not None:
            # Calls to Spots and Actors go through this route cache (`ObjectRoutes`).
            self.outbound.route_objects(self)

    # -- `ObjectRoutes`, registered with `Outbound.route_objects` (a store is set) -----

    def route(self, kind: ObjectKind, target: str) -> object:
        """The route to Spot or Actor (`kind`) `target`: a cached owner's `Route`, or
        one to resolve first (`Resolve`)."""
        key = (kind, target)
        if key in self._queued:  # calls wait for its resolution: this one goes behind them
            self.route_cache_misses += 1
            return _Resolve(kind, target)
        owner = self._cached_owner(key)
        if owner is not None:
            return self._owner_route(kind, target, owner)
        return _Resolve(kind, target)

    def _cached_owner(self, key: tuple[ObjectKind, str]) -> str | None:
        """The owner a fresh cache entry names (counted as a hit), or None (a miss)."""
        cached = self._routes.get(key)
        if type(cached) is _Cached:
            now = time.monotonic()
            lease = self._owner_leases.get(cached.owner)  # one dict read: atomic
            if (
                cached.expires > now
                and lease is not None
                and lease[0] == cached.lease_generation
                and lease[1] > now
            ):
                if lease[1] - now < self._refresh_ahead:
                    self._refresh_lease(cached.owner)  # before every route to it expires
                self.route_cache_hits += 1
                return cached.owner
        self.route_cache_misses += 1
        return None

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        """A one-way to a Spot or Actor: along a cached owner's `Route`, or once its
        target is resolved, in call order (`_in_order`)."""
        if type(route) is not _Resolve:
            assert isinstance(route, Route)
            return self._send(route, payload, metadata, None)
        kind, target = route.kind, route.target
        runtime = self.runtime
        handle, route_id = self.loop_calls.begin_call(None, None)
        if route_id is None:
            return handle

        def step(found: object) -> Completion[Any]:
            if found is _HERE:
                return deliver_send(runtime, kind, target, payload, metadata)
            assert isinstance(found, Route)
            return self._send(found, payload, metadata, None)

        # A one-way has no deadline: it waits for a connecting owner as long as a request
        # on the default timeout would (docs/decisions.md).
        wait = runtime.default_request_timeout
        self._in_order(kind, target, step, _finisher(runtime, route_id, value=False), wait)
        return handle

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A request to a Spot or Actor: along a cached owner's `Route` (its route is
        dropped when the owner answers `UnavailableError`), or once its target is
        resolved, in call order (`_in_order`)."""
        if isinstance(route, Route):
            key = (route.kind, route.target)
            return self.outbound.request_to(
                route, payload, metadata, reply, timeout, cancel, None, key
            )
        assert type(route) is _Resolve
        kind, target = route.kind, route.target
        runtime = self.runtime
        handle, route_id = self.loop_calls.begin_call(timeout, cancel)
        if route_id is None:
            return handle
        due = runtime.timers._now() + timeout

        def step(found: object) -> Completion[Any]:
            left = self.loop_calls.left(due)
            if found is _HERE:
                return local_request(runtime, kind, target, payload, metadata, reply, left, cancel)
            assert isinstance(found, Route)
            return self.outbound.request_to(
                found, payload, metadata, reply, left, cancel, None, (kind, target), due
            )

        self._in_order(kind, target, step, _finisher(runtime, route_id, value=True), timeout)
        return handle

    def forget(self, key: object) -> None:
        """Drop the cached route `key` (its owner answered `UnavailableError`): the next
        call resolves it again."""
        self._routes.pop(key, None)

    def _in_order(
        self,
        kind: ObjectKind,
        target: str,
        step: Callable[[object], Completion[Any]],
        finish: Callable[[Completion[Any] | BaseException], None],
        wait: float,
    ) -> None:
        """Resolve `target`, then `step(found)` (it submits the call) and `finish(...)`
        with what it submitted, or with the error; calls to one target that wait for its
        resolution are submitted in the order they were made, and calls made meanwhile
        queue behind them (`route` sends them here), so per-peer order holds. The
        resolution waits for an owner whose connection is still coming up until the
        latest end of the queued calls' waits (each `wait` seconds from its call): a
        call queued behind one with a shorter wait keeps its own (a request still ends
        at its own deadline)."""
        key = (kind, target)
        end = time.monotonic() + wait
        with self._lock:
            queue = self._queued.get(key)
            if queue is not None:
                queue.append((step, finish))
                self._queue_ends[key] = max(self._queue_ends.get(key, end), end)
                return
            self._queued[key] = [(step, finish)]
            self._queue_ends[key] = end
        try:
            self.loop_calls.spawn(self._run_in_order(kind, target))
        except RuntimeError:  # the loop has stopped
            with self._lock:
                waiting = self._queued.pop(key, [])
                self._queue_ends.pop(key, None)
            for _, ends in waiting:
                ends(shutting_down())

    async def _run_in_order(self, kind: ObjectKind, target: str) -> None:
        key = (kind, target)
        found: object
        try:
            found = await self._resolve(kind, target, lambda: self._queue_ends.get(key, 0.0))
        except Exception as exc:
            found = failure(exc)
        while True:
            with self._lock:
                batch = self._queued.get(key)
                if not batch:
                    self._queued.pop(key, None)  # from now on, calls may go straight out
                    self._queue_ends.pop(key, None)
                    return
                self._queued[key] = []
            for step, finish in batch:
                if isinstance(found, BaseException):
                    finish(found)
                    continue
                try:
                    submitted = step(found)
                except Exception as exc:
                    finish(failure(exc) or exc)
                else:
                    finish(submitted)

    def owner_of(self, kind: ObjectKind, obj_id: str) -> Completion[str | None]:
        async def read() -> str | None:
            assert self.authority is not None
            record = await self.authority.read(AUTHORITY_KIND[kind], obj_id)
            ready = record is not None and record.state is AuthorityState.READY
            return record.owner.node if record is not None and ready else None

        cell: Cell[str | None] = Cell()
        try:
            running = self.loop_calls.spawn(read())
        except RuntimeError:
            return failed(shutting_down())
        running.add_done_callback(
            lambda done: cell.try_set(
                None if isinstance(outcome(done), BaseException) else done.result(),
                failure(outcome(done)),
            )
        )
        return Completion(cell)

    def _owner_route(self, kind: ObjectKind, target: str, owner: str) -> object:
        peer = self._peers.by_rid.get(owner)  # one dict read: atomic
        if peer is None or peer.state is not PeerState.READY:
            self._routes.pop((kind, target), None)  # the next call resolves again
            state = "unknown" if peer is None else peer.state.value
            return failed(
                UnavailableError(
                    f"the owner {owner!r} of {kind} {target!r} is {state}", reason=unusable(peer)
                )
            )
        return Route(peer, kind, target)

    async def _resolve(self, kind: ObjectKind, target: str, until: Callable[[], float]) -> object:
        """The Ready owner of `target`: `_HERE`, a `Route`, or it raises the call's error.
        An owner with a live lease whose connection is still coming up is waited for
        until the monotonic time `until()` (read again as it waits: `_connected_peer`)."""
        authority = self.authority
        assert authority is not None
        record = await authority.read(AUTHORITY_KIND[kind], target)
        if record is None or record.state is AuthorityState.RESERVED:
            being = "" if record is None else " (it is being created)"
            raise NotFoundError(f"no {kind} {target!r} in the mesh{being}")
        owner = record.owner.node
        if owner == self.routing_id:
            if self._held(kind, target) is None:
                raise UnavailableError(
                    f"{kind} {target!r} is closing on this node", reason=UnavailableReason.CLOSED
                )
            return _HERE
        bound = await self._lease_bound(record.owner)
        if bound is None:
            raise UnavailableError(
                f"the owner {owner!r} of {kind} {target!r} holds no lease",
                reason=UnavailableReason.LEASE_LAPSED,
            )
        what = f"the owner {owner!r} of {kind} {target!r}"
        peer = await self._connected_peer(owner, 0.0, what, until)
        self._remember_record(record)
        return Route(peer, kind, target)

    async def _connected_peer(
        self, rid: str, wait: float, what: str, until: Callable[[], float] | None = None
    ) -> Peer:
        """The READY peer `rid`, waiting up to `wait` seconds (or until the monotonic
        time `until()`, read again at each look) while its connection comes up: a node
        not known here yet (discovery lists it within about a second) or known from its
        descriptor and never reached. `UnavailableError` once the wait is over
        (`CONNECTING`), and at once for one lost (`PEER_LOST`; `PEER_PAUSED` when it
        went silent) or draining (`DRAINING`); `ShuttingDownError` when this node stops
        meanwhile."""
        loop = asyncio.get_running_loop()
        end = time.monotonic() + wait
        while True:
            with self._lock:
                peer = self._peers.by_rid.get(rid)
                if peer is not None and peer.state is PeerState.READY:
                    return peer
                coming = peer is None or (peer.state is PeerState.CONNECTING and not peer.lost_at)
                left = (end if until is None else until()) - time.monotonic()
                if not coming or left <= 0 or self.shared.closed or self.shared.draining:
                    break
                waiter: asyncio.Future[None] = loop.create_future()
                self._peer_waiters.append(waiter)
            try:
                # Woken when a peer becomes READY or is lost; the poll is a backstop for
                # the other changes (a BYE, a forgotten descriptor).
                await asyncio.wait_for(waiter, min(left, _CONNECT_POLL))
            except TimeoutError:
                with self._lock, contextlib.suppress(ValueError):
                    self._peer_waiters.remove(waiter)
        shared = self.shared
        if shared.closed or shared.draining:  # this node stops: the wait is not the owner's
            raise shutting_down()
        if peer is None or coming:
            state, reason = "not connected yet", UnavailableReason.CONNECTING
        elif peer.state is PeerState.DRAINING:
            state, reason = "draining", UnavailableReason.DRAINING
        else:
            state, reason = "lost", peer.lost_reason  # PEER_PAUSED when it went silent
        raise UnavailableError(f"{what} is {state}", reason=reason)

    def _remember_record(self, record: AuthorityRecord) -> None:
        """Cache the Ready owner `record` names."""
        kind = _SPOT if record.kind is AuthorityKind.SPOT else _ACTOR
        self._remember(
            kind,
            record.object_id,
            record.owner.node,
            record.generation,
            record.owner_generation,
            record.owner.lease_generation,
        )

    def _remember(
        self,
        kind: ObjectKind,
        target: str,
        owner: str,
        generation: int,
        owner_generation: int,
        lease_generation: int,
    ) -> None:
        """Cache a Ready owner for `route_cache_max_age` (valid while its lease bound
        holds); an entry of a newer record is never replaced by an older one."""
        expires = time.monotonic() + self.config.route_cache_max_age
        with self._lock:
            old = self._routes.get((kind, target))
            if type(old) is _Cached and (old.generation, old.owner_generation) > (
                generation,
                owner_generation,
            ):
                return
            self._routes[(kind, target)] = _Cached(
                owner, generation, owner_generation, lease_generation, expires
            )
        if owner not in self._owner_leases:
            self._refresh_lease(owner)  # a route filled by a create: its bound follows

    def _purge_routes(self, now: float) -> None:
        """Forget expired routes and owner lease bounds (the caches never outgrow what
        was used within `route_cache_max_age`)."""
        with self._lock:
            for key, cached in list(self._routes.items()):
                if type(cached) is _Cached and cached.expires <= now:
                    del self._routes[key]
        for node, (_, bound) in list(self._owner_leases.items()):
            if bound <= now:
                self._owner_leases.pop(node, None)

    async def _lease_bound(self, owner: OwnerFence) -> float | None:
        """Until when (local monotonic) `owner`'s lease is known to hold; None if it
        does not (expired, released, or another run's)."""
        known = self._owner_leases.get(owner.node)
        if known is not None and known[0] == owner.lease_generation and known[1] > time.monotonic():
            return known[1]
        found = await self._read_lease(owner.node)
        if found is None or found[0] != owner.lease_generation:
            return None
        return found[1]

    async def _read_lease(self, node: str) -> tuple[int, float] | None:
        """Read `node`'s lease (one read at a time per node: concurrent callers share
        it) and keep `(lease generation, local bound)` for the route cache."""
        reading = self._lease_reads.get(node)
        if reading is None:
            reading = asyncio.ensure_future(self._fetch_lease(node))
            self._lease_reads[node] = reading
            reading.add_done_callback(lambda _: self._lease_reads.pop(node, None))
        return await asyncio.shield(reading)

    async def _fetch_lease(self, node: str) -> tuple[int, float] | None:
        assert self.location is not None
        sent_at = time.monotonic()
        found = await self.location.read(lease_key(node))
        if not isinstance(found, Found) or found.expires_at is None:
            self._owner_leases.pop(node, None)
            return None
        margin = self.config.lease.fencing_margin
        known = (decode_lease(found)[1], sent_at + (found.expires_at - found.store_now) - margin)
        self._owner_leases[node] = known
        return known

    def _refresh_lease(self, node: str) -> None:
        """Read `node`'s lease again in the background (once at a time)."""
        if node in self._refreshing:
            return
        self._refreshing.add(node)

        async def refresh() -> None:
            try:
                await self._read_lease(node)
            except Exception as exc:  # the store is down: the routes expire with the bound
                log.debug("mesh %s: refreshing the lease of %s: %s", self.routing_id, node, exc)
            finally:
                self._refreshing.discard(node)

        try:
            self.loop_calls.spawn(refresh())
        except RuntimeError:  # the loop has stopped
            self._refreshing.discard(node)

    async def _owner_alive(self, owner: OwnerFence) -> bool:
        """Whether the owner of a Ready record still serves it: its lease lives in the
        store and this node has not seen it lost or draining."""
        peer = self._peers.by_rid.get(owner.node)
        # Lost (or lost before and dialled again from its descriptor) or draining: gone;
        # only a peer we never reached yet is judged by its lease alone.
        if (
            peer is not None
            and peer.state is not PeerState.READY
            and (peer.state is not PeerState.CONNECTING or peer.lost_at)
        ):
            return False
        return await self._lease_live(owner)

    def _gone(self, owner: OwnerFence) -> UnavailableReason:
        """Why `_owner_alive(owner)` said no: DRAINING or the peer's `lost_reason` when
        this node saw it draining or lost, else LEASE_LAPSED (its lease is gone)."""
        peer = self._peers.by_rid.get(owner.node)
        if peer is None or peer.state is PeerState.READY:
            return UnavailableReason.LEASE_LAPSED
        if peer.state is PeerState.DRAINING:
            return UnavailableReason.DRAINING
        if peer.state is PeerState.CONNECTING and not peer.lost_at:
            return UnavailableReason.LEASE_LAPSED
        return peer.lost_reason

    async def _lease_live(self, owner: OwnerFence) -> bool:
        """Whether `owner`'s lease still exists in the store (inside its fencing margin
        too: only an expired lease may be taken over)."""
        assert self.authority is not None
        return await self.authority.owner_alive(owner)

    def _held(self, kind: ObjectKind, obj_id: str) -> Activation | None:
        act = self.runtime.engine.tables[kind].get(obj_id)
        return None if act is None or act.closed else act

    def _ready_peer(self, rid: str) -> Peer:
        peer = self._peers.by_rid.get(rid)
        if peer is None or peer.state is not PeerState.READY:
            state = "unknown" if peer is None else peer.state.value
            raise UnavailableError(f"node {rid!r} is {state}", reason=unusable(peer))
        return peer

    def _local_target(self, env: Envelope) -> tuple[ObjectKind, str] | ZlinkError:
        where = super()._local_target(env)
        if isinstance(where, tuple) and self.authority is not None:
            kind, target = where
            if kind is _SPOT or kind is _ACTOR:
                if self.runtime.fenced:
                    return UnavailableError(
                        f"node {self.routing_id!r}: its owner lease lapsed, it admits no new "
                        "messages",
                        reason=UnavailableReason.FENCED,
                    )
                # An instance still closing here whose record names another node now
                # (`OWNERSHIP_LOST`) is not the owner: a one-way goes on to the new one.
                if env.intent is None and (
                    self._held(kind, target) is None or (kind, target) not in self._owned
                ):
                    return UnavailableError(
                        f"node {self.routing_id!r} is not the owner of {kind} {target!r}",
                        reason=UnavailableReason.NOT_OWNER,
                    )
        return where

    def _refused(self, rec: t.Inbound, peer: Peer, exc: BaseException, *, released: bool) -> bool:
        """A one-way that reached this node on a stale route (it does not hold the
        target: `NOT_OWNER`) goes on to the owner the Location Store names (docs/mesh.md
        "Reaching an object"); one held while fenced whose target went elsewhere meanwhile
        is not (its lifecycle ended: `Inbound._refused`)."""
        if (
            isinstance(exc, UnavailableError)
            and exc.reason is UnavailableReason.NOT_OWNER
            and not self._was_held(rec)
        ):
            if not released:
                self._release(rec)
            self._forward_send(rec, peer)
            return True
        return super()._refused(rec, peer, exc, released=released)

    def _forward_send(self, rec: t.Inbound, peer: Peer) -> None:
        """Send one-way `rec` from `peer` on to the owner of its target, resolved again
        from the Location Store (the route that led here is dropped first, so a record
        that still names this node ends it here); one that cannot be delivered there is
        lost, and its sender told (DROPPED)."""
        try:
            env = wire.ENVELOPE_DECODER.decode(rec.frames[0])  # decoded once already
            kind = KINDS[env.target_kind]
            payload = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
        except ZlinkError as exc:
            self._lost_here(peer, f"not the owner, and not forwarded: {exc}")
            return
        self._routes.pop((kind, env.target), None)
        with self._lock:
            self.forwarded_messages += 1
        outbound = self.outbound
        route = outbound.route(kind, env.target)
        done = (
            route
            if isinstance(route, Completion)
            else failed(NotFoundError(f"{kind} {env.target!r} is not held here"))
            if route is None
            else outbound.send(route, payload, env.metadata)
        )

        def sent(outcome: Completion[Any]) -> None:
            exc = outcome.exception()
            if exc is not None:
                self._lost_here(peer, f"not the owner, and forwarding failed: {exc}")

        done.add_done_callback(sent)

    def _decode_plain(self, name: str, data: bytes) -> object:
        if name and name not in self.codec.registry:
            name = ""  # a type this node does not know: plain values
        return self.codec.decode_payload(name, data)

    async def _ask(
        self,
        peer: Peer,
        op: object,
        reply: type | None,
        due: float,
        token: CancellationToken | None = None,
    ) -> object:
        """One of our own requests to `peer`, within what is left of `due`."""
        left = self.loop_calls.left(due)
        return await wait(
            self.outbound.request_to(
                Route(peer, None, ""), op, None, reply, left, token, None, None, due
            )
        )


def _finisher(
    runtime: Runtime, route_id: int, *, value: bool
) -> Callable[[Completion[Any] | BaseException], None]:
    """What ends the caller's pending entry `route_id` once its call was submitted (or
    failed before): the submitted call's outcome (its value too when `value`)."""

    def finish(result: Completion[Any] | BaseException) -> None:
        if isinstance(result, BaseException):
            runtime.pending.finish(route_id, exc=result)
            return
        result._add_inline(
            lambda done: runtime.pending.finish(
                route_id, done._cell._value if value else None, done._cell._exc
            )
        )

    return finish
