"""The terminators a request can end in, as a table (`TERMINATORS`), each behind one
interface: `terminator.caller(world)` prepares a `Caller`, and `caller.launch(make,
cancel)` starts `make(api).<terminator>(cancel)` and returns the call's `Outcome`.

- `submit()`: on the test's thread; the outcome is the `Completion`'s, recorded by a
  done-callback (which must run once).
- `submit_sync()`: on a thread of its own (an application thread), which blocks.
- `yield_()`: in an `async def` turn of a SpotWide `Driver` Spot on the caller's Host,
  where it is allowed (docs/turns.md "Yield eligibility"); the turn is started by
  `caller()`, before the test sets anything up, and waits for `launch`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from zlink_actors import CancelledError, Completion, RequestCall
from zlink_actors.testing import WAIT

from ._paths import World
from ._targets import Drive, Driver, DriverJob

__all__ = ["TERMINATORS", "Caller", "Make", "Outcome", "Terminator"]

#: Builds the call under test on `api` (a Host or a handler's context).
Make = Callable[[Any], RequestCall[Any]]


class Outcome:
    """How one call ended, as its terminator showed it: `value`, or `error` (`raised`:
    the terminator itself raised it, rather than completing with it)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.settled = 0
        self.value: object = None
        self.error: BaseException | None = None
        self.raised = False
        self.completion: Completion[Any] | None = None

    def settle(
        self, value: object = None, error: BaseException | None = None, raised: bool = False
    ) -> None:
        with self._lock:
            self.settled += 1
            if self.settled == 1:
                self.value, self.error, self.raised = value, error, raised
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, within: float = WAIT) -> bool:
        """True once the call ended (bounded)."""
        return self._done.wait(within)

    def result(self, within: float = WAIT) -> object:
        """The value, or raise the error (after a bounded wait, asserted)."""
        assert self.wait(within), "the call did not end"
        if self.error is not None:
            raise self.error
        return self.value

    def failure(self, within: float = WAIT) -> BaseException:
        """The error the call ended with (after a bounded wait, asserted)."""
        assert self.wait(within), "the call did not end"
        assert self.error is not None, f"the call ended with the value {self.value!r}"
        return self.error


class Caller:
    """Starts calls with one terminator from one place; `close()` ends what it started."""

    def launch(self, make: Make, cancel: Any = None) -> Outcome:
        raise NotImplementedError

    def close(self) -> None:
        """End whatever this caller left running (bounded)."""


class _Submit(Caller):
    def __init__(self, world: World) -> None:
        self.world = world

    def launch(self, make: Make, cancel: Any = None) -> Outcome:
        out = Outcome()
        try:
            completion = make(self.world.caller).submit(cancel)
        except BaseException as exc:
            out.settle(error=exc, raised=True)
            return out
        out.completion = completion

        def record(handle: Completion[Any]) -> None:
            if handle.cancelled():
                out.settle(error=CancelledError())
                return
            exc = handle.exception()
            if exc is None:
                out.settle(value=handle.result())
            else:
                out.settle(error=exc)

        completion.add_done_callback(record)
        return out


class _SubmitSync(Caller):
    def __init__(self, world: World) -> None:
        self.world = world
        self.threads: list[threading.Thread] = []

    def launch(self, make: Make, cancel: Any = None) -> Outcome:
        out = Outcome()

        def run() -> None:
            try:
                value = make(self.world.caller).submit_sync(cancel)
            except BaseException as exc:
                out.settle(error=exc, raised=True)
            else:
                out.settle(value=value)

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        return out

    def close(self) -> None:
        self.world.journal.release_all()
        for thread in self.threads:
            thread.join(WAIT + 5)
            assert not thread.is_alive(), "a submit_sync() caller did not return"


class _Driver:
    """A `Driver` Spot on the caller's Host whose turn has started and waits for work."""

    _ids = 0

    def __init__(self, world: World) -> None:
        _Driver._ids += 1
        self.spot_id = f"driver-{_Driver._ids}"
        world.caller.spots.get_or_create(self.spot_id, Driver).submit_sync()
        self.job = DriverJob()
        world.caller.send_to_spot(self.spot_id, Drive(self.job.key)).submit_sync()
        assert self.job.entered.wait(WAIT), "the driver's turn never started"


class InHandler(Caller):
    """Runs work in `Driver` turns on the caller's Host. The first turn starts here,
    before the test sets anything up (so it is work the Host accepted before a shutdown);
    each further `launch` / `run` starts another one."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._next: _Driver | None = _Driver(world)

    def _turn(self) -> _Driver:
        driver = self._next if self._next is not None else _Driver(self.world)
        self._next = None
        return driver

    def run(self, body: Callable[[Any], Awaitable[object]]) -> Outcome:
        """Run `await body(ctx)` in a driver turn; what it returns or raises is the
        outcome (raised=True: it came out of the turn's own code)."""
        out = Outcome()

        async def work(ctx: Any) -> None:
            try:
                value = await body(ctx)
            except Exception as exc:
                out.settle(error=exc, raised=True)
            else:
                out.settle(value=value)

        assert self._turn().job.go(work)
        return out

    def launch(self, make: Make, cancel: Any = None) -> Outcome:
        out = Outcome()

        async def work(ctx: Any) -> None:
            try:
                awaitable = make(ctx).yield_(cancel)
            except Exception as exc:
                out.settle(error=exc, raised=True)
                return
            try:
                value = await awaitable
            except Exception as exc:
                out.settle(error=exc)
            else:
                out.settle(value=value)

        assert self._turn().job.go(work)
        return out

    def close(self) -> None:
        if self._next is not None:
            self._next.job.go(None)  # a turn still waiting for work ends


@dataclasses.dataclass(frozen=True)
class Terminator:
    """One row of the table: a terminator and how it reports an operation's failure."""

    name: str
    caller: Callable[[World], Caller]
    #: True when the terminator raises the operation's failure itself (`submit_sync()`),
    #: False when it returns normally and the result carries it (docs/errors.md "Usage
    #: errors raise; operational failures complete the Completion").
    raises_failures: bool
    #: True when the caller learns the outcome in a record of the caller's Host (the
    #: resume of a yielding turn), which a forced stop of that Host discards
    #: (docs/completion.md "What a forced stop skips").
    resumes_on_caller: bool = False


TERMINATORS: tuple[Terminator, ...] = (
    Terminator("submit", _Submit, raises_failures=False),
    Terminator("submit_sync", _SubmitSync, raises_failures=True),
    Terminator("yield_", InHandler, raises_failures=False, resumes_on_caller=True),
)
