"""The mailbox: where one owner's work waits (digest §4, design/architecture.md §3).

Two FIFO lanes, lifecycle and application, the application lane bounded by items
(counted in `app_reserved`: queued plus running). Lanes and the waiter queue exist only
while they hold something, so an idle owner costs a few hundred bytes. Every field is
guarded by the lock of the gate the mailbox is attached to now (`lock_box`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from .completion import Cell
from .gate import Gate, wait_free
from .record import Message, Record

__all__ = ["LIFECYCLE_BURST", "Mailbox", "lock_box", "trim"]

#: Consecutive lifecycle turns after which one application turn is forced (yield debt).
LIFECYCLE_BURST: Final = 8


class Mailbox:
    """Two FIFO lanes and their accounting for one owner (Spot, Actor, timer, channel)."""

    __slots__ = (
        "app",
        "app_reserved",
        "claimed",
        "closed",
        "closing",
        "debt",
        "gate",
        "life",
        "listed",
        "owner",
        "waiters",
    )

    def __init__(self, owner: Any, gate: Gate[Mailbox]) -> None:
        #: The engine's object this mailbox belongs to (read by the record runner; the
        #: kernel only names it in a log line).
        self.owner = owner
        self.gate = gate
        # Lists, not deques: most lanes hold one record at a time, and a list costs a
        # tenth of a deque to make (both lanes are dropped whenever they empty).
        self.app: list[Record] | None = None
        self.life: list[Record] | None = None
        #: Application records admitted and not yet terminal (queued + running).
        self.app_reserved = 0
        #: One-way sends waiting for capacity, FIFO: (record, the caller's result cell).
        self.waiters: deque[tuple[Message, Cell[None]]] | None = None
        self.listed = False
        #: A SpotWide member Actor's queue claim held across `yield_()`.
        self.claimed = False
        self.closed = False
        #: close() was requested: no new application work, no waiter is admitted.
        self.closing = False
        self.debt = 0

    # Everything below runs with `self.gate.lock` held.

    def push(self, rec: Record, lifecycle: bool) -> bool:
        """Append `rec` to a lane; True if the gate must be pushed to the pool."""
        if lifecycle:
            lane = self.life
            if lane is None:
                self.life = lane = []
        else:
            lane = self.app
            if lane is None:
                self.app = lane = []
        lane.append(rec)
        return self.gate.list_box(self)

    def take(self) -> Record | None:
        """The next record: lifecycle first, but one application record after every
        `LIFECYCLE_BURST` lifecycle ones while application work waits."""
        life, app = self.life, self.app
        if life and (self.debt < LIFECYCLE_BURST or not app):
            self.debt += 1
            return life.pop(0)
        if app:
            self.debt = 0
            return app.pop(0)
        return None

    def has_work(self) -> bool:
        return bool(self.life) or bool(self.app)

    def queued(self) -> int:
        """Records waiting in both lanes (not running)."""
        return len(self.life or ()) + len(self.app or ())


def lock_box(box: Mailbox) -> Gate[Mailbox]:
    """Acquire the lock of the gate `box` belongs to now (an Actor's mailbox changes gate
    when it joins a Spot); returns that gate with its lock held."""
    while True:
        gate = box.gate
        if gate.lock.locked():
            wait_free(gate.lock)
        gate.lock.acquire()
        if box.gate is gate:
            return gate
        gate.lock.release()


def trim(box: Mailbox) -> None:
    """Give back empty lanes: an idle owner keeps no list. Gate lock held."""
    if box.app is not None and not box.app:
        box.app = None
    if box.life is not None and not box.life:
        box.life = None
