"""Payloads in one process (docs/object-model.md, "Payloads").

In one process any object is a payload. It is passed by reference, never copied or
encoded: the handler receives the sender's own object, and a reply reaches the caller as
the object the handler returned. Frozen `msgspec.Struct`s are a convention, not a rule.
"""

import dataclasses
import threading

import pytest

from zlink_actors import Host, Spot, SpotContext, handler
from zlink_actors.testing import WAIT, HostHarness


class Bag(dict[str, object]):
    """A mutable dict subclass: not a Struct, not frozen."""


@dataclasses.dataclass
class Order:
    """A plain (mutable) dataclass."""

    item: str
    count: int = 1


def make_payload(kind: str) -> Bag | Order:
    return Bag(item="tea") if kind == "dict subclass" else Order("tea")


class Shop(Spot):
    """Keeps every payload it handles, and answers a request with the payload itself."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[object] = []
        self.arrived = threading.Event()

    def _keep(self, msg: object) -> None:
        self.received.append(msg)
        self.arrived.set()

    @handler
    def bag(self, ctx: SpotContext, msg: Bag) -> Bag:
        self._keep(msg)
        return msg

    @handler
    def order(self, ctx: SpotContext, msg: Order) -> Order:
        self._keep(msg)
        return msg


def open_shop(harness: HostHarness) -> tuple[Host, Shop]:
    """A Host with one Shop, and that Shop's instance (the framework constructs it)."""
    made: list[Shop] = []

    class Recorded(Shop):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    host = harness.host(spots=[Recorded])
    host.spots.get_or_create("shop", Recorded).submit_sync()
    (shop,) = made
    return host, shop


@pytest.mark.parametrize("kind", ["dict subclass", "dataclass"])
def test_a_one_way_payload_that_is_not_a_struct_reaches_the_handler_as_the_same_object(
    harness: HostHarness, kind: str
) -> None:
    host, shop = open_shop(harness)
    payload = make_payload(kind)

    host.send_to_spot("shop", payload).submit_sync()

    assert shop.arrived.wait(WAIT)
    assert len(shop.received) == 1
    assert shop.received[0] is payload


@pytest.mark.parametrize("kind", ["dict subclass", "dataclass"])
def test_a_request_payload_and_its_reply_that_are_not_structs_travel_as_the_same_objects(
    harness: HostHarness, kind: str
) -> None:
    host, shop = open_shop(harness)
    payload = make_payload(kind)

    reply = host.request_to_spot("shop", payload, reply=type(payload)).submit_sync()

    assert len(shop.received) == 1
    assert shop.received[0] is payload
    assert reply is payload
