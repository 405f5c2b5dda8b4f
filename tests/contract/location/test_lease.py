"""Owner lease mechanics (digest §6 "Lease and fencing"): timing validation, the
admission deadline from the store's answer plus local monotonic time (an injected
clock), renewal, loss, release and new generations per host run."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from zlink_actors import (
    AlreadyExistsError,
    ConfigurationError,
    DeadlineExceededError,
    InvalidOperationError,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.location import (
    Committed,
    Found,
    LeaseConfig,
    MemoryLocationStore,
    OwnerLease,
    Put,
    RedisLocationStore,
    admission_deadline,
)
from zlink_actors.location.keys import lease_key

from ._redis_server import RedisServer
from .conftest import StoreFactory


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_lease_defaults_are_the_digest_figures() -> None:
    config = LeaseConfig()
    assert (config.renew_interval, config.ttl, config.renew_timeout, config.fencing_margin) == (
        5.0,
        15.0,
        3.0,
        5.0,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"renew_interval": 7.0},  # 7 + 3 >= 15 - 5 (equal: refused)
        {"renew_timeout": 6.0},
        {"ttl": 12.0},
        {"fencing_margin": 8.0},
        {"renew_interval": 0},
        {"ttl": -1},
        {"renew_timeout": math.inf},
        {"fencing_margin": math.nan},
        {"ttl": True},
        {"renew_interval": "5"},
    ],
)
def test_bad_lease_timing_is_configuration_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        LeaseConfig(**kwargs)


def test_lease_timing_just_inside_the_rule_is_accepted() -> None:
    config = LeaseConfig(renew_interval=6.9, renew_timeout=3.0, ttl=15.0, fencing_margin=5.0)
    assert config.renew_interval == 6.9


def test_admission_deadline_is_local_send_time_plus_remaining_store_time_minus_margin() -> None:
    assert admission_deadline(100.0, 1e9, 1e9 + 15.0, 5.0) == 110.0
    assert admission_deadline(100.0, 1e9 + 4.0, 1e9 + 15.0, 5.0) == 106.0


def test_admission_deadline_follows_the_injected_clocks() -> None:
    """The store's clock and the local monotonic clock are unrelated; the deadline is
    measured from the local instant the write was sent."""
    store_clock = Clock(1_700_000_000.0)
    mono = Clock(100.0)
    store = MemoryLocationStore(clock=store_clock)
    lease = OwnerLease(store, "node-1", monotonic=mono)

    async def go() -> None:
        assert not lease.admitting()
        grant = await lease.acquire()
        assert grant.generation == 1
        assert grant.admission_deadline == 110.0
        mono.now, store_clock.now = 109.999, store_clock.now + 9.999
        assert lease.admitting()
        assert lease.remaining() == pytest.approx(0.001)
        mono.now = 110.0
        assert not lease.admitting()  # at the deadline admission stops
        mono.now, store_clock.now = 105.0, 1_700_000_005.0
        renewed = await lease.renew()
        assert renewed.generation == 1
        assert renewed.admission_deadline == 115.0
        assert lease.admitting()

    try:
        run(go())
    finally:
        store.close()


def test_a_lease_expired_in_the_store_is_lost_at_renewal() -> None:
    store_clock = Clock(1_700_000_000.0)
    mono = Clock(0.0)
    store = MemoryLocationStore(clock=store_clock)
    lease = OwnerLease(store, "node-1", monotonic=mono)

    async def go() -> None:
        first = await lease.acquire()
        store_clock.now += 15.0  # the TTL passed on the store's clock
        with pytest.raises(UnavailableError, match="lost") as caught:
            await lease.renew()
        assert caught.value.reason is UnavailableReason.LEASE_LAPSED
        assert lease.grant is None
        assert not lease.admitting()
        with pytest.raises(InvalidOperationError):
            await lease.renew()
        second = await OwnerLease(store, "node-1", monotonic=mono).acquire()
        assert second.generation == first.generation + 1  # a new host run

    try:
        run(go())
    finally:
        store.close()


def test_one_live_lease_per_owner_and_release_frees_it(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        one = OwnerLease(store, "node-1")
        grant = await one.acquire()
        with pytest.raises(InvalidOperationError):
            await one.acquire()
        with pytest.raises(AlreadyExistsError):
            await OwnerLease(store, "node-1").acquire()
        other = await OwnerLease(store, "node-2").acquire()
        assert other.generation == 1
        await one.release()
        await one.release()  # nothing held: no error
        two = OwnerLease(store, "node-1")
        assert (await two.acquire()).generation == grant.generation + 1
        renewed = await two.renew()
        assert renewed.version != grant.version
        assert two.admitting()

    run(go())


def test_renewal_past_renew_timeout_is_deadline_exceeded_and_keeps_the_grant(
    own_redis: RedisServer,
) -> None:
    store = RedisLocationStore(own_redis.url, key_prefix="lease", operation_timeout=5)
    config = LeaseConfig(renew_interval=0.2, ttl=3.0, renew_timeout=0.2, fencing_margin=1.0)
    lease = OwnerLease(store, "node-1", config)

    async def go() -> None:
        grant = await lease.acquire()
        own_redis.pause()
        try:
            with pytest.raises(DeadlineExceededError):
                await lease.renew()
        finally:
            own_redis.resume()
        assert lease.grant == grant  # the old deadline still holds
        # the timed-out renewal may have landed after the resume: renewing adopts it
        renewed = await lease.renew()
        assert renewed.generation == grant.generation
        assert lease.admitting()

    try:
        run(go())
    finally:
        own_redis.resume()
        store.close()


def test_renewal_adopts_an_earlier_renewal_that_landed_unseen(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        lease = OwnerLease(store, "node-1")
        grant = await lease.acquire()
        key = lease_key("node-1")
        current = await store.read(key)
        assert isinstance(current, Found)
        # what a renewal whose reply was lost leaves behind: our value, a new version
        landed = await store.write([], [Put(key, current.value, 15.0)])
        assert isinstance(landed, Committed)
        renewed = await lease.renew()
        assert renewed.generation == grant.generation
        # another run's value is not adopted: the lease is lost
        await store.write([], [Put(key, b"\x92\xa6node-1\x63", 15.0)])
        with pytest.raises(UnavailableError, match="lost"):
            await lease.renew()

    run(go())
