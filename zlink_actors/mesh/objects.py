"""Global Spots and Actors (docs/mesh.md "Global objects"): an id names one object in
the whole mesh, its authority record in the Location Store says which node owns it, and
every node can create, reach and close it.

- **Create / get-or-create** reserve the id by compare-and-set before the factory runs
  (`Authority.reserve`), on this node when it registers the type, else on a READY peer
  that does (placement weight). Callers on the owner node that arrive while the attempt
  runs join it (`_inflight`); callers on other nodes that find the record Reserved ask the
  owner, which joins them to its attempt: one factory, one `on_create`, one result. Ready
  is committed after the creation hooks finished. One deadline covers everything.
- **Routing**: a call to an id this node does not hold resolves its Ready owner through
  the route cache (an entry lives at most `route_cache_max_age` and never past the
  owner's lease; a larger (object, owner) generation replaces it; a stale-owner answer or
  the owner's loss drops it). Missing, errors and Reserved records are never cached.
  The target node checks it still holds the object, and its lease, before it admits.
- **Owner lease**: held and renewed from the I/O loop; past its admission deadline the
  node is fenced (`runtime.fenced`): no new message, timer tick, creation or Ready commit
  for its objects. A dead owner's records are taken over by compare-and-set once its
  lease has expired in the store: `close(id)` deletes them, `get_or_create` aborts a
  Reserved one and starts a new generation. Nothing is recreated automatically.
- **Close** completes once the record is deleted; a graceful shutdown deletes the
  records of every object this node owned; any other removal deletes its record too.
- **Instance Spots**: a message with instance intent to a Missing id activates it once in
  the mesh (reserve, activate, commit); a message that finds it Reserved elsewhere goes to
  the activating node with its intent, and is handled after the first one.
- **Publish**: after the local commit, one routed message per READY, non-draining Object
  Server peer; each delivers to its own subscribed Spots.

Threads: the coroutines run on the I/O executor's loop (the store's loop); `_inflight` is
touched on that loop only; `_owned`, `_deleting` and the route cache under the node lock
(the cache is read without it on the call path: one dict read is atomic).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

import msgspec

import transports as t

from .._calls.create import close_here, create_here
from .._calls.messaging import activate_here, deliver_send, local_request
from .._calls.publish import PublishCall
from .._core.cancellation import CancellationToken
from .._core.completion import Completion, _Cell, failed
from .._core.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    InvalidOperationError,
    NotFoundError,
    ProtocolError,
    TypeMismatchError,
    UnavailableError,
    ZlinkError,
    internal_failure,
    shutting_down,
)
from .._engine.kernel import Runtime
from .._engine.objects import (
    ActorRef,
    Created,
    Existing,
    InstanceSpot,
    ObjectKind,
    Rejected,
    SpotRef,
)
from .._engine.registry import Activation, TypeInfo
from .._engine.remote import RemoteMetadata
from ..location.authority import (
    Authority,
    AuthorityKind,
    AuthorityRecord,
    AuthorityState,
    OwnerFence,
)
from ..location.keys import lease_key
from ..location.lease import OwnerLease, decode_lease
from ..location.spi import Conflict, Found, LocationStore
from . import codec as wire
from .codec import Codec, Envelope
from .config import MeshConfig, PeerState
from .inbound import Inbound
from .peers import Peer, Role
from .state import _POLL, _refuse_cancel, _Route, log

__all__ = ["GlobalObjects"]

T = TypeVar("T")

_SPOT: Final = ObjectKind.SPOT
_ACTOR: Final = ObjectKind.ACTOR
_AUTHORITY_KIND: Final = {_SPOT: AuthorityKind.SPOT, _ACTOR: AuthorityKind.ACTOR}
#: How often one call reads the record again after a compare-and-set conflict.
_ATTEMPTS: Final = 8
#: The local attempt's own bound (the callers' deadlines are their own).
_ATTEMPT_BOUND: Final = 24 * 3600.0
#: Seconds a graceful shutdown waits for the records of its objects to be deleted.
_RELEASE_WAIT: Final = 2.0


# -- the requests the nodes send each other (target kind `wire.OBJECTS`) ---------------


class CreateOp(msgspec.Struct, array_like=True, frozen=True):
    """Create or get-or-create `object_id` on the receiving node (or join its attempt)."""

    type_name: ClassVar[str] = "zla.CreateOp"
    kind: str
    object_id: str
    object_type: str
    exclusive: bool
    fresh: bool
    request_type: str
    request: bytes


class CreateReply(msgspec.Struct, array_like=True, frozen=True):
    type_name: ClassVar[str] = "zla.CreateReply"
    outcome: str  # "created" | "existing" | "rejected"
    routing_id: str
    generation: int
    reply_type: str
    reply: bytes


class CloseOp(msgspec.Struct, array_like=True, frozen=True):
    type_name: ClassVar[str] = "zla.CloseOp"
    kind: str
    object_id: str


class PublishOp(msgspec.Struct, array_like=True, frozen=True):
    type_name: ClassVar[str] = "zla.PublishOp"
    channel: str
    topic: str
    payload_type: str
    payload: bytes


#: Every type the global objects send between nodes.
OPERATION_TYPES: Final = (CreateOp, CreateReply, CloseOp, PublishOp)
_KIND_OF: Final = {kind.value: kind for kind in (_SPOT, _ACTOR)}


@dataclass(slots=True)
class _Cached:
    """A resolved Ready owner."""

    owner: str
    generation: int
    owner_generation: int
    expires: float  # local monotonic


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a create or get-or-create asks for."""

    kind: ObjectKind
    obj_id: str
    type_name: str
    exclusive: bool
    fresh: bool  # `spots.create`'s unique id: no generation counter is kept for it


@dataclass(slots=True)
class _Inflight:
    """A creation or activation this node runs for an id it reserved."""

    type_name: str
    done: asyncio.Future[object]


class _Retry:
    """An attempt lost its reservation race: its joiners read the record again."""


_RETRY: Final = _Retry()


@dataclass(frozen=True, slots=True)
class _Resolve:
    """A route still to be resolved through the Location Store."""

    kind: ObjectKind
    target: str


class _Here:
    """A resolution that found the owner to be this node."""


_HERE: Final = _Here()


class GlobalObjects(Inbound):
    """The global objects of one node (see the module docstring)."""

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
        self.authority = Authority(store) if store is not None else None
        self.lease = (
            OwnerLease(store, self.routing_id, self.config.lease) if store is not None else None
        )
        self._owned: dict[tuple[ObjectKind, str], AuthorityRecord] = {}
        self._deleting: dict[tuple[ObjectKind, str], Future[None]] = {}
        self._inflight: dict[tuple[ObjectKind, str], _Inflight] = {}
        #: Owner routing id -> (lease generation, local monotonic bound of its lease).
        self._owner_leases: dict[str, tuple[int, float]] = {}
        self.route_cache_hits = 0
        self.route_cache_misses = 0
        for cls in OPERATION_TYPES:
            self.codec.registry.add(cls)

    # -- the engine's SPIs ---------------------------------------------------------------

    def route(self, kind: ObjectKind, target: str) -> object:
        if kind is not _SPOT and kind is not _ACTOR:
            return super().route(kind, target)
        if self.authority is None:
            return None  # a mesh without a Location Store: objects stay local
        key = (kind, target)
        cached = self._routes.get(key)
        if type(cached) is _Cached and cached.expires > time.monotonic():
            self.route_cache_hits += 1
            return self._owner_route(kind, target, cached.owner)
        self.route_cache_misses += 1
        return _Resolve(kind, target)

    def send(
        self, route: object, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        if type(route) is not _Resolve:
            return super().send(route, payload, metadata)
        cell: _Cell[None] = _Cell()
        resolving = self._spawn(self._resolve(route.kind, route.target))

        def resolved(done: Future[object]) -> None:
            found = _outcome(done)
            if isinstance(found, BaseException):
                cell.try_set(None, found)
                return
            if found is _HERE:
                sent = deliver_send(self.runtime, route.kind, route.target, payload, metadata)
            else:
                assert isinstance(found, _Route)
                sent = self._send(found, payload, metadata, None)
            sent._add_inline(lambda c: cell.try_set(None, c._cell._exc))

        resolving.add_done_callback(resolved)
        # SC §5/§7: a one-way send has no timeout and refuses cancellation while it waits.
        return Completion(cell, _refuse_cancel)

    def request(
        self,
        route: object,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        if isinstance(route, _Route):
            if route.kind is _SPOT or route.kind is _ACTOR:
                key = (route.kind, route.target)
                return self._request(route, payload, metadata, reply, timeout, cancel, None, key)
            return super().request(route, payload, metadata, reply, timeout, cancel)
        assert type(route) is _Resolve
        kind, target = route.kind, route.target

        async def resolve_and_ask(due: float, token: CancellationToken | None) -> object:
            found = await self._resolve(kind, target)
            left = due - self.runtime.timers._now()
            if left <= 0:
                raise asyncio.CancelledError  # the caller's deadline ends the call
            if found is _HERE:
                asked = local_request(
                    self.runtime, kind, target, payload, metadata, reply, left, token
                )
            else:
                assert isinstance(found, _Route)
                asked = self._request(
                    found, payload, metadata, reply, left, token, None, (kind, target)
                )
            return await _wait(asked)

        return self._call(resolve_and_ask, timeout, cancel)

    def create(
        self,
        kind: ObjectKind,
        obj_id: str,
        type_name: str,
        info: TypeInfo | None,
        exclusive: bool,
        fresh: bool,
        request: object,
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        spec = _Spec(kind, obj_id, type_name, exclusive, fresh)

        def run(due: float, token: CancellationToken | None) -> Awaitable[object]:
            return self._create(spec, info, request, due, False)

        return self._call(run, timeout, cancel)

    def close_object(
        self, kind: ObjectKind, obj_id: str, timeout: float, cancel: CancellationToken | None
    ) -> Completion[bool]:
        def run(due: float, token: CancellationToken | None) -> Awaitable[object]:
            return self._close(kind, obj_id, due, False)

        return self._call(run, timeout, cancel)

    def activate(
        self,
        spot_id: str,
        type_name: str | None,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        timeout: float | None,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        forwarded = type(metadata) is RemoteMetadata  # a message another node sent here
        if timeout is None:
            cell: _Cell[None] = _Cell()
            running = self._spawn(
                self._activate(spot_id, type_name, payload, metadata, None, None, None, forwarded)
            )
            running.add_done_callback(lambda done: cell.try_set(None, _failure(_outcome(done))))
            return Completion(cell, _refuse_cancel)

        def run(due: float, token: CancellationToken | None) -> Awaitable[object]:
            return self._activate(
                spot_id, type_name, payload, metadata, reply, due, token, forwarded
            )

        return self._call(run, timeout, cancel)

    def publish(
        self, channel: str, topic: str, payload: object, metadata: dict[str, object] | None
    ) -> Completion[None]:
        with self._lock:
            peers = [
                p
                for p in self._peers.by_rid.values()
                if p.state is PeerState.READY and p.role == Role.OBJECT_SERVER
            ]
        if not peers:
            return Completion(_Cell.settled(None, None))
        cell: _Cell[None] = _Cell()
        left = [len(peers)]
        failure: list[BaseException] = []

        def sent(done: Completion[None]) -> None:
            exc = done._cell._exc
            if exc is not None and not isinstance(exc, UnavailableError):
                failure.append(exc)  # a peer that left meanwhile has no Spots to reach
            left[0] -= 1
            if not left[0]:
                cell.try_set(None, failure[0] if failure else None)

        for peer in peers:
            try:
                name, data = self._encode(payload, peer)
            except ProtocolError as exc:
                return failed(exc)
            op = PublishOp(channel, topic, name, data)
            self._send(_Route(peer, None, ""), op, metadata, None)._add_inline(sent)
        return Completion(cell, _refuse_cancel)

    def owner_of(self, kind: ObjectKind, obj_id: str) -> Completion[str | None]:
        async def read() -> str | None:
            assert self.authority is not None
            record = await self.authority.read(_AUTHORITY_KIND[kind], obj_id)
            ready = record is not None and record.state is AuthorityState.READY
            return record.owner.node if record is not None and ready else None

        cell: _Cell[str | None] = _Cell()
        try:
            running = self._spawn(read())
        except RuntimeError:
            return failed(shutting_down())
        running.add_done_callback(
            lambda done: cell.try_set(
                None if isinstance(_outcome(done), BaseException) else done.result(),
                _failure(_outcome(done)),
            )
        )
        return Completion(cell)

    def removed(self, act: Activation) -> None:
        key = (act.kind, act.id)
        with self._lock:
            record = self._owned.get(key)
            if record is None or record.generation != act.generation:
                return
            del self._owned[key]
            # RuntimeError: the loop has stopped (shutdown deleted what it could).
            with contextlib.suppress(RuntimeError):
                self._deleting[key] = self._spawn(self._delete(key, record))

    # -- the owner lease -------------------------------------------------------------------

    def acquire_lease(self, loop: asyncio.AbstractEventLoop) -> None:
        """Acquire this run's owner lease before the node serves creations (bounded by
        `renew_timeout`; if the store does not answer, `keep_lease` goes on trying)."""
        lease = self.lease
        assert lease is not None
        try:
            asyncio.run_coroutine_threadsafe(lease.acquire(), loop).result(
                self.config.lease.renew_timeout
            )
            self.runtime.fenced = False
        except Exception as exc:  # the store is down: keep_lease goes on trying
            log.warning("mesh %s: acquiring the owner lease: %r", self.routing_id, exc)

    async def keep_lease(self, stop: Callable[[], bool]) -> None:
        """Acquire this run's owner lease, renew it, fence the node while its admission
        deadline has passed; at the end (`stop()`), delete our records and release it."""
        lease = self.lease
        assert lease is not None
        config = self.config.lease
        next_renewal = time.monotonic() + config.renew_interval
        acquired = lease.grant is not None
        while not stop():
            now = time.monotonic()
            try:
                if lease.grant is None and not acquired:
                    await lease.acquire()
                    acquired = True
                    next_renewal = time.monotonic() + config.renew_interval
                elif lease.grant is not None and now >= next_renewal:
                    await lease.renew()
                    next_renewal = time.monotonic() + config.renew_interval
            except ZlinkError as exc:  # the store is down, or the lease was lost
                log.warning("mesh %s: owner lease: %s", self.routing_id, exc)
                next_renewal = time.monotonic() + min(config.renew_interval, 0.5)
                if acquired and lease.grant is None:
                    # Lost for good: its records may be taken over. A new lease would be
                    # a new run, and this run's objects must not serve again: restart.
                    log.error(
                        "mesh %s: the owner lease was lost; this node's objects admit no "
                        "new work until it restarts",
                        self.routing_id,
                    )
            fenced = not lease.admitting()
            if fenced is not self.runtime.fenced:
                self.runtime.fenced = fenced
                log.warning(
                    "mesh %s: owner lease %s", self.routing_id, "lapsed" if fenced else "admitting"
                )
            wake = next_renewal
            if lease.grant is not None and lease.remaining() > 0:
                wake = min(wake, time.monotonic() + lease.remaining())
            await self._pause(max(0.01, min(wake - time.monotonic(), _POLL)))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.release_all(), _RELEASE_WAIT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(lease.release(forget=True), _RELEASE_WAIT)

    # -- resolution and the route cache ----------------------------------------------------

    def _owner_route(self, kind: ObjectKind, target: str, owner: str) -> object:
        peer = self._peers.by_rid.get(owner)  # one dict read: atomic
        if peer is None or peer.state is not PeerState.READY:
            self._routes.pop((kind, target), None)  # the next call resolves again
            state = "unknown" if peer is None else peer.state.value
            return failed(UnavailableError(f"the owner {owner!r} of {kind} {target!r} is {state}"))
        return _Route(peer, kind, target)

    async def _resolve(self, kind: ObjectKind, target: str) -> object:
        """The Ready owner of `target`: `_HERE`, a `_Route`, or it raises the call's error."""
        authority = self.authority
        assert authority is not None
        record = await authority.read(_AUTHORITY_KIND[kind], target)
        if record is None or record.state is AuthorityState.RESERVED:
            being = "" if record is None else " (it is being created)"
            raise NotFoundError(f"no {kind} {target!r} in the mesh{being}")
        owner = record.owner.node
        if owner == self.routing_id:
            if self._held(kind, target) is None:
                raise UnavailableError(f"{kind} {target!r} is closing on this node")
            return _HERE
        bound = await self._lease_bound(record.owner)
        if bound is None:
            raise UnavailableError(f"the owner {owner!r} of {kind} {target!r} holds no lease")
        found = self._owner_route(kind, target, owner)
        if isinstance(found, Completion):
            exc = found.exception()
            assert exc is not None
            raise exc
        expires = min(time.monotonic() + self.config.route_cache_max_age, bound)
        with self._lock:
            old = self._routes.get((kind, target))
            if not (
                type(old) is _Cached
                and (old.generation, old.owner_generation)
                > (record.generation, record.owner_generation)
            ):
                self._routes[(kind, target)] = _Cached(
                    owner, record.generation, record.owner_generation, expires
                )
        return found

    async def _lease_bound(self, owner: OwnerFence) -> float | None:
        """Until when (local monotonic) `owner`'s lease is known to hold; None if it
        does not (expired, released, or another run's)."""
        known = self._owner_leases.get(owner.node)
        now = time.monotonic()
        if known is not None and known[0] == owner.lease_generation and known[1] > now:
            return known[1]
        assert self.location is not None
        sent_at = time.monotonic()
        found = await self.location.read(lease_key(owner.node))
        if not isinstance(found, Found) or found.expires_at is None:
            return None
        if decode_lease(found)[1] != owner.lease_generation:
            return None
        bound = sent_at + (found.expires_at - found.store_now) - self.config.lease.fencing_margin
        self._owner_leases[owner.node] = (owner.lease_generation, bound)
        return bound

    async def _owner_alive(self, owner: OwnerFence) -> bool:
        """Whether the owner of a Ready record still serves it: its lease lives in the
        store and this node has not seen it lost."""
        peer = self._peers.by_rid.get(owner.node)
        if peer is not None and peer.state is PeerState.LOST:
            return False
        return await self._lease_live(owner)

    async def _lease_live(self, owner: OwnerFence) -> bool:
        """Whether `owner`'s lease still exists in the store (inside its fencing margin
        too: only an expired lease may be taken over)."""
        assert self.authority is not None
        return await self.authority.owner_alive(owner)

    def _held(self, kind: ObjectKind, obj_id: str) -> Activation | None:
        act = self.runtime.engine.tables[kind].get(obj_id)
        return None if act is None or act.closed else act

    # -- create ------------------------------------------------------------------------

    async def _create(
        self, spec: _Spec, info: TypeInfo | None, request: object, due: float, forwarded: bool
    ) -> object:
        """Create or get-or-create `spec` in the mesh (`forwarded`: another node placed
        it here, or asks us because we hold its reservation)."""
        authority = self.authority
        assert authority is not None
        kind, obj_id, type_name = spec.kind, spec.obj_id, spec.type_name
        key = (kind, obj_id)
        for _ in range(_ATTEMPTS):
            joined = self._inflight.get(key)
            if joined is not None:
                if spec.exclusive:
                    raise AlreadyExistsError(f"{kind} {obj_id!r} is being created")
                if joined.type_name != type_name:
                    raise _mismatch(kind, obj_id, joined.type_name, type_name)
                result = await asyncio.shield(joined.done)
                if result is _RETRY:
                    continue
                return result
            held = self._held(kind, obj_id)
            if held is not None and key in self._owned:
                return _existing(held, kind, obj_id, type_name, spec.exclusive)
            record = await authority.read(_AUTHORITY_KIND[kind], obj_id)
            if record is not None:
                if record.type_name != type_name:
                    raise _mismatch(kind, obj_id, record.type_name, type_name)
                owner = record.owner.node
                if owner == self.routing_id:
                    if key in self._inflight:
                        continue  # our own attempt started meanwhile: join it
                    if record.state is AuthorityState.READY:
                        raise UnavailableError(f"{kind} {obj_id!r} is closing")
                    await authority.abort(record)  # a leftover of an attempt of ours
                    continue
                if record.state is AuthorityState.READY:
                    if spec.exclusive:
                        raise AlreadyExistsError(f"{kind} {obj_id!r} already exists")
                    if not await self._owner_alive(record.owner):
                        raise UnavailableError(
                            f"the owner {owner!r} of {kind} {obj_id!r} is gone; "
                            f"close({obj_id!r}) removes its record once its lease expired"
                        )
                    return Existing(_ref(record))
                if not await self._lease_live(record.owner):
                    await authority.take_over_stale(record)  # a dead creator's reservation
                    continue
                if spec.exclusive:
                    raise AlreadyExistsError(f"{kind} {obj_id!r} is being created")
                if forwarded:
                    raise UnavailableError(f"{kind} {obj_id!r} is being created on {owner!r}")
                # The creator joins us to its attempt: one result for every caller.
                return await self._forward_create(self._ready_peer(owner), spec, request, due)
            if info is not None and (forwarded or self.config.placement_weight > 0):
                result = await self._attempt(spec, info, request)
                if result is _RETRY:
                    continue
                return result
            if forwarded:
                raise NotFoundError(f"node {self.routing_id!r} does not register {type_name}")
            with self._lock:
                placed = self._peers.place(type_name)
            if placed is None:
                raise NotFoundError(
                    f"no READY node of mesh {self.config.name!r} registers {kind} type "
                    f"{type_name} with a placement weight above 0"
                )
            return await self._forward_create(placed, spec, request, due)
        raise UnavailableError(f"{kind} {obj_id!r}: the record kept changing; try again")

    async def _attempt(self, spec: _Spec, info: TypeInfo, request: object) -> object:
        """Reserve the id for this node, create it here, commit Ready: the result, or
        `_RETRY` when another reservation won."""
        authority = self.authority
        assert authority is not None
        kind, obj_id = spec.kind, spec.obj_id
        key = (kind, obj_id)
        fence = self._fence(f"creating {kind} {obj_id!r}")
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inflight[key] = _Inflight(spec.type_name, done)
        result: object = _RETRY
        error: BaseException | None = None
        try:
            reserved = await authority.reserve(
                _AUTHORITY_KIND[kind], obj_id, spec.type_name, fence, fresh=spec.fresh
            )
            if isinstance(reserved, Conflict):
                return _RETRY
            result = await self._create_reserved(reserved, info, request)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            del self._inflight[key]
            if error is not None:
                done.set_exception(error if isinstance(error, Exception) else shutting_down())
                done.exception()  # retrieved: joiners may be none
            else:
                done.set_result(result)

    async def _create_reserved(
        self, reserved: AuthorityRecord, info: TypeInfo, request: object
    ) -> object:
        authority = self.authority
        assert authority is not None
        kind = info.kind
        obj_id = reserved.object_id
        try:
            result = await _wait(
                create_here(
                    self.runtime, kind, obj_id, info, request, _ATTEMPT_BOUND, reserved.generation
                )
            )
        except BaseException:
            await _quietly(authority.abort(reserved))
            raise
        if not isinstance(result, Created):
            await _quietly(authority.abort(reserved))
            return result  # Rejected: the id stays free
        return await self._commit(reserved, kind, obj_id, result)

    async def _commit(
        self, reserved: AuthorityRecord, kind: ObjectKind, obj_id: str, result: object
    ) -> object:
        authority = self.authority
        assert authority is not None
        committed: AuthorityRecord | Conflict | None = None
        if self._admitting():
            committed = await authority.commit(reserved)
        if not isinstance(committed, AuthorityRecord):
            # The lease lapsed, or the reservation was taken over: the object may not
            # serve; it closes here and the call fails.
            close_here(self.runtime, kind, obj_id, _ATTEMPT_BOUND, None)
            if committed is None:
                await _quietly(authority.abort(reserved))
            raise UnavailableError(
                f"{kind} {obj_id!r} could not be committed Ready: this node's owner lease "
                "lapsed or its reservation was taken over"
            )
        with self._lock:
            self._owned[(kind, obj_id)] = committed
        return result

    def _fence(self, what: str) -> OwnerFence:
        lease = self.lease
        grant = None if lease is None else lease.grant
        if grant is None or not self._admitting():
            raise UnavailableError(f"{what}: this node holds no admitting owner lease")
        return OwnerFence(self.routing_id, grant.generation)

    def _admitting(self) -> bool:
        return self.lease is not None and self.lease.admitting()

    def _ready_peer(self, rid: str) -> Peer:
        peer = self._peers.by_rid.get(rid)
        if peer is None or peer.state is not PeerState.READY:
            state = "unknown" if peer is None else peer.state.value
            raise UnavailableError(f"node {rid!r} is {state}")
        return peer

    async def _forward_create(self, peer: Peer, spec: _Spec, request: object, due: float) -> object:
        kind, obj_id = spec.kind, spec.obj_id
        name, data = self._encode(request, peer)
        op = CreateOp(kind.value, obj_id, spec.type_name, spec.exclusive, spec.fresh, name, data)
        answer = await self._ask(peer, op, CreateReply, due)
        assert isinstance(answer, CreateReply)
        reply = self._decode_plain(answer.reply_type, answer.reply)
        ref: SpotRef | ActorRef = (
            SpotRef(obj_id, answer.generation, answer.routing_id)
            if kind is _SPOT
            else ActorRef(obj_id, answer.generation, answer.routing_id)
        )
        if answer.outcome == "created":
            return Created(ref, reply)
        if answer.outcome == "existing":
            return Existing(ref)
        return Rejected(reply)

    # -- close -------------------------------------------------------------------------

    async def _close(self, kind: ObjectKind, obj_id: str, due: float, forwarded: bool) -> object:
        authority = self.authority
        assert authority is not None
        key = (kind, obj_id)
        self._routes.pop(key, None)  # whatever happens, the next call resolves again
        for _ in range(_ATTEMPTS):
            if self._held(kind, obj_id) is not None:
                left = max(due - self.runtime.timers._now(), 1e-3)
                closed = await _wait(close_here(self.runtime, kind, obj_id, left, None))
                if closed:
                    await self._record_gone(key)
                return closed
            if forwarded:
                raise UnavailableError(f"node {self.routing_id!r} does not hold {kind} {obj_id!r}")
            record = await authority.read(_AUTHORITY_KIND[kind], obj_id)
            if record is None:
                raise NotFoundError(f"no {kind} {obj_id!r} to close")
            owner = record.owner.node
            if owner == self.routing_id:
                if record.state is AuthorityState.RESERVED:
                    raise NotFoundError(f"no {kind} {obj_id!r} to close (it is being created)")
                await self._record_gone(key)
                continue
            peer = self._peers.by_rid.get(owner)
            if peer is not None and peer.state is PeerState.READY:
                answer = await self._ask(peer, CloseOp(kind.value, obj_id), None, due)
                return bool(answer)
            if await self._lease_live(record.owner):
                if record.state is AuthorityState.RESERVED:
                    raise NotFoundError(f"no {kind} {obj_id!r} to close (it is being created)")
                raise UnavailableError(
                    f"the owner {owner!r} of {kind} {obj_id!r} is unreachable and its lease "
                    "has not expired"
                )
            if isinstance(await authority.take_over_stale(record), Conflict):
                continue  # it changed meanwhile: read again
            self._routes.pop(key, None)
            return True
        raise UnavailableError(f"{kind} {obj_id!r}: the record kept changing; try again")

    async def _record_gone(self, key: tuple[ObjectKind, str]) -> None:
        """Wait until the record of an object this node closed is deleted."""
        with self._lock:
            record = self._owned.pop(key, None)
            deleting = self._deleting.get(key)
        if record is not None:
            await self._delete(key, record)
        elif deleting is not None:
            await asyncio.wrap_future(deleting)
        else:  # closed before we owned it, or a leftover: delete whatever we own there
            assert self.authority is not None
            found = await self.authority.read(_AUTHORITY_KIND[key[0]], key[1])
            if found is not None and found.owner.node == self.routing_id:
                await _quietly(self.authority.delete(found))

    async def _delete(self, key: tuple[ObjectKind, str], record: AuthorityRecord) -> None:
        assert self.authority is not None
        try:
            await self.authority.delete(record)
        except Exception as exc:  # the store is down: the record stays until taken over
            log.warning("mesh %s: deleting the record of %s: %s", self.routing_id, key, exc)
        finally:
            with self._lock:
                self._deleting.pop(key, None)

    async def release_all(self) -> None:
        """Graceful shutdown: delete the record of every object this node owns."""
        with self._lock:
            owned = list(self._owned.items())
            self._owned.clear()
        await asyncio.gather(*(self._delete(key, rec) for key, rec in owned))

    # -- instance activation --------------------------------------------------------------

    async def _activate(
        self,
        spot_id: str,
        type_name: str | None,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        due: float | None,
        token: CancellationToken | None,
        forwarded: bool,
    ) -> object:
        authority = self.authority
        assert authority is not None
        key = (_SPOT, spot_id)
        spot_type = self._instance_type(type_name)
        for _ in range(_ATTEMPTS):
            joined = self._inflight.get(key)
            if joined is not None:
                await asyncio.shield(joined.done)  # the first message goes first
                continue
            if self._held(_SPOT, spot_id) is not None:
                return await self._deliver_here(
                    spot_id, spot_type, payload, metadata, reply, due, token, 0
                )
            record = await authority.read(AuthorityKind.SPOT, spot_id)
            if record is not None:
                owner = record.owner.node
                if owner == self.routing_id:
                    if key in self._inflight:
                        continue
                    if record.state is AuthorityState.READY:
                        raise UnavailableError(f"Spot {spot_id!r} is closing")
                    await authority.abort(record)
                    continue
                if record.state is AuthorityState.RESERVED and not await self._lease_live(
                    record.owner
                ):
                    await authority.take_over_stale(record)
                    continue
                if forwarded:
                    raise UnavailableError(
                        f"node {self.routing_id!r} does not hold Spot {spot_id!r}"
                    )
                # Ready or being activated there: the message goes there, with its intent.
                peer = self._ready_peer(owner)
                return await self._send_with_intent(
                    peer, spot_id, type_name, payload, metadata, reply, due, token
                )
            if spot_type is not None:
                result = await self._activate_here(
                    spot_id, spot_type, payload, metadata, reply, due, token
                )
                if result is _RETRY:
                    continue
                return result
            if forwarded or type_name is None:
                raise NotFoundError(
                    f"no Spot {spot_id!r} and no InstanceSpot type to activate it here"
                    + ("" if type_name is not None else ": pass one to activate()")
                )
            with self._lock:
                placed = self._peers.place(type_name)
            if placed is None:
                raise NotFoundError(f"no READY node of the mesh registers {type_name}")
            return await self._send_with_intent(
                placed, spot_id, type_name, payload, metadata, reply, due, token
            )
        raise UnavailableError(f"Spot {spot_id!r}: the record kept changing; try again")

    def _instance_type(self, type_name: str | None) -> type | None:
        """This node's InstanceSpot type of that name (None: any one of this node's, if
        it has exactly one); None when this node cannot activate it."""
        types = [
            info.cls
            for info in self.runtime.engine.types.values()
            if issubclass(info.cls, InstanceSpot)
        ]
        if type_name is None:
            if len(types) > 1:
                names = ", ".join(sorted(cls.__qualname__ for cls in types))
                raise InvalidOperationError(
                    f"several InstanceSpot types are registered ({names}): pass one to activate()"
                )
            return types[0] if types else None
        info = self.runtime.engine.types.get(type_name)
        return info.cls if info is not None and info.cls in types else None

    async def _activate_here(
        self,
        spot_id: str,
        spot_type: type,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        due: float | None,
        token: CancellationToken | None,
    ) -> object:
        authority = self.authority
        assert authority is not None
        key = (_SPOT, spot_id)
        name = self.runtime.engine.by_class[spot_type].name
        fence = self._fence(f"activating Spot {spot_id!r}")
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inflight[key] = _Inflight(name, done)
        try:
            reserved = await authority.reserve(AuthorityKind.SPOT, spot_id, name, fence)
            if isinstance(reserved, Conflict):
                return _RETRY
            try:
                delivered = self._deliver(
                    spot_id, spot_type, payload, metadata, reply, due, token, reserved.generation
                )
            except BaseException:
                await _quietly(authority.abort(reserved))
                raise
            if self._held(_SPOT, spot_id) is None:
                await _quietly(authority.abort(reserved))  # refused before it activated
            else:
                await self._commit(reserved, _SPOT, spot_id, None)
        finally:
            del self._inflight[key]
            done.set_result(None)
        return await _wait(delivered)

    def _deliver(
        self,
        spot_id: str,
        spot_type: type | None,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        due: float | None,
        token: CancellationToken | None,
        generation: int,
    ) -> Completion[Any]:
        left = None if due is None else max(due - self.runtime.timers._now(), 1e-3)
        return activate_here(
            self.runtime, spot_id, spot_type, payload, metadata, reply, left, token, generation
        )

    async def _deliver_here(
        self,
        spot_id: str,
        spot_type: type | None,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        due: float | None,
        token: CancellationToken | None,
        generation: int,
    ) -> object:
        return await _wait(
            self._deliver(spot_id, spot_type, payload, metadata, reply, due, token, generation)
        )

    async def _send_with_intent(
        self,
        peer: Peer,
        spot_id: str,
        type_name: str | None,
        payload: object,
        metadata: dict[str, object] | None,
        reply: type | None,
        due: float | None,
        token: CancellationToken | None,
    ) -> object:
        route = _Route(peer, _SPOT, spot_id)
        intent = "" if type_name is None else type_name
        if due is None:
            sent: Completion[Any] = self._send(route, payload, metadata, intent)
            return await _wait(sent)
        left = due - self.runtime.timers._now()
        if left <= 0:
            raise asyncio.CancelledError
        return await _wait(
            self._request(route, payload, metadata, reply, left, token, intent, (_SPOT, spot_id))
        )

    # -- the requests other nodes send us ---------------------------------------------------

    def _local_target(self, env: Envelope) -> tuple[ObjectKind, str] | ZlinkError:
        where = super()._local_target(env)
        if isinstance(where, tuple) and self.authority is not None:
            kind, target = where
            if kind is _SPOT or kind is _ACTOR:
                if self.runtime.fenced:
                    return UnavailableError(
                        f"node {self.routing_id!r}: its owner lease lapsed, it admits no new "
                        "messages"
                    )
                if env.intent is None and self._held(kind, target) is None:
                    return UnavailableError(
                        f"node {self.routing_id!r} is not the owner of {kind} {target!r}"
                    )
        return where

    def _receive_send(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        if env.target_kind == wire.OBJECTS:
            self._receive_operation(rec, env, peer)
            return
        if env.intent is not None:
            self._receive_intent(rec, env, peer)
            return
        super()._receive_send(rec, env, peer)

    def _receive_request(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        if env.target_kind == wire.OBJECTS:
            self._receive_operation(rec, env, peer)
            return
        if env.intent is not None:
            self._receive_intent(rec, env, peer)
            return
        super()._receive_request(rec, env, peer)

    def _receive_intent(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        """A Spot message with instance intent: delivered, or activated here."""
        request = rec.kind is t.InboundKind.REQUEST
        try:
            payload = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
        except ProtocolError as exc:
            if request:
                self._release(rec)
                self._reply_error(rec.peer, rec.route_id, exc)
            else:
                self._drop_message(rec, peer, str(exc), decode=True)
            return
        meta = RemoteMetadata(env.metadata or {}, peer.routing_id, None)
        name = env.intent or None
        if not request:
            # Its credit goes back once it was admitted here (or refused), as for a send.
            sent = self.activate(env.target, name, payload, meta, None, None, None)
            sent._add_inline(lambda done: self._sent(rec, peer, meta, done))
            return
        self._release(rec)
        if not env.deadline > 0:
            self._reply_error(rec.peer, rec.route_id, UnavailableError("late"))
            return
        done = self.activate(env.target, name, payload, meta, None, env.deadline, None)
        route = rec.route_id
        done._add_inline(lambda c: self._answer(rec.peer, route, c))

    def _receive_operation(self, rec: t.Inbound, env: Envelope, peer: Peer) -> None:
        request = rec.kind is t.InboundKind.REQUEST
        route = rec.route_id
        self._release(rec)
        try:
            op = self.codec.decode_payload(
                env.type_name, rec.frames[1] if len(rec.frames) > 1 else b""
            )
            if self.authority is None:
                raise NotFoundError(f"node {self.routing_id!r} has no Location Store")
        except ZlinkError as exc:
            if request:
                self._reply_error(rec.peer, route, exc)
            else:
                self._drop_message(rec, peer, str(exc), decode=isinstance(exc, ProtocolError))
            return
        if isinstance(op, PublishOp):
            self._receive_publish(op, env)
            return
        if not request:
            self._drop_message(rec, peer, f"a one-way {type(op).__name__}", decode=True)
            return
        deadline = env.deadline if env.deadline > 0 else 1e-3
        due = self.runtime.timers._now() + deadline
        work: Coroutine[Any, Any, object]
        if isinstance(op, CreateOp) and op.kind in _KIND_OF:
            kind = _KIND_OF[op.kind]
            info = self.runtime.engine.types.get(op.object_type)
            if info is not None and info.kind is not kind:
                info = None
            try:
                request_value = self._decode_plain(op.request_type, op.request)
            except ProtocolError as exc:
                self._reply_error(rec.peer, route, exc)
                return
            spec = _Spec(kind, op.object_id, op.object_type, op.exclusive, op.fresh)
            work = self._served_create(spec, info, request_value, due)
        elif isinstance(op, CloseOp) and op.kind in _KIND_OF:
            work = self._close(_KIND_OF[op.kind], op.object_id, due, True)
        else:
            self._reply_error(rec.peer, route, ProtocolError(f"an unknown operation {op!r}"))
            return
        done = self._spawn(work)
        done.add_done_callback(lambda f: self._answer_future(rec.peer, route, f))

    async def _served_create(
        self, spec: _Spec, info: TypeInfo | None, request: object, due: float
    ) -> object:
        result = await self._create(spec, info, request, due, True)
        if isinstance(result, Created | Existing):
            ref = result.ref
            generation = ref.generation
            rid = ref.routing_id or self.routing_id
            outcome = "created" if isinstance(result, Created) else "existing"
            value = result.reply if isinstance(result, Created) else None
        else:
            assert isinstance(result, Rejected)
            generation, rid, outcome, value = 0, "", "rejected", result.reply
        name, data = self.codec.encode_payload(value)
        return CreateReply(outcome, rid, generation, name, data)

    def _receive_publish(self, op: PublishOp, env: Envelope) -> None:
        try:
            payload = self._decode_plain(op.payload_type, op.payload)
        except ProtocolError as exc:
            with self._lock:
                self.decode_errors += 1
            log.warning("mesh %s: a bad publish: %s", self.routing_id, exc)
            return
        if self.runtime.fenced:
            return
        call = PublishCall(self.runtime, op.channel, op.topic, payload, here=True)
        call._metadata = env.metadata
        with contextlib.suppress(ZlinkError):
            call.submit()

    def _answer_future(self, conn: bytes, route: int, done: Future[object]) -> None:
        found = _outcome(done)
        if isinstance(found, BaseException):
            self._reply_error(conn, route, found)
            return
        self._reply_value(conn, route, found)

    def _answer(self, conn: bytes, route: int, done: Completion[Any]) -> None:
        exc = done._cell._exc
        if exc is not None:
            self._reply_error(conn, route, exc)
        else:
            self._reply_value(conn, route, done._cell._value)

    def _reply_value(self, conn: bytes, route: int, value: object) -> None:
        try:
            name, data = self.codec.encode_payload(value)
        except ProtocolError as exc:
            self._reply_error(conn, route, exc)
            return
        self._reply_frames(conn, route, [wire.encode_fields(wire.REPLY, type_name=name), data])

    # -- plumbing --------------------------------------------------------------------------

    def _decode_plain(self, name: str, data: bytes) -> object:
        if name and name not in self.codec.registry:
            name = ""  # a type this node does not know: plain values
        return self.codec.decode_payload(name, data)

    async def _ask(self, peer: Peer, op: object, reply: type | None, due: float) -> object:
        """One of our own requests to `peer`, within what is left of `due`."""
        left = due - self.runtime.timers._now()
        if left <= 0:
            raise asyncio.CancelledError
        return await _wait(
            self._request(_Route(peer, None, ""), op, None, reply, left, None, None, None)
        )

    def _spawn(self, work: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self.runtime.io.loop)

    def _call(
        self,
        work: Callable[[float, CancellationToken | None], Awaitable[object]],
        timeout: float,
        cancel: CancellationToken | None,
    ) -> Completion[Any]:
        """A call whose work runs on the I/O loop, under one pending entry: its deadline
        and its caller's cancellation race with the work's result."""
        runtime = self.runtime
        cell: _Cell[Any] = _Cell()
        entry = runtime.begin(cell, timeout, cancel)
        handle = runtime.handle(entry)
        route_id = entry.route_id
        if route_id is None:
            return handle
        due = runtime.timers._now() + timeout

        async def run() -> object:
            return await work(due, cancel)

        try:
            running = self._spawn(run())
        except RuntimeError:  # the loop has stopped
            runtime.pending.finish(route_id, exc=shutting_down())
            return handle

        def finished(done: Future[object]) -> None:
            found = _outcome(done)
            if isinstance(found, BaseException):
                runtime.pending.finish(route_id, exc=found)
            else:
                runtime.pending.finish(route_id, found)

        running.add_done_callback(finished)
        return handle


def _outcome(done: Future[Any]) -> object:
    """A finished future's value, or the typed error that ends the call."""
    if done.cancelled():
        return shutting_down("the call finished")
    exc = done.exception()
    if exc is None:
        return done.result()
    return _failure(exc)


def _failure(found: object) -> BaseException | None:
    if found is None or not isinstance(found, BaseException):
        return None
    if isinstance(found, ZlinkError):
        return found
    if isinstance(found, asyncio.CancelledError):
        return DeadlineExceededError("no result within the call's deadline")
    return internal_failure("the global objects", found)


def _wait(completion: Completion[T]) -> asyncio.Future[T]:
    """An asyncio future on the running loop that settles with `completion`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(done: Completion[T]) -> None:
        if future.done():
            return
        exc = done._cell._exc
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(done._cell._value)  # type: ignore[arg-type]

    def done(result: Completion[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop stopped: nobody waits
            loop.call_soon_threadsafe(settle, result)

    completion._add_inline(done)
    return future


async def _quietly(work: Awaitable[object]) -> None:
    """A clean-up write: its failure is logged, never the call's error."""
    try:
        await work
    except Exception as exc:
        log.warning("mesh: a clean-up write failed: %s", exc)


def _ref(record: AuthorityRecord) -> SpotRef | ActorRef:
    if record.kind is AuthorityKind.SPOT:
        return SpotRef(record.object_id, record.generation, record.owner.node)
    return ActorRef(record.object_id, record.generation, record.owner.node)


def _mismatch(kind: ObjectKind, obj_id: str, actual: str, wanted: str) -> TypeMismatchError:
    return TypeMismatchError(f"{kind} {obj_id!r} is a {actual}, not a {wanted}")


def _existing(
    act: Activation, kind: ObjectKind, obj_id: str, type_name: str, exclusive: bool
) -> Existing:
    if exclusive:
        raise AlreadyExistsError(f"{kind} {obj_id!r} already exists")
    if act.type.name != type_name:
        raise _mismatch(kind, obj_id, act.type.name, type_name)
    if act.closing is not None:
        raise UnavailableError(f"{kind} {obj_id!r} is closing")
    return Existing(act.ref())
