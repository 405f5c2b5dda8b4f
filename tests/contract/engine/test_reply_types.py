"""`reply=` takes any type msgspec can validate (docs/validation.md, "Reply types").

A plain class is checked with `isinstance`, as before. Any other type (`int | None`,
`list[int]`, `dict[str, int]`, a union with a Struct, `Literal`, `Annotated`) is checked
by msgspec's strict validation: a reply that already conforms is delivered as is (the
same object); one that does not, or that would only conform once converted (a tuple for a
list, a dict for a Struct, 3 for a float), fails the call with `ProtocolError`. A type
msgspec cannot handle at all is a `TypeError` from the builder, before anything is sent.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Optional, Protocol

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    Host,
    ManualClock,
    ProtocolError,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.testing import HostHarness

from ._support import Note, Pong


class Give(msgspec.Struct, frozen=True):
    """Asks the handler to reply with `value` (the same object: payloads are by reference)."""

    value: Any


class Room(Spot):
    @handler
    def give(self, ctx: SpotContext, msg: Give) -> Any:
        return msg.value


class Player(Actor):
    @handler
    def give(self, ctx: ActorContext, msg: Give) -> Any:
        return msg.value


class Plain:
    pass


big = 10**20  # not a cached small int: identity shows the value was not copied

CONFORMING = [
    pytest.param(int | None, big, id="int|None-int"),
    pytest.param(int | None, None, id="int|None-None"),
    pytest.param(Optional[int], big, id="Optional-int"),  # noqa: UP045 - the typing form on purpose
    pytest.param(list[int], [1, 2, big], id="list[int]"),
    pytest.param(dict[str, int], {"a": 1}, id="dict[str,int]"),
    pytest.param(Pong | None, Pong(1), id="Struct|None-Struct"),
    pytest.param(list[Pong], [Pong(1), Pong(2)], id="list[Struct]"),
    pytest.param(tuple[int, str], (1, "a"), id="tuple[int,str]"),
    pytest.param(Literal["a", "b"], "a", id="Literal"),
    pytest.param(Annotated[int, msgspec.Meta(ge=0)], big, id="Annotated-ge0"),
    pytest.param(Plain | None, Plain(), id="custom-class|None"),
    pytest.param(typing.Any, object(), id="Any"),
    pytest.param(Pong, Pong(3), id="Struct-class"),
    pytest.param(int, big, id="plain-class"),
]

NOT_CONFORMING = [
    pytest.param(int, "3", id="plain-class-str"),
    pytest.param(int | None, "3", id="int|None-str"),
    pytest.param(int | None, 3.0, id="int|None-float"),
    pytest.param(float | None, 3, id="float|None-int-needs-converting"),
    pytest.param(list[int], [1, "2"], id="list[int]-str-item"),
    pytest.param(list[int], (1, 2), id="list[int]-tuple"),
    pytest.param(dict[str, int], {"a": "1"}, id="dict[str,int]-str-value"),
    pytest.param(dict[str, int], {1: 1}, id="dict[str,int]-int-key"),
    pytest.param(Pong | None, {"n": 1}, id="Struct|None-dict"),
    pytest.param(Pong | None, Note(1), id="Struct|None-other-Struct"),
    pytest.param(list[Pong], [{"n": 1}], id="list[Struct]-dict-item"),
    pytest.param(Literal["a", "b"], "c", id="Literal-other"),
    pytest.param(Annotated[int, msgspec.Meta(ge=0)], -1, id="Annotated-ge0-negative"),
    pytest.param(Pong, Note(1), id="Struct-class-other"),
]


def _room(harness: HostHarness, **options: object) -> Host:
    host = harness.host(spots=[Room], actors=[Player], **options)
    host.spots.get_or_create("room", Room).submit_sync()
    host.actors.get_or_create("ana", Player).submit_sync()
    return host


def _request(host: Host, kind: str, terminator: str, value: object, reply: object) -> object:
    if kind == "spot":
        call = host.request_to_spot("room", Give(value), reply=reply)
    else:
        call = host.request_to_actor("ana", Give(value), reply=reply)
    if terminator == "submit_sync":
        return call.submit_sync()
    return call.submit().result(5.0)


@pytest.mark.parametrize("terminator", ["submit_sync", "submit"])
@pytest.mark.parametrize(("reply", "value"), CONFORMING)
def test_a_reply_that_conforms_to_reply_is_delivered_as_is(
    harness: HostHarness, reply: object, value: object, terminator: str
) -> None:
    host = _room(harness)

    assert _request(host, "spot", terminator, value, reply) is value


@pytest.mark.parametrize("terminator", ["submit_sync", "submit"])
@pytest.mark.parametrize(("reply", "value"), NOT_CONFORMING)
def test_a_reply_that_does_not_conform_to_reply_fails_with_protocol_error(
    harness: HostHarness, reply: object, value: object, terminator: str
) -> None:
    host = _room(harness)

    with pytest.raises(ProtocolError, match="expected"):
        _request(host, "spot", terminator, value, reply)
    assert host.statistics().handler_failures == 0  # the handler did not fail


@pytest.mark.parametrize("kind", ["spot", "actor"])
def test_reply_types_hold_for_every_target_and_on_a_manual_clock(
    harness: HostHarness, kind: str
) -> None:
    host = _room(harness, clock=ManualClock())  # the general (timer-backed) request path
    items = [1, 2]

    assert _request(host, kind, "submit_sync", items, list[int]) is items
    with pytest.raises(ProtocolError):
        _request(host, kind, "submit_sync", ["x"], list[int])


def test_a_protocol_error_says_what_was_expected_and_why(harness: HostHarness) -> None:
    host = _room(harness)

    with pytest.raises(ProtocolError) as caught:
        host.request_to_spot("room", Give([1, "2"]), reply=list[int]).submit_sync()

    message = str(caught.value)
    assert "the reply is a list, expected list[int]" in message
    assert "Expected `int`, got `str`" in message
    with pytest.raises(ProtocolError, match="would have to be converted"):
        host.request_to_spot("room", Give((1, 2)), reply=list[int]).submit_sync()


class _NotRuntime(Protocol):
    def speak(self) -> str: ...


@pytest.mark.parametrize(
    "reply",
    [5, "int", int | Plain, Pong | Note, _NotRuntime],
    ids=["int-value", "str", "union-with-custom-class", "untagged-Struct-union", "Protocol"],
)
def test_a_reply_type_msgspec_cannot_handle_is_a_type_error_at_the_builder(
    harness: HostHarness, reply: object
) -> None:
    host = _room(harness)

    with pytest.raises(TypeError, match="reply="):
        host.request_to_spot("room", Give(1), reply=reply)
    with pytest.raises(TypeError, match="reply="):
        host.request_to_channel("any", Give(1), reply=reply)
    assert host.statistics().pending_calls == 0
