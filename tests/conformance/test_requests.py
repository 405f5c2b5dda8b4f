"""The request contract, held on every path with every terminator.

Each test takes `world` (one of `_paths.PATHS`: local, node, channel, global) and, where
the rule concerns how a call ends, `caller` (one of `_terminators.TERMINATORS`: submit,
submit_sync, yield_), so it runs 4 x 3 times. The rules (docs/completion.md, errors.md,
mesh.md; the contract digest's "Requests"): a request ends exactly once, with its reply,
its handler's error (typed), `DeadlineExceededError`, `CancelledError` or a shutdown's
error; one that ended before its handler started never starts it; a usage error is raised
before anything is sent and loses nothing already accepted. Where a path (or a
terminator) differs, the difference is a field of its `Path` (`Terminator`) row that the
test reads, with the doc that says so; no test branches on a path's name. A known break
would be marked `xfail(strict=True)` for its path, with the reason; none is today.

Orders are made with a handler held on a latch (`Hold`), FIFO markers (a request queued
behind) and bounded, asserted waits; the only timed parts are the deadlines under test.
"""

from __future__ import annotations

import math
import random
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    DeadlineExceededError,
    InternalFailureError,
    InvalidOperationError,
    NotFoundError,
    ProtocolError,
    RejectedError,
    RequestCall,
    ShutdownOutcome,
    UnavailableError,
    UnavailableReason,
    completion_dispatcher,
)
from zlink_actors.testing import WAIT, wait_until

from ..contract._support import CtrlC, ShutdownThread, blocked_in_a_wait
from ._paths import Api, Failure, World
from ._targets import Ask, Fail, Hold, Mark, Nap, Stray
from ._terminators import Caller, InHandler, Outcome, Terminator

#: The deadline of a request meant to expire while its target is held: long enough for
#: the request to reach a remote queue on a loaded machine before it passes.
SHORT = 0.3
#: The deadline of a request meant to end some other way first.
LONG = 30.0
#: How soon after its cause a call must have ended (a cancel): well under `LONG`, so a
#: call left to its deadline fails the test.
PROMPT = 2.0
#: How soon the caller's pending table is empty once an interrupt propagated (the
#: blocking paths empty it before the exception leaves them).
AT_ONCE = 0.5


def _tag() -> str:
    return uuid.uuid4().hex[:12]


def _failure(out: Outcome, terminator: Terminator, within: float = WAIT) -> BaseException:
    """The error an operational failure ended the call with, checked to have come the
    terminator's way (raised by `submit_sync()`, carried by the result otherwise)."""
    exc = out.failure(within)
    assert out.raised is terminator.raises_failures, (
        f"{terminator.name}: {type(exc).__name__} raised={out.raised}"
    )
    return exc


def _reason(exc: BaseException) -> UnavailableReason | None:
    return exc.reason if isinstance(exc, UnavailableError) else None


def _hold(world: World, tag: str) -> None:
    """Hold the target in a handler (a one-way `Hold`) until the latch `tag` is set."""
    world.send(world.caller, world.target, Hold(tag)).submit_sync()
    assert wait_until(lambda: tag in world.journal.items("entered")), "Hold never started"


def _queued_behind_a_held_handler(
    world: World, caller: Caller, queued: str, timeout: float, cancel: Any = None
) -> tuple[str, Outcome]:
    """Hold the target, then start `Mark(queued)` and wait until it is queued behind the
    held handler (one more record in the serving Host's lanes); return the held tag (its
    latch releases the target) and the call's outcome."""
    held = _tag()
    _hold(world, held)
    before = world.queued()
    out = caller.launch(lambda api: world.call(Mark(queued), str, api).timeout(timeout), cancel)
    assert wait_until(lambda: world.queued() == before + 1), (
        f"queued {world.queued()}, expected {before + 1}"
    )
    return held, out


def _running_held(
    world: World, caller: Caller, timeout: float, cancel: Any = None
) -> tuple[str, Outcome]:
    """Start `Hold(tag)` and wait until its handler runs (held until the latch `tag` is
    set); return the tag and the call's outcome."""
    tag = _tag()
    out = caller.launch(lambda api: world.call(Hold(tag), str, api).timeout(timeout), cancel)
    assert wait_until(lambda: tag in world.journal.items("entered")), "Hold never started"
    return tag, out


def _after_the_target_ran_what_it_had(world: World) -> None:
    """A request to the target itself: FIFO, so its reply comes after every record that
    was queued there before it ran (or was refused)."""
    assert world.call(Ask(1000), int).timeout(WAIT).submit_sync() == 1001


def _ended_once(world: World, out: Outcome) -> None:
    """The call settled exactly once and left nothing pending at the caller."""
    assert wait_until(lambda: world.caller.statistics().pending_calls == 0)
    assert completion_dispatcher().drain(WAIT)  # a second done-callback would have run
    assert out.settled == 1
    if out.completion is not None:  # the submit() handle keeps its first result
        assert out.completion.done()
        if out.error is None:
            assert out.completion.result(0) == out.value
        elif isinstance(out.error, CancelledError):
            assert out.completion.cancelled()
        else:
            assert type(out.completion.exception(0)) is type(out.error)


# -- replies and errors --------------------------------------------------------------------


def test_the_reply_arrives(world: World, caller: Caller) -> None:
    out = caller.launch(lambda api: world.call(Ask(41), int, api).timeout(LONG))
    assert out.result() == 42
    assert out.raised is False
    assert world.journal.items("asked") == [41]
    _ended_once(world, out)


def test_a_reply_that_wins_leaves_the_handlers_cancellation_untouched(
    world: World, caller: Caller
) -> None:
    # docs/completion.md "ctx.cancellation": cancelled only once the request ended
    # without this handler's reply.
    tag, out = _running_held(world, caller, LONG)
    assert not out.done()
    world.journal.latch(tag).set()
    assert out.result() == "held"
    _ended_once(world, out)  # drains the dispatcher, where a cancellation callback runs
    _after_the_target_ran_what_it_had(world)
    assert completion_dispatcher().drain(WAIT)
    assert world.journal.items("cancelled") == []


def test_a_reply_not_of_the_reply_type_is_a_protocol_error(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    out = caller.launch(lambda api: world.call(Ask(1), str, api).timeout(LONG))
    assert type(_failure(out, terminator)) is ProtocolError
    assert world.journal.items("asked") == [1]  # it ran; its reply did not conform
    _ended_once(world, out)


#: What a request handler's exception reaches its caller as (docs/errors.md "Exceptions
#: raised in handlers"; docs/mesh.md, the table: "the remote handler's ZlinkError, the
#: same kind; any other exception there: InternalFailureError"; an UnavailableError
#: keeps its reason across the wire, docs/errors.md).
HANDLER_ERRORS: dict[str, Failure] = {
    "rejected": (RejectedError, None),
    "not_found": (NotFoundError, None),
    "unavailable": (UnavailableError, UnavailableReason.CONTENDED),
    "value_error": (InternalFailureError, None),
    "keyboard_interrupt": (InternalFailureError, None),
}


def test_a_handlers_exception_reaches_the_caller_as_documented(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    for raised, expected in HANDLER_ERRORS.items():

        def make(api: Api, raised: str = raised) -> RequestCall[Any]:
            return world.call(Fail(raised), int, api).timeout(LONG)

        out = caller.launch(make)
        exc = _failure(out, terminator)
        assert (type(exc), _reason(exc)) == expected, raised
        _ended_once(world, out)
    # The serving Host goes on serving (a KeyboardInterrupt there ended only the handler).
    _after_the_target_ran_what_it_had(world)


def test_a_message_the_target_has_no_handler_for_is_not_found(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    # digest "Requests": no handler -> NotFound.
    out = caller.launch(lambda api: world.call(Stray(), None, api).timeout(LONG))
    assert type(_failure(out, terminator)) is NotFoundError
    _ended_once(world, out)


def test_a_target_that_does_not_exist_is_not_found(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    out = caller.launch(lambda api: world.request(api, "nobody", Ask(1), int).timeout(LONG))
    assert type(_failure(out, terminator)) is NotFoundError
    _ended_once(world, out)


# -- deadlines -----------------------------------------------------------------------------


def test_a_deadline_that_passes_while_queued_ends_the_call_and_its_handler_never_starts(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    held, out = _queued_behind_a_held_handler(world, caller, _tag(), SHORT)

    assert type(_failure(out, terminator)) is DeadlineExceededError
    world.journal.latch(held).set()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("ran") == []  # the queued handler never started
    _ended_once(world, out)


def test_a_deadline_that_passes_while_running_ends_the_call_once_and_the_handler_hears_it(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    tag, out = _running_held(world, caller, SHORT)

    assert type(_failure(out, terminator)) is DeadlineExceededError
    # docs/completion.md "ctx.cancellation": cancelled once the request ended without
    # this handler's reply (its deadline passed).
    assert wait_until(lambda: tag in world.journal.items("cancelled"))
    world.journal.latch(tag).set()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("left") == [tag]  # its late reply was dropped:
    assert type(out.error) is DeadlineExceededError
    _ended_once(world, out)


# -- cancellation --------------------------------------------------------------------------


def test_a_token_cancelled_before_the_terminator_ends_the_call_cancelled_and_nothing_runs(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    source = CancellationSource()
    source.cancel()
    tag = _tag()
    out = caller.launch(lambda api: world.call(Mark(tag), str, api).timeout(LONG), source.token)
    assert type(_failure(out, terminator)) is CancelledError
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("ran") == []
    _ended_once(world, out)


def test_cancelling_a_queued_request_ends_it_cancelled_and_its_handler_never_starts(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    source = CancellationSource()
    held, out = _queued_behind_a_held_handler(world, caller, _tag(), LONG, source.token)

    source.cancel()
    assert type(_failure(out, terminator, within=PROMPT)) is CancelledError
    # docs/mesh.md: a best-effort CANCEL notice follows a cancelled request; once a
    # later call on the same connection is answered, the serving Host has read it.
    world.flush()
    world.journal.latch(held).set()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("ran") == []
    _ended_once(world, out)


def test_cancelling_a_running_request_ends_it_cancelled_at_once_and_the_handler_hears_it(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    source = CancellationSource()
    tag, out = _running_held(world, caller, LONG, source.token)

    source.cancel()
    assert type(_failure(out, terminator, within=PROMPT)) is CancelledError
    assert wait_until(lambda: tag in world.journal.items("cancelled"))
    world.journal.latch(tag).set()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("left") == [tag]
    assert type(out.error) is CancelledError  # the late reply changed nothing
    _ended_once(world, out)


def test_completion_cancel_wins_once_against_a_running_handler(world: World) -> None:
    # `Completion.cancel()` exists only on what submit() returns (docs/completion.md).
    tag = _tag()
    call = world.call(Hold(tag), str).timeout(LONG).submit()
    assert wait_until(lambda: tag in world.journal.items("entered"))

    assert call.cancel() is True
    assert call.cancelled()
    assert call.done()
    assert call.cancel() is False
    assert wait_until(lambda: tag in world.journal.items("cancelled"))
    world.journal.latch(tag).set()
    _after_the_target_ran_what_it_had(world)
    assert call.cancelled()
    with pytest.raises(CancelledError):
        call.result(0)
    assert wait_until(lambda: world.caller.statistics().pending_calls == 0)


# -- shutdown of the serving Host ----------------------------------------------------------


def test_a_request_running_when_the_serving_host_stops_gets_its_reply_within_the_deadline(
    world: World, caller: Caller
) -> None:
    tag, out = _running_held(world, caller, LONG)

    stopping = ShutdownThread(world.serving, WAIT)
    assert wait_until(world.draining)
    assert not out.done()  # accepted work: it may still finish
    world.journal.latch(tag).set()
    assert out.result() == "held"
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    _ended_once(world, out)


def test_a_request_queued_when_the_serving_host_stops_runs_within_the_deadline(
    world: World, caller: Caller
) -> None:
    queued = _tag()
    held, out = _queued_behind_a_held_handler(world, caller, queued, LONG)

    stopping = ShutdownThread(world.serving, WAIT)
    assert wait_until(world.draining)
    world.journal.latch(held).set()
    assert out.result() == queued
    assert world.journal.items("ran") == [queued]
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    _ended_once(world, out)


def test_a_request_whose_handler_outlives_the_shutdown_deadline_ends_once_as_documented(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    tag, out = _running_held(world, caller, LONG)

    stopping = ShutdownThread(world.serving, 0.3)
    # The forced stop completes the held request at the serving Host: its handler hears
    # it (docs/completion.md "ctx.cancellation"), and so does the caller, except that a
    # yielding turn on the Host being stopped never resumes: its resume record is queued
    # after the deadline and discarded ("What a forced stop skips"; its request did end,
    # counted in `forced_operations`).
    assert wait_until(lambda: tag in world.journal.items("cancelled"))
    seen = not (world.path.caller_is_serving and terminator.resumes_on_caller)
    if seen:
        exc = _failure(out, terminator)
        assert (type(exc), _reason(exc)) in world.path.forced_by_shutdown
    world.journal.latch(tag).set()  # the abandoned handler returns: its reply is dropped
    result = stopping.join()
    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert result.forced_operations >= 1  # the held request, at the serving Host
    assert wait_until(lambda: tag in world.journal.items("left"))
    assert out.settled == (1 if seen else 0)
    assert wait_until(lambda: world.caller.statistics().pending_calls == 0)


def test_a_request_made_while_the_serving_host_drains_is_refused_as_documented(
    world: World, caller: Caller, terminator: Terminator
) -> None:
    held, late = _tag(), _tag()
    _hold(world, held)  # keeps the serving Host draining until it is released
    stopping = ShutdownThread(world.serving, WAIT)
    assert wait_until(world.draining)

    out = caller.launch(lambda api: world.call(Mark(late), str, api).timeout(LONG))
    exc = _failure(out, terminator)
    assert (type(exc), _reason(exc)) == world.path.refused_while_draining
    world.journal.latch(held).set()
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    assert world.journal.items("ran") == []
    _ended_once(world, out)


# -- an interrupt while blocked ------------------------------------------------------------


@pytest.mark.usefixtures("default_sigint")
@pytest.mark.parametrize("token", ["no_token", "token"])
def test_keyboard_interrupt_while_blocked_in_submit_sync_ends_the_call_cancelled(
    world: World, token: str
) -> None:
    # docs/decisions.md "A blocking request keeps its own deadline": a KeyboardInterrupt
    # while blocked ends the call as cancelled (its late reply is dropped) and propagates,
    # on every path of `submit_sync()` (the blocking ones: `pending.block`; the general
    # one, with a token or to a global Spot: `pending.result_or_cancel`).
    tag = _tag()
    main = threading.main_thread().ident
    assert main is not None
    ctrl_c = CtrlC()

    def interrupt() -> None:
        # Once the handler runs and the caller waits for its reply: an interrupt that
        # lands inside submit_sync() before it waits ends the call on every path.
        if wait_until(lambda: tag in world.journal.items("entered")) and wait_until(
            blocked_in_a_wait(main)
        ):
            ctrl_c.send(main)

    cancel = CancellationSource().token if token == "token" else None
    previous = signal.signal(signal.SIGINT, ctrl_c.handle)
    try:
        interrupter = threading.Thread(target=interrupt, daemon=True)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            world.call(Hold(tag), str).timeout(LONG).submit_sync(cancel)
        interrupter.join(WAIT)
        assert not interrupter.is_alive()
    finally:
        signal.signal(signal.SIGINT, previous)

    assert ctrl_c.raised.is_set()
    # Ended, not left to its 30 s deadline: nothing pending, and the handler hears it.
    assert wait_until(lambda: world.caller.statistics().pending_calls == 0, within=AT_ONCE)
    assert wait_until(lambda: tag in world.journal.items("cancelled"))
    world.journal.latch(tag).set()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("left") == [tag]
    assert world.caller.statistics().pending_calls == 0


# -- usage errors --------------------------------------------------------------------------

#: Builder mistakes (docs/validation.md, docs/errors.md "Where usage errors are raised"):
#: each is raised where it is made, before anything is sent, and leaves the call as it was.
BUILDER_MISTAKES: dict[str, tuple[Callable[[World, Any], object], type[BaseException]]] = {
    "negative_timeout": (lambda w, api: w.call(Ask(1), int, api).timeout(-1), ValueError),
    "zero_timeout": (lambda w, api: w.call(Ask(1), int, api).timeout(0), ValueError),
    "nan_timeout": (lambda w, api: w.call(Ask(1), int, api).timeout(math.nan), ValueError),
    "str_timeout": (
        lambda w, api: w.call(Ask(1), int, api).timeout("1"),  # type: ignore[arg-type]
        TypeError,
    ),
    "bool_timeout": (lambda w, api: w.call(Ask(1), int, api).timeout(True), TypeError),
    "timeout_twice": (
        lambda w, api: w.call(Ask(1), int, api).timeout(LONG).timeout(LONG),
        InvalidOperationError,
    ),
    "reply_not_a_type": (lambda w, api: w.call(Ask(1), 42, api), TypeError),
    "empty_address": (lambda w, api: w.request(api, "", Ask(1), int), ValueError),
    "address_not_a_str": (
        lambda w, api: w.request(api, 7, Ask(1), int),  # type: ignore[arg-type]
        TypeError,
    ),
}


def test_a_builder_mistake_raises_at_once_and_sends_nothing(world: World, caller: Caller) -> None:
    raised: dict[str, type[BaseException] | None] = {}

    def make(api: Any) -> RequestCall[Any]:
        for mistake, (build, _) in BUILDER_MISTAKES.items():
            try:
                build(world, api)
            except Exception as exc:
                raised[mistake] = type(exc)
            else:
                raised[mistake] = None
        return world.call(Ask(1), int, api).timeout(LONG)

    out = caller.launch(make)
    assert out.result() == 2  # the next, correct call goes through
    assert raised == {mistake: expected for mistake, (_, expected) in BUILDER_MISTAKES.items()}
    assert world.journal.items("asked") == [1]  # nothing of the mistaken ones arrived
    _ended_once(world, out)


def test_a_bad_cancel_argument_raises_and_leaves_the_call_unused(
    world: World, caller: Caller
) -> None:
    built: list[RequestCall[Any]] = []

    def make(api: Any) -> RequestCall[Any]:
        if not built:
            built.append(world.call(Ask(1), int, api).timeout(LONG))
        return built[0]

    first = caller.launch(make, "not a token")
    assert type(first.failure()) is TypeError
    assert first.raised
    # docs/errors.md "Where usage errors are raised": a bad cancel= leaves the builder
    # unused: the same call can still be submitted, once.
    second = caller.launch(make)
    assert second.result() == 2
    third = caller.launch(make)
    assert type(third.failure()) is InvalidOperationError
    assert third.raised
    assert world.journal.items("asked") == [1]
    _ended_once(world, second)


def test_submit_sync_inside_a_handler_raises_before_anything_is_sent(world: World) -> None:
    tag = _tag()

    async def body(ctx: Any) -> object:
        return world.call(Mark(tag), str, ctx).timeout(LONG).submit_sync()

    in_turn = InHandler(world)
    try:
        out = in_turn.run(body)
        assert type(out.failure()) is InvalidOperationError
    finally:
        in_turn.close()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("ran") == []


def test_yield_outside_a_handler_raises_before_anything_is_sent(world: World) -> None:
    tag = _tag()
    with pytest.raises(InvalidOperationError):
        world.call(Mark(tag), str).timeout(LONG).yield_()
    _after_the_target_ran_what_it_had(world)
    assert world.journal.items("ran") == []
    assert world.caller.statistics().pending_calls == 0


# -- races ---------------------------------------------------------------------------------

#: Calls per race, and the seed of their timings (fixed: a failure repeats).
RACERS = 12
SEED = 27


def _race(
    world: World, terminator: Terminator, seed: int, meanwhile: Callable[[], object]
) -> list[Outcome]:
    """Start `RACERS` requests (`Nap`s of 0 - 30 ms, deadlines of 10 - 40 ms, each
    cancelled 0 - 30 ms after it started, timings drawn from `seed`), call `meanwhile()`
    half-way through, and return their outcomes once every one ended (bounded)."""
    rng = random.Random(seed)
    callers = [terminator.caller(world) for _ in range(RACERS)]
    outs: list[Outcome] = []
    timers: list[threading.Timer] = []
    try:
        for i, c in enumerate(callers):
            nap, deadline, cancel_at = (rng.uniform(0.0, 0.03) for _ in range(3))

            def make(api: Any, i: int = i, nap: float = nap, deadline: float = deadline) -> Any:
                return world.call(Nap(i, nap), int, api).timeout(0.01 + deadline)

            source = CancellationSource()
            outs.append(c.launch(make, source.token))
            timer = threading.Timer(cancel_at, source.cancel)  # the race, not a wait
            timers.append(timer)
            timer.start()
            if i == RACERS // 2:
                meanwhile()
        for out in outs:
            assert out.wait(), "a racing call never ended"
    finally:
        for timer in timers:
            timer.join(WAIT)
        for c in callers:
            c.close()
    assert completion_dispatcher().drain(WAIT)
    assert all(out.settled == 1 for out in outs)
    napped = world.journal.items("napped")
    assert len(napped) == len(set(napped))  # no handler ran twice
    assert {i for i, out in enumerate(outs) if out.error is None} <= set(napped)
    for i, out in enumerate(outs):
        assert out.error is not None or out.value == i
        assert out.error is None or out.raised is terminator.raises_failures
    return outs


#: How a racing request may end besides its reply.
RACING: tuple[Failure, ...] = ((DeadlineExceededError, None), (CancelledError, None))


@pytest.mark.stress
def test_replies_deadlines_and_cancels_racing_end_each_call_exactly_once(
    world: World, terminator: Terminator
) -> None:
    outs = _race(world, terminator, SEED, lambda: None)
    for out in outs:
        assert out.error is None or (type(out.error), None) in RACING, repr(out.error)
    _after_the_target_ran_what_it_had(world)
    assert wait_until(lambda: world.caller.statistics().pending_calls == 0)
    assert wait_until(lambda: world.serving.statistics().pending_calls == 0)


@pytest.mark.stress
def test_the_serving_hosts_shutdown_racing_them_too_ends_each_call_exactly_once(
    world: World, terminator: Terminator
) -> None:
    stopping: list[ShutdownThread] = []
    outs = _race(
        world, terminator, SEED + 1, lambda: stopping.append(ShutdownThread(world.serving, WAIT))
    )
    # A call made once the drain began is refused as on its path; one made after the
    # serving Host stopped sees it gone (a lost peer, or no channel server).
    allowed = {
        *RACING,
        world.path.refused_while_draining,
        *world.path.raced_drain,
        *world.path.forced_by_shutdown,
    }
    for out in outs:
        assert out.error is None or (type(out.error), _reason(out.error)) in allowed, (
            repr(out.error),
            _reason(out.error),
        )
    assert stopping[0].join().outcome is ShutdownOutcome.STOPPED  # nothing was stuck
    assert wait_until(lambda: world.caller.statistics().pending_calls == 0)
    assert world.serving.statistics().pending_calls == 0
