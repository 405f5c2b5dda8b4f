"""Request completion (digest §5 "Requests", "Completion mechanics"; SC §9-11).

Exactly one of reply, error, timeout, cancellation or shutdown completes a request;
anything later is dropped. Handler failures are classified by type.
"""

import threading
import weakref
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    CancellationSource,
    CancelledError,
    ChannelContext,
    ChannelHandler,
    Completion,
    DeadlineExceededError,
    ErrorKind,
    Host,
    InternalFailureError,
    InvalidOperationError,
    ManualClock,
    NotFoundError,
    ProtocolError,
    Spot,
    SpotContext,
    UnavailableError,
    UnavailableReason,
    completion_dispatcher,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hit, Hold, Note, Ping, Pong, Probe


class Fail(msgspec.Struct, frozen=True):
    kind: str


class Desk:
    """A Spot class built per test: `Hold` blocks on a latch and then replies."""

    def __init__(self, harness: HostHarness) -> None:
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.hits = 0
        self.replied: list[str] = []
        self.metadata: list[dict[str, object]] = []
        desk = self

        class Room(Spot):
            @handler
            def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
                desk.metadata.append(dict(ctx.metadata))
                return Pong(msg.n)

            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> str:
                desk.entered.set()
                desk.latch.wait(WAIT)
                desk.replied.append("late")
                return "late"

            @handler
            def hit(self, ctx: SpotContext, msg: Hit) -> None:
                desk.hits += 1

            @handler
            def fail(self, ctx: SpotContext, msg: Fail) -> None:
                if msg.kind == "not_found":
                    raise NotFoundError("the handler could not find it")
                raise ValueError("bad value")

            @handler
            def note(self, ctx: SpotContext, msg: Note) -> object:
                return {"n": msg.n} if msg.n else "plain"

            @handler
            def probe(self, ctx: SpotContext, msg: Probe) -> int:
                return desk.hits

        self.cls = Room


def _room(harness: HostHarness, **options: object) -> tuple[Host, Desk]:
    desk = Desk(harness)
    host = harness.host(spots=[desk.cls], **options)
    host.spots.get_or_create("room", desk.cls).submit_sync()
    return host, desk


def _count_callbacks(completion: Completion[Any]) -> list[object]:
    calls: list[object] = []
    completion.add_done_callback(calls.append)
    return calls


class Counter(Actor):
    @handler
    def ping(self, ctx: ActorContext, msg: Ping) -> Pong:
        return Pong(msg.n)


class Echo(ChannelHandler):
    @handler
    def ping(self, ctx: ChannelContext, msg: Ping) -> Pong:
        return Pong(msg.n)


@pytest.mark.parametrize("terminator", ["request", "send"])
@pytest.mark.parametrize("kind", ["spot", "actor", "channel"])
def test_call_to_an_unknown_target_fails_with_not_found(
    harness: HostHarness, kind: str, terminator: str
) -> None:
    host = harness.host(spots=[], actors=[Counter], channels={"echo": Echo})
    calls: dict[tuple[str, str], Callable[[], Completion[Any]]] = {
        ("spot", "request"): lambda: host.request_to_spot("nope", Ping()).submit(),
        ("spot", "send"): lambda: host.send_to_spot("nope", Ping()).submit(),
        ("actor", "request"): lambda: host.request_to_actor("nope", Ping()).submit(),
        ("actor", "send"): lambda: host.send_to_actor("nope", Ping()).submit(),
        ("channel", "request"): lambda: host.request_to_channel("nope", Ping()).submit(),
        ("channel", "send"): lambda: host.send_to_channel("nope", Ping()).submit(),
    }

    with pytest.raises(NotFoundError):
        calls[kind, terminator]().result(WAIT)


def test_request_with_no_handler_for_the_payload_type_fails_with_not_found(
    harness: HostHarness,
) -> None:
    class Unhandled(msgspec.Struct, frozen=True):
        pass

    host, _ = _room(harness)

    with pytest.raises(NotFoundError):
        host.request_to_spot("room", Unhandled()).submit_sync()


def test_timed_out_request_fails_with_deadline_exceeded_and_drops_the_late_reply(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    host, desk = _room(harness, clock=clock)
    request = host.request_to_spot("room", Hold(), reply=str).timeout(1.0).submit()
    callbacks = _count_callbacks(request)
    assert desk.entered.wait(WAIT)

    clock.advance(1.0)
    with pytest.raises(DeadlineExceededError):
        request.result(WAIT)

    desk.latch.set()
    host.request_to_spot("room", Probe()).submit_sync()  # the late reply was produced
    assert desk.replied == ["late"]
    assert completion_dispatcher().drain(WAIT)
    assert len(callbacks) == 1
    with pytest.raises(DeadlineExceededError):
        request.result()
    assert host.statistics().pending_calls == 0


def test_handler_raising_a_zlink_error_fails_the_request_with_that_kind(
    harness: HostHarness,
) -> None:
    host, _ = _room(harness)

    with pytest.raises(NotFoundError) as raised:
        host.request_to_spot("room", Fail("not_found")).submit_sync()
    assert raised.value.kind is ErrorKind.NOT_FOUND


def test_handler_raising_another_exception_fails_with_internal_failure_and_its_cause(
    harness: HostHarness,
) -> None:
    host, _ = _room(harness)
    before = host.statistics().handler_failures

    with pytest.raises(InternalFailureError) as raised:
        host.request_to_spot("room", Fail("value")).submit_sync()
    assert isinstance(raised.value.__cause__, ValueError)
    assert raised.value.__cause__.args == ("bad value",)
    assert host.statistics().handler_failures == before + 1


@pytest.mark.parametrize("terminator", ["submit_sync", "submit"])
def test_a_handler_raising_a_zlink_error_counts_as_a_handler_failure(
    harness: HostHarness, terminator: str
) -> None:
    host, _ = _room(harness)
    before = host.statistics().handler_failures
    call = host.request_to_spot("room", Fail("not_found"))

    with pytest.raises(NotFoundError, match="the handler could not find it"):
        call.submit_sync() if terminator == "submit_sync" else call.submit().result(WAIT)

    assert host.statistics().handler_failures == before + 1


def test_a_wrong_reply_and_a_request_dropped_unrun_are_not_handler_failures(
    harness: HostHarness,
) -> None:
    host, desk = _room(harness)
    with pytest.raises(ProtocolError):
        host.request_to_spot("room", Ping(1), reply=Note).submit_sync()
    held = host.request_to_spot("room", Hold()).submit()
    assert desk.entered.wait(WAIT)
    queued = host.request_to_spot("room", Ping(2)).submit()
    closing = host.spots.close("room").submit()
    assert not queued.done()
    desk.latch.set()

    assert closing.result(WAIT) is True
    with pytest.raises(UnavailableError) as caught:
        queued.result(WAIT)
    assert caught.value.reason is UnavailableReason.CLOSED
    assert held.result(WAIT) == "late"
    assert host.statistics().handler_failures == 0


def test_reply_of_the_wrong_type_fails_with_protocol_error(harness: HostHarness) -> None:
    host, _ = _room(harness)

    with pytest.raises(ProtocolError):
        host.request_to_spot("room", Ping(1), reply=Note).submit_sync()


def test_request_without_reply_type_returns_whatever_the_handler_returned(
    harness: HostHarness,
) -> None:
    host, _ = _room(harness)

    assert host.request_to_spot("room", Note(0)).submit_sync() == "plain"
    assert host.request_to_spot("room", Note(3)).submit_sync() == {"n": 3}
    assert host.request_to_spot("room", Ping(2)).submit_sync() == Pong(2)


def test_request_without_timeout_uses_the_hosts_default_request_timeout(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    host, desk = _room(harness, clock=clock, default_request_timeout=2.0)
    defaulted = host.request_to_spot("room", Hold()).submit()
    assert desk.entered.wait(WAIT)
    shorter = host.request_to_spot("room", Ping()).timeout(1.9).submit()

    clock.advance(1.95)
    with pytest.raises(DeadlineExceededError):
        shorter.result(WAIT)
    # One heap fires deadlines in order: a default earlier than 1.9 s would have fired.
    assert not defaulted.done()

    clock.advance(0.05)
    with pytest.raises(DeadlineExceededError):
        defaulted.result(WAIT)


def test_requests_on_the_default_deadline_each_time_out_at_their_own_time(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    host, desk = _room(harness, clock=clock, default_request_timeout=2.0)
    first = host.request_to_spot("room", Hold()).submit()
    assert desk.entered.wait(WAIT)
    clock.advance(0.5)
    # An explicit timeout equal to the default behaves the same.
    second = host.request_to_spot("room", Ping()).timeout(2.0).submit()
    clock.advance(0.5)
    third = host.request_to_spot("room", Ping()).submit()

    clock.advance(1.0)  # t = 2.0
    with pytest.raises(DeadlineExceededError):
        first.result(WAIT)
    assert not second.done()
    assert not third.done()

    clock.advance(0.5)  # t = 2.5
    with pytest.raises(DeadlineExceededError):
        second.result(WAIT)
    assert not third.done()

    clock.advance(0.5)  # t = 3.0
    with pytest.raises(DeadlineExceededError):
        third.result(WAIT)
    assert host.statistics().pending_calls == 0


def test_request_with_an_already_cancelled_token_is_cancelled_and_never_handled(
    harness: HostHarness,
) -> None:
    host, _ = _room(harness)
    source = CancellationSource()
    source.cancel()

    request = host.request_to_spot("room", Hit()).submit(cancel=source.token)
    send = host.send_to_spot("room", Hit()).submit(cancel=source.token)

    for completion in (request, send):
        with pytest.raises(CancelledError):
            completion.result(WAIT)
        assert completion.cancelled()
    assert host.request_to_spot("room", Probe(), reply=int).submit_sync() == 0


def test_cancelling_an_admitted_request_ends_only_the_callers_wait(harness: HostHarness) -> None:
    host, desk = _room(harness)
    source = CancellationSource()
    by_token = host.request_to_spot("room", Hold()).submit(cancel=source.token)
    assert desk.entered.wait(WAIT)
    by_handle = host.request_to_spot("room", Hit()).submit()

    source.cancel()
    assert by_handle.cancel() is True

    for completion in (by_token, by_handle):
        with pytest.raises(CancelledError):
            completion.result(WAIT)
    desk.latch.set()
    # The running Hold finished (its late reply was dropped); the Hit, cancelled while it
    # was still queued, never ran.
    assert host.request_to_spot("room", Probe(), reply=int).submit_sync() == 0
    assert desk.replied == ["late"]
    assert host.statistics().pending_calls == 0


def test_second_terminator_on_one_builder_raises_invalid_operation(harness: HostHarness) -> None:
    host, _ = _room(harness)
    request = host.request_to_spot("room", Ping(1), reply=Pong)
    send = host.send_to_spot("room", Hit())

    assert request.submit().result(WAIT) == Pong(1)
    assert send.submit().result(WAIT) is None
    with pytest.raises(InvalidOperationError):
        request.submit()
    with pytest.raises(InvalidOperationError):
        request.submit_sync()
    with pytest.raises(InvalidOperationError):
        send.submit()
    assert host.request_to_spot("room", Probe(), reply=int).submit_sync() == 1


def test_handler_sees_the_metadata_the_call_was_built_with(harness: HostHarness) -> None:
    host, desk = _room(harness)

    host.request_to_spot("room", Ping()).metadata("trace", "t-1").metadata("n", 2).submit_sync()
    host.send_to_spot("room", Ping()).submit_sync()
    host.request_to_spot("room", Probe()).submit_sync()

    assert desk.metadata == [{"trace": "t-1", "n": 2}, {}]


@pytest.mark.stress
def test_many_callers_waiting_cancelling_and_listening_each_see_their_own_request_once(
    harness: HostHarness,
) -> None:
    # Requests' results share internals: several threads blocking on, cancelling and
    # adding callbacks to their own requests while replies land must each see only
    # their own outcome, once.
    host, _ = _room(harness)
    start = threading.Barrier(4)
    seen: list[list[object]] = [[] for _ in range(4)]
    callbacks: list[list[object]] = [[] for _ in range(4)]

    def caller(index: int) -> None:
        start.wait(WAIT)
        for n in range(300):
            call = host.request_to_spot("room", Ping(index * 1000 + n), reply=Pong).submit()
            if n % 3 == 0:
                call.add_done_callback(callbacks[index].append)
            if n % 5 == 0 and call.cancel():
                seen[index].append("cancelled")
                continue
            seen[index].append(call.result(WAIT).n)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 4)

    assert not any(thread.is_alive() for thread in threads)
    assert completion_dispatcher().drain(WAIT)
    for index in range(4):
        assert len(seen[index]) == 300
        replies = [n for n in seen[index] if n != "cancelled"]
        expected = [index * 1000 + n for n in range(300)]
        assert replies == [n for n in expected if n in replies]  # own replies, in order
        assert len(callbacks[index]) == 100  # once each
    assert host.statistics().pending_calls == 0


@pytest.mark.stress
def test_reply_cancel_and_timeout_racing_complete_a_request_exactly_once(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    barrier = threading.Barrier(2)

    class Racer(Spot):
        @handler
        def race(self, ctx: SpotContext, msg: Ping) -> Pong:
            barrier.wait(WAIT)
            return Pong(msg.n)

    host = harness.host(spots=[Racer], clock=clock, app_threads=2)
    host.spots.get_or_create("racer", Racer).submit_sync()
    outcomes: set[str] = set()

    for n in range(300):
        request = host.request_to_spot("racer", Ping(n), reply=Pong).timeout(1.0).submit()
        callbacks = _count_callbacks(request)
        barrier.wait(WAIT)  # the handler replies as this thread cancels and times out
        request.cancel()
        clock.advance(1.0)
        try:
            outcomes.add(type(request.result(WAIT)).__name__)
        except (CancelledError, DeadlineExceededError) as exc:
            outcomes.add(type(exc).__name__)
        assert completion_dispatcher().drain(WAIT)
        assert len(callbacks) == 1
    assert host.statistics().pending_calls == 0
    assert outcomes <= {"Pong", "CancelledError", "DeadlineExceededError"}


class Bulky:
    """A reply that can be watched for collection."""


def test_answered_requests_are_not_kept_alive_behind_a_pending_deadline(
    harness: HostHarness,
) -> None:
    # Found by review: answered requests waited in the timer FIFO behind the live
    # deadline of a slow one, keeping their replies alive until that deadline passed.
    latch = harness.latch()
    entered = threading.Event()
    replies: list[weakref.ref[Bulky]] = []

    class Slow(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            entered.set()
            latch.wait(WAIT)

    class Fast(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Bulky:
            reply = Bulky()
            replies.append(weakref.ref(reply))
            return reply

    host = harness.host(spots=[Slow, Fast])
    host.spots.get_or_create("slow", Slow).submit_sync()
    host.spots.get_or_create("fast", Fast).submit_sync()
    stuck = host.request_to_spot("slow", Hold()).timeout(60).submit()
    assert entered.wait(WAIT)
    # Same timeout, so the same timer FIFO, behind the stuck request's live deadline.
    calls = [host.request_to_spot("fast", Ping(n)).timeout(60).submit() for n in range(50)]
    assert all(isinstance(call.result(WAIT), Bulky) for call in calls)
    del calls

    assert len(replies) == 50
    assert [ref for ref in replies if ref() is not None] == []
    latch.set()
    assert stuck.result(WAIT) is None
