"""Message types and helpers shared by the object-model contract tests.

Concurrency here is ordered by `threading.Event`, `threading.Barrier`, FIFO probes and
the Host's own timer heap, never by sleeping. `NEGATIVE_WAIT` is the one exception, and
only for checks that something does *not* happen where its absence cannot be observed
any other way: a correct runtime passes them regardless of the value.
"""

import threading
from typing import Any

import msgspec

from zlink_actors import Actor, ActorManager, Host, RequestCall, Spot, SpotContext, SpotManager
from zlink_actors.testing import HostHarness

from .._support import NEGATIVE_WAIT

__all__ = [
    "KINDS",
    "NEGATIVE_WAIT",
    "Countdown",
    "base_class",
    "host_with",
    "manager_of",
    "own_id",
    "request_to",
    "Hit",
    "Hold",
    "Marker",
    "News",
    "Note",
    "Park",
    "Ping",
    "Probe",
    "Where",
]


class Ping(msgspec.Struct, frozen=True):
    n: int = 0


class Note(msgspec.Struct, frozen=True):
    n: int = 0


class Hit(msgspec.Struct, frozen=True):
    """A message whose only effect is to be counted or logged by its target."""

    n: int = 0


class Hold(msgspec.Struct, frozen=True):
    """Asks a handler to block on the test's latch."""


class Park(msgspec.Struct, frozen=True):
    """Asks an `async def` handler to await a held worker (with `yield_()` where eligible)."""


class Probe(msgspec.Struct, frozen=True):
    """A FIFO marker: once its reply arrives, every record queued before it has run."""


class Where(msgspec.Struct, frozen=True):
    """Asks an Actor which Spot it belongs to."""


class News(msgspec.Struct, frozen=True):
    text: str = ""


class Marker(msgspec.Struct, frozen=True):
    """A publish sent after the one under test, to learn that the earlier one is over."""


class Countdown:
    """An Event that is set once `count()` has been called `n` times."""

    def __init__(self, n: int) -> None:
        self._left = n
        self._lock = threading.Lock()
        self.done = threading.Event()
        if n <= 0:
            self.done.set()

    def count(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self.done.set()


# -- helpers for tests parametrised over KINDS ("spot" / "actor") ----------------------

KINDS = ["spot", "actor"]


def base_class(kind: str) -> type:
    return Spot if kind == "spot" else Actor


def host_with(harness: HostHarness, kind: str, *types: type, **options: Any) -> Host:
    return harness.host(**{f"{kind}s": list(types)}, **options)


def manager_of(host: Host, kind: str) -> SpotManager | ActorManager:
    return host.spots if kind == "spot" else host.actors


def own_id(ctx: Any) -> str:
    """The id of the Spot or Actor whose handler context `ctx` is."""
    return ctx.spot_id if isinstance(ctx, SpotContext) else ctx.actor_id


def request_to(host: Host, kind: str, obj_id: str, payload: object) -> RequestCall[Any]:
    if kind == "spot":
        return host.request_to_spot(obj_id, payload)
    return host.request_to_actor(obj_id, payload)
