"""Authority records (digest §6 "Authority operations"): who owns one global Spot or
Actor, kept in a Location Store and changed only by compare-and-set against the store
version that was read.

Lifecycle: no record (Missing) -> `RESERVED` (`reserve`) -> `READY` (`commit`);
`abort` returns a Reserved record to Missing; `new_owner` moves a Ready record to another
owner and increments its owner generation; `delete` removes a Ready record. Object
generations are issued from a counter kept beside the record (it survives `delete`),
so a re-created object never reuses one. Every transition is one batch; a batch whose
condition fails returns the SPI's `Conflict` and changes nothing: read again and decide.

A record whose owner's lease has expired (no live lease of that owner and lease
generation) can be taken over: `take_over_stale` deletes it (or aborts it when Reserved)
in one batch that also checks the lease is still gone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import msgspec

from .._core.errors import InvalidOperationError, ProtocolError
from .._core.validation import check_id
from .generations import next_generation
from .keys import authority_key, generation_key, lease_key
from .lease import decode_lease
from .spi import Committed, Conflict, Delete, Found, IfMissing, IfVersion, LocationStore, Put

__all__ = ["Authority", "AuthorityKind", "AuthorityRecord", "AuthorityState", "OwnerFence"]


class AuthorityKind(enum.Enum):
    """What a record is the authority of."""

    SPOT = "spot"
    ACTOR = "actor"


class AuthorityState(enum.Enum):
    """The stored states (a missing record is the third, Missing)."""

    RESERVED = "reserved"
    READY = "ready"


@dataclass(frozen=True, slots=True)
class OwnerFence:
    """One host run: the owner node's routing id and its lease generation."""

    node: str
    lease_generation: int


@dataclass(frozen=True, slots=True)
class AuthorityRecord:
    """The authority of one object as read from (or just written to) the store."""

    kind: AuthorityKind
    object_id: str
    type_name: str
    generation: int  # the object generation, issued by `reserve`
    owner: OwnerFence
    owner_generation: int  # incremented by `new_owner`
    state: AuthorityState
    version: str  # the store version this record was read or written at


class _Stored(msgspec.Struct, array_like=True, frozen=True):
    type_name: str
    generation: int
    owner: str
    lease_generation: int
    owner_generation: int
    state: str


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(_Stored).decode


def _value(record: AuthorityRecord) -> bytes:
    return _encode(
        _Stored(
            record.type_name,
            record.generation,
            record.owner.node,
            record.owner.lease_generation,
            record.owner_generation,
            record.state.value,
        )
    )


def _parse(kind: AuthorityKind, object_id: str, found: Found) -> AuthorityRecord:
    try:
        stored = _decode(found.value)
        state = AuthorityState(stored.state)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ProtocolError(f"an undecodable authority record for {object_id!r}: {exc}") from None
    return AuthorityRecord(
        kind,
        object_id,
        stored.type_name,
        stored.generation,
        OwnerFence(stored.owner, stored.lease_generation),
        stored.owner_generation,
        state,
        found.version,
    )


def _need(record: AuthorityRecord, state: AuthorityState, operation: str) -> None:
    if record.state is not state:
        raise InvalidOperationError(
            f"{operation} needs a {state.value} record; "
            f"{record.object_id!r} is {record.state.value}"
        )


class Authority:
    """The authority operations on one Location Store (no Host needed)."""

    def __init__(self, store: LocationStore) -> None:
        self.store = store

    async def read(self, kind: AuthorityKind, object_id: str) -> AuthorityRecord | None:
        """The record of `object_id` (`None` = Missing), by exact read."""
        check_id("object_id", object_id)
        found = await self.store.read(authority_key(kind.value, object_id))
        return _parse(kind, object_id, found) if isinstance(found, Found) else None

    async def reserve(
        self,
        kind: AuthorityKind,
        object_id: str,
        type_name: str,
        owner: OwnerFence,
        *,
        fresh: bool = False,
    ) -> AuthorityRecord | Conflict:
        """Missing -> Reserved, with the next object generation for this id.

        `fresh`: the id was made unique for this object (`spots.create`'s random id), so
        it can never be created again: generation 1, and no counter is kept for it.

        Returns `Conflict` when a record exists (or another reserve won the race).

        Raises:
            GenerationExhaustedError: this id's generations are used up.
        """
        check_id("object_id", object_id)
        key = authority_key(kind.value, object_id)
        conditions: list[IfMissing | IfVersion] = [IfMissing(key)]
        mutations: list[Put] = []
        if fresh:
            generation = 1
        else:
            counter_key = generation_key(kind.value, object_id)
            counter = await self.store.read(counter_key)
            if isinstance(counter, Found):
                current = int(counter.value)
                conditions.append(IfVersion(counter_key, counter.version))
            else:
                current = 0
                conditions.append(IfMissing(counter_key))
            generation = next_generation(current, "object")
            mutations.append(Put(counter_key, b"%d" % generation))
        record = AuthorityRecord(
            kind, object_id, type_name, generation, owner, 1, AuthorityState.RESERVED, ""
        )
        done = await self.store.write(conditions, [Put(key, _value(record)), *mutations])
        if isinstance(done, Conflict):
            return done
        return replace(record, version=done.versions[key])

    async def _swap(
        self, record: AuthorityRecord, new: AuthorityRecord
    ) -> AuthorityRecord | Conflict:
        key = authority_key(record.kind.value, record.object_id)
        done = await self.store.write([IfVersion(key, record.version)], [Put(key, _value(new))])
        if isinstance(done, Conflict):
            return done
        return replace(new, version=done.versions[key])

    async def _remove(self, record: AuthorityRecord) -> Committed | Conflict:
        key = authority_key(record.kind.value, record.object_id)
        return await self.store.write([IfVersion(key, record.version)], [Delete(key)])

    async def commit(self, record: AuthorityRecord) -> AuthorityRecord | Conflict:
        """Reserved -> Ready (`InvalidOperationError` from any other state)."""
        _need(record, AuthorityState.RESERVED, "commit")
        return await self._swap(record, replace(record, state=AuthorityState.READY))

    async def abort(self, record: AuthorityRecord) -> Committed | Conflict:
        """Reserved -> Missing (`InvalidOperationError` from any other state)."""
        _need(record, AuthorityState.RESERVED, "abort")
        return await self._remove(record)

    async def new_owner(
        self, record: AuthorityRecord, owner: OwnerFence
    ) -> AuthorityRecord | Conflict:
        """Give a Ready record to `owner`, incrementing its owner generation.

        Raises:
            InvalidOperationError: the record is not Ready.
            GenerationExhaustedError: the owner generation is used up.
        """
        _need(record, AuthorityState.READY, "new_owner")
        generation = next_generation(record.owner_generation, "owner")
        return await self._swap(record, replace(record, owner=owner, owner_generation=generation))

    async def delete(self, record: AuthorityRecord) -> Committed | Conflict:
        """Ready -> Missing (a Reserved record is aborted instead)."""
        _need(record, AuthorityState.READY, "delete")
        return await self._remove(record)

    async def reclaim(
        self, held: AuthorityRecord, found: AuthorityRecord | None, owner: OwnerFence
    ) -> AuthorityRecord | Conflict:
        """A node that recovered from a lost lease claims again, for its new run `owner`,
        an object it still holds (`held`, the record it committed): by compare-and-set
        against what it just read (`found`), never blindly.

        - `found` is None (the record is Missing, as after a store that lost its data):
          written again if still Missing, Ready, with `held`'s object generation; the
          id's generation counter is written too if it is missing as well, so the
          generation is never issued again.
        - `found` names `held.owner.node` and `held`'s object generation (an older run
          of that node, or this very run): moved to `owner` if still at its version,
          Ready, its owner generation incremented.

        Returns `Conflict` when the record changed since it was read (read again).

        Raises:
            InvalidOperationError: `found` names another node or another generation of
                the object (it is not this node's to claim).
            GenerationExhaustedError: the owner generation is used up.
        """
        key = authority_key(held.kind.value, held.object_id)
        if found is None:
            counter_key = generation_key(held.kind.value, held.object_id)
            counter = await self.store.read(counter_key)
            conditions: list[IfMissing | IfVersion] = [IfMissing(key)]
            mutations = []
            if not isinstance(counter, Found):
                conditions.append(IfMissing(counter_key))
                mutations.append(Put(counter_key, b"%d" % held.generation))
            new = replace(
                held,
                owner=owner,
                owner_generation=next_generation(held.owner_generation, "owner"),
                state=AuthorityState.READY,
            )
            done = await self.store.write(conditions, [Put(key, _value(new)), *mutations])
            if isinstance(done, Conflict):
                return done
            return replace(new, version=done.versions[key])
        if found.owner.node != held.owner.node or found.generation != held.generation:
            raise InvalidOperationError(
                f"the record of {held.object_id!r} names another owner or generation"
            )
        generation = next_generation(found.owner_generation, "owner")
        return await self._swap(
            found,
            replace(found, owner=owner, owner_generation=generation, state=AuthorityState.READY),
        )

    async def owner_alive(self, owner: OwnerFence) -> bool:
        """Whether the run `owner` names still holds a live lease."""
        found = await self.store.read(lease_key(owner.node))
        return isinstance(found, Found) and decode_lease(found)[1] == owner.lease_generation

    async def take_over_stale(self, record: AuthorityRecord) -> Committed | Conflict:
        """Remove a record whose owner's lease has expired: delete a Ready record, abort
        a Reserved one, in one batch that also checks the lease did not come back.

        Raises:
            InvalidOperationError: the owner's lease is still live.
        """
        lease = lease_key(record.owner.node)
        found = await self.store.read(lease)
        if isinstance(found, Found):
            if decode_lease(found)[1] == record.owner.lease_generation:
                raise InvalidOperationError(
                    f"the owner of {record.object_id!r} still holds its lease"
                )
            lease_guard: IfMissing | IfVersion = IfVersion(lease, found.version)
        else:
            lease_guard = IfMissing(lease)
        key = authority_key(record.kind.value, record.object_id)
        return await self.store.write([IfVersion(key, record.version), lease_guard], [Delete(key)])
