"""Create and get-or-create (digest §3 "Create / GetOrCreate"; digest §9 Tier 1 "GetOrCreate runs
the factory once").

`host.spots` / `host.actors` (and the same managers on handler contexts) hand out
single-use builders. One creation attempt runs the no-argument constructor and
`on_create` once; concurrent callers join that attempt and observe its one terminal;
callers after Ready get `Existing`. `Created`, `Existing` and `Rejected` are typed results,
not errors. Misuse raises where it is made: a bad id or an unregistered type at the
builder, a repeated option or terminator at that call.
"""

import dataclasses
import threading
from typing import Any

import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    ActorRef,
    AlreadyExistsError,
    Created,
    DeadlineExceededError,
    Existing,
    InternalFailureError,
    InvalidOperationError,
    ManualClock,
    NotConfiguredError,
    NotFoundError,
    Rejected,
    Spot,
    SpotContext,
    SpotRef,
    TypeMismatchError,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import KINDS, Hit, Ping, Probe, base_class, host_with, manager_of, request_to


def _ref_id(ref: SpotRef | ActorRef) -> str:
    return ref.spot_id if isinstance(ref, SpotRef) else ref.actor_id


class Room(Spot):
    @handler
    def probe(self, ctx: SpotContext, msg: Probe) -> str:
        return "room"


class Player(Actor):
    @handler
    def probe(self, ctx: ActorContext, msg: Probe) -> str:
        return "player"


@pytest.mark.parametrize("style", ["plain", "async"])
@pytest.mark.parametrize("kind", KINDS)
def test_on_create_runs_once_before_ready_and_its_return_value_is_the_created_reply(
    harness: HostHarness, kind: str, style: str
) -> None:
    requests: list[object] = []
    entered = threading.Event()
    latch = harness.latch()

    class Plain(base_class(kind)):  # type: ignore[misc]
        def on_create(self, ctx: Any, request: object) -> str:
            requests.append(request)
            entered.set()
            assert latch.wait(WAIT)
            return f"hello {request}"

        @handler
        def probe(self, ctx: Any, msg: Probe) -> int:
            return len(requests)

    class Async(base_class(kind)):  # type: ignore[misc]
        async def on_create(self, ctx: Any, request: object) -> str:
            requests.append(request)
            entered.set()
            assert latch.wait(WAIT)
            word = await ctx.run_cpu_worker(str, "hello").submit()
            return f"{word} {request}"

        @handler
        def probe(self, ctx: Any, msg: Probe) -> int:
            return len(requests)

    cls = Plain if style == "plain" else Async
    host = host_with(harness, kind, cls)

    call = manager_of(host, kind).get_or_create("x", cls).request(21).submit()
    assert entered.wait(WAIT)
    # Not Ready while on_create runs: the id is not reachable yet.
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()
    assert not call.done()
    latch.set()

    created = call.result(WAIT)
    assert type(created) is Created
    assert created.reply == "hello 21"
    assert _ref_id(created.ref) == "x"
    assert request_to(host, kind, "x", Probe()).submit_sync() == 1
    assert manager_of(host, kind).get_or_create("x", cls).submit_sync() == Existing(created.ref)
    assert requests == [21]


@pytest.mark.parametrize("kind", KINDS)
def test_on_create_returning_rejected_completes_with_rejected_and_leaves_the_id_free(
    harness: HostHarness, kind: str
) -> None:
    constructed: list[object] = []

    class Picky(base_class(kind)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            constructed.append(self)

        def on_create(self, ctx: Any, request: object) -> object:
            if request == "no":
                return Rejected(f"refused {request}")
            return "welcome"

        @handler
        def probe(self, ctx: Any, msg: Probe) -> str:
            return "ready"

    host = host_with(harness, kind, Picky)
    manager = manager_of(host, kind)

    # A typed result, not an error.
    refused = manager.get_or_create("x", Picky).request("no").submit_sync()
    assert type(refused) is Rejected
    assert refused.reply == "refused no"
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()

    again = manager.get_or_create("x", Picky).request("yes").submit_sync()
    assert type(again) is Created
    assert again.reply == "welcome"
    assert request_to(host, kind, "x", Probe()).submit_sync() == "ready"
    assert len(constructed) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_get_or_create_of_one_id_runs_the_constructor_and_on_create_once(
    harness: HostHarness, kind: str
) -> None:
    racers = 8
    constructed: list[str] = []
    hooked: list[object] = []

    class Once(base_class(kind)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            constructed.append("constructor")

        def on_create(self, ctx: Any, request: object) -> str:
            hooked.append(request)
            return f"made for racer {request}"

    host = host_with(harness, kind, Once)
    manager = manager_of(host, kind)

    for round_ in range(5):
        obj_id = f"x{round_}"
        barrier = threading.Barrier(racers)
        results: list[object] = [None] * racers

        def race(
            i: int,
            obj_id: str = obj_id,
            barrier: threading.Barrier = barrier,
            results: list[object] = results,
        ) -> None:
            barrier.wait(WAIT)
            results[i] = manager.get_or_create(obj_id, Once).request(i).submit_sync()

        threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
            assert not thread.is_alive()

        assert len(constructed) == round_ + 1
        assert len(hooked) == round_ + 1
        created = [r for r in results if type(r) is Created]
        existing = [r for r in results if type(r) is Existing]
        assert len(created) + len(existing) == racers
        assert created, "some racer must have joined the attempt"
        assert all(c == created[0] for c in created)
        assert created[0].reply == f"made for racer {hooked[-1]}"
        assert _ref_id(created[0].ref) == obj_id
        assert all(e.ref == created[0].ref for e in existing)


@pytest.mark.parametrize("kind", KINDS)
def test_callers_joining_a_held_creation_observe_its_one_created_and_later_ones_get_existing(
    harness: HostHarness, kind: str
) -> None:
    hooked: list[object] = []
    entered = threading.Event()
    latch = harness.latch()

    class Slow(base_class(kind)):  # type: ignore[misc]
        def on_create(self, ctx: Any, request: object) -> str:
            hooked.append(request)
            entered.set()
            assert latch.wait(WAIT)
            return f"made by {request}"

    host = host_with(harness, kind, Slow)
    manager = manager_of(host, kind)

    first = manager.get_or_create("x", Slow).request("first").submit()
    assert entered.wait(WAIT)
    joined = [manager.get_or_create("x", Slow).request(f"joiner {i}").submit() for i in range(3)]
    side: list[object] = []
    thread = threading.Thread(
        target=lambda: side.append(manager.get_or_create("x", Slow).submit_sync())
    )
    thread.start()
    assert not first.done()
    assert not any(call.done() for call in joined)
    latch.set()

    created = first.result(WAIT)
    assert type(created) is Created
    assert created.reply == "made by first"
    assert [call.result(WAIT) for call in joined] == [created] * 3
    thread.join(WAIT)
    assert not thread.is_alive()
    assert side in ([created], [Existing(created.ref)])
    assert manager.get_or_create("x", Slow).submit_sync() == Existing(created.ref)
    assert hooked == ["first"]


def test_create_builders_on_handler_contexts_complete_like_the_hosts(harness: HostHarness) -> None:
    class Made(Spot):
        def on_create(self, ctx: SpotContext, request: object) -> str:
            return f"made with {request}"

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> str:
            return ctx.spot_id

    class Buddy(Actor):
        def on_create(self, ctx: ActorContext, request: object) -> str:
            return f"buddy {ctx.actor_id}"

    class Maker(Actor):
        @handler
        async def make(self, ctx: ActorContext, msg: Ping) -> list[object]:
            return [
                await ctx.spots.get_or_create("made", Made).request(msg.n).submit(),
                await ctx.spots.get_or_create("made", Made).submit(),
                await ctx.spots.create(Made).submit(),
                await ctx.actors.create("buddy", Buddy).submit(),
            ]

    class Hall(Spot):
        @handler
        async def make(self, ctx: SpotContext, msg: Ping) -> object:
            # A SpotWide turn may also release its gate while a creation runs.
            return await ctx.actors.get_or_create("pal", Buddy).yield_()

    host = harness.host(spots=[Made, Hall], actors=[Maker, Buddy])
    host.actors.get_or_create("maker", Maker).submit_sync()
    host.spots.get_or_create("hall", Hall).submit_sync()

    made, existing, fresh, buddy = host.request_to_actor("maker", Ping(7)).submit_sync()
    assert made == Created(SpotRef("made", made.ref.generation), "made with 7")
    assert existing == Existing(made.ref)
    assert type(fresh) is Created
    assert fresh.ref.spot_id != "made"
    assert host.request_to_spot(fresh.ref.spot_id, Probe()).submit_sync() == fresh.ref.spot_id
    assert buddy == Created(ActorRef("buddy", buddy.ref.generation), "buddy buddy")
    with pytest.raises(AlreadyExistsError):
        host.actors.create("buddy", Buddy).submit_sync()

    pal = host.request_to_spot("hall", Ping()).submit_sync()
    assert pal == Created(ActorRef("pal", pal.ref.generation), "buddy pal")


def test_spots_create_makes_a_new_spot_under_a_fresh_id_each_time(harness: HostHarness) -> None:
    host = harness.host(spots=[Room])

    first = host.spots.create(Room).submit_sync()
    second = host.spots.create(Room).submit_sync()

    assert type(first) is Created
    assert type(second) is Created
    assert first.ref.spot_id != second.ref.spot_id
    for ref in (first.ref, second.ref):
        assert host.request_to_spot(ref.spot_id, Probe()).submit_sync() == "room"


def test_spots_create_mints_an_id_that_calls_can_address(harness: HostHarness) -> None:
    class Long(Spot):
        # A legal registered name longer than an id may be: the minted id must still fit.
        type_name = "L" * 240

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> str:
            return ctx.spot_id

    host = harness.host(spots=[Long])

    created = host.spots.create(Long).submit_sync()

    assert type(created) is Created
    spot_id = created.ref.spot_id
    assert 1 <= len(spot_id.encode("utf-8")) <= 255
    assert host.request_to_spot(spot_id, Probe()).submit_sync() == spot_id


@pytest.mark.parametrize("stage", ["ready", "creating"])
@pytest.mark.parametrize("kind", KINDS)
def test_get_or_create_of_an_id_held_by_another_type_raises_type_mismatch(
    harness: HostHarness, kind: str, stage: str
) -> None:
    entered = threading.Event()
    latch = harness.latch()

    class First(base_class(kind)):  # type: ignore[misc]
        def on_create(self, ctx: Any, request: object) -> str:
            if stage == "creating":
                entered.set()
                assert latch.wait(WAIT)
            return "first"

        @handler
        def probe(self, ctx: Any, msg: Probe) -> str:
            return "first"

    class Second(base_class(kind)):  # type: ignore[misc]
        def on_create(self, ctx: Any, request: object) -> str:
            return "second"

    host = host_with(harness, kind, First, Second)
    manager = manager_of(host, kind)
    pending = manager.get_or_create("x", First).submit()
    if stage == "creating":
        assert entered.wait(WAIT)
    else:
        assert type(pending.result(WAIT)) is Created

    with pytest.raises(TypeMismatchError):
        manager.get_or_create("x", Second).submit_sync()

    latch.set()
    assert pending.result(WAIT).reply == "first"
    assert request_to(host, kind, "x", Probe()).submit_sync() == "first"


@pytest.mark.parametrize("stage", ["ready", "creating"])
def test_create_of_an_existing_actor_id_raises_already_exists(
    harness: HostHarness, stage: str
) -> None:
    hooked: list[object] = []
    entered = threading.Event()
    latch = harness.latch()

    class Slow(Actor):
        def on_create(self, ctx: ActorContext, request: object) -> object:
            hooked.append(request)
            if stage == "creating":
                entered.set()
                assert latch.wait(WAIT)
            return request

    host = harness.host(actors=[Slow])
    pending = host.actors.create("x", Slow).request("first").submit()
    if stage == "creating":
        assert entered.wait(WAIT)
    else:
        assert type(pending.result(WAIT)) is Created

    with pytest.raises(AlreadyExistsError):
        host.actors.create("x", Slow).request("second").submit_sync()

    latch.set()
    assert pending.result(WAIT).reply == "first"
    assert hooked == ["first"]


@pytest.mark.parametrize("option", ["timeout", "request"])
def test_repeating_an_option_raises_invalid_operation_and_keeps_the_first(
    harness: HostHarness, option: str
) -> None:
    requests: list[object] = []

    class Made(Spot):
        def on_create(self, ctx: SpotContext, request: object) -> object:
            requests.append(request)
            return request

    host = harness.host(spots=[Made])
    call = host.spots.get_or_create("x", Made)
    if option == "timeout":
        call.timeout(WAIT)
        with pytest.raises(InvalidOperationError):
            call.timeout(WAIT)
    else:
        call.request("first")
        with pytest.raises(InvalidOperationError):
            call.request("second")

    created = call.submit_sync()

    assert type(created) is Created
    assert requests == ([None] if option == "timeout" else ["first"])
    with pytest.raises(InvalidOperationError):
        call.request("after submit")
    with pytest.raises(InvalidOperationError):
        call.timeout(WAIT)


@pytest.mark.parametrize("second", ["submit", "submit_sync"])
@pytest.mark.parametrize("first", ["submit", "submit_sync"])
def test_a_second_terminator_raises_invalid_operation(
    harness: HostHarness, first: str, second: str
) -> None:
    hooked: list[object] = []

    class Made(Spot):
        def on_create(self, ctx: SpotContext, request: object) -> None:
            hooked.append(request)

    host = harness.host(spots=[Made])
    call = host.spots.get_or_create("x", Made)
    if first == "submit":
        assert type(call.submit().result(WAIT)) is Created
    else:
        assert type(call.submit_sync()) is Created

    with pytest.raises(InvalidOperationError):
        getattr(call, second)()

    assert hooked == [None]


@pytest.mark.parametrize("where", ["constructor", "on_create", "on_initialize"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_constructor_or_creation_hook_raises_internal_failure_and_frees_the_id(
    harness: HostHarness, kind: str, where: str
) -> None:
    failing = [True]

    class Fragile(base_class(kind)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            if where == "constructor" and failing[0]:
                raise RuntimeError("constructor failed")

        def on_create(self, ctx: Any, request: object) -> str:
            if where == "on_create" and failing[0]:
                raise RuntimeError("on_create failed")
            return "made"

        async def on_initialize(self, ctx: Any) -> None:
            if where == "on_initialize" and failing[0]:
                raise RuntimeError("on_initialize failed")

        @handler
        def probe(self, ctx: Any, msg: Probe) -> str:
            return "ready"

    host = host_with(harness, kind, Fragile)
    manager = manager_of(host, kind)

    with pytest.raises(InternalFailureError):
        manager.get_or_create("x", Fragile).submit_sync()
    with pytest.raises(NotFoundError):
        request_to(host, kind, "x", Probe()).submit_sync()

    failing[0] = False
    assert manager.get_or_create("x", Fragile).submit_sync().reply == "made"
    assert request_to(host, kind, "x", Probe()).submit_sync() == "ready"


def test_an_unregistered_type_raises_not_configured_when_the_builder_is_made(
    harness: HostHarness,
) -> None:
    class StrangeSpot(Spot):
        pass

    class StrangeActor(Actor):
        pass

    host = harness.host(spots=[Room], actors=[Player])

    with pytest.raises(NotConfiguredError):
        host.spots.get_or_create("x", StrangeSpot)
    with pytest.raises(NotConfiguredError):
        host.spots.create(StrangeSpot)
    with pytest.raises(NotConfiguredError):
        host.actors.get_or_create("x", StrangeActor)
    with pytest.raises(NotConfiguredError):
        host.actors.create("x", StrangeActor)
    # A registered type of the other kind is not one of this kind.
    with pytest.raises(NotConfiguredError):
        host.spots.get_or_create("x", Player)
    with pytest.raises(NotConfiguredError):
        host.actors.create("x", Room)
    with pytest.raises(NotFoundError):
        host.request_to_spot("x", Probe()).submit_sync()


def test_spot_and_actor_refs_are_frozen_and_carry_a_generation(harness: HostHarness) -> None:
    host = harness.host(spots=[Room], actors=[Player])
    spot = host.spots.get_or_create("r", Room).submit_sync().ref
    actor = host.actors.get_or_create("p", Player).submit_sync().ref

    assert spot == SpotRef("r", spot.generation)
    assert actor == ActorRef("p", actor.generation)
    assert isinstance(spot.generation, int)
    assert isinstance(actor.generation, int)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spot.generation = spot.generation + 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spot.spot_id = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        actor.generation = actor.generation + 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        actor.actor_id = "other"  # type: ignore[misc]
    assert {spot: "value"}[SpotRef("r", spot.generation)] == "value"
    assert host.spots.get_or_create("r", Room).submit_sync().ref == spot
    assert host.actors.get_or_create("p", Player).submit_sync().ref == actor


BUILDERS = {
    "spots.get_or_create": lambda host, obj_id: host.spots.get_or_create(obj_id, Room),
    "spots.close": lambda host, obj_id: host.spots.close(obj_id),
    "actors.get_or_create": lambda host, obj_id: host.actors.get_or_create(obj_id, Player),
    "actors.create": lambda host, obj_id: host.actors.create(obj_id, Player),
    "actors.close": lambda host, obj_id: host.actors.close(obj_id),
    "send_to_spot": lambda host, obj_id: host.send_to_spot(obj_id, Hit()),
    "request_to_actor": lambda host, obj_id: host.request_to_actor(obj_id, Probe()),
}


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (5, TypeError),
        (b"room", TypeError),
        (None, TypeError),
        ("", ValueError),
        ("a" * 256, ValueError),
        ("€" * 85 + "a", ValueError),  # 256 UTF-8 bytes in 86 characters
    ],
    ids=["int", "bytes", "none", "empty", "256-ascii", "256-bytes-multibyte"],
)
@pytest.mark.parametrize("builder", BUILDERS)
def test_an_id_that_is_not_a_str_of_1_to_255_utf8_bytes_is_refused_at_the_builder(
    harness: HostHarness, builder: str, bad: object, error: type[Exception]
) -> None:
    host = harness.host(spots=[Room], actors=[Player])

    with pytest.raises(error):
        BUILDERS[builder](host, bad)

    assert host.statistics().spots == 0
    assert host.statistics().actors == 0


@pytest.mark.parametrize(
    "bad",
    ["\ud800", "room-\udfff", "\udc80" * 63, "€" * 40 + "\ud83d"],
    ids=["lone-surrogate", "trailing-surrogate", "63-surrogates", "multibyte-then-surrogate"],
)
@pytest.mark.parametrize("builder", BUILDERS)
def test_an_id_with_no_strict_utf8_encoding_is_refused_at_the_builder(
    harness: HostHarness, builder: str, bad: str
) -> None:
    host = harness.host(spots=[Room], actors=[Player])

    with pytest.raises(ValueError, match="UTF-8"):
        BUILDERS[builder](host, bad)

    assert host.statistics().spots == 0  # nothing was created
    assert host.statistics().actors == 0


@pytest.mark.parametrize(
    "obj_id",
    ["€" * 85, "😀" * 63 + "abc", "a" * 255],
    ids=["3-byte-chars", "4-byte-chars", "ascii"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_an_id_of_exactly_255_utf8_bytes_is_accepted(
    harness: HostHarness, kind: str, obj_id: str
) -> None:
    assert len(obj_id.encode("utf-8")) == 255
    cls = Room if kind == "spot" else Player
    host = host_with(harness, kind, cls)

    created = manager_of(host, kind).get_or_create(obj_id, cls).submit_sync()

    assert type(created) is Created
    assert _ref_id(created.ref) == obj_id
    assert request_to(host, kind, obj_id, Probe()).submit_sync() == (
        "room" if kind == "spot" else "player"
    )
    assert manager_of(host, kind).get_or_create(obj_id, cls).submit_sync() == Existing(created.ref)


def test_a_creation_deadline_fails_only_the_caller_that_set_it(harness: HostHarness) -> None:
    entered = threading.Event()
    latch = harness.latch()
    hooked: list[object] = []

    class Slow(Spot):
        def on_create(self, ctx: SpotContext, request: object) -> str:
            hooked.append(request)
            entered.set()
            assert latch.wait(WAIT)
            return "made"

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> str:
            return "ready"

    clock = ManualClock()
    host = harness.host(spots=[Slow], clock=clock)

    timed = host.spots.get_or_create("x", Slow).timeout(0.2).submit()
    assert entered.wait(WAIT)
    joined = host.spots.get_or_create("x", Slow).submit()
    clock.advance(0.2)

    with pytest.raises(DeadlineExceededError):
        timed.result(WAIT)
    assert not joined.done()
    latch.set()
    created = joined.result(WAIT)
    assert type(created) is Created
    assert created.reply == "made"
    assert host.request_to_spot("x", Probe()).submit_sync() == "ready"
    assert hooked == [None]
