"""Gates: who may run a turn (digest §3, §4 "Queues vs gates"; design/architecture.md §4).

SpotWide Spot: one gate over its handlers and timers. PerActor Spot: a gate for its own
work and one per timer. Entry Spot: a gate per Actor. Actor payloads always go to the
Actor's own queue.
"""

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    CapacityExceededError,
    CompletionSource,
    ManualClock,
    Spot,
    SpotContext,
    SpotMode,
    TimerTick,
    completion_dispatcher,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hold, Ping, Pong


class StartTimers(msgspec.Struct, frozen=True):
    keys: int
    interval: float


class StopTimers(msgspec.Struct, frozen=True):
    keys: int


class Work(msgspec.Struct, frozen=True):
    n: int


class OverlapMeter:
    """Counts how many turns are inside a critical section at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self.most_inside = 0

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._lock:
            self._inside += 1
            self.most_inside = max(self.most_inside, self._inside)
        try:
            # Give up the GIL inside the section so another pool thread *could* enter it
            # if the gate let it (this widens the race window; it orders nothing).
            os.sched_yield()
            yield
            os.sched_yield()
        finally:
            with self._lock:
                self._inside -= 1


@pytest.mark.stress
def test_spotwide_spot_handlers_and_timers_never_overlap(harness: HostHarness) -> None:
    meter = OverlapMeter()
    senders, per_sender, timer_keys, wanted_ticks = 4, 100, 4, 40
    lock = threading.Lock()
    counts = {"work": 0, "ticks": 0}
    all_worked = threading.Event()
    enough_ticks = threading.Event()

    class Room(Spot):
        @handler
        def start(self, ctx: SpotContext, msg: StartTimers) -> None:
            for key in range(msg.keys):
                ctx.timers.start(key, msg.interval, self.tick)

        @handler
        def stop(self, ctx: SpotContext, msg: StopTimers) -> None:
            for key in range(msg.keys):
                ctx.timers.cancel(key)

        @handler
        def work(self, ctx: SpotContext, msg: Work) -> None:
            with meter.turn(), lock:
                counts["work"] += 1
                if counts["work"] == senders * per_sender:
                    all_worked.set()

        def tick(self, ctx: SpotContext, tick: TimerTick) -> None:
            with meter.turn(), lock:
                counts["ticks"] += 1
                if counts["ticks"] == wanted_ticks:
                    enough_ticks.set()

    host = harness.host(spots=[Room], app_threads=4)
    host.spots.get_or_create("room", Room).submit_sync()

    for _ in range(5):
        counts.update(work=0, ticks=0)
        all_worked.clear()
        enough_ticks.clear()
        host.request_to_spot("room", StartTimers(timer_keys, 0.001)).submit_sync()
        barrier = threading.Barrier(senders)
        failures: list[BaseException] = []

        def send_all(
            barrier: threading.Barrier = barrier, failures: list[BaseException] = failures
        ) -> None:
            try:
                barrier.wait(WAIT)
                for n in range(per_sender):
                    host.send_to_spot("room", Work(n)).submit_sync()
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=send_all) for _ in range(senders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert all_worked.wait(WAIT)
        assert enough_ticks.wait(WAIT)
        host.request_to_spot("room", StopTimers(timer_keys)).submit_sync()

        assert counts["work"] == senders * per_sender
        assert meter.most_inside == 1


def test_per_actor_spot_timer_ticks_overlap_its_own_handlers(harness: HostHarness) -> None:
    clock = ManualClock()
    entered = threading.Event()
    tick_ran = threading.Event()

    class Lobby(Spot):
        mode = SpotMode.PER_ACTOR

        @handler
        def wait_for_tick(self, ctx: SpotContext, msg: Hold) -> bool:
            ctx.timers.start("t", 1.0, lambda _ctx, _tick: tick_ran.set())
            entered.set()
            # Only the timer's tick can set this: it must run while this turn still runs.
            return tick_ran.wait(WAIT)

    host = harness.host(spots=[Lobby], clock=clock, app_threads=2)
    host.spots.get_or_create("lobby", Lobby).submit_sync()

    reply = host.request_to_spot("lobby", Hold(), reply=bool).timeout(30.0).submit()
    assert entered.wait(WAIT)
    clock.advance(1.0)

    assert reply.result(WAIT) is True


def test_per_actor_spot_timers_overlap_each_other(harness: HostHarness) -> None:
    clock = ManualClock()
    b_ran = threading.Event()
    a_saw_b: list[bool] = []
    a_done = threading.Event()

    def tick_a(ctx: SpotContext, tick: TimerTick) -> None:
        # Only timer "b"'s tick can set this: it must run while this tick still runs.
        a_saw_b.append(b_ran.wait(WAIT))
        a_done.set()

    class Lobby(Spot):
        mode = SpotMode.PER_ACTOR

        @handler
        def start(self, ctx: SpotContext, msg: Hold) -> None:
            ctx.timers.start("a", 1.0, tick_a)
            ctx.timers.start("b", 1.0, lambda _ctx, _tick: b_ran.set())

    host = harness.host(spots=[Lobby], clock=clock, app_threads=2)
    host.spots.get_or_create("lobby", Lobby).submit_sync()
    host.request_to_spot("lobby", Hold()).submit_sync()

    clock.advance(1.0)

    assert a_done.wait(WAIT)
    assert a_saw_b == [True]


def test_entry_spot_actors_run_concurrently_with_each_other(harness: HostHarness) -> None:
    entered = threading.Event()
    signalled = threading.Event()
    spots_seen: list[str] = []

    class Player(Actor):
        @handler
        def wait_for_peer(self, ctx: ActorContext, msg: Hold) -> bool:
            spots_seen.append(ctx.spot_id)
            entered.set()
            # Only the other Actor's handler can set this.
            return signalled.wait(WAIT)

        @handler
        def signal(self, ctx: ActorContext, msg: Ping) -> Pong:
            spots_seen.append(ctx.spot_id)
            signalled.set()
            return Pong(msg.n)

    host = harness.host(actors=[Player], app_threads=2)
    host.actors.get_or_create("alice", Player).submit_sync()
    host.actors.get_or_create("bob", Player).submit_sync()

    waiting = host.request_to_actor("alice", Hold(), reply=bool).submit()
    assert entered.wait(WAIT)
    assert host.request_to_actor("bob", Ping(1), reply=Pong).submit_sync() == Pong(1)

    assert waiting.result(WAIT) is True
    # Both are members of the one Entry Spot, yet each had a gate of its own.
    assert spots_seen == [host.entry_spot_id, host.entry_spot_id]


def test_actor_payloads_go_to_the_actors_own_queue(harness: HostHarness) -> None:
    latch = harness.latch()
    entered = threading.Event()

    class Player(Actor):
        @handler
        def hold(self, ctx: ActorContext, msg: Hold) -> None:
            entered.set()
            latch.wait(WAIT)

        @handler
        def ping(self, ctx: ActorContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(actors=[Player], application_lane_items=2, app_threads=2)
    host.actors.get_or_create("alice", Player).submit_sync()
    host.actors.get_or_create("bob", Player).submit_sync()
    host.send_to_actor("alice", Hold()).submit_sync()
    assert entered.wait(WAIT)
    host.send_to_actor("alice", Ping(1)).submit_sync()  # alice's queue is now full

    refused = host.request_to_actor("alice", Ping(2)).submit()
    with pytest.raises(CapacityExceededError):
        refused.result(WAIT)
    # Both Actors belong to the Entry Spot; had their payloads shared its queue, bob's
    # request would have been refused too.
    assert host.request_to_actor("bob", Ping(3), reply=Pong).submit_sync() == Pong(3)
    assert host.statistics().queued_records == 1


def test_done_callback_added_in_a_turn_runs_later_under_that_owners_gate(
    harness: HostHarness,
) -> None:
    source: CompletionSource[int] = CompletionSource()
    latch = harness.latch()
    entered = threading.Event()
    callback_ran = threading.Event()
    busy = False
    seen: list[tuple[bool, int]] = []

    class Room(Spot):
        @handler
        def register(self, ctx: SpotContext, msg: Ping) -> None:
            source.completion.add_done_callback(self.on_done)

        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            nonlocal busy
            busy = True
            entered.set()
            latch.wait(WAIT)
            busy = False

        def on_done(self, completion: object) -> None:
            seen.append((busy, source.completion.result()))
            callback_ran.set()

    host = harness.host(spots=[Room], app_threads=2)
    host.spots.get_or_create("room", Room).submit_sync()
    host.request_to_spot("room", Ping()).submit_sync()
    host.send_to_spot("room", Hold()).submit_sync()
    assert entered.wait(WAIT)

    source.set_result(7)
    # Everything the dispatcher was given has been handed on; the callback itself waits
    # for the Room's gate, which the blocked handler holds.
    assert completion_dispatcher().drain(WAIT)
    assert not callback_ran.is_set()

    latch.set()
    assert callback_ran.wait(WAIT)
    assert seen == [(False, 7)]
