"""`Host.statistics()` counts the objects the application made.

The Entry Spot is the framework's own: a new Host reports no Spots, and each User Spot or
Instance Spot counts from Ready until it is removed.
"""

from zlink_actors import (
    Actor,
    ActorContext,
    ChannelContext,
    ChannelHandler,
    InstanceSpot,
    Spot,
    SpotContext,
    handler,
)

from ._support import Probe
from .conftest import Harness


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
    harness: Harness,
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
