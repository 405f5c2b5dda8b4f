"""The global Spot the multi-process tests create across node processes: a `Room` that
answers which node it runs on and counts every message and construction in its process
(the test asks a node for its counts with `RoomCounts`)."""

from __future__ import annotations

import threading

import msgspec

import zlink_actors as z

__all__ = [
    "ROOM_TYPES",
    "CreateRooms",
    "Made",
    "Room",
    "RoomCounts",
    "Rooms",
    "Said",
    "Say",
    "counts",
]


class Say(msgspec.Struct, frozen=True):
    text: str


class Said(msgspec.Struct, frozen=True):
    text: str
    room: str
    routing_id: str


class RoomCounts(msgspec.Struct, frozen=True):
    """Ask a node (node-direct) for its Room counts."""


class Rooms(msgspec.Struct, frozen=True):
    constructed: int
    handled: int
    routing_id: str


class CreateRooms(msgspec.Struct, frozen=True):
    """Ask a node (node-direct) to get-or-create these Room ids itself, in order."""

    ids: list[str]


class Made(msgspec.Struct, frozen=True):
    """One get-or-create result: "Created" or "Existing", and the ref's fields."""

    outcome: str
    spot_id: str
    generation: int
    routing_id: str


ROOM_TYPES: tuple[type, ...] = (Say, Said, RoomCounts, Rooms, CreateRooms, Made)

_lock = threading.Lock()
_constructed = 0
_handled = 0


def counts() -> tuple[int, int]:
    with _lock:
        return _constructed, _handled


class Room(z.Spot):
    mode = z.SpotMode.SPOT_WIDE

    def __init__(self) -> None:
        global _constructed
        with _lock:
            _constructed += 1

    @z.handler
    def say(self, ctx: z.SpotContext, msg: Say) -> Said:
        global _handled
        with _lock:
            _handled += 1
        info = ctx.node
        assert info is not None
        return Said(msg.text, ctx.spot_id, info.routing_id)
