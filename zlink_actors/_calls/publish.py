"""`publish(channel, topic, payload)`: the call that starts a publish transaction.

What a publish does, and when it completes, is `_engine/multicast.py`.
"""

from __future__ import annotations

from typing import Self

from .._core.cancellation import CancellationToken, check_token
from .._core.completion import Cell, Completion, settled
from .._core.errors import InvalidOperationError
from .._engine.kernel import Runtime
from .._engine.multicast import Transaction
from .call import Call

__all__ = ["PublishCall"]


class PublishCall(Call[None]):
    """`publish(channel, topic, payload)`. Created by the runtime; not constructed by
    users. Terminators `submit()` and `submit_sync()`; no `yield_()`, no `timeout()`."""

    __slots__ = ("_channel", "_here", "_payload", "_topic")

    def __init__(
        self, runtime: Runtime, channel: str, topic: str, payload: object, *, here: bool = False
    ) -> None:
        for name, value in (("channel", channel), ("topic", topic)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if not value:
                raise ValueError(f"{name} must not be empty")
        super().__init__(runtime)
        self._channel = channel
        self._topic = topic
        self._payload = payload
        #: A publish another node routed here: its Spots only, never routed again.
        self._here = here

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
        # The target snapshot, taken when the operation starts.
        targets = runtime.engine.subscribed(self._channel, self._topic)
        if runtime.fenced:
            targets = []  # the owner lease lapsed: this Host's Spots admit nothing new
        objects = None if self._here else runtime.objects
        if not targets:
            if objects is None:
                return settled(None)
            return objects.publish(self._channel, self._topic, self._payload, self._metadata)
        tx = Transaction(targets, self._payload, self._metadata)
        publisher = runtime.publisher
        if cancel is not None:
            tx.registration = cancel._register_internal(lambda: publisher.cancel(tx))
        publisher.submit(tx)
        if objects is None:
            return Completion(tx.cell, lambda: publisher.cancel(tx))
        # Global objects: after the local commit, one routed message per remote node.
        cell: Cell[None] = Cell()
        channel, topic, payload, metadata = (
            self._channel,
            self._topic,
            self._payload,
            self._metadata,
        )

        def committed(local: Completion[None]) -> None:
            exc = local._cell._exc
            if exc is not None:
                cell.try_set(None, exc)
                return
            sent = objects.publish(channel, topic, payload, metadata)
            sent._add_inline(lambda done: cell.try_set(None, done._cell._exc))

        Completion(tx.cell)._add_inline(committed)
        return Completion(cell, lambda: publisher.cancel(tx))
