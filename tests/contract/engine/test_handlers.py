"""Handler registration, dispatch and contexts (design/architecture.md §5-6).

Handlers are registered by the annotated type of their message parameter; mistakes are
`ConfigurationError`s when the `Host` is built. Each handler turn gets the context of its
owner kind.
"""

from collections.abc import AsyncIterator, Iterator

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    ChannelContext,
    ChannelHandler,
    ConfigurationError,
    Created,
    Existing,
    Host,
    InstanceSpot,
    InternalFailureError,
    Spot,
    SpotContext,
    SpotMode,
    SpotRef,
    handler,
)
from zlink_actors.testing import HostHarness

from ._support import Note, Ping, Pong


class Where(msgspec.Struct, frozen=True):
    pass


def test_handler_without_a_message_annotation_is_a_configuration_error() -> None:
    class Sloppy(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg) -> None:  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(ConfigurationError):
        Host(spots=[Sloppy])


def test_two_handlers_for_one_message_type_is_a_configuration_error() -> None:
    class Twice(Spot):
        @handler
        def first(self, ctx: SpotContext, msg: Ping) -> None:
            pass

        @handler
        def second(self, ctx: SpotContext, msg: Ping) -> None:
            pass

    with pytest.raises(ConfigurationError):
        Host(spots=[Twice])


def test_two_classes_with_one_type_name_in_a_host_is_a_configuration_error() -> None:
    class First(Spot):
        type_name = "shared"

    class Second(Actor):
        type_name = "shared"

    with pytest.raises(ConfigurationError):
        Host(spots=[First], actors=[Second])


def test_messages_are_dispatched_by_their_annotated_type(harness: HostHarness) -> None:
    class Room(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> str:
            return "ping"

        @handler
        async def note(self, ctx: SpotContext, msg: Note) -> str:
            return "note"

    host = harness.host(spots=[Room])
    host.spots.get_or_create("room", Room).submit_sync()

    assert host.request_to_spot("room", Ping()).submit_sync() == "ping"
    assert host.request_to_spot("room", Note()).submit_sync() == "note"


def test_each_owner_kind_sees_its_own_context(harness: HostHarness) -> None:
    class Room(Spot):
        @handler
        def where(self, ctx: SpotContext, msg: Where) -> tuple[str, str]:
            return type(ctx).__name__, ctx.spot_id

    class Player(Actor):
        @handler
        def where(self, ctx: ActorContext, msg: Where) -> tuple[str, str, str]:
            return type(ctx).__name__, ctx.actor_id, ctx.spot_id

    class Lobby(ChannelHandler):
        @handler
        def where(self, ctx: ChannelContext, msg: Where) -> tuple[str, str]:
            return type(ctx).__name__, ctx.channel

    host = harness.host(spots=[Room], actors=[Player], channels={"lobby": Lobby})
    host.spots.get_or_create("room", Room).submit_sync()
    host.actors.get_or_create("alice", Player).submit_sync()

    assert host.request_to_spot("room", Where()).submit_sync() == ("SpotContext", "room")
    assert host.request_to_actor("alice", Where()).submit_sync() == (
        "ActorContext",
        "alice",
        host.entry_spot_id,
    )
    assert host.request_to_channel("lobby", Where()).submit_sync() == ("ChannelContext", "lobby")


def test_get_or_create_creates_once_and_then_finds_the_existing_object(
    harness: HostHarness,
) -> None:
    class Room(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(spots=[Room])

    created = host.spots.get_or_create("room", Room).submit_sync()
    existing = host.spots.get_or_create("room", Room).submit_sync()

    assert isinstance(created, Created)
    assert isinstance(created.ref, SpotRef)
    assert created.ref.spot_id == "room"
    assert existing == Existing(created.ref)


class Echo(ChannelHandler):
    @handler
    def ping(self, ctx: ChannelContext, msg: Ping) -> str:
        return ctx.channel


@pytest.mark.parametrize(
    "name",
    ["", "a" * 256, "€" * 85 + "a", "\ud800", "lobby-\udfff", 5, b"lobby"],
    ids=["empty", "256-ascii", "256-bytes", "lone-surrogate", "surrogate", "int", "bytes"],
)
def test_a_channel_name_that_is_not_1_to_255_utf8_bytes_is_a_configuration_error(
    name: object,
) -> None:
    with pytest.raises(ConfigurationError, match="channel name"):
        Host(channels={name: Echo})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", ValueError),
        ("a" * 256, ValueError),
        ("€" * 85 + "a", ValueError),
        ("\ud800", ValueError),
        (5, TypeError),
        (None, TypeError),
    ],
    ids=["empty", "256-ascii", "256-bytes", "lone-surrogate", "int", "none"],
)
def test_a_bad_channel_name_is_refused_at_the_builder(
    harness: HostHarness, name: object, error: type[Exception]
) -> None:
    host = harness.host(channels={"echo": Echo})

    with pytest.raises(error, match="channel"):
        host.send_to_channel(name, Ping())  # type: ignore[arg-type]
    with pytest.raises(error, match="channel"):
        host.request_to_channel(name, Ping())  # type: ignore[arg-type]


def test_a_channel_name_of_exactly_255_utf8_bytes_is_registered_and_reachable(
    harness: HostHarness,
) -> None:
    name = "€" * 85
    assert len(name.encode("utf-8")) == 255
    host = harness.host(channels={name: Echo})

    assert host.request_to_channel(name, Ping(), reply=str).submit_sync() == name


# -- registration refuses what could only fail later -----------------------------------


def test_a_keyword_only_message_parameter_is_a_configuration_error() -> None:
    class KeywordOnly(Spot):
        @handler
        def ping(self, ctx: SpotContext, *, msg: Ping) -> None:
            pass

    with pytest.raises(ConfigurationError, match=r"positionally; 'msg' is keyword-only"):
        Host(spots=[KeywordOnly])


def test_a_variadic_message_parameter_is_a_configuration_error() -> None:
    class Variadic(Actor):
        @handler
        def ping(self, ctx: ActorContext, *msgs: Ping) -> None:
            pass

    with pytest.raises(ConfigurationError, match="'msgs' is variadic positional"):
        Host(actors=[Variadic])


def test_a_generator_handler_is_a_configuration_error() -> None:
    class Generating(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Iterator[int]:
            yield 1

    with pytest.raises(ConfigurationError, match="is a generator"):
        Host(spots=[Generating])


def test_an_async_generator_handler_is_a_configuration_error() -> None:
    class Streaming(ChannelHandler):
        @handler
        async def ping(self, ctx: ChannelContext, msg: Ping) -> AsyncIterator[int]:
            yield 1

    with pytest.raises(ConfigurationError, match="is a generator"):
        Host(channels={"stream": Streaming})


@pytest.mark.parametrize("name", ["", 5, b"room"], ids=["empty", "int", "bytes"])
def test_a_type_name_that_is_not_a_non_empty_str_is_a_configuration_error(name: object) -> None:
    class Named(Spot):
        type_name = name  # type: ignore[assignment]

    with pytest.raises(ConfigurationError, match="type_name"):
        Host(spots=[Named])


def test_an_empty_type_name_does_not_fall_back_to_the_qualified_name() -> None:
    class Room(Actor):
        type_name = ""

    with pytest.raises(ConfigurationError, match="non-empty"):
        Host(actors=[Room])


def test_an_instance_spot_in_per_actor_mode_is_a_configuration_error() -> None:
    class Inbox(InstanceSpot):
        mode = SpotMode.PER_ACTOR

    with pytest.raises(ConfigurationError, match="SPOT_WIDE"):
        Host(spots=[Inbox])


@pytest.mark.parametrize(
    "options",
    [
        {"spots": [Spot]},
        {"spots": [InstanceSpot]},
        {"actors": [Actor]},
        {"channels": {"base": ChannelHandler}},
    ],
    ids=["Spot", "InstanceSpot", "Actor", "ChannelHandler"],
)
def test_registering_a_framework_base_class_itself_is_a_configuration_error(
    options: dict[str, object],
) -> None:
    with pytest.raises(ConfigurationError, match="base class"):
        Host(**options)  # type: ignore[arg-type]


def test_a_class_whose_constructor_needs_arguments_is_a_configuration_error() -> None:
    class NeedsName(Spot):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    class NeedsKeyword(Actor):
        def __init__(self, *, level: int) -> None:
            super().__init__()
            self.level = level

    class NeedsPort(ChannelHandler):
        def __init__(self, port: int) -> None:
            super().__init__()
            self.port = port

    with pytest.raises(ConfigurationError, match=r"NeedsName\(\) must take no arguments"):
        Host(spots=[NeedsName])
    with pytest.raises(ConfigurationError, match=r"NeedsKeyword\(\) must take no arguments"):
        Host(actors=[NeedsKeyword])
    with pytest.raises(ConfigurationError, match=r"NeedsPort\(\) must take no arguments"):
        Host(channels={"port": NeedsPort})


def test_a_constructor_with_defaults_registers_and_one_that_raises_fails_at_creation(
    harness: HostHarness,
) -> None:
    class Defaults(Spot):
        def __init__(self, size: int = 3, *extra: object, **options: object) -> None:
            super().__init__()
            self.size = size

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> int:
            return self.size

    class Broken(Spot):
        def __init__(self) -> None:
            raise RuntimeError("broken on purpose")

    host = harness.host(spots=[Defaults, Broken])
    host.spots.get_or_create("d", Defaults).submit_sync()

    assert host.request_to_spot("d", Ping(), reply=int).submit_sync() == 3
    with pytest.raises(InternalFailureError) as caught:
        host.spots.get_or_create("b", Broken).submit_sync()
    assert isinstance(caught.value.__cause__, RuntimeError)
