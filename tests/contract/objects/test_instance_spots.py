"""Instance Spots and cold activation (digest §3 "Cold activation"; digest §1 "Instance Spot").

A direct message with instance intent (`send_to_spot(...).activate()`,
`request_to_spot(...).activate(M)`) to a missing id activates an `InstanceSpot` for it:
the constructor runs once however many activators race, and the activating message is
the first record the new Spot handles, with `on_initialize` at the start of that turn.
Instance Spots are never created with `spots.get_or_create`.
"""

import threading
from typing import Any

import pytest

from zlink_actors import (
    InstanceSpot,
    InvalidOperationError,
    NotFoundError,
    Spot,
    SpotContext,
    TypeMismatchError,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hit, Park, Probe


def test_cold_activation_runs_the_constructor_once_for_concurrent_activators(
    harness: HostHarness,
) -> None:
    racers = 8
    constructed: list[str] = []
    initialized: list[str] = []
    handled: dict[str, list[int]] = {}

    class Match(InstanceSpot):
        def __init__(self) -> None:
            super().__init__()
            constructed.append("constructor")

        def on_initialize(self, ctx: SpotContext) -> None:
            initialized.append(ctx.spot_id)
            handled[ctx.spot_id] = []

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> int:
            handled[ctx.spot_id].append(msg.n)
            return msg.n * 10

    host = harness.host(spots=[Match])

    for round_ in range(5):
        spot_id = f"m{round_}"
        barrier = threading.Barrier(racers)
        replies: list[object] = [None] * racers

        def activate(
            i: int,
            spot_id: str = spot_id,
            barrier: threading.Barrier = barrier,
            replies: list[object] = replies,
        ) -> None:
            barrier.wait(WAIT)
            replies[i] = host.request_to_spot(spot_id, Hit(i)).activate().submit_sync()

        threads = [threading.Thread(target=activate, args=(i,)) for i in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
            assert not thread.is_alive()

        assert len(constructed) == round_ + 1
        assert initialized.count(spot_id) == 1
        assert replies == [i * 10 for i in range(racers)]
        assert sorted(handled[spot_id]) == list(range(racers))


def test_the_activating_message_is_the_first_record_and_on_initialize_starts_its_turn(
    harness: HostHarness,
) -> None:
    log: list[tuple[str, int, Any]] = []
    entered = threading.Event()
    latch = harness.latch()

    class Match(InstanceSpot):
        def on_initialize(self, ctx: SpotContext) -> None:
            log.append(("on_initialize", -1, ctx))
            entered.set()
            assert latch.wait(WAIT)

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            log.append(("hit", msg.n, ctx))

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return len(log)

    host = harness.host(spots=[Match])

    host.send_to_spot("m", Hit(0)).activate().submit_sync()
    assert entered.wait(WAIT)
    # Sent while the first turn is still in on_initialize; the Spot is Ready now.
    for i in (1, 2):
        host.send_to_spot("m", Hit(i)).submit_sync()
    host.send_to_spot("m", Hit(3)).activate().submit_sync()
    latch.set()

    assert host.request_to_spot("m", Probe()).submit_sync() == 5
    assert [(what, n) for what, n, _ in log] == [
        ("on_initialize", -1),
        ("hit", 0),
        ("hit", 1),
        ("hit", 2),
        ("hit", 3),
    ]
    # One turn has one context: on_initialize and the activating message share it.
    assert log[0][2] is log[1][2]
    assert log[2][2] is not log[1][2]


def test_a_message_without_instance_intent_to_a_missing_id_raises_not_found(
    harness: HostHarness,
) -> None:
    constructed: list[str] = []

    class Match(InstanceSpot):
        def __init__(self) -> None:
            super().__init__()
            constructed.append("constructor")

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> int:
            return msg.n

    host = harness.host(spots=[Match])

    with pytest.raises(NotFoundError):
        host.send_to_spot("m", Hit()).submit_sync()
    with pytest.raises(NotFoundError):
        host.request_to_spot("m", Hit()).submit_sync()
    assert constructed == []
    assert host.request_to_spot("m", Hit(4)).activate().submit_sync() == 4
    assert constructed == ["constructor"]


def test_several_instance_types_without_an_explicit_one_raise_invalid_operation_at_the_terminator(
    harness: HostHarness,
) -> None:
    constructed: list[str] = []

    class MatchA(InstanceSpot):
        def __init__(self) -> None:
            super().__init__()
            constructed.append("A")

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> str:
            return "A"

    class MatchB(InstanceSpot):
        def __init__(self) -> None:
            super().__init__()
            constructed.append("B")

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> str:
            return "B"

    host = harness.host(spots=[MatchA, MatchB])
    send = host.send_to_spot("m", Hit()).activate()
    request = host.request_to_spot("m", Hit()).activate()

    # Raised by the terminator itself, not delivered in a Completion.
    with pytest.raises(InvalidOperationError):
        send.submit()
    with pytest.raises(InvalidOperationError):
        request.submit_sync()
    assert constructed == []

    assert host.request_to_spot("m", Hit()).activate(MatchB).submit_sync() == "B"
    assert host.request_to_spot("m", Hit()).submit_sync() == "B"
    assert constructed == ["B"]


def test_activation_with_no_instance_type_registered_raises_not_found(
    harness: HostHarness,
) -> None:
    class Room(Spot):
        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            pass

    host = harness.host(spots=[Room])

    with pytest.raises(NotFoundError):
        host.send_to_spot("m", Hit()).activate().submit_sync()
    with pytest.raises(NotFoundError):
        host.request_to_spot("m", Hit()).activate().submit_sync()
    assert host.statistics().spots == 0


def test_activation_of_an_id_held_by_a_user_spot_raises_type_mismatch(
    harness: HostHarness,
) -> None:
    hits: list[int] = []

    class Room(Spot):
        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            hits.append(msg.n)

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return len(hits)

    class Match(InstanceSpot):
        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> None:
            pass

    host = harness.host(spots=[Room, Match])
    host.spots.get_or_create("r", Room).submit_sync()

    with pytest.raises(TypeMismatchError):
        host.send_to_spot("r", Hit(1)).activate().submit_sync()
    with pytest.raises(TypeMismatchError):
        host.request_to_spot("r", Hit(2)).activate(Match).submit_sync()
    assert host.request_to_spot("r", Probe()).submit_sync() == 0


def test_activation_of_an_id_whose_user_spot_is_being_created_raises_type_mismatch(
    harness: HostHarness,
) -> None:
    constructed: list[str] = []
    entered = threading.Event()
    latch = harness.latch()

    class Room(Spot):
        def on_create(self, ctx: SpotContext, request: object) -> str:
            entered.set()
            assert latch.wait(WAIT)
            return "room"

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> str:
            return "room"

    class Match(InstanceSpot):
        def __init__(self) -> None:
            super().__init__()
            constructed.append("match")

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> str:
            return "match"

    host = harness.host(spots=[Room, Match])
    creating = host.spots.get_or_create("x", Room).submit()
    assert entered.wait(WAIT)

    # The id is taken by a User Spot that is not Ready yet: no second object for it.
    try:
        with pytest.raises(TypeMismatchError):
            host.request_to_spot("x", Hit()).activate().submit_sync()
    finally:
        latch.set()

    assert creating.result(WAIT).reply == "room"
    assert host.request_to_spot("x", Probe()).submit_sync() == "room"
    assert constructed == []


def test_yield_is_allowed_in_an_instance_spots_async_handler(harness: HostHarness) -> None:
    job = harness.job(7)
    hits: list[int] = []

    class Match(InstanceSpot):
        @handler
        async def park(self, ctx: SpotContext, msg: Park) -> str:
            value = await ctx.run_cpu_worker(job).yield_()
            return f"resumed with {value} after {len(hits)} hits"

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> int:
            hits.append(msg.n)
            return len(hits)

    host = harness.host(spots=[Match])

    parked = host.request_to_spot("m", Park()).activate().submit()
    assert job.started.wait(WAIT)
    # The gate was released: another message is handled while the first one is parked.
    assert host.request_to_spot("m", Hit()).submit_sync() == 1
    assert not parked.done()
    job.release()

    assert parked.result(WAIT) == "resumed with 7 after 1 hits"


def test_spots_get_or_create_of_an_instance_spot_type_raises_invalid_operation(
    harness: HostHarness,
) -> None:
    constructed: list[str] = []

    class Match(InstanceSpot):
        def __init__(self) -> None:
            super().__init__()
            constructed.append("constructor")

    host = harness.host(spots=[Match])

    with pytest.raises(InvalidOperationError):
        host.spots.get_or_create("m", Match)
    with pytest.raises(InvalidOperationError):
        host.spots.create(Match)
    assert constructed == []
