"""The payloads, the target every path calls, and the driver that runs `yield_()`.

One behaviour (`Behaviour`) is mixed into a Spot, a node handler and a channel handler,
so every path calls the same handlers: `Ask` replies, `Fail` raises, `Hold` blocks on a
latch of the test, `Mark` notes that it ran. What they do goes to the test's `Journal`
(`_global_objects.journal()`, installed by each world), keyed by the message's tag.

`Driver` is a SpotWide Spot on the caller's Host whose `async def` turn runs a job the
test hands it (`DriverJob`): the `yield_()` terminator and the terminators refused inside
a handler run there.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import msgspec

from zlink_actors import (
    ChannelHandler,
    CompletionSource,
    NodeHandler,
    NotFoundError,
    RejectedError,
    Spot,
    SpotContext,
    SpotMode,
    UnavailableError,
    UnavailableReason,
    handler,
)
from zlink_actors.testing import WAIT

from ..contract.mesh._global_objects import journal

__all__ = [
    "PAYLOADS",
    "Ask",
    "Drive",
    "Driver",
    "DriverJob",
    "Fail",
    "Hold",
    "Mark",
    "Nap",
    "Stray",
    "TargetChannel",
    "TargetNode",
    "TargetSpot",
]


class Ask(msgspec.Struct, frozen=True):
    """Replies `n + 1`; journals `asked` (n)."""

    n: int


class Fail(msgspec.Struct, frozen=True):
    """Raises the exception `RAISED[error]` names."""

    error: str


class Hold(msgspec.Struct, frozen=True):
    """Journals `entered` (tag), then `cancelled` (tag) once its `ctx.cancellation` is
    cancelled, waits for the latch `tag`, journals `left` (tag) and replies "held"."""

    tag: str


class Mark(msgspec.Struct, frozen=True):
    """Journals `ran` (tag) and replies the tag: a request whose handler must not start."""

    tag: str


class Nap(msgspec.Struct, frozen=True):
    """Takes `seconds` (a handler that works a while), then replies `n`; journals
    `napped` (n) as it starts."""

    n: int
    seconds: float


class Stray(msgspec.Struct, frozen=True):
    """A payload every Host knows and no target handles."""


class Drive(msgspec.Struct, frozen=True):
    """Starts the driver turn that runs job `key`."""

    key: int


#: Every payload type; every Host of a world knows them all (it encodes only those).
PAYLOADS: tuple[type, ...] = (Ask, Fail, Hold, Mark, Nap, Stray, Drive)

#: What `Fail(error)` raises.
RAISED: dict[str, Callable[[], BaseException]] = {
    "rejected": lambda: RejectedError("card declined"),
    "not_found": lambda: NotFoundError("no such account"),
    "unavailable": lambda: UnavailableError(
        "the ledger is contended", reason=UnavailableReason.CONTENDED
    ),
    "value_error": lambda: ValueError("a plain bug"),
    "keyboard_interrupt": KeyboardInterrupt,
}


class Behaviour:
    """The handlers every target has, whatever it is (Spot, node or channel handler)."""

    @handler
    def ask(self, ctx: Any, msg: Ask) -> int:
        journal().note("asked", msg.n)
        return msg.n + 1

    @handler
    def fail(self, ctx: Any, msg: Fail) -> int:
        raise RAISED[msg.error]()

    @handler
    def hold(self, ctx: Any, msg: Hold) -> str:
        log = journal()
        log.note("entered", msg.tag)
        ctx.cancellation.register(lambda: log.note("cancelled", msg.tag))
        assert log.latch(msg.tag).wait(WAIT + 5), f"latch {msg.tag!r} was never set"
        log.note("left", msg.tag)
        return "held"

    @handler
    def nap(self, ctx: Any, msg: Nap) -> int:
        journal().note("napped", msg.n)
        time.sleep(msg.seconds)  # the work itself, not a wait for anything
        return msg.n

    @handler
    def mark(self, ctx: Any, msg: Mark) -> str:
        journal().note("ran", msg.tag)
        return msg.tag


class TargetSpot(Behaviour, Spot):
    """The target of the local and the global path (one turn at a time)."""

    type_name = "conformance.TargetSpot"
    mode = SpotMode.SPOT_WIDE


class TargetNode(Behaviour, NodeHandler):
    """The target of the node-direct path (a node handler runs one turn at a time)."""


class TargetChannel(Behaviour, ChannelHandler):
    """The target of the channel path (a channel handler runs one turn at a time)."""


class DriverJob:
    """One job for a `Driver` turn: `entered` is set once the turn runs; `go(work)` hands
    it `work(ctx)`, awaited in that turn (`go(None)`: the turn ends with nothing done)."""

    _keys = itertools.count(1)
    _jobs: ClassVar[dict[int, DriverJob]] = {}
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._go: CompletionSource[Callable[[Any], Awaitable[None]] | None] = CompletionSource()
        with DriverJob._lock:
            self.key = next(DriverJob._keys)
            DriverJob._jobs[self.key] = self

    @classmethod
    def take(cls, key: int) -> DriverJob:
        with cls._lock:
            return cls._jobs.pop(key)

    def go(self, work: Callable[[Any], Awaitable[None]] | None) -> bool:
        """Hand the turn its work; False if it had some already."""
        return self._go.set_result(work)

    async def run(self, ctx: SpotContext) -> None:
        self.entered.set()
        work = await self._go.completion  # keeps the turn until the test says go
        if work is not None:
            await work(ctx)


class Driver(Spot):
    """Runs `DriverJob`s in `async def` turns of a SpotWide Spot, where `yield_()` is
    allowed (docs/turns.md "Yield eligibility")."""

    type_name = "conformance.Driver"
    mode = SpotMode.SPOT_WIDE

    @handler
    async def drive(self, ctx: SpotContext, msg: Drive) -> None:
        await DriverJob.take(msg.key).run(ctx)
