"""`Host.statistics()` counts the objects the application made.

The Entry Spot is the framework's own: a new Host reports no Spots, and each User Spot or
Instance Spot counts from Ready until it is removed.
"""

import threading

from zlink_actors import (
    Actor,
    ActorContext,
    ChannelContext,
    ChannelHandler,
    CloseReason,
    InstanceSpot,
    ManualClock,
    Spot,
    SpotContext,
    TimerTick,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Note, Probe


class Room(Spot):
    @handler
    def probe(self, ctx: SpotContext, msg: Probe) -> str:
        return ctx.spot_id


class Match(InstanceSpot):
    @handler
    def probe(self, ctx: SpotContext, msg: Probe) -> str:
        return ctx.spot_id


class Player(Actor):
    @handler
    def probe(self, ctx: ActorContext, msg: Probe) -> str:
        return ctx.actor_id


class Greeter(ChannelHandler):
    @handler
    def probe(self, ctx: ChannelContext, msg: Probe) -> str:
        return ctx.channel


def test_statistics_count_the_spots_actors_and_channels_the_application_made(
    harness: HostHarness,
) -> None:
    host = harness.host(
        spots=[Room, Match], actors=[Player], channels={"greet": Greeter, "hello": Greeter}
    )
    fresh = host.statistics()
    assert (fresh.spots, fresh.actors, fresh.channels) == (0, 0, 2)  # no Entry Spot

    host.spots.get_or_create("lobby", Room).submit_sync()
    host.spots.create(Room).submit_sync()
    assert host.request_to_spot("m1", Probe()).activate().submit_sync() == "m1"
    host.actors.get_or_create("ana", Player).submit_sync()
    made = host.statistics()
    assert (made.spots, made.actors, made.channels) == (3, 1, 2)

    assert host.spots.close("lobby").submit_sync() is True
    assert host.actors.close("ana").submit_sync() is True
    closed = host.statistics()
    assert (closed.spots, closed.actors, closed.channels) == (2, 0, 2)


def test_handler_failures_counts_timer_callbacks_and_lifecycle_hooks_that_raised(
    harness: HostHarness,
) -> None:
    ticked = threading.Event()

    class Faulty(Spot):
        @handler
        def start(self, ctx: SpotContext, msg: Note) -> None:
            ctx.timers.start("t", 1.0, self.tick)

        def tick(self, ctx: SpotContext, tick: TimerTick) -> None:
            ticked.set()
            raise ValueError("tick failed")

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> str:
            return ctx.spot_id

        def on_closing(self, ctx: SpotContext, reason: CloseReason) -> None:
            raise ValueError("on_closing failed")

    clock = ManualClock()
    host = harness.host(spots=[Faulty], clock=clock)
    host.spots.get_or_create("f", Faulty).submit_sync()
    host.request_to_spot("f", Note()).submit_sync()
    clock.advance(1.0)
    assert ticked.wait(WAIT)
    # FIFO: once the probe is answered the tick's post-turn work is done.
    assert host.request_to_spot("f", Probe()).timeout(60).submit_sync() == "f"
    assert host.statistics().handler_failures == 1

    assert host.spots.close("f").timeout(60).submit_sync() is True
    assert host.statistics().handler_failures == 2
