"""Global Spots and Actors across meshed Hosts in one process (issue 16; design/mesh.md §2
"Global objects", "Owner leases").

`GlobalMesh` starts Hosts that share one `MemoryLocationStore` (they keep their authority
records, owner leases and node descriptors in it), each on tcp loopback with the short
liveness of `_mesh.py`, each dialling the live Hosts started before it (discovery through
the store would find them too, a second later). `add()` returns a Host only once it and
every live Host before it see each other READY (bounded by `WAIT`, asserted). Closing the
mesh (the end of its `with` block, also when the test failed) sets every latch first, then
shuts every Host still serving down in parallel, asserts that each one not killed stopped
cleanly, and closes the store last.

The store's clock is a `StoreClock` the test can move forward (the owner leases expire in
the store when it passes their TTL). `Cuttable` wraps the store for one Host so the test
can cut that Host off from it; `GlobalMesh.kill()` cuts a Host off from the store and
from its peers at once: what the rest of the mesh sees of a process that was SIGKILLed.

The payloads and object classes are in `_global_objects.py`; they report what they do
to the test's `Journal`, which `GlobalMesh` installs for the length of a test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

from zlink_actors import (
    Actor,
    Host,
    HostState,
    LeaseConfig,
    MemoryLocationStore,
    MeshStatistics,
    PeerState,
    ShutdownOutcome,
    ShutdownResult,
    Spot,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.location.spi import (
    Committed,
    Conflict,
    Delete,
    Found,
    IfMissing,
    IfVersion,
    LocationStore,
    Missing,
    Put,
    ScanPage,
)
from zlink_actors.testing import WAIT, wait_until

from ._global_objects import SHARED, Journal, install
from ._mesh import mesh_config

__all__ = [
    "MESH",
    "Cuttable",
    "GlobalMesh",
    "StoreClock",
    "mesh_stats",
    "run_racers",
]

#: The mesh name of every Host these tests start.
MESH = "global"


# -- the store ---------------------------------------------------------------------------


class StoreClock:
    """The `MemoryLocationStore`'s clock: real epoch time plus an offset the test moves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset = 0.0

    def __call__(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds


class Cuttable:
    """A `LocationStore` that passes everything to `inner` until `cut()`; from then on
    every operation raises `UnavailableError`, as for a store that became unreachable
    (the renewals of the Host using it fail, and its lease runs out in the store)."""

    def __init__(self, inner: LocationStore) -> None:
        self._inner = inner
        self._cut = threading.Event()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        """Pass everything to the store again."""
        self._cut.clear()

    def _check(self) -> None:
        if self._cut.is_set():
            raise UnavailableError(
                "the test cut this Host off from the store",
                reason=UnavailableReason.STORE_UNAVAILABLE,
            )

    async def read(self, key: str) -> Found | Missing:
        self._check()
        return await self._inner.read(key)

    async def write(
        self, conditions: Sequence[IfMissing | IfVersion], mutations: Sequence[Put | Delete]
    ) -> Committed | Conflict:
        self._check()
        return await self._inner.write(conditions, mutations)

    async def scan(self, prefix: str, *, cursor: str | None = None, limit: int = 1000) -> ScanPage:
        self._check()
        return await self._inner.scan(prefix, cursor=cursor, limit=limit)

    def close(self) -> None:
        """The shared store is closed by `GlobalMesh`, not here."""


# -- the mesh ----------------------------------------------------------------------------


def mesh_stats(host: Host) -> MeshStatistics:
    """`host.statistics().mesh`, which a meshed Host always has."""
    stats = host.statistics().mesh
    assert stats is not None
    return stats


def _ready(host: Host, routing_id: str) -> bool:
    return any(p.routing_id == routing_id and p.state is PeerState.READY for p in host.peers())


class GlobalMesh:
    """Hosts of one test sharing one `MemoryLocationStore`; a context manager.

    Args:
        lease: the `LeaseConfig` of every Host unless `add()` is given another (the
            default timings unless a test is about leases).
    """

    def __init__(self, lease: LeaseConfig | None = None) -> None:
        self.clock = StoreClock()
        self.store = MemoryLocationStore(clock=self.clock)
        self.lease = lease if lease is not None else LeaseConfig()
        self.hosts: list[Host] = []
        self.journal = Journal()
        self._killed: list[Host] = []
        self._cuttable: dict[int, Cuttable] = {}

    def add(
        self,
        *,
        spots: Iterable[type[Spot]] = (),
        actors: Iterable[type[Actor]] = (),
        mesh: dict[str, Any] | None = None,
        cuttable: bool = False,
        **options: Any,
    ) -> Host:
        """Start a Host on the shared store; return it once it and every live Host
        before it see each other READY.

        Args:
            spots: its Spot types (none and no `actors`: an Object Client).
            actors: its Actor types.
            mesh: `MeshConfig` options over `_mesh.mesh_config()`'s and `lease`.
            cuttable: reach the store through a `Cuttable` (needed for `kill()`).
            **options: other `Host` options (`message_types` defaults to `SHARED`).
        """
        options.setdefault("message_types", SHARED)
        earlier = self.live()
        # The store's discovery would find the earlier Hosts too, but only on its next
        # poll (about a second): dialling them at start makes the mesh READY at once.
        dial = tuple(h.node.endpoint for h in earlier)
        config = mesh_config(MESH, **{"lease": self.lease, "peers": dial, **(mesh or {})})
        location: LocationStore = self.store
        if cuttable:
            location = Cuttable(self.store)
        host = Host(
            spots=list(spots), actors=list(actors), mesh=config, location=location, **options
        )
        if isinstance(location, Cuttable):
            self._cuttable[id(host)] = location
        self.hosts.append(host)
        host.start()
        assert len(host.wait_for_peers(len(earlier), timeout=WAIT)) >= len(earlier)
        rid = host.node.routing_id
        for other in earlier:
            assert wait_until(lambda other=other: _ready(host, other.node.routing_id)), (
                f"{rid} never saw {other.node.routing_id} READY"
            )
            assert wait_until(lambda other=other: _ready(other, rid)), (
                f"{other.node.routing_id} never saw {rid} READY"
            )
        return host

    def live(self) -> list[Host]:
        """The Hosts still serving that were not killed."""
        return [h for h in self.hosts if h.state is HostState.SERVING and h not in self._killed]

    def kill(self, host: Host) -> None:
        """What the rest of the mesh sees of a SIGKILLed process: `host` is cut off from
        the store (no lease renewal, no record change, no descriptor) and its mesh node is
        closed without draining (no DRAINING, no record deleted; its peers list it LOST).
        The Host object itself is shut down at the end of the test, outcome unchecked.

        There is no public way to stop a node's networking alone; this reaches into the
        Host's mesh node (`Host._mesh`), the in-process stand-in for SIGKILL.
        """
        store = self._cuttable.get(id(host))
        assert store is not None, "kill() needs a Host added with cuttable=True"
        rid = host.node.routing_id
        self._killed.append(host)
        store.cut()
        node = host._mesh
        assert node is not None
        node.close(0.0)
        for other in self.live():
            assert wait_until(
                lambda other=other: any(
                    p.routing_id == rid and p.state is not PeerState.READY for p in other.peers()
                )
            ), f"{other.node.routing_id} still lists {rid} READY"

    def cut(self, host: Host) -> None:
        """Cut `host` off from the store only (added with `cuttable=True`)."""
        store = self._cuttable.get(id(host))
        assert store is not None, "cut() needs a Host added with cuttable=True"
        store.cut()

    def heal(self, host: Host) -> None:
        """Let `host` (added with `cuttable=True`) reach the store again."""
        store = self._cuttable.get(id(host))
        assert store is not None, "heal() needs a Host added with cuttable=True"
        store.heal()

    def close(self) -> None:
        """Set every latch, shut every Host still serving down (in parallel), assert the
        ones not killed stopped cleanly, then close the store."""
        try:
            self.journal.release_all()
            serving = [h for h in self.hosts if h.state is HostState.SERVING]
            results: dict[int, ShutdownResult] = {}

            def stop(h: Host) -> None:
                results[id(h)] = h.shutdown(deadline=WAIT)

            threads = [threading.Thread(target=stop, args=(h,), daemon=True) for h in serving]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT + 5)
            stuck = [t for t in threads if t.is_alive()]
            assert not stuck, "a Host's shutdown did not return"
            failures = [
                f"{h!r}: {results.get(id(h))}"
                for h in serving
                if h not in self._killed
                and (id(h) not in results or results[id(h)].outcome is not ShutdownOutcome.STOPPED)
            ]
            assert not failures, "a Host did not stop cleanly: " + "; ".join(failures)
        finally:
            self.store.close()
            install(Journal())

    def __enter__(self) -> Self:
        install(self.journal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run_racers(count: int, body: Callable[[int], object]) -> list[object]:
    """Run `body(i)` for i in 0..count-1 on `count` threads started together on a
    barrier; return their results in order (bounded, asserted)."""
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(WAIT)
            results[i] = body(i)
        except BaseException as exc:  # re-raised on the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
        assert not t.is_alive(), "a racer did not finish"
    if errors:
        raise errors[0]
    return results
