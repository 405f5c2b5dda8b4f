"""64-byte msgspec payloads shared by the scenarios, and the peer actors."""

from __future__ import annotations

import threading

import msgspec
import pykka

import zlink_actors as z

#: Encodes to 64 bytes of MessagePack (checked in tests/unit/test_benchmarks.py).
FILLER = "x" * 52


class Msg(msgspec.Struct, frozen=True):
    n: int
    text: str = FILLER


class Counter(z.Spot):
    """Counts one-way messages; sets `done` when it has seen `target` of them."""

    target = 0
    done: threading.Event | None = None

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    @z.handler
    def on_msg(self, ctx: z.SpotContext, msg: Msg) -> int:
        self.seen += 1
        if self.seen == Counter.target and Counter.done is not None:
            Counter.done.set()
        return msg.n


class PeerCounter(pykka.ThreadingActor):  # type: ignore[misc]
    def __init__(self, target: int, done: threading.Event) -> None:
        super().__init__()
        self.seen = 0
        self.target = target
        self.done = done

    def on_receive(self, message: object) -> object:
        if isinstance(message, Msg):
            self.seen += 1
            if self.seen == self.target:
                self.done.set()
            return message.n
        return None
