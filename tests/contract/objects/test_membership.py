"""Membership: `join_spot(...).defer()` and `leave_spot().defer()` (digest §3, §4 "Defer /
Join", digest §9 Tier 1 "Defer", "Gates", "Yield").

`defer()` registers the move and returns at once; the move starts only after the handler
ends normally and is discarded if it raises. The target Spot decides in `on_actor_join`;
the Actor hears `on_join_completed(JoinResult)`. A member of a SpotWide Spot shares the
Spot's gate (never overlapping its handlers) and reaches its state through `ctx.spot`.
"""

import itertools
import logging
import queue
import threading
import time

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    ActorRef,
    Host,
    InstanceSpot,
    InternalFailureError,
    InvalidOperationError,
    JoinCall,
    JoinResult,
    NotFoundError,
    ShutdownOutcome,
    Spot,
    SpotContext,
    SpotMode,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import NEGATIVE_WAIT, Hit, Hold, Note, Park, Ping, Probe, Where


class Join(msgspec.Struct, frozen=True):
    spot_id: str


class Leave(msgspec.Struct, frozen=True):
    pass


class Book:
    """What one test's Spots and Actors report."""

    def __init__(self) -> None:
        #: Every `on_actor_join` call, in order.
        self.asked: list[ActorRef] = []
        #: Every `on_join_completed` result, in order.
        self.results: queue.Queue[JoinResult] = queue.Queue()
        #: Whether `on_actor_join` approves.
        self.approve = True

    def next_result(self) -> JoinResult:
        return self.results.get(timeout=WAIT)


def classes(book: Book) -> tuple[type[Spot], type[Actor]]:
    """A Room that records Join requests and a Player that joins, leaves and reports."""

    class Room(Spot):
        def on_actor_join(self, ctx: SpotContext, actor: ActorRef) -> bool:
            book.asked.append(actor)
            return book.approve

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> list[ActorRef]:
            return list(book.asked)

    class Player(Actor):
        @handler
        def join(self, ctx: ActorContext, msg: Join) -> None:
            ctx.join_spot(msg.spot_id).defer()

        @handler
        def leave(self, ctx: ActorContext, msg: Leave) -> None:
            ctx.leave_spot().defer()

        @handler
        def where(self, ctx: ActorContext, msg: Where) -> str:
            return ctx.spot_id

        def on_join_completed(self, ctx: ActorContext, result: JoinResult) -> None:
            book.results.put(result)

    return Room, Player


def _where(host: Host, actor_id: str = "p") -> str:
    return host.request_to_actor(actor_id, Where(), reply=str).submit_sync()


def _joined(host: Host, book: Book, spot_id: str = "room", actor_id: str = "p") -> None:
    host.send_to_actor(actor_id, Join(spot_id)).submit_sync()
    assert book.next_result() == JoinResult(spot_id, True, None)


def test_defer_returns_none_at_once_and_the_join_runs_only_after_the_handler_ends(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    returned: list[object] = []
    where_during: list[str] = []
    deferred = threading.Event()
    latch = harness.latch()

    class Lingering(player):  # type: ignore[misc,valid-type]
        @handler
        def join(self, ctx: ActorContext, msg: Join) -> None:
            returned.append(ctx.join_spot(msg.spot_id).defer())
            where_during.append(ctx.spot_id)
            deferred.set()
            assert latch.wait(WAIT)

    host = harness.host(spots=[room], actors=[Lingering])
    host.spots.get_or_create("room", room).submit_sync()
    ref = host.actors.get_or_create("p", Lingering).submit_sync().ref

    running = host.request_to_actor("p", Join("room")).submit()
    assert deferred.wait(WAIT)
    assert returned == [None]
    # Lifecycle work runs before application work in the Spot's queue: had the Join
    # started at defer(), its on_actor_join would have run before this probe.
    assert host.request_to_spot("room", Probe()).submit_sync() == []
    assert book.results.empty()
    latch.set()

    assert running.result(WAIT) is None
    assert book.next_result() == JoinResult("room", True, None)
    assert book.asked == [ref]
    assert where_during == [host.entry_spot_id]
    assert _where(host) == "room"


def test_a_handler_that_raises_after_defer_discards_the_join(harness: HostHarness) -> None:
    book = Book()
    room, player = classes(book)

    class Failing(player):  # type: ignore[misc,valid-type]
        @handler
        def join(self, ctx: ActorContext, msg: Join) -> None:
            ctx.join_spot(msg.spot_id).defer()
            raise RuntimeError("after defer")

    host = harness.host(spots=[room], actors=[Failing])
    host.spots.get_or_create("room", room).submit_sync()
    host.actors.get_or_create("p", Failing).submit_sync()

    with pytest.raises(InternalFailureError):
        host.request_to_actor("p", Join("room")).submit_sync()

    # A Join that started would hold the Actor's queue until decided, so this request
    # would see the Spot it joined.
    assert _where(host) == host.entry_spot_id
    assert host.request_to_spot("room", Probe()).submit_sync() == []
    assert book.results.empty()


def test_a_second_defer_in_one_handler_raises_invalid_operation(harness: HostHarness) -> None:
    book = Book()
    room, player = classes(book)

    class Twice(player):  # type: ignore[misc,valid-type]
        @handler
        def join(self, ctx: ActorContext, msg: Join) -> list[str]:
            first = ctx.join_spot(msg.spot_id)
            first.defer()
            outcomes = []
            for again in (
                first.defer,
                ctx.join_spot("other").defer,
                ctx.leave_spot().defer,
            ):
                try:
                    again()
                except InvalidOperationError:
                    outcomes.append("refused")
                else:
                    outcomes.append("accepted")
            return outcomes

    host = harness.host(spots=[room], actors=[Twice])
    for spot_id in ("room", "other"):
        host.spots.get_or_create(spot_id, room).submit_sync()
    host.actors.get_or_create("p", Twice).submit_sync()

    assert host.request_to_actor("p", Join("room")).submit_sync() == ["refused"] * 3

    # The first defer() still stands, and only it.
    assert book.next_result() == JoinResult("room", True, None)
    assert _where(host) == "room"
    assert book.results.empty()
    assert len(book.asked) == 1


def test_defer_after_the_handler_returned_raises_invalid_operation(harness: HostHarness) -> None:
    book = Book()
    room, player = classes(book)
    stash: list[JoinCall] = []

    class Stasher(player):  # type: ignore[misc,valid-type]
        @handler
        def stash(self, ctx: ActorContext, msg: Note) -> None:
            stash.append(ctx.join_spot("room"))

        @handler
        def late(self, ctx: ActorContext, msg: Ping) -> str:
            try:
                stash[0].defer()
            except InvalidOperationError:
                return "refused"
            return "accepted"

    host = harness.host(spots=[room], actors=[Stasher])
    host.spots.get_or_create("room", room).submit_sync()
    host.actors.get_or_create("p", Stasher).submit_sync()
    host.request_to_actor("p", Note()).submit_sync()

    with pytest.raises(InvalidOperationError):
        stash[0].defer()  # from an application thread
    assert host.request_to_actor("p", Ping()).submit_sync() == "refused"  # a later turn

    assert _where(host) == host.entry_spot_id
    assert host.request_to_spot("room", Probe()).submit_sync() == []
    assert book.results.empty()


def test_join_spot_from_a_spot_handler_raises_invalid_operation(harness: HostHarness) -> None:
    book = Book()
    room, player = classes(book)

    class Wanderer(room):  # type: ignore[misc,valid-type]
        @handler
        def wander(self, ctx: SpotContext, msg: Join) -> list[str]:
            outcomes = []
            for attempt in (
                lambda: ctx.join_spot(msg.spot_id).defer(),
                lambda: ctx.leave_spot().defer(),
            ):
                try:
                    attempt()
                except InvalidOperationError:
                    outcomes.append("refused")
                else:
                    outcomes.append("accepted")
            return outcomes

    host = harness.host(spots=[Wanderer], actors=[player])
    for spot_id in ("here", "there"):
        host.spots.get_or_create(spot_id, Wanderer).submit_sync()

    assert host.request_to_spot("here", Join("there")).submit_sync() == ["refused"] * 2
    assert host.request_to_spot("there", Probe()).submit_sync() == []


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "declined"])
def test_on_actor_join_decides_and_on_join_completed_receives_the_join_result(
    harness: HostHarness, approve: bool
) -> None:
    book = Book()
    book.approve = approve
    room, player = classes(book)
    host = harness.host(spots=[room], actors=[player])
    host.spots.get_or_create("room", room).submit_sync()
    ref = host.actors.get_or_create("p", player).submit_sync().ref

    host.send_to_actor("p", Join("room")).submit_sync()

    assert book.next_result() == JoinResult("room", approve, None)
    assert book.asked == [ref]
    assert _where(host) == ("room" if approve else host.entry_spot_id)
    assert host.spots.close("room").submit_sync() is not approve


def test_a_join_to_a_missing_spot_completes_unapproved_with_not_found(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    host = harness.host(spots=[room], actors=[player])
    host.actors.get_or_create("p", player).submit_sync()

    host.send_to_actor("p", Join("nowhere")).submit_sync()

    result = book.next_result()
    assert result.spot_id == "nowhere"
    assert result.approved is False
    assert isinstance(result.error, NotFoundError)
    assert _where(host) == host.entry_spot_id


class Tracker:
    """Counts turns running at once across one gate's owners."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def enter(self) -> None:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)

    def leave(self) -> None:
        with self._lock:
            self.inside -= 1


def test_a_spotwide_member_never_overlaps_the_spots_handlers_and_shares_its_state(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    tracker = Tracker()
    entered = threading.Event()
    spot_entered = threading.Event()
    latch = harness.latch()
    rounds = 200

    class Hall(room):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> object:
            spot_entered.set()
            tracker.enter()
            self.lines.append(f"spot {msg.n}")
            tracker.leave()
            return self

    class Member(player):  # type: ignore[misc,valid-type]
        @handler
        def hold(self, ctx: ActorContext, msg: Hold) -> None:
            tracker.enter()
            entered.set()
            assert latch.wait(WAIT)
            tracker.leave()

        @handler
        def note(self, ctx: ActorContext, msg: Note) -> object:
            tracker.enter()
            ctx.spot.lines.append(f"actor {msg.n}")
            tracker.leave()
            return ctx.spot

    host = harness.host(spots=[Hall], actors=[Member])
    host.spots.get_or_create("room", Hall).submit_sync()
    host.actors.get_or_create("p", Member).submit_sync()
    _joined(host, book)

    held = host.request_to_actor("p", Hold()).submit()
    assert entered.wait(WAIT)
    touched = host.request_to_spot("room", Hit(-1)).submit()
    # The Spot's handler needs the gate the member's turn holds; that it has not started
    # can only be seen by watching for a short while.
    assert not spot_entered.wait(NEGATIVE_WAIT)
    latch.set()
    assert held.result(WAIT) is None
    hall = touched.result(WAIT)

    barrier = threading.Barrier(2)
    replies: dict[str, list[object]] = {"spot": [], "actor": []}

    def hammer(kind: str) -> None:
        barrier.wait(WAIT)
        calls = [
            host.request_to_spot("room", Hit(i)).submit()
            if kind == "spot"
            else host.request_to_actor("p", Note(i)).submit()
            for i in range(rounds)
        ]
        replies[kind] = [call.result(WAIT) for call in calls]

    threads = [threading.Thread(target=hammer, args=(kind,)) for kind in replies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
        assert not thread.is_alive()

    assert tracker.most == 1
    assert all(reply is hall for reply in replies["spot"])
    assert all(reply is hall for reply in replies["actor"])  # ctx.spot is the Spot itself
    assert sorted(hall.lines) == sorted(
        ["spot -1"] + [f"spot {i}" for i in range(rounds)] + [f"actor {i}" for i in range(rounds)]
    )


@pytest.mark.parametrize("membership", ["entry", "per_actor_spot"])
def test_ctx_spot_of_an_actor_outside_a_spotwide_spot_raises_invalid_operation(
    harness: HostHarness, membership: str
) -> None:
    book = Book()
    room, player = classes(book)

    class Lounge(room):  # type: ignore[misc,valid-type]
        mode = SpotMode.PER_ACTOR

    class Curious(player):  # type: ignore[misc,valid-type]
        @handler
        def peek(self, ctx: ActorContext, msg: Ping) -> str:
            try:
                ctx.spot  # noqa: B018
            except InvalidOperationError:
                return "refused"
            return "reached"

    host = harness.host(spots=[Lounge], actors=[Curious])
    host.spots.get_or_create("lounge", Lounge).submit_sync()
    host.actors.get_or_create("p", Curious).submit_sync()
    if membership == "per_actor_spot":
        _joined(host, book, "lounge")

    assert host.request_to_actor("p", Ping()).submit_sync() == "refused"


def test_messages_sent_while_a_join_is_pending_are_handled_after_it_in_order(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    log: list[object] = []
    asking = threading.Event()
    latch = harness.latch()

    class Gatekeeper(room):  # type: ignore[misc,valid-type]
        def on_actor_join(self, ctx: SpotContext, actor: ActorRef) -> bool:
            asking.set()
            assert latch.wait(WAIT)
            return True

    class Patient(player):  # type: ignore[misc,valid-type]
        @handler
        def note(self, ctx: ActorContext, msg: Note) -> None:
            log.append((msg.n, ctx.spot_id))

        def on_join_completed(self, ctx: ActorContext, result: JoinResult) -> None:
            log.append(("joined", result.approved))

    host = harness.host(spots=[Gatekeeper], actors=[Patient])
    host.spots.get_or_create("room", Gatekeeper).submit_sync()
    host.actors.get_or_create("p", Patient).submit_sync()
    host.send_to_actor("p", Join("room")).submit_sync()
    assert asking.wait(WAIT)

    for i in range(5):
        host.send_to_actor("p", Note(i)).submit_sync()
    last = host.request_to_actor("p", Where()).submit()
    assert not last.done()
    latch.set()

    assert last.result(WAIT) == "room"
    assert log == [("joined", True)] + [(i, "room") for i in range(5)]


def test_leave_spot_defer_returns_the_actor_to_the_entry_spot(harness: HostHarness) -> None:
    book = Book()
    room, player = classes(book)
    host = harness.host(spots=[room], actors=[player])
    host.spots.get_or_create("room", room).submit_sync()
    host.actors.get_or_create("p", player).submit_sync()
    _joined(host, book)
    assert _where(host) == "room"

    host.send_to_actor("p", Leave()).submit_sync()

    assert book.next_result() == JoinResult(host.entry_spot_id, True, None)
    assert _where(host) == host.entry_spot_id
    assert host.spots.close("room").submit_sync() is True  # no members left


def test_a_yielding_spotwide_member_keeps_its_queue_claim_while_the_spot_runs(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    job = harness.job()
    log: list[str] = []
    note_ran = threading.Event()

    class Hall(room):  # type: ignore[misc,valid-type]
        @handler
        def hit(self, ctx: SpotContext, msg: Hit) -> list[str]:
            log.append("spot hit")
            return list(log)

    class Yielder(player):  # type: ignore[misc,valid-type]
        @handler
        async def park(self, ctx: ActorContext, msg: Park) -> None:
            log.append("park start")
            await ctx.run_cpu_worker(job).yield_()
            log.append("park resumed")

        @handler
        def note(self, ctx: ActorContext, msg: Note) -> None:
            log.append("actor note")
            note_ran.set()

    host = harness.host(spots=[Hall], actors=[Yielder])
    host.spots.get_or_create("room", Hall).submit_sync()
    host.actors.get_or_create("p", Yielder).submit_sync()
    _joined(host, book)

    host.send_to_actor("p", Park()).submit_sync()
    assert job.started.wait(WAIT)
    host.send_to_actor("p", Note()).submit_sync()

    # The Spot's own handler runs (the gate was released) while the Actor's next record,
    # queued before it, still waits behind the parked one.
    assert host.request_to_spot("room", Hit()).submit_sync() == ["park start", "spot hit"]
    assert not note_ran.is_set()
    job.release()

    assert note_ran.wait(WAIT)
    assert log == ["park start", "spot hit", "park resumed", "actor note"]


def test_a_request_to_your_own_actor_with_yield_raises_invalid_operation_before_submission(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    pings: list[int] = []

    class SelfAsker(player):  # type: ignore[misc,valid-type]
        @handler
        async def ask(self, ctx: ActorContext, msg: Note) -> list[object]:
            outcomes: list[object] = []
            try:
                await ctx.request_to_actor(ctx.actor_id, Ping(1)).yield_()
            except InvalidOperationError:
                outcomes.append("refused")
            else:
                outcomes.append("accepted")
            # yield_() itself is eligible in this turn (a SpotWide member's async handler).
            outcomes.append(await ctx.request_to_spot("room", Probe()).yield_())
            return outcomes

        @handler
        def ping(self, ctx: ActorContext, msg: Ping) -> int:
            pings.append(msg.n)
            return msg.n

        @handler
        def count(self, ctx: ActorContext, msg: Probe) -> int:
            return len(pings)

    host = harness.host(spots=[room], actors=[SelfAsker])
    host.spots.get_or_create("room", room).submit_sync()
    ref = host.actors.get_or_create("p", SelfAsker).submit_sync().ref
    _joined(host, book)

    assert host.request_to_actor("p", Note()).submit_sync() == ["refused", [ref]]
    # FIFO: a Ping submitted by that handler would have been handled before this probe.
    assert host.request_to_actor("p", Probe()).submit_sync() == 0
    assert pings == []


def test_an_actor_in_the_entry_spot_reports_the_entry_spot_id(harness: HostHarness) -> None:
    book = Book()
    room, player = classes(book)
    host = harness.host(spots=[room], actors=[player])
    host.actors.get_or_create("p", player).submit_sync()

    assert host.entry_spot_id
    assert _where(host) == host.entry_spot_id


# -- ctx.members (issue 10) --------------------------------------------------------------


class Roster(msgspec.Struct, frozen=True):
    """Asks a Spot for `ctx.members`."""


def _roster(host: Host, spot_id: str = "room") -> object:
    return host.request_to_spot(spot_id, Roster()).submit_sync()


def test_ctx_members_lists_members_in_join_order_across_leaves_joins_elsewhere_and_closes(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)

    class Hall(room):  # type: ignore[misc,valid-type]
        @handler
        def roster(self, ctx: SpotContext, msg: Roster) -> tuple[ActorRef, ...]:
            return ctx.members

    host = harness.host(spots=[Hall], actors=[player])
    for spot_id in ("room", "other"):
        host.spots.get_or_create(spot_id, Hall).submit_sync()
    refs = {n: host.actors.get_or_create(n, player).submit_sync().ref for n in ("a", "b", "c")}
    assert _roster(host) == ()

    for name in ("c", "a", "b"):
        _joined(host, book, actor_id=name)
    assert _roster(host) == (refs["c"], refs["a"], refs["b"])

    host.send_to_actor("a", Leave()).submit_sync()
    assert book.next_result() == JoinResult(host.entry_spot_id, True, None)
    assert _roster(host) == (refs["c"], refs["b"])

    _joined(host, book, "other", actor_id="c")
    assert _roster(host) == (refs["b"],)
    assert _roster(host, "other") == (refs["c"],)

    _joined(host, book, actor_id="a")  # a member again: the newest one
    assert _roster(host) == (refs["b"], refs["a"])

    assert host.actors.close("b").submit_sync() is True
    assert _roster(host) == (refs["a"],)
    again = host.actors.get_or_create("b", player).submit_sync().ref
    assert again.generation != refs["b"].generation
    _joined(host, book, actor_id="b")
    assert _roster(host) == (refs["a"], again)
    assert _roster(host, "other") == (refs["c"],)


def test_ctx_members_of_an_instance_spot_is_empty_and_the_entry_spot_has_none(
    harness: HostHarness,
) -> None:
    class Match(InstanceSpot):
        @handler
        def roster(self, ctx: SpotContext, msg: Roster) -> tuple[ActorRef, ...]:
            return ctx.members

    host = harness.host(spots=[Match])
    assert host.request_to_spot("m1", Roster()).activate().submit_sync() == ()

    # No user code runs in the Entry Spot; its context (internal) still refuses.
    runtime = host._runtime
    entry = runtime.engine.entry
    with pytest.raises(InvalidOperationError):
        SpotContext(runtime, entry, entry.box, None).members  # noqa: B018


@pytest.mark.stress
def test_ctx_members_is_a_consistent_snapshot_while_members_leave_on_other_threads(
    harness: HostHarness,
) -> None:
    book = Book()
    room, player = classes(book)
    count = 40
    watching = threading.Event()

    class Lounge(room):  # type: ignore[misc,valid-type]
        mode = SpotMode.PER_ACTOR  # members run on gates of their own, beside the Spot

        @handler
        def roster(self, ctx: SpotContext, msg: Roster) -> list[tuple[ActorRef, ...]]:
            seen = [ctx.members]
            watching.set()
            end = time.monotonic() + WAIT
            while seen[-1] and time.monotonic() < end:
                now = ctx.members
                if now != seen[-1]:
                    seen.append(now)
            return seen

    host = harness.host(spots=[Lounge], actors=[player])
    host.spots.get_or_create("room", Lounge).submit_sync()
    names = [f"p{i}" for i in range(count)]
    joined = [host.actors.get_or_create(n, player).submit_sync().ref for n in names]
    for name in names:
        _joined(host, book, actor_id=name)

    watch = host.request_to_spot("room", Roster()).timeout(WAIT * 2).submit()
    assert watching.wait(WAIT)
    for name in names:
        host.send_to_actor(name, Leave()).submit_sync()
    snapshots = watch.result(WAIT * 2)

    assert snapshots[0] == tuple(joined)  # no Leave was sent before the first read
    assert snapshots[-1] == ()
    for earlier, later in itertools.pairwise(snapshots):
        assert len(later) < len(earlier)
        assert later == tuple(ref for ref in earlier if ref in later)  # order kept
    for _ in names:
        assert book.next_result().approved


# -- Spot.on_actor_leave (issue 10) ------------------------------------------------------


def leaving_classes(
    book: Book, heard: queue.Queue[tuple[str, ActorRef, tuple[ActorRef, ...]]], asynchronous: bool
) -> tuple[type[Spot], type[Actor]]:
    """`classes(book)` with a Room that reports each `on_actor_leave` and `ctx.members`."""
    room, player = classes(book)

    class Hall(room):  # type: ignore[misc,valid-type]
        @handler
        def roster(self, ctx: SpotContext, msg: Roster) -> tuple[ActorRef, ...]:
            return ctx.members

    if asynchronous:

        class Told(Hall):  # type: ignore[misc,valid-type]
            async def on_actor_leave(self, ctx: SpotContext, actor: ActorRef) -> None:
                heard.put((ctx.spot_id, actor, ctx.members))

    else:

        class Told(Hall):  # type: ignore[misc,valid-type,no-redef]
            def on_actor_leave(self, ctx: SpotContext, actor: ActorRef) -> None:
                heard.put((ctx.spot_id, actor, ctx.members))

    return Told, player


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain", "async"])
def test_on_actor_leave_runs_once_per_leave_with_its_ref_after_ctx_members_dropped_it(
    harness: HostHarness, asynchronous: bool
) -> None:
    book = Book()
    heard: queue.Queue[tuple[str, ActorRef, tuple[ActorRef, ...]]] = queue.Queue()
    room, player = leaving_classes(book, heard, asynchronous)
    host = harness.host(spots=[room], actors=[player])
    for spot_id in ("room", "other"):
        host.spots.get_or_create(spot_id, room).submit_sync()
    a, b, c = (host.actors.get_or_create(n, player).submit_sync().ref for n in "abc")
    for name in "abc":
        _joined(host, book, actor_id=name)

    host.send_to_actor("a", Leave()).submit_sync()
    assert book.next_result().approved
    assert heard.get(timeout=WAIT) == ("room", a, (b, c))

    _joined(host, book, "other", actor_id="b")
    assert heard.get(timeout=WAIT) == ("room", b, (c,))

    assert host.actors.close("c").submit_sync() is True
    assert heard.get(timeout=WAIT) == ("room", c, ())

    # Not leaves: a declined Join (b stays in "other"), a Join of the Spot one is in.
    book.approve = False
    host.send_to_actor("b", Join("room")).submit_sync()
    assert book.next_result() == JoinResult("room", False, None)
    _joined(host, book, "other", actor_id="b")
    # Leave notices are lifecycle records queued before the Actor hears its result, so
    # they run before these probes: any extra one would be in `heard` by now.
    assert _roster(host) == ()
    assert _roster(host, "other") == (b,)
    assert heard.empty()


def test_on_actor_leave_is_not_called_once_the_spot_is_closing(harness: HostHarness) -> None:
    book = Book()
    heard: queue.Queue[tuple[str, ActorRef, tuple[ActorRef, ...]]] = queue.Queue()
    room, player = leaving_classes(book, heard, asynchronous=False)
    entered = threading.Event()
    latch = harness.latch()
    closing: list[str] = []

    class Lounge(room):  # type: ignore[misc,valid-type]
        mode = SpotMode.PER_ACTOR  # the member leaves while the Spot's own gate is held

        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            entered.set()
            assert latch.wait(WAIT)

        def on_closing(self, ctx: SpotContext, reason: object) -> None:
            closing.append(ctx.spot_id)

    host = harness.host(spots=[Lounge], actors=[player])
    host.spots.get_or_create("room", Lounge).submit_sync()
    host.actors.get_or_create("p", player).submit_sync()
    _joined(host, book)
    held = host.request_to_spot("room", Hold()).submit()
    assert entered.wait(WAIT)

    host.send_to_actor("p", Leave()).submit_sync()
    assert book.next_result().approved  # its leave notice is queued behind the Hold
    closed = host.spots.close("room").submit()  # no members left: accepted
    latch.set()

    assert held.result(WAIT) is None
    assert closed.result(WAIT) is True
    assert closing == ["room"]
    assert heard.empty()


def test_at_shutdown_a_spot_hears_no_leave_for_members_the_shutdown_closes(
    harness: HostHarness,
) -> None:
    book = Book()
    heard: queue.Queue[tuple[str, ActorRef, tuple[ActorRef, ...]]] = queue.Queue()
    room, player = leaving_classes(book, heard, asynchronous=False)
    closing: list[str] = []

    class Closer(player):  # type: ignore[misc,valid-type]
        def on_closing(self, ctx: ActorContext, reason: object) -> None:
            closing.append(ctx.actor_id)

    host = harness.host(spots=[room], actors=[Closer])
    host.spots.get_or_create("room", room).submit_sync()
    for name in "ab":
        host.actors.get_or_create(name, Closer).submit_sync()
        _joined(host, book, actor_id=name)

    result = host.shutdown(deadline=WAIT)

    assert result.outcome is ShutdownOutcome.STOPPED
    assert sorted(closing) == ["a", "b"]
    assert heard.empty()


def test_an_exception_in_on_actor_leave_is_logged_and_counted_and_changes_nothing_else(
    harness: HostHarness, caplog: pytest.LogCaptureFixture
) -> None:
    book = Book()
    room, player = classes(book)

    class Touchy(room):  # type: ignore[misc,valid-type]
        def on_actor_leave(self, ctx: SpotContext, actor: ActorRef) -> None:
            raise ValueError(f"{actor.actor_id} left")

        @handler
        def roster(self, ctx: SpotContext, msg: Roster) -> tuple[ActorRef, ...]:
            return ctx.members

    host = harness.host(spots=[Touchy], actors=[player])
    host.spots.get_or_create("room", Touchy).submit_sync()
    host.actors.get_or_create("p", player).submit_sync()
    _joined(host, book)
    before = host.statistics().handler_failures

    with caplog.at_level(logging.ERROR, logger="zlink_actors"):
        host.send_to_actor("p", Leave()).submit_sync()
        assert book.next_result() == JoinResult(host.entry_spot_id, True, None)
        assert _roster(host) == ()  # runs after the leave notice

    assert host.statistics().handler_failures == before + 1
    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == ["p left"]
    assert _where(host) == host.entry_spot_id
    _joined(host, book)  # the Spot and the Actor go on as before
    assert host.spots.close("room").submit_sync() is False
