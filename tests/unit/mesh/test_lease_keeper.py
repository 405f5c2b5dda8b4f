"""`mesh/lease.py`: a node's owner lease and its keeper, driven through `LeaseKeeper`'s
public methods on a real `MemoryLocationStore` and a real Host's runtime and I/O loop,
with short lease timings; the rest of the node (`LeaseWork`) is a recorder."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from _pair import node_shared

from zlink_actors import (
    LeaseConfig,
    MemoryLocationStore,
    MeshConfig,
    NodeInfo,
    StateChange,
    StateChangeKind,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.location.keys import lease_key
from zlink_actors.location.spi import Delete, Found
from zlink_actors.mesh.lease import LeaseKeeper
from zlink_actors.mesh.shared import NodeShared
from zlink_actors.testing import WAIT, HostHarness, wait_until

#: Renewed every 0.2 s, admitting until 1.5 s after each renewal.
_FAST = LeaseConfig(renew_interval=0.2, ttl=2.0, renew_timeout=0.5, fencing_margin=0.5)


class _Work:
    """What the keeper has the node do, recorded in one list with the state changes the
    Host hears, in the order they happen."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.changes: list[StateChange] = []
        self.changed = threading.Condition()
        #: What `take_episode` returns next: (claimed again, lost); `reclaim_all` counts
        #: (2, 1), as a recovery that claimed two objects again and lost one.
        self.episode = (0, 0)

    def _add(self, what: str) -> None:
        with self.changed:
            self.log.append(what)
            self.changed.notify_all()

    async def reclaim_all(self, wiped: bool) -> None:
        self.episode = (2, 1)
        self._add(f"reclaim_all wiped={wiped}")

    async def release_all(self) -> None:
        self._add("release_all")

    def take_episode(self) -> tuple[int, int]:
        episode, self.episode = self.episode, (0, 0)
        return episode

    def tell_update(self) -> None:
        self._add("tell_update")

    def admitting_again(self) -> None:
        pass  # every pass that admits: not recorded

    def purge(self, now: float) -> None:
        pass

    def told(self, change: StateChange) -> None:
        """`on_state_change` (on the completion dispatcher: after the keeper's step)."""
        with self.changed:
            self.changes.append(change)
            self.changed.notify_all()

    def wait_for(self, *kinds: StateChangeKind) -> list[StateChange]:
        """The state changes the Host heard, once they are `kinds` (waited for)."""
        with self.changed:
            assert self.changed.wait_for(
                lambda: [c.kind for c in self.changes] == list(kinds), WAIT
            ), self.changes
            return list(self.changes)


class _Lease:
    def __init__(self, keeper: LeaseKeeper, shared: NodeShared, store: MemoryLocationStore):
        self.keeper = keeper
        self.shared = shared
        self.store = store

    def run(self, coro: object) -> object:
        """Run `coro` on the Host's I/O loop (the store's methods run there)."""
        loop = self.shared.runtime.io.loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result(WAIT)  # type: ignore[arg-type]

    def lose(self) -> None:
        """The lease's record is gone from the store (as when it expired there): its
        next renewal finds it lost; the keeper is asked to renew at once."""
        self.run(self.store.write([], [Delete(lease_key("a"))]))
        self.shared.runtime.io.loop.call_soon_threadsafe(self.keeper.check_now)


@contextmanager
def _keeper(
    harness: HostHarness, work: _Work, *, on_lease_lost: str = "recover"
) -> Iterator[tuple[_Lease, list[int]]]:
    """A keeper of node "a" on a new store; the Host's shutdown stops it at the end."""
    store = MemoryLocationStore()
    shared = node_shared(
        harness,
        config=MeshConfig("m", lease=_FAST, on_lease_lost=on_lease_lost),
        location=store,
    )
    shut: list[int] = []
    keeper = LeaseKeeper(shared, on_state_change=work.told, shut_host_down=lambda: shut.append(1))
    try:
        yield _Lease(keeper, shared, store), shut
    finally:
        keeper.stop(WAIT)
        store.close()


def test_the_node_is_fenced_until_its_lease_is_acquired(harness: HostHarness) -> None:
    with _keeper(harness, _Work()) as (lease, _):
        keeper, runtime = lease.keeper, lease.shared.runtime
        assert runtime.fenced
        assert not keeper.lease_admitting()
        assert not keeper.admitting()
        assert keeper.generation == 0
        with pytest.raises(UnavailableError) as refused:
            keeper.fence("creating Spot 'x'")
        assert refused.value.reason is UnavailableReason.FENCED
        keeper.acquire(runtime.io.loop)
        assert not runtime.fenced
        assert keeper.lease_admitting()
        assert keeper.admitting()
        assert keeper.generation >= 1
        fence = keeper.fence("creating Spot 'x'")
        assert (fence.node, fence.lease_generation) == ("a", keeper.generation)
        assert isinstance(lease.run(lease.store.read(lease_key("a"))), Found)


def test_a_lost_lease_fences_then_claims_again_before_it_recovers(harness: HostHarness) -> None:
    work = _Work()
    with _keeper(harness, work) as (lease, _):
        keeper, shared = lease.keeper, lease.shared
        shared.attach(None, NodeInfo("m", "a", "tcp://127.0.0.1:1"))  # peers are told
        keeper.acquire(shared.runtime.io.loop)
        keeper.start(shared.runtime.io.loop, work)
        assert wait_until(lambda: shared.lease_state == "admitting")
        first = keeper.generation
        assert work.log == []  # acquired: admitting, no change to tell
        lease.lose()
        fenced, recovered = work.wait_for(StateChangeKind.FENCED, StateChangeKind.RECOVERED)
        # Fenced (peers told), the records claimed again, then admitting (peers told).
        assert work.log == ["tell_update", "reclaim_all wiped=False", "tell_update"]
        # Found lost: no lease is held as it is fenced; the recovery holds a new one.
        assert (fenced.lease_generation, recovered.lease_generation) == (0, keeper.generation)
        assert keeper.generation > first  # a new lease: the lost one never admits again
        assert (recovered.reclaimed_objects, recovered.lost_objects) == (
            2,
            1,
        )  # counted by the reclaim
        assert keeper.recoveries == 1
        assert shared.lease_state == "admitting"
        assert keeper.lease_admitting()


def test_on_lease_lost_shutdown_shuts_the_host_down_once(harness: HostHarness) -> None:
    work = _Work()
    with _keeper(harness, work, on_lease_lost="shutdown") as (lease, shut):
        keeper, shared = lease.keeper, lease.shared
        keeper.acquire(shared.runtime.io.loop)
        keeper.start(shared.runtime.io.loop, work)
        assert wait_until(lambda: shared.lease_state == "admitting")
        lease.lose()
        work.wait_for(StateChangeKind.FENCED, StateChangeKind.LEASE_LOST)
        assert wait_until(lambda: shut == [1])
        # It stays fenced: the Host shuts down; the keeper never acquires again.
        assert wait_until(lambda: shared.lease_state == "fenced")
        assert not keeper.lease_admitting()
        assert shut == [1]
        assert "reclaim_all wiped=False" not in work.log


def test_stop_deletes_the_records_and_releases_the_lease(harness: HostHarness) -> None:
    work = _Work()
    with _keeper(harness, work) as (lease, _):
        keeper, shared = lease.keeper, lease.shared
        keeper.acquire(shared.runtime.io.loop)
        keeper.start(shared.runtime.io.loop, work)
        assert wait_until(lambda: shared.lease_state == "admitting")
        keeper.stop(WAIT)
        assert work.log[-1] == "release_all"
        assert shared.lease_state == "released"
        assert not isinstance(lease.run(lease.store.read(lease_key("a"))), Found)
