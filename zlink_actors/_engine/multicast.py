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
from typing import TYPE_CHECKING, Any, Self

from .._calls.call import Call, check_token, settled
from .._core.cancellation import CancellationToken
from .._core.completion import Completion, _Cell
from .._core.errors import InvalidOperationError, ZlinkError, shutting_down
from .._core.pool import Record
from .turn import K_MESSAGE

if TYPE_CHECKING:
    from .kernel import Runtime
    from .registry import Activation

__all__ = ["PublishCall", "Publisher", "PublisherStatistics"]

log = logging.getLogger("zlink_actors")


class _Transaction:
    __slots__ = ("cell", "metadata", "payload", "registration", "targets")

    def __init__(
        self, targets: list[Activation], payload: Any, metadata: dict[str, Any] | None
    ) -> None:
        self.targets = targets
        self.payload = payload
        self.metadata = metadata
        self.cell: _Cell[None] = _Cell()
        self.registration: Any = None


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

    def __init__(self, runtime: Runtime, limit: int) -> None:
        self.runtime = runtime
        self.limit = limit
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0
        self._waiting: deque[_Transaction] = deque()
        self._sealed = False

    def submit(self, tx: _Transaction) -> None:
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

    def cancel(self, tx: _Transaction) -> bool:
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

    def _commit(self, tx: _Transaction) -> None:
        # Committed: the slot is ours and delivery is being scheduled.
        if tx.registration is not None:
            tx.registration.unregister()
        tx.cell.set_result(None)
        io = self.runtime.io
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

    async def _deliver(self, tx: _Transaction) -> None:
        pool = self.runtime.pool
        try:
            for act in tx.targets:
                if act.closed:
                    continue
                info = act.type.table.find(type(tx.payload))
                if info is None:
                    log.debug("publish: %r has no handler for %s", act, type(tx.payload))
                    continue
                rec = Record(K_MESSAGE, tx.payload, tx.metadata, info)
                waiting = pool.send(act.box, rec, _Cell)
                if isinstance(waiting, _Cell):  # no room yet: wait like a one-way send
                    try:
                        await Completion(waiting)
                    except ZlinkError as exc:
                        log.debug("publish to %r ended: %r", act, exc)
        finally:
            self._release()


class PublishCall(Call[None]):
    """`publish(channel, topic, payload)`. Created by the runtime; not constructed by
    users. Terminators `submit()` and `submit_sync()`; no `yield_()`, no `timeout()`."""

    __slots__ = ("_channel", "_payload", "_topic")

    def __init__(self, runtime: Runtime, channel: str, topic: str, payload: Any) -> None:
        for name, value in (("channel", channel), ("topic", topic)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if not value:
                raise ValueError(f"{name} must not be empty")
        super().__init__(runtime)
        self._channel = channel
        self._topic = topic
        self._payload = payload

    def timeout(self, seconds: float) -> Self:
        """Not offered: a publish waits for a slot with no time limit (docs/object-model.md)."""
        raise InvalidOperationError("publish has no timeout: it waits untimed for a slot")

    def submit(self, cancel: CancellationToken | None = None) -> Completion[None]:
        """Publish to every Spot subscribed to (channel, topic) now.

        Completes when: the transaction commits (value `None`), also with 0 targets.
        Before commit it may wait for a slot with no time limit; cancellation then wins
        and nothing is delivered. After commit cancellation changes nothing.
        Turn: `await` keeps the turn.
        Raises (in the Completion): `ShuttingDownError`, `CancelledError`.
        """
        return super().submit(cancel)

    def submit_sync(self, cancel: CancellationToken | None = None) -> None:
        """Publish from an application thread, blocking until commit (see `submit()`)."""
        return super().submit_sync(cancel)

    def _start(self, cancel: CancellationToken | None) -> Completion[None]:
        runtime = self._runtime
        early = self._refused(check_token(cancel))
        if early is not None:
            return early
        engine = runtime.engine
        with engine.lock:  # the target snapshot, taken when the operation starts
            ids = engine.subscribers.get((self._channel, self._topic), ())
            targets = [engine.spots[i] for i in ids if i in engine.spots]
        if not targets:
            return settled(None)
        tx = _Transaction(targets, self._payload, self._metadata)
        publisher = runtime.publisher
        if cancel is not None:
            tx.registration = cancel._register_internal(lambda: publisher.cancel(tx))
        publisher.submit(tx)
        return Completion(tx.cell, lambda: publisher.cancel(tx))
