"""One rule for every time argument (`_core/validation.check_seconds`; docs/validation.md).

Each entry point that takes seconds is tried with the same eleven values; the table says
what each must do with each: accept it ("ok"), or refuse it with `TypeError` / `ValueError`
(`ConfigurationError` in `Host(...)`) whose message names the argument. Refusal never
depends on timing: a settled `Completion` refuses a bad `timeout` as an unsettled one does.
"""

from __future__ import annotations

import math
import threading
import typing
from collections.abc import Callable
from fractions import Fraction
from typing import Annotated, Any

import msgspec
import pytest

from zlink_actors import (
    CompletionSource,
    ConfigurationError,
    Deadline,
    Host,
    HostState,
    InternalFailureError,
    ManualClock,
    ShutdownOutcome,
    Spot,
    SpotContext,
    TimerTick,
    handler,
)
from zlink_actors._core.validation import (
    MAX_SECONDS,
    MIN_INTERVAL,
    check_id,
    check_seconds,
    reply_mismatch,
    reply_rule,
)
from zlink_actors.testing import WAIT

MAX = threading.TIMEOUT_MAX

#: The values every entry point is tried with, by a short name for the test ids.
VALUES: dict[str, object] = {
    "str": "1",
    "bool": True,
    "None": None,
    "nan": math.nan,
    "-1": -1,
    "0": 0,
    "inf": math.inf,
    "1e300": 1e300,
    "10**400": 10**400,
    "TIMEOUT_MAX": MAX,
    "normal": 0.5,
}

OK, TE, VE, CE = "ok", TypeError, ValueError, ConfigurationError

#: Entry point -> (argument name, outcome for each of VALUES, in order).
TABLE: dict[str, tuple[str, tuple[object, ...]]] = {
    # str  bool  None  nan  -1  0   inf  1e300  10**400  MAX  normal
    "Call.timeout": ("timeout", (TE, TE, TE, VE, VE, VE, VE, VE, VE, OK, OK)),
    "Completion.wait": ("timeout", (TE, TE, OK, VE, VE, OK, VE, VE, VE, OK, OK)),
    "Completion.result": ("timeout", (TE, TE, OK, VE, VE, OK, VE, VE, VE, OK, OK)),
    "Completion.exception": ("timeout", (TE, TE, OK, VE, VE, OK, VE, VE, VE, OK, OK)),
    "Host(default_request_timeout)": (
        "default_request_timeout",
        (CE, CE, CE, CE, CE, CE, CE, CE, CE, OK, OK),
    ),
    "Host.shutdown": ("deadline", (TE, TE, TE, VE, VE, VE, VE, VE, VE, OK, OK)),
    "Deadline.after": ("seconds", (TE, TE, OK, VE, VE, OK, VE, VE, VE, OK, OK)),
    "TimerSet.start": ("interval", (TE, TE, TE, VE, VE, VE, VE, VE, VE, OK, OK)),
    "ManualClock.advance": ("seconds", (TE, TE, TE, VE, VE, OK, VE, VE, VE, OK, OK)),
}


class StartTimer(msgspec.Struct, frozen=True):
    interval: Any


class Ping(msgspec.Struct, frozen=True):
    n: int


def _tick(ctx: SpotContext, tick: TimerTick) -> None:
    pass


class Timed(Spot):
    """Starts timer "t" with the interval it is sent; replies what `start` raised."""

    @handler
    def start(self, ctx: SpotContext, msg: StartTimer) -> str:
        try:
            ctx.timers.start("t", msg.interval, _tick)
        except (TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "ok" if ctx.timers.cancel("t") else "not started"

    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        return msg.n


class Raw(Spot):
    """Starts timer "t" with the interval it is sent, and lets `start` raise."""

    @handler
    def start(self, ctx: SpotContext, msg: StartTimer) -> None:
        ctx.timers.start("t", msg.interval, _tick)

    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        return msg.n


def _settled() -> CompletionSource[int]:
    source: CompletionSource[int] = CompletionSource()
    source.set_result(7)
    return source


def _run(entry: str, value: Any, make_host: Callable[..., Host]) -> None:
    """Pass `value` to `entry`; returns normally when it was accepted."""
    if entry == "Call.timeout":
        call = make_host().run_cpu_worker(int).timeout(value)
        assert call.submit().result(WAIT) == 0
    elif entry == "Completion.wait":
        assert _settled().completion.wait(value) is True
    elif entry == "Completion.result":
        assert _settled().completion.result(value) == 7
    elif entry == "Completion.exception":
        assert _settled().completion.exception(value) is None
    elif entry == "Host(default_request_timeout)":
        host = make_host(spots=[Timed], default_request_timeout=value)
        host.spots.get_or_create("t", Timed).submit_sync()
        assert host.request_to_spot("t", Ping(3), reply=int).submit_sync() == 3
    elif entry == "Host.shutdown":
        host = make_host()
        try:
            result = host.shutdown(deadline=value)
        except (TypeError, ValueError):
            assert host.state is HostState.SERVING
            raise
        assert result.outcome is ShutdownOutcome.STOPPED, result
    elif entry == "Deadline.after":
        clock = ManualClock(start=10.0)
        deadline = Deadline.after(value, clock)
        assert deadline.at == (math.inf if value is None else 10.0 + value)
    elif entry == "TimerSet.start":
        host = make_host(spots=[Timed], clock=ManualClock())
        host.spots.get_or_create("t", Timed).submit_sync()
        outcome = host.request_to_spot("t", StartTimer(value), reply=str).submit_sync()
        if outcome != "ok":
            kind, _, message = outcome.partition(": ")
            raise {"TypeError": TypeError, "ValueError": ValueError}[kind](message)
    elif entry == "ManualClock.advance":
        clock = ManualClock(start=1.0)
        try:
            clock.advance(value)
        except (TypeError, ValueError):
            assert clock.monotonic() == 1.0
            raise
        assert clock.monotonic() == 1.0 + value
    else:  # pragma: no cover - the table names only the entries above
        raise AssertionError(entry)


CELLS = [
    pytest.param(entry, value, outcome, name, id=f"{entry}-{label}")
    for entry, (name, outcomes) in TABLE.items()
    for (label, value), outcome in zip(VALUES.items(), outcomes, strict=True)
]


@pytest.mark.parametrize(("entry", "value", "outcome", "name"), CELLS)
def test_time_argument_is_accepted_or_refused_as_the_table_says(
    entry: str, value: object, outcome: object, name: str, make_host: Callable[..., Host]
) -> None:
    if outcome == OK:
        _run(entry, value, make_host)
        return
    assert isinstance(outcome, type)
    with pytest.raises(outcome, match=name) as caught:
        _run(entry, value, make_host)
    assert type(caught.value) is outcome  # never an OverflowError, nor a subclass


def test_a_bad_observation_timeout_is_refused_before_blocking() -> None:
    pending: CompletionSource[int] = CompletionSource()

    with pytest.raises(TypeError, match="timeout"):
        pending.completion.result(timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        pending.completion.wait(-1)
    with pytest.raises(TimeoutError):
        pending.completion.result(timeout=0)  # 0 polls
    assert pending.completion.wait(0) is False
    assert not pending.completion.done()


@pytest.mark.parametrize("interval", [5e-324, 0.000999, MIN_INTERVAL / 2])
def test_a_timer_interval_under_one_millisecond_is_refused_and_the_host_keeps_serving(
    interval: float, make_host: Callable[..., Host]
) -> None:
    host = make_host(spots=[Raw], clock=ManualClock())
    host.spots.get_or_create("r", Raw).submit_sync()

    with pytest.raises(InternalFailureError) as caught:
        host.request_to_spot("r", StartTimer(interval)).submit_sync()

    assert isinstance(caught.value.__cause__, ValueError)
    assert "interval" in str(caught.value.__cause__)
    assert host.request_to_spot("r", Ping(5), reply=int).submit_sync() == 5
    result = host.shutdown(deadline=WAIT)
    assert result.outcome is ShutdownOutcome.STOPPED, result


def test_a_timer_interval_of_one_millisecond_is_accepted(make_host: Callable[..., Host]) -> None:
    host = make_host(spots=[Timed], clock=ManualClock())
    host.spots.get_or_create("t", Timed).submit_sync()

    assert host.request_to_spot("t", StartTimer(MIN_INTERVAL), reply=str).submit_sync() == "ok"


@pytest.mark.parametrize("seconds", [math.inf, math.nan, 1e300])
def test_advancing_a_manual_clock_by_a_bad_step_is_refused_and_the_host_keeps_serving(
    seconds: float, make_host: Callable[..., Host]
) -> None:
    clock = ManualClock()
    host = make_host(spots=[Raw], clock=clock)
    host.spots.get_or_create("r", Raw).submit_sync()

    with pytest.raises(ValueError, match="NaN" if math.isnan(seconds) else "TIMEOUT_MAX"):
        clock.advance(seconds)

    assert clock.monotonic() == 0.0
    assert host.request_to_spot("r", Ping(6), reply=int).submit_sync() == 6
    result = host.shutdown(deadline=WAIT)
    assert result.outcome is ShutdownOutcome.STOPPED, result


def test_a_bad_default_request_timeout_names_the_option() -> None:
    with pytest.raises(ConfigurationError, match=r"default_request_timeout.*got str"):
        Host(default_request_timeout="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"default_request_timeout.*> 0"):
        Host(default_request_timeout=0)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", "timeout must be a real number (seconds), got str"),
        (True, "timeout must be a real number (seconds), got bool"),
        (None, "timeout must be a real number (seconds), got None"),
        (math.nan, "timeout must be a number, not NaN"),
        (-1, "timeout must be > 0 seconds, got -1"),
        (math.inf, "timeout must be finite and at most threading.TIMEOUT_MAX"),
        (10**400, "got an int of 1329 bits"),
    ],
)
def test_messages_say_what_was_wrong(value: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError)) as caught:
        check_seconds("timeout", value)

    assert message in str(caught.value)


def test_other_real_numbers_are_seconds_too() -> None:
    assert check_seconds("timeout", Fraction(1, 4)) == 0.25
    assert check_seconds("timeout", MAX_SECONDS) == MAX_SECONDS
    with pytest.raises(ValueError, match="> 0"):
        check_seconds("timeout", -(10**400))


# -- ids and channel names -------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["a", "a" * 255, "€" * 85, "😀" * 63 + "abc", "é" * 127, "\u0000"],
    ids=["1-byte", "255-ascii", "255-3-byte", "255-4-byte", "254-2-byte", "nul"],
)
def test_an_id_of_1_to_255_strict_utf8_bytes_is_taken_as_is(value: str) -> None:
    assert check_id("spot_id", value) is value


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("", ValueError, "1-255 UTF-8 bytes, got 0"),
        ("a" * 256, ValueError, "got 256"),
        ("é" * 128, ValueError, "got 256"),
        ("\ud800", ValueError, "lone surrogate"),  # one character, no UTF-8 encoding
        ("ab\udfff", ValueError, "at index 2"),
        (5, TypeError, "must be a str, got int"),
        (None, TypeError, "got None"),
    ],
)
def test_an_id_outside_the_rule_is_refused(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match="spot_id") as caught:
        check_id("spot_id", value)

    assert message in str(caught.value)


def test_a_str_subclass_id_is_checked_by_its_encoding() -> None:
    class Name(str):
        __slots__ = ()

    assert check_id("actor_id", Name("ana")) == "ana"
    with pytest.raises(ValueError, match="surrogate"):
        check_id("actor_id", Name("\ud800"))


# -- reply types -----------------------------------------------------------------------


def test_a_class_is_its_own_reply_rule_and_any_checks_nothing() -> None:
    class Plain:
        pass

    assert reply_rule(Plain) is Plain
    assert reply_rule(Ping) is Ping
    assert reply_rule(typing.Any) is None


def test_a_reply_rule_is_made_once_per_type_and_named_after_it() -> None:
    rule = reply_rule(int | None)

    assert rule is not None
    assert reply_rule(int | None) is rule
    assert rule.__name__ == "int | None"
    assert isinstance(3, rule)
    assert isinstance(None, rule)
    assert not isinstance("3", rule)
    assert not isinstance(3.0, rule)


def test_a_reply_rule_for_an_unhashable_type_still_works() -> None:
    unhashable = Annotated[list[int], {"doc": "not hashable"}]  # dict metadata
    with pytest.raises(TypeError):
        hash(unhashable)

    rule = reply_rule(unhashable)

    assert rule is not None
    assert isinstance([1], rule)
    assert not isinstance([1.5], rule)


def test_a_value_that_msgspec_would_convert_does_not_conform() -> None:
    class Items(list[int]):
        pass

    rule = reply_rule(list[int])

    assert rule is not None
    assert isinstance([1, 2], rule)
    assert not isinstance(Items([1]), rule)  # msgspec would make a list of it
    assert not isinstance((1, 2), rule)


def test_a_mismatch_message_says_why() -> None:
    rule = reply_rule(list[int])

    assert rule is not None
    assert "it would have to be converted" in reply_mismatch(rule, (1, 2))
    assert "Expected `int`, got `str` - at `$[0]`" in reply_mismatch(rule, ["x"])
    assert reply_mismatch(int, "x") == "the reply is a str, expected int"


@pytest.mark.parametrize("reply", [5, "int", threading.Lock])
def test_a_reply_type_msgspec_cannot_handle_is_a_type_error(reply: object) -> None:
    with pytest.raises(TypeError, match="reply= takes a class or a type msgspec can validate"):
        reply_rule(reply)
