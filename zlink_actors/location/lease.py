"""Owner leases (digest §6 "Lease and fencing"): one lease per host run, acquired,
renewed and released by compare-and-set in a Location Store, and the admission deadline
a host keeps to: past it, the host must stop admitting work (the global-objects tier
acts on it; this module computes it).

The admission deadline is computed from the store's answer and local monotonic time:
`sent_at + (expires_at - store_now) - fencing_margin`, where `sent_at` is the local
monotonic time read *before* the write was sent. The lease cannot expire in the store
before that instant (the store computed `expires_at` after `sent_at`), whatever the
offset between the two clocks.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from .._core.errors import (
    AlreadyExistsError,
    ConfigurationError,
    DeadlineExceededError,
    InvalidOperationError,
    ProtocolError,
    UnavailableError,
    UnavailableReason,
)
from .generations import next_generation
from .keys import lease_counter_key, lease_key
from .spi import Committed, Delete, Found, IfMissing, IfVersion, LocationStore, Put

__all__ = ["LeaseConfig", "LeaseGrant", "OwnerLease", "admission_deadline", "decode_lease"]


def _positive(name: str, value: object) -> float:
    if type(value) is bool or not isinstance(value, numbers.Real):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Owner lease timing, in seconds (digest §6 defaults).

    Raises:
        ConfigurationError: a value that is not a finite number > 0 (a bool included),
            or `renew_interval + renew_timeout >= ttl - fencing_margin` (a renewal that
            is late by its whole timeout must still land before admission stops).
    """

    renew_interval: float = 5.0
    ttl: float = 15.0
    renew_timeout: float = 3.0
    fencing_margin: float = 5.0

    def __post_init__(self) -> None:
        for name in ("renew_interval", "ttl", "renew_timeout", "fencing_margin"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        if self.renew_interval + self.renew_timeout >= self.ttl - self.fencing_margin:
            raise ConfigurationError(
                f"lease timing: renew_interval + renew_timeout ({self.renew_interval:g} + "
                f"{self.renew_timeout:g}) must be below ttl - fencing_margin "
                f"({self.ttl:g} - {self.fencing_margin:g})"
            )


def admission_deadline(
    sent_at: float, store_now: float, expires_at: float, fencing_margin: float
) -> float:
    """The local monotonic instant until which a lease holder may admit work."""
    return sent_at + (expires_at - store_now) - fencing_margin


class _LeaseValue(msgspec.Struct, array_like=True, frozen=True):
    owner: str
    generation: int


_encode = msgspec.msgpack.Encoder().encode
_decode_lease = msgspec.msgpack.Decoder(_LeaseValue).decode


def decode_lease(found: Found) -> tuple[str, int]:
    """The `(owner, lease generation)` a lease key holds."""
    try:
        value = _decode_lease(found.value)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"an undecodable lease in the location store: {exc}") from None
    return value.owner, value.generation


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """One acquired or renewed lease: `(owner, generation)` names the host run."""

    owner: str
    generation: int
    version: str
    admission_deadline: float  # local monotonic seconds


class OwnerLease:
    """The lease of one host run of `owner` (a node's routing id).

    Args:
        store: the Location Store.
        owner: the owner id.
        config: the timing (`LeaseConfig()` by default).
        monotonic: the local monotonic clock (injected in tests).

    Not thread-safe: one host run drives its lease from one task.
    """

    def __init__(
        self,
        store: LocationStore,
        owner: str,
        config: LeaseConfig | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.owner = owner
        self.config = config if config is not None else LeaseConfig()
        self._monotonic = monotonic
        self._key = lease_key(owner)
        self._counter = lease_counter_key(owner)
        self.grant: LeaseGrant | None = None
        #: The highest generation this object ever held: a later `acquire` (a node that
        #: recovers from a lost lease) takes a higher one, even from a store that lost
        #: its generation counter (a Redis restarted without persistence), so a lost
        #: run's generation is never issued again and stays fenced for good.
        self.last_generation = 0
        #: The last `acquire` found the owner's generation counter below
        #: `last_generation` (or gone): the store lost its data since (a restart without
        #: persistence), so a record missing there may have been lost with it rather
        #: than deleted.
        self.counter_lost = False

    def admitting(self) -> bool:
        """Whether the admission deadline of the current grant is still ahead."""
        grant = self.grant
        return grant is not None and self._monotonic() < grant.admission_deadline

    def remaining(self) -> float:
        """Seconds until the admission deadline (<= 0 when past it or not held)."""
        grant = self.grant
        return -math.inf if grant is None else grant.admission_deadline - self._monotonic()

    def _deadline(self, sent_at: float, done: Committed) -> float:
        return admission_deadline(
            sent_at, done.store_now, done.store_now + self.config.ttl, self.config.fencing_margin
        )

    async def acquire(self) -> LeaseGrant:
        """Start a host run: a new lease generation for `owner`, written under the TTL,
        above every generation this object held before (`last_generation`).

        Raises:
            AlreadyExistsError: a live lease of `owner` exists (another run holds it).
            InvalidOperationError: this object already holds a lease.
            GenerationExhaustedError: the owner's generations are used up.
            UnavailableError, DeadlineExceededError: as the store raises them.
        """
        if self.grant is not None:
            raise InvalidOperationError("this lease is already acquired")
        for _ in range(16):  # another run of the same owner id racing on the counter
            counter = await self.store.read(self._counter)
            if isinstance(counter, Found):
                current = int(counter.value)
                guard: IfMissing | IfVersion = IfVersion(self._counter, counter.version)
            else:
                current, guard = 0, IfMissing(self._counter)
            generation = next_generation(max(current, self.last_generation), "lease")
            sent_at = self._monotonic()
            done = await self.store.write(
                [guard, IfMissing(self._key)],
                [
                    Put(self._counter, b"%d" % generation),
                    Put(self._key, _encode(_LeaseValue(self.owner, generation)), self.config.ttl),
                ],
            )
            if isinstance(done, Committed):
                self.grant = LeaseGrant(
                    self.owner, generation, done.versions[self._key], self._deadline(sent_at, done)
                )
                self.counter_lost = current < self.last_generation
                self.last_generation = generation
                return self.grant
            live = await self.store.read(self._key)
            if isinstance(live, Found):
                raise AlreadyExistsError(f"owner {self.owner!r} already holds a live lease")
        raise UnavailableError(
            f"could not acquire the lease of {self.owner!r}: contention",
            reason=UnavailableReason.CONTENDED,
        )

    async def renew(self) -> LeaseGrant:
        """Extend the lease by one TTL, within `renew_timeout`.

        Raises:
            InvalidOperationError: no lease is held.
            UnavailableError: the lease was lost (expired or taken over): the grant is
                dropped and admission must stop; or the store failed (the grant is kept
                and its deadline still holds).
            DeadlineExceededError: the renewal took longer than `renew_timeout`.
        """
        grant = self.grant
        if grant is None:
            raise InvalidOperationError("renew() without a held lease")
        value = _encode(_LeaseValue(self.owner, grant.generation))
        version = grant.version
        for _ in range(2):
            sent_at = self._monotonic()
            try:
                async with asyncio.timeout(self.config.renew_timeout):
                    done = await self.store.write(
                        [IfVersion(self._key, version)], [Put(self._key, value, self.config.ttl)]
                    )
            except TimeoutError:
                raise DeadlineExceededError(
                    f"renewing the lease of {self.owner!r} took over "
                    f"{self.config.renew_timeout:g} s"
                ) from None
            if isinstance(done, Committed):
                self.grant = LeaseGrant(
                    self.owner,
                    grant.generation,
                    done.versions[self._key],
                    self._deadline(sent_at, done),
                )
                return self.grant
            # An earlier renewal whose outcome was unknown may have landed: the key then
            # holds this very run's value at a version we never saw. Adopt it once.
            current = await self.store.read(self._key)
            if not (
                isinstance(current, Found)
                and decode_lease(current) == (self.owner, grant.generation)
                and current.version != version
            ):
                break
            version = current.version
        self.grant = None
        raise UnavailableError(
            f"the lease of {self.owner!r} was lost (expired or replaced)",
            reason=UnavailableReason.LEASE_LAPSED,
        )

    async def release(self, *, forget: bool = False) -> None:
        """End the host run's lease (a lease already lost is no error).

        `forget`: also delete the owner's generation counter, for an owner id that is
        never used again (a mesh node's routing id is new at every start); a later run of
        the same id would start again at generation 1.
        """
        grant, self.grant = self.grant, None
        if grant is None:
            return
        mutations = [Delete(self._key), *([Delete(self._counter)] if forget else [])]
        await self.store.write([IfVersion(self._key, grant.version)], mutations)
