"""Logical Multicast in one process: `publish(channel, topic, payload)` (SC §6, CS §4).

Spots subscribe in `configure(cfg)` with `cfg.subscribe(channel, topic)`. A publish
snapshots the matching Ready Spots when it starts, then runs as a transaction on the I/O
executor, at most `Host(publish_concurrency=64)` at once; beyond that it waits, with no
time limit, for a slot. *Commit* is the moment a slot is taken and delivery is scheduled,
both under one lock. Before commit, cancellation (or shutdown) ends the publish and nothing
is delivered. The publish completes normally (`None`) at commit; after that cancellation
changes nothing, and delivery continues: each target once, waiting for lane space like a
one-way send. Per-target failures (closed, no handler) never change the result and are not
reported. Every matched Spot receives the same payload object.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

from .._core.cancellation import CancellationRegistration
from .._core.completion import Cell, Completion
from .._core.errors import ZlinkError, shutting_down
from .._core.pool import AppPool
from .._core.record import Message
from .._core.workers import IoExecutor
from .registry import Activation

__all__ = ["Publisher", "PublisherStatistics", "Transaction"]

log = logging.getLogger("zlink_actors")


class Transaction:
    """One publish: its targets (snapshot at start), what it delivers, and its result."""

    __slots__ = ("cell", "metadata", "payload", "registration", "targets")

    def __init__(
        self, targets: list[Activation], payload: object, metadata: dict[str, object] | None
    ) -> None:
        self.targets = targets
        self.payload = payload
        self.metadata = metadata
        self.cell: Cell[None] = Cell()
        self.registration: CancellationRegistration | None = None


@dataclass(frozen=True, slots=True)
class PublisherStatistics:
    """A snapshot of a Host's publish admission (`HostStatistics.publisher`).

    Attributes:
        running: committed publishes still delivering, each holding a slot (a delivery
            waits for lane space like a one-way send, so a full target keeps its slot).
        waiting: publishes waiting, untimed, for a slot (not yet committed).
        concurrency: the slots, `Host(publish_concurrency=...)`.
    """

    running: int
    waiting: int
    concurrency: int


class Publisher:
    """Admits publish transactions: at most `limit` running, the rest waiting FIFO."""

    def __init__(self, pool: AppPool, io: IoExecutor, limit: int) -> None:
        self.pool = pool
        self.io = io
        self.limit = limit
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0
        self._waiting: deque[Transaction] = deque()
        self._sealed = False

    def submit(self, tx: Transaction) -> None:
        with self._lock:
            if self._sealed:
                commit = False
                sealed = True
            elif self._running < self.limit and not self._waiting:
                self._running += 1
                commit, sealed = True, False
            else:
                self._waiting.append(tx)
                commit = sealed = False
        if sealed:
            tx.cell.set_exception(shutting_down())
        elif commit:
            self._commit(tx)

    def statistics(self) -> PublisherStatistics:
        """Running and waiting transactions now (takes the admission lock briefly)."""
        with self._lock:
            return PublisherStatistics(
                running=self._running, waiting=len(self._waiting), concurrency=self.limit
            )

    def cancel(self, tx: Transaction) -> bool:
        """Cancellation before commit wins (nothing is delivered); after it, False."""
        with self._lock:
            if tx not in self._waiting:
                return False
            self._waiting.remove(tx)
        return tx.cell.cancel()

    def seal(self) -> None:
        """Shutdown: publishes still waiting for a slot end with `ShuttingDownError`."""
        with self._lock:
            self._sealed = True
            waiting, self._waiting = list(self._waiting), deque()
        for tx in waiting:
            tx.cell.set_exception(shutting_down())

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no committed transaction is still delivering."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout)

    def _commit(self, tx: Transaction) -> None:
        # Committed: the slot is ours and delivery is being scheduled.
        if tx.registration is not None:
            tx.registration.unregister()
        tx.cell.set_result(None)
        io = self.io
        if not io.call_soon(io.create_task, lambda: self._deliver(tx)):
            self._release()

    def _release(self) -> None:
        with self._lock:
            nxt = self._waiting.popleft() if self._waiting and not self._sealed else None
            if nxt is None:
                self._running -= 1
                if self._running == 0:
                    self._idle.notify_all()
        if nxt is not None:
            self._commit(nxt)

    async def _deliver(self, tx: Transaction) -> None:
        pool = self.pool
        try:
            for act in tx.targets:
                if act.closed:
                    continue
                info = act.type.table.find(type(tx.payload))
                if info is None:
                    log.debug("publish: %r has no handler for %s", act, type(tx.payload))
                    continue
                rec = Message(tx.payload, tx.metadata, info)
                waiting = pool.send(act.box, rec, Cell)
                if isinstance(waiting, Cell):  # no room yet: wait like a one-way send
                    try:
                        await Completion(waiting)
                    except ZlinkError as exc:
                        log.debug("publish to %r ended: %r", act, exc)
        finally:
            self._release()
