"""Records: the units of work a mailbox holds, one class per kind.

A pool thread hands each record it takes to the record runner (`_engine/runner.py`),
which dispatches on `kind`. Requests are records too, but they also carry their pending
entry and result, so they live with the pending table (`pending.Request`,
`pending.SyncRequest`); they have the same three fields as `Message`.

| kind         | class            | fields                                             |
|--------------|------------------|----------------------------------------------------|
| `K_MESSAGE`  | `Message`        | `payload`, `metadata`, `handler`                   |
| `K_REQUEST`  | `pending.Request`| `payload`, `metadata`, `handler` (+ its reply)     |
| `K_CALLBACK` | `CallbackRecord` | `fn` (the done-callback), `completion` (its arg)   |
| `K_RESUME`   | `Resume`         | `frame` (a coroutine continuing after `yield_()`)  |
| `K_TICK`     | `Tick`           | `timer`, `tick`                                    |
| `K_CALL`     | `Job`            | `fn` (runs with the instance and a context), `on_done` |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Final, Protocol

__all__ = [
    "K_CALL",
    "K_CALLBACK",
    "K_MESSAGE",
    "K_REQUEST",
    "K_RESUME",
    "K_TICK",
    "CallbackRecord",
    "Handler",
    "Job",
    "Message",
    "OnDone",
    "Record",
    "Resumable",
    "Resume",
    "Tick",
    "TickSource",
]

K_MESSAGE: Final = 0
K_REQUEST: Final = 1
K_CALLBACK: Final = 2
K_RESUME: Final = 3
K_TICK: Final = 4
K_CALL: Final = 5

#: A turn's post-turn work: called once with the turn's value or its exception.
OnDone = Callable[[object, BaseException | None], None]


class Handler(Protocol):
    """What a message or request record runs: `fn(instance, context, payload)`."""

    @property
    def fn(self) -> Callable[..., object]: ...


class Resumable(Protocol):
    """A suspended handler coroutine (`_engine/driver.Frame`)."""

    def resume(self) -> bool: ...

    def discard(self, exc: BaseException) -> None: ...


class TickSource(Protocol):
    """A Spot timer as its tick records see it (`_engine/spot_timers`)."""

    @property
    def cancelled(self) -> bool: ...

    @property
    def callback(self) -> Callable[..., object]: ...

    def tick_done(self, value: object, exc: BaseException | None) -> None: ...


#: The base record's slots: none. (A name, not a literal, so that the type checker lets
#: code assign `reserved`, which every concrete record class declares.)
_NO_SLOTS: tuple[str, ...] = ()


class Record:
    """One unit of work in a lane. Subclasses name their fields, set `kind` and give the
    `reserved` slot (the base has none, so that a request can also be a result cell)."""

    __slots__ = _NO_SLOTS

    kind: ClassVar[int]
    #: True while this record holds an application-lane reservation.
    reserved: bool

    def reply(self, value: object, exc: BaseException | None) -> None:
        """A request record's post-turn work: deliver the handler's outcome."""
        raise AssertionError(f"record kind {self.kind} carries no reply")

    def drop(self, exc: BaseException) -> None:
        """A request record that will never run: its caller hears `exc`."""
        raise AssertionError(f"record kind {self.kind} carries no reply")


class Message(Record):
    """A one-way message: `handler.fn(instance, ctx, payload)`."""

    __slots__ = ("handler", "metadata", "payload", "reserved")

    kind = K_MESSAGE

    def __init__(
        self, payload: object, metadata: dict[str, object] | None, handler: Handler
    ) -> None:
        self.reserved = False
        self.payload = payload
        self.metadata = metadata
        self.handler = handler


class CallbackRecord(Record):
    """A done-callback registered in a turn, run as a turn of the same owner."""

    __slots__ = ("completion", "fn", "reserved")

    kind = K_CALLBACK

    def __init__(self, fn: Callable[[object], object], completion: object) -> None:
        self.reserved = False
        self.fn = fn
        self.completion = completion


class Resume(Record):
    """A handler coroutine continuing after `yield_()` released its gate."""

    __slots__ = ("frame", "reserved")

    kind = K_RESUME

    def __init__(self, frame: Resumable) -> None:
        self.reserved = False
        self.frame = frame


class Tick(Record):
    """One due tick of a Spot timer."""

    __slots__ = ("reserved", "tick", "timer")

    kind = K_TICK

    def __init__(self, timer: TickSource, tick: object) -> None:
        self.reserved = False
        self.timer = timer
        self.tick = tick


class Job(Record):
    """Framework work under an owner's gate (creation hooks, `on_closing`, Join steps):
    `fn(instance, ctx)`, then `on_done(value, exc)`."""

    __slots__ = ("fn", "on_done", "reserved")

    kind = K_CALL

    def __init__(self, fn: Callable[..., object], on_done: OnDone) -> None:
        self.reserved = False
        self.fn = fn
        self.on_done = on_done
