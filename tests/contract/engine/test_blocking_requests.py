"""Blocking requests: `request_to_spot(...).submit_sync()` (digest §5 "Requests"; SC §9-11).

On a Host that runs on the real clock, an application thread's `submit_sync()` with no
`cancel=` token takes the blocking path: one record that is also the pending entry and
the result, and no timer. The caller keeps the deadline in its own timed wait and then
races for the one terminal like any other path. These tests hold it to the request
contract: one outcome per call, late replies dropped, the pending table left empty. The
last ones make the same calls on the general path (a `ManualClock`, a `cancel=` token).

`paths` counts the calls that took the blocking path, so each test also checks which path
it covered.
"""

import _thread
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    CapacityExceededError,
    DeadlineExceededError,
    ErrorKind,
    Host,
    InternalFailureError,
    InvalidOperationError,
    ManualClock,
    NotFoundError,
    ProtocolError,
    RequestCall,
    ShutdownOutcome,
    ShutdownResult,
    ShuttingDownError,
    Spot,
    SpotContext,
    UnavailableError,
    UnavailableReason,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from .._support import CtrlC
from ._support import NEGATIVE_WAIT, Hold, Note, Ping, Pong, Probe

#: A bound on how long a blocking call may overrun the moment it should end.
PROMPT = 2.0


class Fail(msgspec.Struct, frozen=True):
    kind: str


class Nested(msgspec.Struct, frozen=True):
    """Asks a handler to try a blocking request itself."""


class Lag(msgspec.Struct, frozen=True):
    """Asks a handler to take `seconds` before it replies `Pong(n)`."""

    n: int
    seconds: float


class Slow(msgspec.Struct, frozen=True):
    """An `async def` handler's message."""

    n: int = 0


class PathSpy:
    """Counts the calls that took the blocking path (`RequestCall._request_sync`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fast = 0

    @property
    def fast(self) -> int:
        with self._lock:
            return self._fast

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(call: Any, *args: Any) -> Any:
            with self._lock:
                self._fast += 1
            return original(call, *args)

        return counted


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> PathSpy:
    spy = PathSpy()
    monkeypatch.setattr(RequestCall, "_request_sync", spy.wrap(RequestCall._request_sync))
    return spy


class Desk:
    """A Spot class built per test: `Hold` blocks on a latch, then replies "late"."""

    def __init__(self, harness: HostHarness) -> None:
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.pings: list[int] = []
        self.pinged = threading.Event()
        self.lagged: list[int] = []
        self.replied: list[str] = []
        self.raised: list[BaseException] = []
        self.nested: list[str] = []
        desk = self

        class Room(Spot):
            @handler
            def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
                desk.pings.append(msg.n)
                desk.pinged.set()
                return Pong(msg.n)

            @handler
            def lag(self, ctx: SpotContext, msg: Lag) -> Pong:
                desk.lagged.append(msg.n)
                # Reply latency, not synchronisation: it only spreads the replies around
                # the caller's deadline, and every outcome is checked whatever it is.
                time.sleep(msg.seconds)
                return Pong(msg.n)

            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> str:
                desk.entered.set()
                desk.latch.wait(WAIT)
                desk.replied.append("late")
                return "late"

            @handler
            def fail(self, ctx: SpotContext, msg: Fail) -> None:
                exc: Exception = (
                    NotFoundError("the handler could not find it")
                    if msg.kind == "not_found"
                    else ValueError("bad value")
                )
                desk.raised.append(exc)
                raise exc

            @handler
            async def slow(self, ctx: SpotContext, msg: Slow) -> int:
                return msg.n * 2

            @handler
            def nested(self, ctx: SpotContext, msg: Nested) -> str:
                try:
                    ctx.request_to_spot("room", Probe()).submit_sync()
                except InvalidOperationError:
                    desk.nested.append("refused")
                    return "refused"
                desk.nested.append("answered")
                return "answered"

            @handler
            def probe(self, ctx: SpotContext, msg: Probe) -> list[str]:
                return list(desk.replied)

        self.cls = Room


def _room(harness: HostHarness, **options: object) -> tuple[Host, Desk]:
    desk = Desk(harness)
    host = harness.host(spots=[desk.cls], **options)
    host.spots.get_or_create("room", desk.cls).submit_sync()
    return host, desk


def _pending(host: Host) -> int:
    return len(host._runtime.pending)


def _in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _join(thread: threading.Thread) -> None:
    thread.join(WAIT)
    assert not thread.is_alive()


# -- replies -------------------------------------------------------------------------------


def test_blocking_request_returns_the_handlers_reply(harness: HostHarness, paths: PathSpy) -> None:
    host, _ = _room(harness)
    assert host._runtime.real_time

    assert host.request_to_spot("room", Ping(7)).submit_sync() == Pong(7)
    assert paths.fast == 1
    assert _pending(host) == 0


def test_blocking_request_with_a_matching_reply_type_returns_the_typed_reply(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, _ = _room(harness)

    reply = host.request_to_spot("room", Ping(3), reply=Pong).submit_sync()

    assert type(reply) is Pong
    assert reply == Pong(3)
    assert paths.fast == 1


def test_blocking_request_with_a_mismatched_reply_type_raises_protocol_error(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)

    with pytest.raises(ProtocolError) as raised:
        host.request_to_spot("room", Ping(4), reply=Note).submit_sync()

    assert raised.value.kind is ErrorKind.PROTOCOL_ERROR
    assert desk.pings == [4]  # the handler ran; only its reply was refused
    assert paths.fast == 1
    assert _pending(host) == 0
    assert host.request_to_spot("room", Ping(5), reply=Pong).submit_sync() == Pong(5)


def test_blocking_request_to_an_async_handler_returns_its_result(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, _ = _room(harness)

    assert host.request_to_spot("room", Slow(21), reply=int).submit_sync() == 42
    assert paths.fast == 1
    assert _pending(host) == 0


def test_blocking_requests_from_many_threads_each_get_their_own_reply(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, _ = _room(harness)
    callers, rounds = 8, 50
    start = threading.Barrier(callers)
    wrong: list[tuple[int, object]] = []
    finished: list[int] = []

    def caller(c: int) -> None:
        start.wait(WAIT)
        for i in range(rounds):
            n = c * 1000 + i
            reply = host.request_to_spot("room", Ping(n), reply=Pong).submit_sync()
            if reply != Pong(n):
                wrong.append((n, reply))
        finished.append(c)

    threads = [threading.Thread(target=caller, args=(c,), daemon=True) for c in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        _join(thread)

    assert sorted(finished) == list(range(callers))
    assert wrong == []
    assert paths.fast == callers * rounds
    assert _pending(host) == 0


# -- handler failures ----------------------------------------------------------------------


def test_handler_raising_a_plain_exception_fails_with_internal_failure_and_its_cause(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)
    before = host.statistics().handler_failures

    with pytest.raises(InternalFailureError) as raised:
        host.request_to_spot("room", Fail("value")).submit_sync()

    assert raised.value.__cause__ is desk.raised[0]
    assert isinstance(raised.value.__cause__, ValueError)
    assert host.statistics().handler_failures == before + 1
    assert paths.fast == 1
    assert _pending(host) == 0


def test_handler_raising_a_zlink_error_fails_the_blocking_request_with_that_error(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)

    with pytest.raises(NotFoundError) as raised:
        host.request_to_spot("room", Fail("not_found")).submit_sync()

    assert raised.value is desk.raised[0]
    assert paths.fast == 1
    assert _pending(host) == 0


def test_blocking_request_inside_a_handler_raises_invalid_operation(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)

    assert host.request_to_spot("room", Nested(), reply=str).submit_sync() == "refused"
    assert desk.nested == ["refused"]
    assert paths.fast == 1  # the outer call only: a handler never takes the blocking path


# -- deadlines -----------------------------------------------------------------------------


def test_blocking_request_past_its_deadline_raises_deadline_exceeded_and_drops_the_late_reply(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)

    started = time.monotonic()
    with pytest.raises(DeadlineExceededError) as raised:
        host.request_to_spot("room", Hold()).timeout(0.05).submit_sync()
    elapsed = time.monotonic() - started

    assert isinstance(raised.value, TimeoutError)
    assert 0.05 <= elapsed < PROMPT
    assert desk.entered.wait(WAIT)
    assert _pending(host) == 0
    desk.latch.set()
    # FIFO: once the probe is answered the held handler has replied, and that was dropped.
    assert host.request_to_spot("room", Probe()).submit_sync() == ["late"]
    assert host.request_to_spot("room", Ping(1), reply=Pong).submit_sync() == Pong(1)
    assert paths.fast == 3
    assert _pending(host) == 0
    assert host.statistics().handler_failures == 0


@pytest.mark.stress
def test_deadline_racing_the_reply_completes_each_blocking_request_exactly_once(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)
    rounds = 200
    outcomes = {"reply": 0, "deadline": 0}
    replied: set[int] = set()

    for n in range(rounds):
        # A 1 ms deadline, and replies that take from 0 to 1.9 ms: both sides win often.
        call = host.request_to_spot("room", Lag(n, 0.0001 * (n % 20)), reply=Pong)
        try:
            reply = call.timeout(0.001).submit_sync()
        except DeadlineExceededError:
            outcomes["deadline"] += 1
        else:
            assert reply == Pong(n)  # never an earlier round's late reply
            outcomes["reply"] += 1
            replied.add(n)
        assert _pending(host) == 0

    # Every handler ran at most once, in order, and every one that replied ran; a request
    # whose deadline passed before its turn never ran; late replies were dropped.
    assert host.request_to_spot("room", Probe()).submit_sync() == []
    assert desk.lagged == sorted(set(desk.lagged))
    assert replied <= set(desk.lagged)
    assert outcomes["reply"] + outcomes["deadline"] == rounds
    assert outcomes["reply"] > 0
    assert outcomes["deadline"] > 0
    assert paths.fast == rounds + 1
    assert _pending(host) == 0
    assert host.statistics().handler_failures == 0


def test_blocking_request_at_the_longest_timed_wait_still_returns_the_reply(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, _ = _room(harness)

    reply = host.request_to_spot("room", Ping(9)).timeout(threading.TIMEOUT_MAX).submit_sync()

    assert reply == Pong(9)
    assert paths.fast == 1
    assert _pending(host) == 0


# -- refusals ------------------------------------------------------------------------------


def test_blocking_request_to_a_full_queue_raises_capacity_exceeded_at_once(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness, application_lane_items=2)
    held = host.send_to_spot("room", Hold()).submit()
    assert desk.entered.wait(WAIT)
    queued = host.send_to_spot("room", Ping(0)).submit()
    assert held.done()
    assert queued.done()  # both admitted: the lane is full now

    started = time.monotonic()
    with pytest.raises(CapacityExceededError):
        host.request_to_spot("room", Ping(1)).submit_sync()
    assert time.monotonic() - started < PROMPT
    assert paths.fast == 1
    assert _pending(host) == 0

    desk.latch.set()
    # Once the queued ping runs, the held handler's slot is free: one of two is taken.
    assert desk.pinged.wait(WAIT)
    assert host.request_to_spot("room", Ping(2), reply=Pong).submit_sync() == Pong(2)
    assert desk.pings == [0, 2]


def test_blocking_request_to_no_such_spot_raises_not_found(harness: HostHarness) -> None:
    host, _ = _room(harness)

    with pytest.raises(NotFoundError):
        host.request_to_spot("nope", Ping()).submit_sync()
    assert _pending(host) == 0


def test_blocking_request_to_a_closed_spot_raises_not_found(harness: HostHarness) -> None:
    host, _ = _room(harness)
    assert host.spots.close("room").submit_sync() is True

    with pytest.raises(NotFoundError):
        host.request_to_spot("room", Ping()).submit_sync()
    assert _pending(host) == 0


def test_blocking_request_to_a_closing_spot_raises_not_found(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)
    held = host.send_to_spot("room", Hold()).submit()
    assert desk.entered.wait(WAIT)
    closing = host.spots.close("room").submit()  # waits for the held handler's turn
    assert held.done()
    assert not closing.done()

    with pytest.raises(NotFoundError):
        host.request_to_spot("room", Ping(1)).submit_sync()
    assert paths.fast == 1  # still registered: refused by its queue, not looked up
    assert _pending(host) == 1  # the close itself (a pending call); the request left none

    desk.latch.set()
    assert closing.result(WAIT) is True
    assert desk.pings == []


def test_blocking_request_queued_when_its_spot_closes_raises_unavailable(
    harness: HostHarness, paths: PathSpy, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, desk = _room(harness)
    held = host.send_to_spot("room", Hold()).submit()
    assert desk.entered.wait(WAIT)
    assert held.done()
    pool = host._runtime.pool
    enqueue = pool.enqueue
    queued = threading.Event()

    def noting_enqueue(*args: Any, **kwargs: Any) -> int:
        status: int = enqueue(*args, **kwargs)
        queued.set()
        return status

    outcome: list[object] = []

    def caller() -> None:
        try:
            outcome.append(host.request_to_spot("room", Ping(1)).timeout(WAIT).submit_sync())
        except BaseException as exc:
            outcome.append(exc)

    with monkeypatch.context() as patch:
        patch.setattr(pool, "enqueue", noting_enqueue)
        thread = _in_thread(caller)
        assert queued.wait(WAIT)  # the request is queued behind the held handler
    closing = host.spots.close("room").submit()
    desk.latch.set()

    assert closing.result(WAIT) is True
    _join(thread)
    assert len(outcome) == 1
    assert isinstance(outcome[0], UnavailableError)
    assert outcome[0].reason is UnavailableReason.CLOSED
    assert paths.fast == 1
    assert desk.pings == []
    assert _pending(host) == 0


def test_host_shutdown_ends_a_blocked_caller_with_shutting_down(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)
    results: list[ShutdownResult] = []

    def stop() -> None:
        if desk.entered.wait(WAIT):
            results.append(host.shutdown(deadline=0.1))

    stopper = _in_thread(stop)
    started = time.monotonic()
    with pytest.raises(ShuttingDownError):
        host.request_to_spot("room", Hold()).timeout(WAIT).submit_sync()
    elapsed = time.monotonic() - started

    assert elapsed < PROMPT
    assert _pending(host) == 0
    desk.latch.set()  # the held handler's late reply finds nothing to complete
    _join(stopper)
    assert len(results) == 1
    assert results[0].forced_operations == 1
    assert results[0].outcome is ShutdownOutcome.FORCE_STOPPED
    assert paths.fast == 1


# -- interruption --------------------------------------------------------------------------


@pytest.mark.usefixtures("default_sigint")
def test_keyboard_interrupt_while_blocked_cancels_the_call_and_the_late_reply_is_dropped(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)
    main = threading.main_thread().ident
    assert main is not None
    ctrl_c = CtrlC()

    def interrupt() -> None:
        # The handler runs only once the record is queued: the caller is in its wait.
        if desk.entered.wait(WAIT):
            ctrl_c.send(main)

    previous = signal.signal(signal.SIGINT, ctrl_c.handle)
    try:
        interrupter = _in_thread(interrupt)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            host.request_to_spot("room", Hold()).timeout(WAIT).submit_sync()
        elapsed = time.monotonic() - started
        assert _pending(host) == 0
        _join(interrupter)  # every repeat was sent, and met the handler that ignores it
    finally:
        signal.signal(signal.SIGINT, previous)

    assert elapsed < PROMPT
    assert ctrl_c.raised.is_set()
    desk.latch.set()
    assert host.request_to_spot("room", Probe()).submit_sync() == ["late"]
    assert host.request_to_spot("room", Ping(1), reply=Pong).submit_sync() == Pong(1)
    assert paths.fast == 3
    assert _pending(host) == 0
    assert host.statistics().handler_failures == 0


@pytest.mark.usefixtures("default_sigint")
def test_keyboard_interrupt_noticed_as_the_deadline_passes_still_empties_the_table(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)

    def interrupt() -> None:
        if desk.entered.wait(WAIT):
            _thread.interrupt_main()  # noticed when the caller's timed wait ends

    interrupter = _in_thread(interrupt)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        host.request_to_spot("room", Hold()).timeout(0.2).submit_sync()
    elapsed = time.monotonic() - started

    assert elapsed < PROMPT
    assert _pending(host) == 0
    _join(interrupter)
    desk.latch.set()
    assert host.request_to_spot("room", Probe()).submit_sync() == ["late"]
    assert paths.fast == 2
    assert _pending(host) == 0


# -- the general path ----------------------------------------------------------------------


def test_blocking_request_on_a_manual_clock_host_returns_the_reply(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, _ = _room(harness, clock=ManualClock())
    assert not host._runtime.real_time

    assert host.request_to_spot("room", Ping(6), reply=Pong).submit_sync() == Pong(6)
    assert host.request_to_spot("room", Ping(7)).timeout(1.0).submit_sync() == Pong(7)
    assert paths.fast == 0
    assert _pending(host) == 0


def test_blocking_request_on_a_manual_clock_host_keeps_its_deadline_on_that_clock(
    harness: HostHarness, paths: PathSpy
) -> None:
    clock = ManualClock()
    host, desk = _room(harness, clock=clock)
    outcome: list[object] = []
    done = threading.Event()

    def caller() -> None:
        try:
            outcome.append(host.request_to_spot("room", Hold()).timeout(0.01).submit_sync())
        except BaseException as exc:
            outcome.append(exc)
        done.set()

    thread = _in_thread(caller)
    assert desk.entered.wait(WAIT)
    assert not done.wait(NEGATIVE_WAIT)  # 0.01 s of wall time is not 0.01 s on the clock

    clock.advance(0.01)
    assert done.wait(WAIT)
    _join(thread)
    assert len(outcome) == 1
    assert isinstance(outcome[0], DeadlineExceededError)
    assert paths.fast == 0
    assert _pending(host) == 0


def test_blocking_request_with_an_uncancelled_token_returns_the_reply(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, _ = _room(harness)
    source = CancellationSource()

    reply = host.request_to_spot("room", Ping(8), reply=Pong).submit_sync(cancel=source.token)

    assert reply == Pong(8)
    assert paths.fast == 0
    assert _pending(host) == 0


def test_cancelling_the_token_of_a_blocked_request_raises_cancelled(
    harness: HostHarness, paths: PathSpy
) -> None:
    host, desk = _room(harness)
    source = CancellationSource()

    def cancel() -> None:
        if desk.entered.wait(WAIT):
            source.cancel()

    canceller = _in_thread(cancel)
    with pytest.raises(CancelledError):
        host.request_to_spot("room", Hold()).timeout(WAIT).submit_sync(cancel=source.token)

    _join(canceller)
    assert _pending(host) == 0
    desk.latch.set()
    assert host.request_to_spot("room", Probe()).submit_sync() == ["late"]
    assert paths.fast == 1  # the probe only


@pytest.mark.parametrize("terminator", ["submit", "submit_sync"])
def test_an_interrupt_before_the_request_is_queued_leaves_nothing_pending(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch, terminator: str
) -> None:
    # KeyboardInterrupt can land between registration and queueing; the caller then
    # holds no handle, so the entry must not stay pending (shutdown would wait for it).
    host, _ = _room(harness)
    pool = host._runtime.pool

    def interrupted(*args: object, **kwargs: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "enqueue", interrupted)
    call = host.request_to_spot("room", Ping(1))
    with pytest.raises(KeyboardInterrupt):
        getattr(call, terminator)()
    monkeypatch.undo()

    assert _pending(host) == 0
    assert host.request_to_spot("room", Ping(2), reply=Pong).submit_sync() == Pong(2)
