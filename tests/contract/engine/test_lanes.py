"""Application lanes and one-way backpressure (digest §4 "Lanes", digest §5 "One-way sends",
"Backpressure"; SC §4-7).

A one-way send completes at admission. When the target's application lane is full it
waits, with no time limit and refusing caller cancellation, FIFO, and is admitted exactly
once, or ends with `ShuttingDownError`. A request never waits: `CapacityExceededError`.
A send to a target behind your own gate never waits.
"""

import logging
import threading
from collections.abc import Callable

import pytest

from zlink_actors import (
    CancellationSource,
    CancellationToken,
    CapacityExceededError,
    Completion,
    HostState,
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

from ._support import Boom, Hold, Note, Ping, Probe


class Mailroom:
    """A Spot class built per test: `Hold` blocks on a latch, `Note`s are recorded."""

    def __init__(self, harness: HostHarness, last_note: int = -1) -> None:
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.saw_last = threading.Event()
        self.notes: list[int] = []
        mailroom = self

        class Room(Spot):
            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> None:
                mailroom.entered.set()
                mailroom.latch.wait(WAIT)

            @handler
            def note(self, ctx: SpotContext, msg: Note) -> None:
                mailroom.notes.append(msg.n)
                if msg.n == last_note:
                    mailroom.saw_last.set()

            @handler
            def boom(self, ctx: SpotContext, msg: Boom) -> None:
                raise ValueError("one-way handler failed")

            @handler
            def probe(self, ctx: SpotContext, msg: Probe) -> list[int]:
                return list(mailroom.notes)

        self.cls = Room


def test_sends_to_a_full_queue_wait_and_are_admitted_in_fifo_order_exactly_once(
    harness: HostHarness,
) -> None:
    room = Mailroom(harness, last_note=3)
    host = harness.host(spots=[room.cls], application_lane_items=2)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)

    first = host.send_to_spot("room", Note(0)).submit()
    waiting = [host.send_to_spot("room", Note(n)).submit() for n in (1, 2, 3)]

    assert first.done()
    assert [c.done() for c in waiting] == [False, False, False]
    assert [c.cancel() for c in waiting] == [False, False, False]
    assert [c.done() for c in waiting] == [False, False, False]
    assert host.statistics().waiting_sends == 3

    room.latch.set()
    assert [c.result(WAIT) for c in waiting] == [None, None, None]
    assert room.saw_last.wait(WAIT)
    assert host.request_to_spot("room", Probe()).submit_sync() == [0, 1, 2, 3]
    assert host.statistics().waiting_sends == 0


def test_request_to_a_full_queue_fails_at_once_with_capacity_exceeded(
    harness: HostHarness,
) -> None:
    room = Mailroom(harness, last_note=0)
    host = harness.host(spots=[room.cls], application_lane_items=2)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)
    host.send_to_spot("room", Note(0)).submit_sync()

    refused = host.request_to_spot("room", Note(99)).submit()

    assert refused.done()
    with pytest.raises(CapacityExceededError):
        refused.result()
    assert host.statistics().pending_calls == 0
    room.latch.set()
    assert room.saw_last.wait(WAIT)
    # The refused request was never visible to the handler.
    assert host.request_to_spot("room", Probe()).submit_sync() == [0]


def test_one_way_handler_failure_keeps_the_send_result_and_counts_a_failure(
    harness: HostHarness, caplog: pytest.LogCaptureFixture
) -> None:
    room = Mailroom(harness)
    host = harness.host(spots=[room.cls])
    host.spots.get_or_create("room", room.cls).submit_sync()
    before = host.statistics().handler_failures

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        sent = host.send_to_spot("room", Boom()).submit()
        assert sent.result(WAIT) is None
        host.request_to_spot("room", Probe()).submit_sync()  # Boom was handled before it

    assert host.statistics().handler_failures == before + 1
    assert sent.result() is None
    assert sent.exception() is None
    assert any(
        isinstance(r.exc_info[1] if r.exc_info else None, ValueError) for r in caplog.records
    )


def test_send_waiting_for_space_when_shutdown_starts_ends_with_shutting_down(
    harness: HostHarness,
) -> None:
    room = Mailroom(harness)
    host = harness.host(spots=[room.cls], application_lane_items=1)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)
    waiting = host.send_to_spot("room", Note(1)).submit()
    assert not waiting.done()

    results: list[ShutdownResult] = []
    stopper = threading.Thread(target=lambda: results.append(host.shutdown(deadline=WAIT)))
    stopper.start()
    with pytest.raises(ShuttingDownError):
        waiting.result(WAIT)

    room.latch.set()
    stopper.join(WAIT * 2)
    assert not stopper.is_alive()
    assert results[0].outcome is ShutdownOutcome.STOPPED
    assert room.notes == []  # the waiting send was never admitted


def test_lane_slot_stays_reserved_while_an_async_handler_awaits(harness: HostHarness) -> None:
    job = harness.job()
    notes: list[int] = []

    class Room(Spot):
        @handler
        async def slow(self, ctx: SpotContext, msg: Hold) -> None:
            await ctx.run_cpu_worker(job).submit()

        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            notes.append(msg.n)

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> list[int]:
            return list(notes)

    host = harness.host(spots=[Room], application_lane_items=2)
    host.spots.get_or_create("room", Room).submit_sync()
    slow = host.request_to_spot("room", Hold()).timeout(30.0).submit()
    assert job.started.wait(WAIT)

    host.send_to_spot("room", Note(1)).submit_sync()
    waiting = host.send_to_spot("room", Note(2)).submit()

    assert not waiting.done()  # the suspended handler still holds its slot
    job.release()
    assert slow.result(WAIT) is None
    assert waiting.result(WAIT) is None
    host.send_to_spot("room", Note(3)).submit_sync()  # behind note 2 (a FIFO marker)
    assert host.request_to_spot("room", Probe()).submit_sync()[:2] == [1, 2]


def test_lane_slot_stays_reserved_across_yield_although_the_gate_is_released(
    harness: HostHarness,
) -> None:
    job = harness.job()
    room = Mailroom(harness, last_note=2)

    class YieldingRoom(room.cls):  # type: ignore[name-defined,misc]
        @handler
        async def slow(self, ctx: SpotContext, msg: Ping) -> None:
            await ctx.run_cpu_worker(job).yield_()

    host = harness.host(spots=[YieldingRoom], application_lane_items=2)
    host.spots.get_or_create("room", YieldingRoom).submit_sync()
    slow = host.request_to_spot("room", Ping()).timeout(30.0).submit()
    assert job.started.wait(WAIT)

    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)  # the gate was released: Hold runs meanwhile
    waiting = host.send_to_spot("room", Note(2)).submit()

    assert not waiting.done()  # the parked handler still holds its slot
    job.release()
    room.latch.set()
    assert slow.result(WAIT) is None
    assert waiting.result(WAIT) is None
    assert room.saw_last.wait(WAIT)


class PausingToken(CancellationToken):
    """A never-cancelled token whose `cancelled` read blocks until `resume` is set.

    Terminators read `cancel.cancelled` once, right after the Host's admission check, so
    this holds a call between that check and its enqueue: a seam to place a seal there.
    """

    __slots__ = ("_events",)

    def __init__(self, reached: threading.Event, resume: threading.Event) -> None:
        super().__init__(CancellationSource().token._state)
        self._events = (reached, resume)

    @property
    def cancelled(self) -> bool:
        reached, resume = self._events
        reached.set()
        resume.wait(WAIT)
        return False


def test_send_that_starts_waiting_while_the_host_drains_ends_with_shutting_down(
    harness: HostHarness,
) -> None:
    room = Mailroom(harness)
    host = harness.host(spots=[room.cls], application_lane_items=1)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)
    early = host.send_to_spot("room", Note(1)).submit()
    reached, resume = threading.Event(), threading.Event()
    late: list[Completion[None]] = []
    sender = threading.Thread(
        target=lambda: late.append(
            host.send_to_spot("room", Note(2)).submit(cancel=PausingToken(reached, resume))
        )
    )
    sender.start()
    assert reached.wait(WAIT)  # the late send passed the admission check: still serving

    results: list[ShutdownResult] = []
    stopper = threading.Thread(target=lambda: results.append(host.shutdown(deadline=1.0)))
    stopper.start()
    with pytest.raises(ShuttingDownError):
        early.result(WAIT)  # sealed: the sends waiting then were failed
    resume.set()
    sender.join(WAIT)
    assert not sender.is_alive()
    assert host.state is HostState.DRAINING  # the late send started waiting while draining
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert results[0].outcome is ShutdownOutcome.FORCE_STOPPED

    # Shutdown has returned: every send still waiting must have ended.
    assert late[0].done()
    with pytest.raises(ShuttingDownError):
        late[0].result(0)


def test_send_to_a_target_behind_your_own_gate_never_waits_even_when_full(
    harness: HostHarness,
) -> None:
    go = harness.latch()
    entered = threading.Event()
    finished = threading.Event()
    saw_last = threading.Event()
    notes: list[int] = []
    done_at_once: list[bool] = []

    class Room(Spot):
        @handler
        def fill(self, ctx: SpotContext, msg: Hold) -> None:
            entered.set()
            go.wait(WAIT)
            sends = [ctx.send_to_spot(ctx.spot_id, Note(n)).submit() for n in (1, 2)]
            done_at_once.extend(c.done() for c in sends)
            finished.set()

        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            notes.append(msg.n)
            if msg.n == 9:
                saw_last.set()

    host = harness.host(spots=[Room], application_lane_items=2)
    host.spots.get_or_create("room", Room).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert entered.wait(WAIT)
    host.send_to_spot("room", Note(0)).submit_sync()
    outside = host.send_to_spot("room", Note(9)).submit()
    assert not outside.done()  # the lane is full: a send from outside waits

    go.set()
    assert finished.wait(WAIT)
    assert done_at_once == [True, True]

    assert outside.result(WAIT) is None
    assert saw_last.wait(WAIT)
    assert notes == [0, 1, 2, 9]


def test_observers_of_waiting_sends_hear_of_their_admission_once(harness: HostHarness) -> None:
    # A waiting send's result shares its target's gate lock and is settled inside the
    # critical section that admits it: callbacks and blocked readers must still hear.
    room = Mailroom(harness, last_note=3)
    host = harness.host(spots=[room.cls], application_lane_items=2)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)
    host.send_to_spot("room", Note(0)).submit_sync()
    waiting = [host.send_to_spot("room", Note(n)).submit() for n in (1, 2, 3)]
    assert not any(c.done() for c in waiting)

    fired: list[int] = []
    all_fired = threading.Event()

    def on_done(n: int) -> Callable[[Completion[None]], None]:
        def done(completion: Completion[None]) -> None:
            assert completion.result() is None
            fired.append(n)
            if len(fired) == 3:
                all_fired.set()

        return done

    for n, completion in zip((1, 2, 3), waiting, strict=True):
        completion.add_done_callback(on_done(n))
    read: list[object] = []
    reader = threading.Thread(target=lambda: read.append(waiting[2].result(WAIT)))
    reader.start()

    room.latch.set()
    assert all_fired.wait(WAIT)
    reader.join(WAIT)
    assert not reader.is_alive()
    assert read == [None]
    assert sorted(fired) == [1, 2, 3]
    assert room.saw_last.wait(WAIT)
    assert host.request_to_spot("room", Probe()).submit_sync() == [0, 1, 2, 3]
    # Each callback ran once: nothing fires twice after the fact.
    assert host.request_to_spot("room", Probe()).submit_sync() == [0, 1, 2, 3]
    assert sorted(fired) == [1, 2, 3]


def _unobserved_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "zlink_actors"
        and r.levelno == logging.DEBUG
        and "nothing observes its Completion" in r.getMessage()
    ]


@pytest.mark.parametrize("observer", ["none", "timed_out_read", "callback"])
def test_a_waiting_send_that_fails_on_close_is_logged_at_debug_only_when_nothing_observes_it(
    harness: HostHarness, caplog: pytest.LogCaptureFixture, observer: str
) -> None:
    room = Mailroom(harness)
    host = harness.host(spots=[room.cls], application_lane_items=1)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)
    waiting = host.send_to_spot("room", Note(7)).submit()
    heard: list[Completion[None]] = []
    called = threading.Event()
    if observer == "timed_out_read":
        assert not waiting.wait(0)  # looked once; nothing is waiting when the send fails
    elif observer == "callback":
        waiting.add_done_callback(lambda c: (heard.append(c), called.set()))

    with caplog.at_level(logging.DEBUG, logger="zlink_actors"):
        closing = host.spots.close("room").submit()
        room.latch.set()
        assert closing.result(WAIT) is True  # the waiting send was failed on the way

    assert isinstance(waiting.exception(0), UnavailableError)
    assert waiting.exception(0).reason is UnavailableReason.CLOSED
    if observer == "callback":
        assert called.wait(WAIT)
        assert heard == [waiting]
        assert _unobserved_logs(caplog) == []
    else:
        assert _unobserved_logs(caplog) == [
            "a one-way send of Note to Spot 'room' ended with UnavailableError after "
            "submit() returned, and nothing observes its Completion"
        ]


def test_a_waiting_send_ended_by_shutdown_that_nothing_observes_is_logged_at_debug(
    harness: HostHarness, caplog: pytest.LogCaptureFixture
) -> None:
    room = Mailroom(harness)
    host = harness.host(spots=[room.cls], application_lane_items=1)
    host.spots.get_or_create("room", room.cls).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert room.entered.wait(WAIT)
    waiting = host.send_to_spot("room", Note(7)).submit()
    logged = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "nothing observes its Completion" in record.getMessage():
                logged.set()

    watch = Watch(logging.DEBUG)
    logging.getLogger("zlink_actors").addHandler(watch)
    results: list[ShutdownResult] = []
    try:
        with caplog.at_level(logging.DEBUG, logger="zlink_actors"):
            stopper = threading.Thread(target=lambda: results.append(host.shutdown(WAIT)))
            stopper.start()
            assert logged.wait(WAIT)  # the log is the only sign: nothing observes the send
            room.latch.set()
            stopper.join(WAIT * 2)
            assert not stopper.is_alive()
    finally:
        logging.getLogger("zlink_actors").removeHandler(watch)

    assert results[0].outcome is ShutdownOutcome.STOPPED
    assert isinstance(waiting.exception(0), ShuttingDownError)
    assert _unobserved_logs(caplog) == [
        "a one-way send of Note to Spot 'room' ended with ShuttingDownError after "
        "submit() returned, and nothing observes its Completion"
    ]
