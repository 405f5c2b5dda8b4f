"""The gate: the right to run one turn at a time in its scope (digest §4).

A SpotWide Spot has one gate over its own mailbox and every member Actor's; an Entry or
PerActor Spot gives each Actor, each timer and the Spot's own work a gate of its own. No
thread belongs to a gate: the application pool (`pool.py`) runs the turns of every gate.

States::

    IDLE --work arrives--> READY --a pool thread takes it--> RUNNING
    RUNNING --no work left--> IDLE          RUNNING --10 ms used--> READY (back of the set)
    RUNNING --handler awaits--> SUSPENDED --result settles--> READY (resumes first)

The gate's lock also guards the fields of the mailboxes attached to it (`mailbox.py`).
The gate is generic over its mailbox type only so that this module need not import
`mailbox.py` (which imports this one).
"""

from __future__ import annotations

import _thread
from time import sleep as _sleep
from typing import Final, Generic, Protocol, TypeVar

from .record import Record, Resumable

__all__ = ["IDLE", "READY", "RUNNING", "SUSPENDED", "Gate", "wait_free"]

IDLE: Final = 0
READY: Final = 1
RUNNING: Final = 2
SUSPENDED: Final = 3


class Listable(Protocol):
    """What a gate reads of a mailbox to list it as runnable."""

    listed: bool
    claimed: bool


B = TypeVar("B", bound=Listable)


class Gate(Generic[B]):
    """The right to run a turn, shared by the mailboxes attached to it."""

    __slots__ = ("frame", "lock", "pos", "ready_boxes", "run", "spotwide", "state")

    def __init__(self, spotwide: bool = False) -> None:
        self.lock = _thread.allocate_lock()
        self.state = IDLE
        #: Mailboxes with runnable records, round-robin; created on first use.
        self.ready_boxes: list[B] | None = None
        #: The suspended coroutine to resume first (an `await` that keeps the turn).
        self.frame: Resumable | None = None
        #: True for a SpotWide / Instance gate: `yield_()` may release it.
        self.spotwide = spotwide
        #: The run of records a pool thread took, (mailbox, records), and the index of the
        #: one running: a turn that suspends hands the rest back (`AppPool.hand_back`).
        self.run: tuple[B, list[Record]] | None = None
        self.pos = 0

    def list_box(self, box: B) -> bool:
        """Make `box` runnable; return True if the gate must be pushed to the pool.

        Caller holds `self.lock`.
        """
        if box.listed or box.claimed:
            return False
        box.listed = True
        boxes = self.ready_boxes
        if boxes is None:
            self.ready_boxes = boxes = []
        boxes.append(box)
        if self.state == IDLE:
            self.state = READY
            return True
        return False


def wait_free(lock: _thread.LockType) -> None:
    """Wait, without blocking in C, until a scheduler lock that another thread holds is
    free; the caller then takes it with `with` (which an interrupt cannot split from the
    release).

    A thread blocked in `acquire()` owns the lock the moment it is released and only
    then waits for the GIL; the releasing thread, still running Python, soon wants the
    lock again and blocks on it, and from then on every acquisition costs both threads
    a context switch (a lock convoy; measured: one switch per request on each thread
    when 10,000 requests go to 10,000 idle Spots). The holder of a scheduler lock is a
    thread inside a few lines of Python, so it can only be waiting for the GIL: hand the
    GIL over (`sleep(0)`) until the lock is free.
    """
    while lock.locked():
        _sleep(0)
