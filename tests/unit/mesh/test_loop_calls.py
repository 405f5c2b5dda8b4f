"""`mesh/loop_calls.py`: calls run on the Host's I/O loop under one pending entry, and
the helpers that tie an asyncio step to a `Completion` (each on a real Host's runtime
and I/O loop, with an injected clock where time matters)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    DeadlineExceededError,
    InternalFailureError,
    ManualClock,
    NotFoundError,
)
from zlink_actors._core.cancellation import CancellationToken
from zlink_actors._core.completion import failed, settled
from zlink_actors.mesh.loop_calls import LoopCalls, failure, pause, wait
from zlink_actors.testing import WAIT, HostHarness


def test_left_rounds_up_to_ten_milliseconds_and_refuses_a_passed_deadline(
    harness: HostHarness,
) -> None:
    clock = ManualClock()
    calls = LoopCalls(harness.host(clock=clock)._runtime)
    now = clock.monotonic()
    assert calls.left(now + 1.001) == pytest.approx(1.01)
    assert calls.left(now + 0.5) == pytest.approx(0.5)
    with pytest.raises(DeadlineExceededError):
        calls.left(now)


def test_a_call_ends_with_its_work_s_result_or_typed_error_once(harness: HostHarness) -> None:
    calls = LoopCalls(harness.host()._runtime)

    async def value(due: float, cancel: CancellationToken | None) -> object:
        return 42

    async def missing(due: float, cancel: CancellationToken | None) -> object:
        raise NotFoundError("no such thing")

    async def broken(due: float, cancel: CancellationToken | None) -> object:
        raise RuntimeError("a bug")

    assert calls.call(value, WAIT, None).result(WAIT) == 42
    with pytest.raises(NotFoundError):
        calls.call(missing, WAIT, None).result(WAIT)
    with pytest.raises(InternalFailureError):  # not a ZlinkError: an internal failure
        calls.call(broken, WAIT, None).result(WAIT)


def test_a_call_s_caller_cancellation_and_deadline_race_its_work(harness: HostHarness) -> None:
    clock = ManualClock()
    calls = LoopCalls(harness.host(clock=clock)._runtime)
    never = threading.Event()

    async def stuck(due: float, cancel: CancellationToken | None) -> object:
        await asyncio.get_running_loop().run_in_executor(None, never.wait, WAIT)
        return None

    source = CancellationSource()
    cancelled = calls.call(stuck, WAIT, source.token)
    source.cancel()
    with pytest.raises(CancelledError):
        cancelled.result(WAIT)
    timed = calls.call(stuck, 1.0, None)
    clock.advance(1.0)
    with pytest.raises(DeadlineExceededError):
        timed.result(WAIT)
    never.set()


def test_a_one_way_refuses_cancellation_and_ends_at_its_work_s_end(harness: HostHarness) -> None:
    calls = LoopCalls(harness.host()._runtime)
    ran = threading.Event()

    async def work() -> None:
        ran.set()

    done = calls.one_way(work())
    assert done.result(WAIT) is None
    assert ran.is_set()
    assert done.cancel() is False


def test_wait_settles_on_the_loop_with_the_completion_s_value_or_error() -> None:
    async def main() -> None:
        assert await wait(settled(7)) == 7
        with pytest.raises(NotFoundError):
            await wait(failed(NotFoundError("gone")))
        woken = asyncio.Event()
        woken.set()
        await asyncio.wait_for(pause(WAIT, woken), WAIT)  # returns at once when woken

    asyncio.run(main())


def test_failure_types_what_a_step_raised() -> None:
    assert failure(None) is None
    assert failure(3) is None
    missing = NotFoundError("x")
    assert failure(missing) is missing
    assert isinstance(failure(asyncio.CancelledError()), DeadlineExceededError)
    assert isinstance(failure(ValueError("bug")), InternalFailureError)
