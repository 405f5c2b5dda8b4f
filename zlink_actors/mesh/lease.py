"""The owner lease of a node with a Location Store (docs/mesh.md "Owner leases"): acquired
before the node serves, renewed from the I/O loop, the node fenced while it does not
admit, and recovered by itself.

`LeaseKeeper` is the only writer of the Host's admission deadline (`Runtime.fence_until`)
and of `NodeShared.lease_state`. Past the lease's admission deadline the node is fenced
(`runtime.fenced`): no new message, timer tick, creation or Ready commit for its objects;
its peers hear it at once (an UPDATE) and so does `Host(on_state_change=...)`. It recovers
once the store answers: the same lease if it renews in time, else a new one (a higher
generation); either way the records of the objects it still holds are claimed again before
it admits (`LeaseWork.reclaim_all`). `MeshConfig(on_lease_lost="shutdown")` shuts the Host
down instead once the lease is found lost.

Threads: the keeper runs on the I/O loop (`start`); `acquire` and `stop` block the calling
thread (the Host's start and shutdown) for a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from .._core.dispatcher import get_dispatcher
from .._core.errors import UnavailableError, UnavailableReason
from .._core.state import HostState, ShutdownReason
from ..location.authority import OwnerFence
from ..location.lease import LeaseGrant, OwnerLease
from .config import StateChange, StateChangeKind
from .loop_calls import LoopCalls, pause
from .operations import RELEASE_WAIT
from .shared import POLL, WITHDRAW_WAIT, NodeShared, log

__all__ = ["LeaseKeeper", "LeaseWork"]


class LeaseWork(Protocol):
    """What the lease keeper has the rest of its node do."""

    async def reclaim_all(self, wiped: bool) -> None:
        """Claim again, for the lease held now, the records of the objects still held
        here (a missing one only when the store lost its data: `wiped`); close those
        another node took. Raises on a store failure (the keeper tries again)."""
        ...

    async def release_all(self) -> None:
        """Shutdown: delete the record of every object still owned here."""
        ...

    def take_episode(self) -> tuple[int, int]:
        """Under the node lock: (objects claimed again, objects lost) since the node was
        last fenced, and start counting again."""
        ...

    def tell_update(self) -> None:
        """Tell every live peer this node's state now (an UPDATE notice)."""
        ...

    def admitting_again(self) -> None:
        """The lease admits: hand on the one-ways held while it was fenced, if any."""
        ...

    def purge(self, now: float) -> None:
        """Drop the expired routes of the route cache (every `route_cache_max_age`)."""
        ...


class LeaseKeeper:
    """A node's owner lease and its keeper (see the module docstring).

    `recoveries` (read under the node lock): times the node admitted again after it was
    fenced."""

    def __init__(
        self,
        shared: NodeShared,
        *,
        on_state_change: Callable[[StateChange], object] | None = None,
        shut_host_down: Callable[[], object] | None = None,
    ) -> None:
        """`on_state_change`: `Host(on_state_change=...)`, told of every `StateChange` (on
        the completion dispatcher). `shut_host_down`: what shuts the Host down when the
        lease is lost and `on_lease_lost="shutdown"`."""
        store = shared.location
        assert store is not None
        self._shared = shared
        self._runtime = shared.runtime
        self._config = shared.config
        self._lock = shared.lock
        self._routing_id = shared.routing_id
        self._on_state_change = on_state_change
        self._shut_host_down = shut_host_down
        self._loop_calls = LoopCalls(shared.runtime)
        #: This run's owner lease.
        self.lease = OwnerLease(store, shared.routing_id, shared.config.lease)
        self.recoveries = 0
        #: `acquire`'s acquisition (it may outlive its bounded wait).
        self._acquiring: Future[LeaseGrant] | None = None
        #: The keeper's task on the I/O loop (`start`).
        self._leasing: Future[None] | None = None
        #: The keeper runs until every object closed (`stop`, a shutdown finisher).
        self._stop = threading.Event()
        #: Wakes the keeper: at the stop, and for `check_now`.
        self._wake = asyncio.Event()
        #: Discovery asks for a renewal at once (`check_now`).
        self._check_now = False
        #: `on_lease_lost="shutdown"` began the Host's shutdown.
        self._lost_shutdown = False
        self._work: LeaseWork | None = None
        shared.runtime.fence_until(-math.inf)  # fenced until the lease is acquired

    # -- its life ---------------------------------------------------------------------

    def acquire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Acquire this run's owner lease before the node serves creations (bounded by
        `renew_timeout`; if the store does not answer, the keeper goes on trying)."""
        self._acquiring = asyncio.run_coroutine_threadsafe(self.lease.acquire(), loop)
        try:
            grant = self._acquiring.result(self._config.lease.renew_timeout)
            self._runtime.fence_until(grant.admission_deadline)
        except Exception as exc:  # the store is down: the keeper goes on trying
            log.warning("mesh %s: acquiring the owner lease: %r", self._routing_id, exc)

    def start(self, loop: asyncio.AbstractEventLoop, work: LeaseWork) -> None:
        """Run the keeper on the I/O loop `loop`, having the node do `work`."""
        self._work = work
        self._leasing = asyncio.run_coroutine_threadsafe(self._keep(work), loop)

    def stop(self, seconds: float) -> None:
        """A shutdown finisher (every object closed, the I/O loop still runs): the keeper
        deletes the records still ours and releases the lease; waits for it at most
        `seconds` (and at least `WITHDRAW_WAIT`)."""
        self._loop_calls.stop_task(self._stop, self._wake)
        if self._leasing is not None:
            with contextlib.suppress(Exception):
                self._leasing.result(max(seconds, WITHDRAW_WAIT))

    def check_now(self) -> None:
        """On the I/O loop: the keeper renews (or finds lost) the lease at once instead
        of at its next renewal (discovery saw the store lose its data)."""
        self._check_now = True
        self._wake.set()  # only wakes the keeper: it ends on `_stop`

    # -- what the node asks -----------------------------------------------------------

    def lease_admitting(self) -> bool:
        """Whether this node's owner lease admits work now (False before the lease is
        acquired, while fenced and while recovering): what readiness waits for."""
        return not self._runtime.fenced

    def admitting(self) -> bool:
        """The lease admits, and the keeper let admission resume (not while a recovery
        still claims the records of the objects held here)."""
        return self.lease.admitting() and not self._runtime.fenced

    def fence(self, what: str) -> OwnerFence:
        """The fence a store write for `what` carries: this node and its lease's
        generation; `UnavailableError` (`FENCED`) when the lease does not admit."""
        grant = self.lease.grant
        if grant is None or not self.admitting():
            raise UnavailableError(
                f"{what}: this node holds no admitting owner lease",
                reason=UnavailableReason.FENCED,
            )
        return OwnerFence(self._routing_id, grant.generation)

    @property
    def generation(self) -> int:
        """The generation of the lease held now (0: none)."""
        grant = self.lease.grant
        return 0 if grant is None else grant.generation

    # -- inside -----------------------------------------------------------------------

    def _acquiring_now(self) -> bool:
        """`acquire`'s acquisition is still on its way (it timed out there)."""
        acquiring = self._acquiring
        return acquiring is not None and not acquiring.done()

    async def _keep(self, work: LeaseWork) -> None:
        """Acquire this run's owner lease, renew it, fence the node while it does not
        admit, and recover (module docstring); at the end (`stop`: at shutdown, once
        every object closed), wait for the deletions of the records of the objects that
        closed, delete the records still ours and release the lease."""
        lease = self.lease
        stop = self._stop.is_set
        wake = self._wake
        config = self._config.lease
        runtime = self._runtime
        shared = self._shared
        next_renewal = time.monotonic() + config.renew_interval
        acquired = lease.grant is not None
        #: The records of the objects still held are claimed again before admitting.
        reclaim = False
        #: The store lost its data since the lease was lost (`OwnerLease.counter_lost`):
        #: a record missing there may be claimed again; otherwise it was deleted.
        wiped = False
        detail = ""
        next_purge = time.monotonic() + self._config.route_cache_max_age
        while not stop():
            now = time.monotonic()
            acquired = acquired or lease.grant is not None  # also by `acquire`'s late answer
            if self._check_now:
                self._check_now = False
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
                    if self._config.on_lease_lost == "shutdown":
                        self._shut_down(detail)
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
                    await work.reclaim_all(wiped)
                    wiped = False
                    reclaim = False
            except Exception as exc:  # the store is down, or the lease was lost
                detail = f"{type(exc).__name__}: {exc}"
                log.warning("mesh %s: owner lease: %s", self._routing_id, detail)
                next_renewal = time.monotonic() + min(config.renew_interval, 0.5)
            if now >= next_purge:
                work.purge(now)
                next_purge = now + self._config.route_cache_max_age
            grant = lease.grant
            admit = not (reclaim or self._lost_shutdown)
            runtime.fence_until(
                grant.admission_deadline if grant is not None and admit else -math.inf
            )
            if runtime.fenced:
                if shared.lease_state == "admitting":
                    reclaim = True  # whatever the store kept, checked before admitting
                    self._changed("fenced", StateChangeKind.FENCED, detail or "lapsed")
            else:
                if shared.lease_state != "admitting":
                    recovered = shared.lease_state == "fenced"
                    self._changed("admitting", StateChangeKind.RECOVERED if recovered else None, "")
                work.admitting_again()  # the one-ways that arrived while it was fenced
            due = next_renewal
            if lease.grant is not None and lease.remaining() > 0:
                due = min(due, time.monotonic() + lease.remaining())
            await pause(max(0.01, min(due - time.monotonic(), POLL)), wake)
            if not stop():
                wake.clear()  # set by `check_now` (the stop sets it once more)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(work.release_all(), RELEASE_WAIT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(lease.release(forget=True), RELEASE_WAIT)
        with self._lock:
            shared.set_lease_state("released")

    def _changed(self, state: str, kind: StateChangeKind | None, detail: str) -> None:
        """The keeper's decision changed: peers hear it at once (an UPDATE: placement
        and channel selection leave or take this node back), and so does the Host's
        `on_state_change`."""
        work = self._work
        assert work is not None
        with self._lock:
            self._shared.set_lease_state(state)
            episode = work.take_episode()
            if kind is StateChangeKind.RECOVERED:
                self.recoveries += 1
        if kind is StateChangeKind.FENCED:
            log.warning("mesh %s: owner lease fenced: %s", self._routing_id, detail)
        elif kind is StateChangeKind.RECOVERED:
            log.warning(
                "mesh %s: owner lease admitting again (generation %d): %d objects claimed "
                "again, %d lost to other nodes",
                self._routing_id,
                self.generation,
                *episode,
            )
        if self._shared.info is not None and kind is not None:
            work.tell_update()
        if kind is not None:
            reclaimed, lost = episode if kind is StateChangeKind.RECOVERED else (0, 0)
            generation = self.generation
            self._tell(StateChange(kind, self._routing_id, generation, detail, reclaimed, lost))

    def _tell(self, change: StateChange) -> None:
        """Hand `change` to `Host(on_state_change=...)` on the completion dispatcher (in
        order; what the callback raises is logged there)."""
        callback = self._on_state_change
        if callback is not None:
            get_dispatcher().post(callback, change, None)

    def _shut_down(self, detail: str) -> None:
        """`on_lease_lost="shutdown"`: the Host shuts itself down (once), its result
        saying why, for a supervisor to restart it."""
        if self._lost_shutdown:
            return
        self._lost_shutdown = True
        if self._runtime.state is HostState.SERVING:
            self._runtime.shutdown_reason = ShutdownReason.LEASE_LOST
        log.error(
            "mesh %s: the owner lease was lost (%s): the Host shuts down (on_lease_lost="
            "'shutdown')",
            self._routing_id,
            detail or "expired or gone from the store",
        )
        self._tell(StateChange(StateChangeKind.LEASE_LOST, self._routing_id, 0, detail))
        shut = self._shut_host_down
        if shut is not None:
            threading.Thread(
                target=shut, name=f"zlink-lease-lost-{self._routing_id}", daemon=True
            ).start()
