"""Global objects, second layer: what this node owns (docs/mesh.md "Create and
get-or-create", "Close", "Owner leases").

- **Owner lease**: acquired before the node serves, renewed from the I/O loop; past its
  admission deadline the node is fenced (`runtime.fenced`): no new message, timer tick,
  creation or Ready commit for its objects; its peers hear it at once (an UPDATE: it
  leaves placement and channel selection) and so does `Host(on_state_change=...)`.
  It recovers by itself once the store answers: the same lease if it renews in time,
  else a new one (a higher generation: the lost one never admits again); either way it
  first claims again, by compare-and-set, the records of the objects it still holds
  that are missing or still name it, and closes with `CloseReason.OWNERSHIP_LOST` those
  another node claimed meanwhile. `MeshConfig(on_lease_lost="shutdown")` shuts the
  Host down instead once the lease is found lost.
- **Create / get-or-create** reserve the id by compare-and-set before the factory runs,
  here when this node registers the type, else on a READY peer that does (placement
  weight). Callers here that arrive while the attempt runs join it (`_inflight`); callers
  elsewhere that find the record Reserved ask this node, which joins them: one factory,
  one `on_create`, one result. Ready is committed after the creation hooks finished.
- **Close** completes once the record is deleted; any removal deletes its record; a
  graceful shutdown deletes every record this node owns. A dead owner's records are taken
  over by compare-and-set once its lease expired in the store.

Threads: `_inflight` is touched on the I/O loop only; `_owned` and `_deleting` under
the node lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from .._calls.create import close_here, create_here
from .._core.cancellation import CancellationToken
from .._core.completion import Completion
from .._core.dispatcher import get_dispatcher
from .._core.errors import (
    AlreadyExistsError,
    InvalidOperationError,
    NotFoundError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
from .._core.state import HostState, ShutdownReason
from .._engine.lifecycle import close_activation
from .._engine.objects import (
    ActorRef,
    CloseReason,
    Created,
    Existing,
    ObjectKind,
    Rejected,
    SpotRef,
)
from .._engine.registry import Activation, TypeInfo
from ..location.authority import (
    AuthorityRecord,
    AuthorityState,
    OwnerFence,
)
from ..location.spi import Conflict
from . import codec as wire
from .config import PeerState, StateChange, StateChangeKind
from .loop_calls import pause, quietly, wait
from .operations import (
    _RETRY,
    ATTEMPT_BOUND,
    ATTEMPTS,
    AUTHORITY_KIND,
    RELEASE_WAIT,
    CloseOp,
    CreateOp,
    CreateReply,
    _existing,
    _Inflight,
    _mismatch,
    _ref,
    _Spec,
)
from .peers import Peer, unusable
from .routing import Routing
from .shared import POLL, log

__all__ = ["Ownership"]


@dataclass(frozen=True, slots=True)
class _Looked:
    """The authority record a create read (None: Missing)."""

    record: AuthorityRecord | None


_SPOT: Final = ObjectKind.SPOT
#: Records a recovery claims again at once (each a read and a compare-and-set).
_RECLAIM_BATCH: Final = 64


class Ownership(Routing):
    """The objects this node owns (see the module docstring)."""

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

        return self.loop_calls.call(run, timeout, cancel)

    def close_object(
        self, kind: ObjectKind, obj_id: str, timeout: float, cancel: CancellationToken | None
    ) -> Completion[bool]:
        def run(due: float, token: CancellationToken | None) -> Awaitable[object]:
            return self._close(kind, obj_id, due, False, token)

        return self.loop_calls.call(run, timeout, cancel)

    def removed(self, act: Activation) -> None:
        key = (act.kind, act.id)
        with self._lock:
            record = self._owned.get(key)
            if record is None or record.generation != act.generation:
                return
            del self._owned[key]
            # RuntimeError: the loop has stopped (shutdown deleted what it could).
            with contextlib.suppress(RuntimeError):
                self._deleting[key] = self.loop_calls.spawn(self._delete(key, record))

    def acquire_lease(self, loop: asyncio.AbstractEventLoop) -> None:
        """Acquire this run's owner lease before the node serves creations (bounded by
        `renew_timeout`; if the store does not answer, `keep_lease` goes on trying)."""
        lease = self.lease
        assert lease is not None
        self._acquiring = asyncio.run_coroutine_threadsafe(lease.acquire(), loop)
        try:
            grant = self._acquiring.result(self.config.lease.renew_timeout)
            self.runtime.fence_until(grant.admission_deadline)
        except Exception as exc:  # the store is down: keep_lease goes on trying
            log.warning("mesh %s: acquiring the owner lease: %r", self.routing_id, exc)

    def _acquiring_now(self) -> bool:
        """`acquire_lease`'s acquisition is still on its way (it timed out there)."""
        acquiring = self._acquiring
        return acquiring is not None and not acquiring.done()

    async def keep_lease(self, stop: Callable[[], bool], wake: asyncio.Event) -> None:
        """Acquire this run's owner lease, renew it, fence the node while it does not
        admit, and recover (module docstring); at the end (`stop()`, signalled by
        `wake`: at shutdown, once every object closed), wait for the deletions of the
        records of the objects that closed, delete the records still ours and release
        the lease."""
        lease = self.lease
        assert lease is not None
        config = self.config.lease
        next_renewal = time.monotonic() + config.renew_interval
        acquired = lease.grant is not None
        #: The records of the objects still held are claimed again before admitting.
        reclaim = False
        #: The store lost its data since the lease was lost (`OwnerLease.counter_lost`):
        #: a record missing there may be claimed again; otherwise it was deleted.
        wiped = False
        detail = ""
        next_purge = time.monotonic() + self.config.route_cache_max_age
        while not stop():
            now = time.monotonic()
            acquired = acquired or lease.grant is not None  # also by `acquire_lease`'s late answer
            if self._lease_check_now:
                self._lease_check_now = False
                next_renewal = now  # discovery saw the store lose its data
            try:
                if lease.grant is None and not acquired:
                    if not self._acquiring_now():
                        await lease.acquire()
                        acquired = True
                        next_renewal = time.monotonic() + config.renew_interval
                elif lease.grant is None:
                    # Lost (expired, or gone with the store's data): its records may be
                    # taken over, and its generation never admits again.
                    if self.config.on_lease_lost == "shutdown":
                        self._shut_down_for_lost_lease(detail)
                        next_renewal = time.monotonic() + POLL  # until the shutdown stops it
                    else:
                        await lease.acquire()  # a new generation, above the lost one
                        reclaim = True
                        wiped = lease.counter_lost
                        next_renewal = time.monotonic() + config.renew_interval
                elif now >= next_renewal:
                    await lease.renew()
                    next_renewal = time.monotonic() + config.renew_interval
                if reclaim and lease.admitting():
                    await self._reclaim_all(wiped)
                    wiped = False
                    reclaim = False
            except Exception as exc:  # the store is down, or the lease was lost
                detail = f"{type(exc).__name__}: {exc}"
                log.warning("mesh %s: owner lease: %s", self.routing_id, detail)
                next_renewal = time.monotonic() + min(config.renew_interval, 0.5)
            if now >= next_purge:
                self._purge_routes(now)
                next_purge = now + self.config.route_cache_max_age
            grant = lease.grant
            admit = not (reclaim or self._lease_lost_shutdown)
            self.runtime.fence_until(
                grant.admission_deadline if grant is not None and admit else -math.inf
            )
            if self.runtime.fenced:
                if self.shared.lease_state == "admitting":
                    reclaim = True  # whatever the store kept, checked before admitting
                    self._lease_changed("fenced", StateChangeKind.FENCED, detail or "lapsed")
            elif self.shared.lease_state != "admitting":
                recovered = self.shared.lease_state == "fenced"
                self._lease_changed(
                    "admitting", StateChangeKind.RECOVERED if recovered else None, ""
                )
            if self._fence_held is not None and not self.runtime.fenced:
                self._deliver_held()  # the one-ways that arrived while it was fenced
            due = next_renewal
            if lease.grant is not None and lease.remaining() > 0:
                due = min(due, time.monotonic() + lease.remaining())
            await pause(max(0.01, min(due - time.monotonic(), POLL)), wake)
            if not stop():
                wake.clear()  # set by `check_lease_now` (the stop sets it once more)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.release_all(), RELEASE_WAIT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(lease.release(forget=True), RELEASE_WAIT)
        with self._lock:
            self.shared.set_lease_state("released")

    def check_lease_now(self) -> None:
        """On the I/O loop: the keeper renews (or finds lost) the lease at once instead
        of at its next renewal (discovery saw the store lose its data)."""
        self._lease_check_now = True
        self._lease_stopping.set()  # only wakes the keeper: it ends on `_lease_stop`

    def lease_admitting(self) -> bool:
        """Whether this node's owner lease admits work now (False without `location=`,
        before the lease is acquired, while fenced and while recovering): what
        readiness waits for."""
        return self.lease is not None and not self.runtime.fenced

    def _lease_changed(self, state: str, kind: StateChangeKind | None, detail: str) -> None:
        """The keeper's decision changed: peers hear it at once (an UPDATE: placement
        and channel selection leave or take this node back), and so does the Host's
        `on_state_change`."""
        with self._lock:
            self.shared.set_lease_state(state)
            episode, self._episode = self._episode, (0, 0)
            if kind is StateChangeKind.RECOVERED:
                self.lease_recoveries += 1
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
        if kind is StateChangeKind.FENCED:
            log.warning("mesh %s: owner lease fenced: %s", self.routing_id, detail)
        elif kind is StateChangeKind.RECOVERED:
            log.warning(
                "mesh %s: owner lease admitting again (generation %d): %d objects claimed "
                "again, %d lost to other nodes",
                self.routing_id,
                self._lease_generation(),
                *episode,
            )
        if self.shared.info is not None and kind is not None:
            update = self._hello_bytes()
            for peer in peers:  # a notice: it must not wait behind credit or a PAUSED peer
                self._notify_quietly(peer.conn, wire.encode_fields(wire.UPDATE), update)
        if kind is not None:
            reclaimed, lost = episode if kind is StateChangeKind.RECOVERED else (0, 0)
            generation = self._lease_generation()
            self._tell(StateChange(kind, self.routing_id, generation, detail, reclaimed, lost))

    def _lease_generation(self) -> int:
        grant = None if self.lease is None else self.lease.grant
        return 0 if grant is None else grant.generation

    def _tell(self, change: StateChange) -> None:
        """Hand `change` to `Host(on_state_change=...)` on the completion dispatcher (in
        order; what the callback raises is logged there)."""
        callback = self.on_state_change
        if callback is not None:
            get_dispatcher().post(callback, change, None)

    def _shut_down_for_lost_lease(self, detail: str) -> None:
        """`on_lease_lost="shutdown"`: the Host shuts itself down (once), its result
        saying why, for a supervisor to restart it."""
        if self._lease_lost_shutdown:
            return
        self._lease_lost_shutdown = True
        if self.runtime.state is HostState.SERVING:
            self.runtime.shutdown_reason = ShutdownReason.LEASE_LOST
        log.error(
            "mesh %s: the owner lease was lost (%s): the Host shuts down (on_lease_lost="
            "'shutdown')",
            self.routing_id,
            detail or "expired or gone from the store",
        )
        self._tell(StateChange(StateChangeKind.LEASE_LOST, self.routing_id, 0, detail))
        shut = self.shut_host_down
        if shut is not None:
            threading.Thread(
                target=shut, name=f"zlink-lease-lost-{self.routing_id}", daemon=True
            ).start()

    async def _reclaim_all(self, wiped: bool) -> None:
        """Claim again, for the lease held now, every object this node still holds whose
        record still names it, or is missing because the store lost its data (`wiped`);
        close the others (`_ownership_lost`): a record missing from a store that kept
        its data was deleted (another node took the object over and closed it). Raises
        on a store failure: the keeper tries the whole pass again (what was claimed
        already is found claimed)."""
        lease = self.lease
        assert lease is not None
        assert lease.grant is not None
        fence = OwnerFence(self.routing_id, lease.grant.generation)
        with self._lock:
            owned = list(self._owned.items())
        for start in range(0, len(owned), _RECLAIM_BATCH):  # a few store round trips each
            batch = owned[start : start + _RECLAIM_BATCH]
            await asyncio.gather(
                *(self._reclaim_one(key, held, fence, wiped) for key, held in batch)
            )

    async def _reclaim_one(
        self, key: tuple[ObjectKind, str], held: AuthorityRecord, fence: OwnerFence, wiped: bool
    ) -> None:
        authority = self.authority
        assert authority is not None
        kind, obj_id = key
        for _ in range(ATTEMPTS):
            found = await authority.read(AUTHORITY_KIND[kind], obj_id)
            if (
                found is not None
                and found.owner == fence
                and found.generation == held.generation
                and found.state is AuthorityState.READY
            ):
                new = found  # claimed by an earlier pass
            elif (found is None and wiped) or (
                found is not None
                and found.owner.node == self.routing_id
                and found.generation == held.generation
            ):
                claimed = await authority.reclaim(held, found, fence)
                if isinstance(claimed, Conflict):
                    continue  # it changed since it was read: read again
                new = claimed
            else:
                self._ownership_lost(key, held, found)
                return
            with self._lock:
                kept = self._owned.get(key) is held
                if kept:
                    self._owned[key] = new
                    if new is not found:
                        self.objects_reclaimed += 1
                        self._episode = (self._episode[0] + 1, self._episode[1])
            if not kept:  # closed meanwhile: its removal found the old record
                await quietly(authority.delete(new))
            return
        raise UnavailableError(
            f"{kind} {obj_id!r}: the record kept changing while it was claimed again",
            reason=UnavailableReason.CONTENDED,
        )

    def _ownership_lost(
        self, key: tuple[ObjectKind, str], held: AuthorityRecord, found: AuthorityRecord | None
    ) -> None:
        """Another node claimed `key` while this node's lease was lost (its record names
        that node, or was deleted there: `found` None): the object closes here
        (`on_closing` with `OWNERSHIP_LOST`) and never serves here again; the other
        node's record is left alone."""
        with self._lock:
            if self._owned.get(key) is not held:
                return
            del self._owned[key]  # its removal must not delete the other node's record
            self.ownership_lost += 1
            self._episode = (self._episode[0], self._episode[1] + 1)
        self._routes.pop(key, None)
        log.warning(
            "mesh %s: %s %r was claimed by %s while this node's lease was lost: it closes here",
            self.routing_id,
            key[0],
            key[1],
            "another node (and closed there)" if found is None else repr(found.owner.node),
        )
        act = self._held(*key)
        if act is not None and act.generation == held.generation:
            close_activation(self.runtime, act, CloseReason.OWNERSHIP_LOST)

    async def _create(
        self, spec: _Spec, info: TypeInfo | None, request: object, due: float, forwarded: bool
    ) -> object:
        """Create or get-or-create `spec` in the mesh (`forwarded`: another node placed
        it here, or asks us because we hold its reservation)."""
        authority = self.authority
        assert authority is not None
        kind, obj_id, type_name = spec.kind, spec.obj_id, spec.type_name
        key = (kind, obj_id)
        # `spots.create`'s id was made for this call: no other caller can know it, so the
        # first round skips straight to placement (the reservation still checks it).
        unseen = spec.fresh
        for _ in range(ATTEMPTS):
            if unseen:
                unseen = False
                record = None
            else:
                found = await self._look(spec, key)
                if not isinstance(found, _Looked):
                    if found is _RETRY:
                        continue
                    return found
                record = found.record
            if record is not None:
                if record.type_name != type_name:
                    raise _mismatch(kind, obj_id, record.type_name, type_name)
                owner = record.owner.node
                if owner == self.routing_id:
                    if key in self._inflight:
                        continue  # our own attempt started meanwhile: join it
                    await self._own_leftover(key, record)
                    continue
                if record.state is AuthorityState.READY:
                    if spec.exclusive:
                        raise AlreadyExistsError(f"{kind} {obj_id!r} already exists")
                    if not await self._owner_alive(record.owner):
                        raise UnavailableError(
                            f"the owner {owner!r} of {kind} {obj_id!r} is gone; "
                            f"close({obj_id!r}) removes its record once its lease expired",
                            reason=self._gone(record.owner),
                        )
                    return Existing(_ref(record))
                if not await self._lease_live(record.owner):
                    await authority.take_over_stale(record)  # a dead creator's reservation
                    continue
                if spec.exclusive:
                    raise AlreadyExistsError(f"{kind} {obj_id!r} is being created")
                # The creator joins us to its attempt: one result for every caller (also
                # when another node placed the call here meanwhile: the record names one
                # creator, so this goes one hop further at most).
                creator = await self._connected_peer(
                    owner,
                    self.loop_calls.left(due),
                    f"the node {owner!r} creating {kind} {obj_id!r}",
                )
                return await self._forward_create(creator, spec, request, due)
            here = info is not None and (forwarded or self.config.placement_weight > 0)
            if info is not None and here and (forwarded or self._admitting()):
                result = await self._attempt(spec, info, request)
                if result is _RETRY:
                    continue
                return result
            if forwarded:
                raise NotFoundError(f"node {self.routing_id!r} does not register {type_name}")
            # Placed elsewhere: never on a node whose lease does not admit (this one
            # included: it creates here only while it admits, or when no other can).
            placed = self._place(kind, type_name, here)
            if placed is None:
                assert info is not None
                result = await self._attempt(spec, info, request)  # refused: FENCED
                if result is _RETRY:
                    continue
                return result
            return await self._forward_create(placed, spec, request, due)
        raise UnavailableError(
            f"{kind} {obj_id!r}: the record kept changing; try again",
            reason=UnavailableReason.CONTENDED,
        )

    async def _own_leftover(self, key: tuple[ObjectKind, str], record: AuthorityRecord) -> None:
        """A record naming this node that no attempt here is making: its object is
        closing (wait for its deletion), or it is a leftover (delete it); then read
        again."""
        with self._lock:
            deleting = self._deleting.get(key)
            owned = key in self._owned
        if deleting is not None:
            await asyncio.wrap_future(deleting)
            return
        held = self._held(*key)
        if owned or (held is not None and held.generation == record.generation):
            raise UnavailableError(
                f"{key[0]} {key[1]!r} is closing", reason=UnavailableReason.CLOSED
            )
        assert self.authority is not None
        if record.state is AuthorityState.RESERVED:
            await quietly(self.authority.abort(record))
        else:
            await quietly(self.authority.delete(record))

    async def _look(self, spec: _Spec, key: tuple[ObjectKind, str]) -> object:
        """What a create finds before it decides: an attempt here to join (its result,
        or `_RETRY`), an object of ours (`Existing`), or the record (`_Looked`)."""
        kind, obj_id, type_name = spec.kind, spec.obj_id, spec.type_name
        joined = self._inflight.get(key)
        if joined is not None:
            if spec.exclusive:
                raise AlreadyExistsError(f"{kind} {obj_id!r} is being created")
            if joined.type_name != type_name:
                raise _mismatch(kind, obj_id, joined.type_name, type_name)
            return await asyncio.shield(joined.done)
        held = self._held(kind, obj_id)
        if held is not None and key in self._owned:
            if self.runtime.fenced:
                raise UnavailableError(
                    f"{kind} {obj_id!r}: this node's owner lease lapsed",
                    reason=UnavailableReason.FENCED,
                )
            return _existing(held, kind, obj_id, type_name, spec.exclusive)
        assert self.authority is not None
        return _Looked(await self.authority.read(AUTHORITY_KIND[kind], obj_id))

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
                AUTHORITY_KIND[kind], obj_id, spec.type_name, fence, fresh=spec.fresh
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
            # Off the I/O loop: the factory is user code (it may be slow, or block).
            made = await asyncio.to_thread(
                create_here,
                self.runtime,
                kind,
                obj_id,
                info,
                request,
                ATTEMPT_BOUND,
                reserved.generation,
            )
            result = await wait(made)
        except BaseException:
            await quietly(authority.abort(reserved))
            raise
        if not isinstance(result, Created):
            await quietly(authority.abort(reserved))
            return result  # Rejected: the id stays free
        return await self._commit(reserved, kind, obj_id, result)

    async def _commit(
        self, reserved: AuthorityRecord, kind: ObjectKind, obj_id: str, result: object
    ) -> object:
        authority = self.authority
        assert authority is not None
        committed: AuthorityRecord | Conflict | None = None
        try:
            if self._admitting():
                committed = await authority.commit(reserved)
        except BaseException:
            # The store failed (or the outcome is unknown): the object may not serve.
            close_here(self.runtime, kind, obj_id, ATTEMPT_BOUND, None)
            await quietly(authority.abort(reserved))
            raise
        if not isinstance(committed, AuthorityRecord):
            # The lease lapsed, or the reservation was taken over: the object may not
            # serve; it closes here and the call fails.
            close_here(self.runtime, kind, obj_id, ATTEMPT_BOUND, None)
            if committed is None:
                await quietly(authority.abort(reserved))
            raise UnavailableError(
                f"{kind} {obj_id!r} could not be committed Ready: this node's owner lease "
                "lapsed or its reservation was taken over",
                reason=UnavailableReason.FENCED,
            )
        with self._lock:
            held = self._held(kind, obj_id)
            kept = held is not None and held.generation == reserved.generation
            if kept:
                self._owned[(kind, obj_id)] = committed
        if not kept:
            # It was removed while the commit was on its way (closed, or its
            # `on_initialize` failed): `removed()` found nothing to delete; delete here.
            await quietly(authority.delete(committed))
        return result

    def _place(self, kind: ObjectKind, type_name: str, here: bool) -> Peer | None:
        """A READY peer with an admitting lease to create `type_name` on; None when this
        node may still try (`here`: it registers the type; it is then refused with
        `FENCED`). Raises when no node can take it."""
        with self._lock:
            placed = self._peers.place(type_name)
            fenced = self._peers.fenced_servers(type_name)
        if placed is not None or here:
            return placed
        if fenced:
            raise UnavailableError(
                f"every node of mesh {self.config.name!r} that registers {kind} type "
                f"{type_name} is fenced (its owner lease does not admit): try again once "
                "one recovers",
                reason=UnavailableReason.FENCED,
            )
        raise NotFoundError(
            f"no READY node of mesh {self.config.name!r} registers {kind} type "
            f"{type_name} with a placement weight above 0"
        )

    def _fence(self, what: str) -> OwnerFence:
        lease = self.lease
        grant = None if lease is None else lease.grant
        if grant is None or not self._admitting():
            raise UnavailableError(
                f"{what}: this node holds no admitting owner lease",
                reason=UnavailableReason.FENCED,
            )
        return OwnerFence(self.routing_id, grant.generation)

    def _admitting(self) -> bool:
        """The lease admits, and the keeper let admission resume (not while a recovery
        still claims the records of the objects held here)."""
        return self.lease is not None and self.lease.admitting() and not self.runtime.fenced

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
            if answer.lease_generation and answer.routing_id == peer.routing_id:
                # The node that created it owns it: the first call needs no store read.
                self._remember(
                    kind,
                    obj_id,
                    peer.routing_id,
                    answer.generation,
                    answer.owner_generation,
                    answer.lease_generation,
                )
            return Created(ref, reply)
        if answer.outcome == "existing":
            return Existing(ref)
        return Rejected(reply)

    async def _close(
        self,
        kind: ObjectKind,
        obj_id: str,
        due: float,
        forwarded: bool,
        token: CancellationToken | None = None,
    ) -> object:
        authority = self.authority
        assert authority is not None
        key = (kind, obj_id)
        self._routes.pop(key, None)  # whatever happens, the next call resolves again
        for _ in range(ATTEMPTS):
            if self._held(kind, obj_id) is not None:
                left = max(due - self.runtime.timers._now(), 1e-3)
                closed = await wait(close_here(self.runtime, kind, obj_id, left, token))
                if closed:
                    await self._record_gone(key)
                return closed
            if forwarded:
                if key in self._inflight or key in self.runtime.engine.creating:
                    raise NotFoundError(f"no {kind} {obj_id!r} to close (it is being created)")
                raise UnavailableError(
                    f"node {self.routing_id!r} does not hold {kind} {obj_id!r}",
                    reason=UnavailableReason.NOT_OWNER,
                )
            record = await authority.read(AUTHORITY_KIND[kind], obj_id)
            if record is None:
                raise NotFoundError(f"no {kind} {obj_id!r} to close")
            owner = record.owner.node
            if owner == self.routing_id:
                if record.state is AuthorityState.RESERVED:
                    raise NotFoundError(f"no {kind} {obj_id!r} to close (it is being created)")
                await self._record_gone(key)
                continue
            if await self._lease_bound(record.owner) is None:
                # Past what we know of its lease: if it expired in the store, take the
                # record over, even from an owner still connected (cut off from the store,
                # fenced: it serves the object no more).
                try:
                    taken = await authority.take_over_stale(record)
                except InvalidOperationError:  # still live, within its fencing margin
                    taken = None
                if isinstance(taken, Conflict):
                    continue  # it changed meanwhile: read again
                if taken is not None:
                    self._routes.pop(key, None)
                    return True
            if record.state is AuthorityState.RESERVED:
                raise NotFoundError(f"no {kind} {obj_id!r} to close (it is being created)")
            peer = self._peers.by_rid.get(owner)
            if peer is not None and peer.state is PeerState.READY:
                answer = await self._ask(peer, CloseOp(kind.value, obj_id), None, due, token)
                return bool(answer)
            raise UnavailableError(
                f"the owner {owner!r} of {kind} {obj_id!r} is unreachable and its lease has "
                "not expired",
                reason=unusable(peer),
            )
        raise UnavailableError(
            f"{kind} {obj_id!r}: the record kept changing; try again",
            reason=UnavailableReason.CONTENDED,
        )

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
            found = await self.authority.read(AUTHORITY_KIND[key[0]], key[1])
            if found is not None and found.owner.node == self.routing_id:
                await quietly(self.authority.delete(found))

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
        """Graceful shutdown: wait for the deletions under way, and delete the record of
        every object this node still owns."""
        with self._lock:
            owned = list(self._owned.items())
            self._owned.clear()
            deleting = list(self._deleting.values())
        await asyncio.gather(
            *(self._delete(key, rec) for key, rec in owned),
            *(asyncio.wrap_future(done) for done in deleting),
            return_exceptions=True,
        )

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
        grant = None if self.lease is None else self.lease.grant
        if outcome == "created" and rid == self.routing_id and grant is not None:
            owned = self._owned.get((spec.kind, spec.obj_id))
            if owned is not None:
                return CreateReply(
                    outcome, rid, generation, name, data, owned.owner_generation, grant.generation
                )
        return CreateReply(outcome, rid, generation, name, data)
