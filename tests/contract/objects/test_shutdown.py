"""Objects at Host shutdown (docs/completion.md, "Shutdown").

A Spot or Actor whose creation was accepted before shutdown sealed admission is created
and then closed like every other object: it hears `on_closing(HOST_SHUTDOWN)`. A forced
stop counts exactly the one-way records it never ran, and none of them runs afterwards.
"""

import threading
from typing import Any

import pytest

from zlink_actors import (
    CloseReason,
    Created,
    HostState,
    InvalidOperationError,
    ShutdownOutcome,
    ShuttingDownError,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness, wait_until

from .._support import ShutdownThread
from ._support import KINDS, Hit, Hold, base_class, host_with, manager_of


@pytest.mark.parametrize("kind", KINDS)
def test_an_object_still_in_on_create_when_shutdown_starts_is_created_and_then_closed(
    harness: HostHarness, kind: str
) -> None:
    entered = threading.Event()
    latch = harness.latch()
    closings: list[CloseReason] = []

    class Slow(base_class(kind)):  # type: ignore[misc]
        def on_create(self, ctx: Any, request: object) -> str:
            entered.set()
            assert latch.wait(WAIT)
            return "made"

        def on_closing(self, ctx: Any, reason: CloseReason) -> None:
            closings.append(reason)

    host = host_with(harness, kind, Slow)
    creating = manager_of(host, kind).get_or_create("x", Slow).submit()
    assert entered.wait(WAIT)
    stopping = ShutdownThread(host, WAIT)
    assert wait_until(lambda: host.state is not HostState.SERVING)
    latch.set()

    created = creating.result(WAIT)
    assert type(created) is Created
    assert stopping.returned.wait(WAIT + 2)
    assert stopping.result is not None
    assert stopping.result.outcome is ShutdownOutcome.STOPPED
    assert closings == [CloseReason.HOST_SHUTDOWN]


def test_a_forced_stop_counts_every_one_way_record_it_never_ran(harness: HostHarness) -> None:
    entered = threading.Event()
    latch = harness.latch()
    handled: list[int] = []

    class Room(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            entered.set()
            assert latch.wait(WAIT)

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            handled.append(msg.n)

    host = harness.host(spots=[Room])
    host.spots.get_or_create("r", Room).submit_sync()
    host.send_to_spot("r", Hold()).submit_sync()
    assert entered.wait(WAIT)
    for n in range(21):
        host.send_to_spot("r", Hit(n)).submit_sync()

    result = host.shutdown(0.05)
    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    assert host.statistics().dropped_records == 21
    latch.set()
    assert wait_until(lambda: host.statistics().pool.busy_threads == 0)
    assert handled == []
    assert host.statistics().dropped_records == 21


def test_a_forced_stop_counts_the_batch_a_stuck_thread_took_and_never_runs_it(
    harness: HostHarness,
) -> None:
    entered = threading.Event()
    gate_latch = harness.latch()
    first_latch = harness.latch()
    handled: list[int] = []

    class Room(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            assert gate_latch.wait(WAIT)

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            handled.append(msg.n)
            if msg.n == 0:
                entered.set()
                assert first_latch.wait(WAIT)

    host = harness.host(spots=[Room], app_threads=1)
    host.spots.get_or_create("r", Room).submit_sync()
    host.send_to_spot("r", Hold()).submit_sync()
    for n in range(22):
        host.send_to_spot("r", Hit(n)).submit_sync()
    # The pool thread takes the queued Hits as one run; the first one gets stuck.
    gate_latch.set()
    assert entered.wait(WAIT)

    result = host.shutdown(0.05)
    assert result.outcome is ShutdownOutcome.FORCE_STOPPED
    first_latch.set()
    # Counted once the stuck thread returns and finds the mailbox closed; never run.
    assert wait_until(lambda: host.statistics().dropped_records == 21)
    assert handled == [0]


@pytest.mark.parametrize("kind", KINDS)
def test_get_or_create_of_its_own_id_inside_on_create_is_refused(
    harness: HostHarness, kind: str
) -> None:
    refused: list[BaseException] = []

    class Selfish(base_class(kind)):  # type: ignore[misc]
        def on_create(self, ctx: Any, request: object) -> None:
            manager = ctx.spots if kind == "spot" else ctx.actors
            try:
                manager.get_or_create("x", Selfish).submit()
            except InvalidOperationError as exc:
                refused.append(exc)

    host = host_with(harness, kind, Selfish)
    created = manager_of(host, kind).get_or_create("x", Selfish).timeout(WAIT).submit_sync()

    assert type(created) is Created
    assert len(refused) == 1


def test_a_create_admitted_just_before_shutdown_sealed_cannot_escape_it(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a create that passed the admission check just before shutdown
    began registered its object after shutdown had closed everything."""
    closings: list[CloseReason] = []

    class Room(Spot):
        def on_closing(self, ctx: SpotContext, reason: CloseReason) -> None:
            closings.append(reason)

    reached, go = threading.Event(), threading.Event()
    host = harness.host(spots=[Room])
    engine = host._runtime.engine
    real_lock = engine.lock

    class PausingLock:
        """The engine lock, entered after a pause on the creating thread: stands for a
        preemption right after the create passed the admission check."""

        def __enter__(self) -> None:
            if threading.current_thread().name == "creator" and not reached.is_set():
                reached.set()
                assert go.wait(WAIT)
            real_lock.acquire()

        def __exit__(self, *exc: object) -> None:
            real_lock.release()

    monkeypatch.setattr(engine, "lock", PausingLock())
    results: list[Any] = []
    creator = threading.Thread(
        target=lambda: results.append(host.spots.get_or_create("late", Room).submit()),
        name="creator",
    )
    creator.start()
    assert reached.wait(WAIT)
    stopping = ShutdownThread(host, WAIT)
    assert wait_until(lambda: host.state is not HostState.SERVING)
    go.set()
    creator.join(WAIT)
    assert not creator.is_alive()

    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    with pytest.raises(ShuttingDownError):
        results[0].result(WAIT)
    assert closings == []  # no object was made
