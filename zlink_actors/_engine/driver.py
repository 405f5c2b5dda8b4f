"""The coroutine driver: steps `async def` handlers without an asyncio loop.

`await completion` parks the turn and keeps the gate (SUSPENDED): the pool thread is
freed, nothing else runs under that gate, and the continuation is scheduled first when
the result settles. `await call.yield_()` parks the coroutine and releases the gate; it
resumes as one resume record queued behind the work already in the Spot's queue. A
SpotWide member Actor keeps its Actor-queue claim meanwhile, so only its own next record
waits.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Generator
from contextvars import Context
from typing import Any, Generic, Protocol, TypeVar

from .._core.completion import Completion
from .._core.errors import InvalidOperationError, UnavailableError, UnavailableReason
from .._core.gate import SUSPENDED, Gate
from .._core.mailbox import Mailbox
from .._core.pool import AppPool
from .._core.record import OnDone, Record, Resume

__all__ = ["Frame", "Parking", "TurnHost", "YieldAwaitable"]

log = logging.getLogger("zlink_actors")
T = TypeVar("T")


class Parking(Protocol):
    """The object a turn belongs to, as the driver sees it: where parked coroutines wait
    (`registry.Activation`)."""

    parked: set[Frame] | None


class TurnHost(Protocol):
    """A turn context as the driver (and the registry's spare slot) see it
    (`turn.TurnContext`, which the contexts of `_calls` extend)."""

    _box: Mailbox
    _gate: Gate[Mailbox]
    _frame: Frame | None
    _rec: Record | None
    _metadata: dict[str, object] | None

    @property
    def _act(self) -> Parking: ...


class YieldAwaitable(Generic[T]):
    """What `yield_()` returns: `await` it to release the gate until the result settles.

    Created by the runtime; not constructed by users.
    """

    __slots__ = ("_completion",)

    def __init__(self, completion: Completion[T]) -> None:
        self._completion = completion

    def __await__(self) -> Generator[Any, None, T]:
        yield self
        return self._completion.result()


class Frame:
    """A handler coroutine in progress, with what it owns across suspensions."""

    __slots__ = (
        "box",
        "claimed",
        "context",
        "coro",
        "ctx",
        "ended",
        "on_done",
        "pool",
        "rec",
        "reserved",
        "resume_box",
    )

    def __init__(
        self,
        coro: Coroutine[Any, Any, object],
        ctx: TurnHost,
        context: Context,
        rec: Record,
        on_done: OnDone,
        pool: AppPool,
        resume_box: Mailbox,
    ) -> None:
        self.coro = coro
        self.ctx = ctx
        #: The turn's own context (it holds the runtime marker), kept across resumptions.
        self.context = context
        self.box = ctx._box
        self.rec = rec
        self.on_done = on_done
        self.pool = pool
        self.resume_box = resume_box
        self.reserved = False
        self.claimed = False
        self.ended = False
        ctx._frame = self

    def resume(self) -> bool:
        """Step the coroutine; True if the turn was handed off (gate SUSPENDED)."""
        coro = self.coro
        ctx = self.ctx
        run = self.context.run
        throw: BaseException | None = None
        while True:
            try:
                yielded = run(coro.send, None) if throw is None else run(coro.throw, throw)
            except StopIteration as stop:
                self._finish(stop.value, None)
                return False
            except BaseException as exc:
                self._finish(None, exc)
                return False
            if isinstance(yielded, Completion):
                self._hold_reservation()
                gate = ctx._gate
                with gate.lock:
                    gate.state = SUSPENDED
                    gate.frame = self
                    self.pool.hand_back(gate)
                yielded._add_inline(_Resume(self.pool, gate))
                return True
            if isinstance(yielded, YieldAwaitable):
                self._park(yielded._completion)
                return False
            throw = InvalidOperationError(
                f"a handler can await only zlink-actors calls, not {type(yielded).__name__}; "
                "run asyncio code with run_io_worker()"
            )

    def _hold_reservation(self) -> None:
        # The record is not terminal yet: its lane slot now belongs to this coroutine.
        rec = self.rec
        if rec.reserved:
            rec.reserved = False
            self.reserved = True

    def _park(self, completion: Completion[Any]) -> None:
        self._hold_reservation()
        box = self.box
        if box is not self.resume_box and not self.claimed:
            # A SpotWide member Actor keeps its queue claim across yield_().
            self.pool.claim(box)
            self.claimed = True
        self.pool.park()
        act = self.ctx._act
        if act.parked is None:
            act.parked = set()  # allocated on first use: idle objects stay small
        act.parked.add(self)
        completion._add_inline(self._enqueue_resume)

    def _unpark(self) -> bool:
        """Leave the parked set; True for the one caller that got it out (then unpark)."""
        parked = self.ctx._act.parked
        try:
            if parked is None:
                return False
            parked.remove(self)  # atomic: the resume and a close race here
        except KeyError:
            return False
        self.pool.unpark()
        return True

    def _enqueue_resume(self, _: Completion[Any]) -> None:
        if not self._unpark():
            return  # discarded when its object closed
        if not self.pool.force(self.resume_box, Resume(self)):
            self.discard(
                UnavailableError(
                    "the object closed while its handler waited", reason=UnavailableReason.CLOSED
                )
            )

    def discard(self, exc: BaseException) -> None:
        """The owner closed while parked: close the coroutine, end its record with `exc`
        (a request's caller hears it at once), release what it held. Idempotent."""
        self._unpark()
        if self.ended:
            return
        try:
            self.coro.close()
        except BaseException:
            log.exception("closing a parked handler coroutine raised")
        self._finish(None, exc)

    def _finish(self, value: object, exc: BaseException | None) -> None:
        self.ended = True
        try:
            self.on_done(value, exc)
        except BaseException:
            log.exception("post-turn work of %r failed", self.coro)
        self._release()

    def _release(self) -> None:
        if self.claimed:
            self.claimed = False
            self.pool.release_claim(self.box)
        if self.reserved:
            self.reserved = False
            self.pool.release_reservation(self.box)


class _Resume:
    """Wakes a SUSPENDED gate when the awaited result settles."""

    __slots__ = ("gate", "pool")

    def __init__(self, pool: AppPool, gate: Gate[Mailbox]) -> None:
        self.pool = pool
        self.gate = gate

    def __call__(self, _: Completion[Any]) -> None:
        self.pool.resume(self.gate)
