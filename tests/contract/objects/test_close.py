"""Close as a call: its own deadline and cancellation, and a close made from the closing
object's own turn (docs/object-model.md, "Closing").

A close is a call like a request: its deadline or its caller's cancellation, when it wins
before `on_closing` began, ends the call and the close does not happen (the object then
admits work again). Once `on_closing` began the close completes with True. A close of
your own object from inside its own turn completes when it is accepted, and `on_closing`
runs after the turn: awaiting it never deadlocks.
"""

import threading
from typing import Any

import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    CloseReason,
    DeadlineExceededError,
    ManualClock,
    NotFoundError,
    ShutdownOutcome,
    SpotContext,
    handler,
)
from zlink_actors._engine import lifecycle as _lifecycle
from zlink_actors.testing import WAIT, HostHarness

from ._support import (
    KINDS,
    NEGATIVE_WAIT,
    Hold,
    Ping,
    Probe,
    base_class,
    host_with,
    manager_of,
    own_id,
    request_to,
)


def _own_manager(ctx: Any) -> Any:
    return ctx.spots if isinstance(ctx, SpotContext) else ctx.actors


@pytest.mark.parametrize("kind", KINDS)
def test_awaiting_a_close_of_your_own_object_completes_when_accepted(
    harness: HostHarness, kind: str
) -> None:
    log: list[object] = []
    closed = threading.Event()

    class SelfClosing(base_class(kind)):  # type: ignore[misc]
        @handler
        async def quit(self, ctx: Any, msg: Ping) -> bool:
            # Even with a deadline of its own the close must not wait for this turn.
            done: bool = await _own_manager(ctx).close(own_id(ctx)).timeout(1).submit()
            log.append(("closed?", done))
            return done

        def on_closing(self, ctx: Any, reason: CloseReason) -> None:
            log.append(("on_closing", reason))
            closed.set()

    host = host_with(harness, kind, SelfClosing)
    manager_of(host, kind).get_or_create("x", SelfClosing).submit_sync()

    assert request_to(host, kind, "x", Ping()).submit_sync() is True
    assert closed.wait(WAIT)
    # on_closing ran after the turn that asked for it ended.
    assert log == [("closed?", True), ("on_closing", CloseReason.EXPLICIT_CLOSE)]
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()
    assert host.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED


@pytest.mark.parametrize("kind", KINDS)
def test_a_close_of_your_own_object_that_is_not_awaited_still_closes(
    harness: HostHarness, kind: str
) -> None:
    closed = threading.Event()

    class SelfClosing(base_class(kind)):  # type: ignore[misc]
        @handler
        def quit(self, ctx: Any, msg: Ping) -> None:
            _own_manager(ctx).close(own_id(ctx)).submit()

        def on_closing(self, ctx: Any, reason: CloseReason) -> None:
            closed.set()

    host = host_with(harness, kind, SelfClosing)
    manager_of(host, kind).get_or_create("x", SelfClosing).submit_sync()

    request_to(host, kind, "x", Ping()).submit_sync()
    assert closed.wait(WAIT)
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()


class _Busy:
    """A handler held on a latch, and an `on_closing` that reports and can be held."""

    def __init__(self, harness: HostHarness) -> None:
        self.entered = threading.Event()
        self.latch = harness.latch()
        self.closing_started = threading.Event()
        self.closing_latch = harness.latch()
        self.closing_latch.set()
        self.probes = 0


def _busy_type(kind: str, busy: _Busy) -> type:
    class Busy(base_class(kind)):  # type: ignore[misc]
        @handler
        def hold(self, ctx: Any, msg: Hold) -> None:
            busy.entered.set()
            assert busy.latch.wait(WAIT)

        @handler
        def probe(self, ctx: Any, msg: Probe) -> int:
            busy.probes += 1
            return busy.probes

        def on_closing(self, ctx: Any, reason: CloseReason) -> None:
            busy.closing_started.set()
            assert busy.closing_latch.wait(WAIT)

    return Busy


def _held(harness: HostHarness, kind: str, **options: object) -> tuple[Any, _Busy, Any]:
    """A Host with object "x" of a `_Busy` type whose handler is held on its latch:
    (host, busy, the held request)."""
    busy = _Busy(harness)
    cls = _busy_type(kind, busy)
    host = host_with(harness, kind, cls, **options)
    manager_of(host, kind).get_or_create("x", cls).submit_sync()
    held = request_to(host, kind, "x", Hold()).timeout(60).submit()
    assert busy.entered.wait(WAIT)
    return host, busy, held


@pytest.mark.parametrize("kind", KINDS)
def test_a_close_whose_deadline_passes_before_on_closing_does_not_happen(
    harness: HostHarness, kind: str
) -> None:
    clock = ManualClock()
    host, busy, held = _held(harness, kind, clock=clock)

    closing = manager_of(host, kind).close("x").timeout(0.3).submit()
    # While the close is pending the object refuses new work.
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()
    clock.advance(0.5)

    with pytest.raises(DeadlineExceededError):
        closing.result(WAIT)
    busy.latch.set()
    assert held.result(WAIT) is None
    # The close did not happen: on_closing never ran and the object serves again.
    assert request_to(host, kind, "x", Probe()).submit_sync() == 1
    assert not busy.closing_started.is_set()
    # A later close is a new one and completes.
    assert manager_of(host, kind).close("x").submit_sync() is True
    assert busy.closing_started.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancelled_close_before_on_closing_does_not_happen(
    harness: HostHarness, kind: str
) -> None:
    host, busy, held = _held(harness, kind)

    source = CancellationSource()
    closing = manager_of(host, kind).close("x").submit(cancel=source.token)
    source.cancel()

    with pytest.raises(CancelledError):
        closing.result(WAIT)
    busy.latch.set()
    assert held.result(WAIT) is None
    assert request_to(host, kind, "x", Probe()).submit_sync() == 1
    assert not busy.closing_started.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_completion_cancel_of_a_close_before_on_closing_withdraws_it(
    harness: HostHarness, kind: str
) -> None:
    host, busy, held = _held(harness, kind)

    closing = manager_of(host, kind).close("x").submit()
    assert closing.cancel() is True

    busy.latch.set()
    assert held.result(WAIT) is None
    assert request_to(host, kind, "x", Probe()).submit_sync() == 1
    assert not busy.closing_started.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_a_close_deadline_that_passes_after_on_closing_began_still_completes_true(
    harness: HostHarness, kind: str
) -> None:
    clock = ManualClock()
    busy = _Busy(harness)
    busy.closing_latch.clear()
    cls = _busy_type(kind, busy)
    host = host_with(harness, kind, cls, clock=clock)
    manager_of(host, kind).get_or_create("x", cls).submit_sync()

    closing = manager_of(host, kind).close("x").timeout(0.3).submit()
    assert busy.closing_started.wait(WAIT)
    clock.advance(1.0)
    # The deadline passed while on_closing ran: too late to give up.
    assert not closing.wait(NEGATIVE_WAIT)
    assert closing.cancel() is False
    busy.closing_latch.set()

    assert closing.result(WAIT) is True
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()


@pytest.mark.parametrize("kind", KINDS)
def test_a_close_goes_on_while_another_caller_still_waits_for_it(
    harness: HostHarness, kind: str
) -> None:
    clock = ManualClock()
    host, busy, held = _held(harness, kind, clock=clock)

    impatient = manager_of(host, kind).close("x").timeout(0.3).submit()
    patient = manager_of(host, kind).close("x").timeout(30).submit()
    clock.advance(0.5)

    with pytest.raises(DeadlineExceededError):
        impatient.result(WAIT)
    assert not patient.done()
    busy.latch.set()
    assert held.result(WAIT) is None
    assert patient.result(WAIT) is True
    assert busy.closing_started.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_withdrawn_closes_leave_no_records_behind(harness: HostHarness, kind: str) -> None:
    host, busy, held = _held(harness, kind)

    # More withdrawn closes than the lifecycle lane holds (128).
    for _ in range(200):
        assert manager_of(host, kind).close("x").submit().cancel() is True
    closing = manager_of(host, kind).close("x").submit()
    busy.latch.set()

    assert held.result(WAIT) is None
    assert closing.result(WAIT) is True
    assert busy.closing_started.is_set()


def test_a_deadline_and_a_cancel_of_one_close_racing_count_as_one_give_up(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: both of one caller's give-ups withdrew a close another caller
    still waited for."""
    clock = ManualClock()
    busy = _Busy(harness)
    cls = _busy_type("spot", busy)
    host = harness.host(spots=[cls], clock=clock)
    host.spots.get_or_create("x", cls).submit_sync()
    held = host.request_to_spot("x", Hold()).timeout(60).submit()
    assert busy.entered.wait(WAIT)
    impatient = host.spots.close("x").timeout(1).submit()
    patient = host.spots.close("x").timeout(30).submit()

    # Both of the impatient caller's give-ups reach the close at once.
    both = threading.Barrier(2, timeout=WAIT)
    real_give_up = _lifecycle.Closing.give_up

    def meeting(self: Any, caller: Any) -> bool:
        both.wait()
        return real_give_up(self, caller)

    monkeypatch.setattr(_lifecycle.Closing, "give_up", meeting)
    canceller = threading.Thread(target=impatient.cancel)
    canceller.start()
    clock.advance(2)  # the timer thread expires the same caller meanwhile
    canceller.join(WAIT)
    assert not canceller.is_alive()
    monkeypatch.setattr(_lifecycle.Closing, "give_up", real_give_up)

    with pytest.raises((CancelledError, DeadlineExceededError)):
        impatient.result(WAIT)
    assert not patient.done()
    busy.latch.set()
    assert held.result(WAIT) is None
    assert patient.result(WAIT) is True
    assert busy.closing_started.is_set()
