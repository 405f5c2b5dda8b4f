"""Global objects, second layer: what this node owns (docs/mesh.md "Create and
get-or-create", "Close", "Owner leases").

- **Owner lease**: kept by `lease.LeaseKeeper`; after a lost lease, before the node
  admits again, it claims again, by compare-and-set, the records of the objects it still
  holds that are missing or still name it (`_reclaim_all`), and closes with
  `CloseReason.OWNERSHIP_LOST` those another node claimed meanwhile.
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
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Final

from .._calls.create import close_here, create_here
from .._core.cancellation import CancellationToken
from .._core.completion import Completion
from .._core.errors import (
    AlreadyExistsError,
    InvalidOperationError,
    NotFoundError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
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
from .config import PeerState
from .loop_calls import quietly, wait
from .operations import (
    _RETRY,
    ATTEMPT_BOUND,
    ATTEMPTS,
    AUTHORITY_KIND,
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
from .shared import log

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
        """`LeaseKeeper.fence` (only with a Location Store, as every store write)."""
        keeper = self.lease_keeper
        assert keeper is not None
        return keeper.fence(what)

    def _admitting(self) -> bool:
        """`LeaseKeeper.admitting` (False without a Location Store: no lease)."""
        keeper = self.lease_keeper
        return keeper is not None and keeper.admitting()

    def take_episode(self) -> tuple[int, int]:
        """Under the node lock: (objects claimed again, objects lost) since the node was
        last fenced, and start counting again (`LeaseWork`)."""
        episode, self._episode = self._episode, (0, 0)
        return episode

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
