"""The payload types the test process and its node processes exchange (the same class
names on both sides, so the wire type names match)."""

from __future__ import annotations

import msgspec

__all__ = [
    "ALL_TYPES",
    "Blob",
    "Count",
    "Done",
    "Echoed",
    "HowMany",
    "Job",
    "JobLog",
    "Load",
    "Nap",
    "Napped",
    "Ping",
    "Pong",
    "Relay",
    "Seq",
    "SeqLog",
    "SetWeight",
    "Stats",
    "StatsReply",
]


class Ping(msgspec.Struct, frozen=True):
    n: int


class Pong(msgspec.Struct, frozen=True):
    n: int
    routing_id: str


class Blob(msgspec.Struct, frozen=True):
    """A payload to echo; the node answers with its digest and the bytes themselves."""

    data: bytes


class Echoed(msgspec.Struct, frozen=True):
    sha256: str
    size: int
    data: bytes
    routing_id: str


class Relay(msgspec.Struct, frozen=True):
    """Ask a node to request `Blob(data)` of node `target` and return its `Echoed`."""

    target: str
    data: bytes


class Nap(msgspec.Struct, frozen=True):
    """Hold the handler for `seconds`; released early when the node begins to stop,
    unless `through_stop` (then a stopping node finishes it as accepted work)."""

    seconds: float
    through_stop: bool = False


class Napped(msgspec.Struct, frozen=True):
    routing_id: str


class Job(msgspec.Struct, frozen=True):
    n: int


class Done(msgspec.Struct, frozen=True):
    n: int
    routing_id: str


class Load(msgspec.Struct, frozen=True):
    """A one-way message to the channel handler (counted)."""

    data: bytes


class Seq(msgspec.Struct, frozen=True):
    """A numbered one-way to the channel handler: it records `n` in arrival order."""

    n: int
    data: bytes = b""


class SeqLog(msgspec.Struct, frozen=True):
    """The numbers of the `Seq` messages this node's channel handler ran, in order."""


class JobLog(msgspec.Struct, frozen=True):
    """The numbers of the `Job` requests this node's channel handler ran, in order."""


class HowMany(msgspec.Struct, frozen=True):
    """How many messages this node's channel handler has handled."""


class Count(msgspec.Struct, frozen=True):
    handled: int
    routing_id: str


class SetWeight(msgspec.Struct, frozen=True):
    channel: str
    weight: int


class Stats(msgspec.Struct, frozen=True):
    """A snapshot of the node's Host and its peers."""


class StatsReply(msgspec.Struct, frozen=True):
    routing_id: str
    waiting_sends: int
    queued_records: int
    napping: int  # naps running now
    peers: dict[str, str]  # routing id -> PeerState value


ALL_TYPES: tuple[type, ...] = (
    Ping,
    Pong,
    Blob,
    Echoed,
    Relay,
    Nap,
    Napped,
    Job,
    Done,
    Load,
    Seq,
    SeqLog,
    JobLog,
    HowMany,
    Count,
    SetWeight,
    Stats,
    StatsReply,
)
