"""`yield_()` and `await` in handler turns (digest §4 "Yield eligibility";
design/architecture.md §5).

`yield_()` is for `async def` turns of SpotWide Spots only; anywhere else it raises
`InvalidOperationError` at the call, before anything is submitted. It releases the gate,
and the continuation is one record queued behind the work already waiting. `await` on a
`submit()` keeps the gate (but frees the pool thread).
"""

import threading
from typing import Any

import msgspec
import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    ChannelContext,
    ChannelHandler,
    CpuWorkerCall,
    CreateCall,
    Host,
    InvalidOperationError,
    NotFoundError,
    RequestCall,
    Spot,
    SpotContext,
    SpotMode,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import NEGATIVE_WAIT, Hit, Hold, Note, Ping, Pong, Probe

CALLS = ["request", "cpu_worker", "create"]


class TryYield(msgspec.Struct, frozen=True):
    call: str


class Target(Spot):
    """Counts the `Hit`s it handled; `Probe` answers the count."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    @handler
    def hit(self, ctx: SpotContext, msg: Hit) -> None:
        self.hits += 1

    @handler
    def probe(self, ctx: SpotContext, msg: Probe) -> int:
        return self.hits


def _nothing_was_submitted(host: Host, worker_runs: list[int]) -> None:
    # FIFO probes: a Hit sent earlier would be handled before this Probe, and with one
    # CPU worker thread a job submitted earlier would run before this one.
    assert host.request_to_spot("target", Probe(), reply=int).submit_sync() == 0
    assert host.run_cpu_worker(len, worker_runs).submit_sync() == 0
    with pytest.raises(NotFoundError):
        host.request_to_spot("never-created", Probe()).submit_sync()


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(
    "caller", ["per_actor_spot", "entry_actor", "channel_handler", "sync_spotwide_handler"]
)
def test_ineligible_yield_raises_invalid_operation_before_anything_is_submitted(
    harness: HostHarness, caller: str, call: str
) -> None:
    worker_runs: list[int] = []

    def attempt(ctx: SpotContext | ActorContext | ChannelContext) -> str:
        builder: RequestCall[Any] | CpuWorkerCall[Any] | CreateCall
        if call == "request":
            builder = ctx.request_to_spot("target", Hit())
        elif call == "cpu_worker":
            builder = ctx.run_cpu_worker(worker_runs.append, 1)
        else:
            builder = ctx.spots.get_or_create("never-created", Target)
        try:
            builder.yield_()
        except InvalidOperationError:
            return "refused"
        return "accepted"

    class PerActorCaller(Spot):
        mode = SpotMode.PER_ACTOR

        @handler
        async def try_yield(self, ctx: SpotContext, msg: TryYield) -> str:
            return attempt(ctx)

    class SyncCaller(Spot):
        @handler
        def try_yield(self, ctx: SpotContext, msg: TryYield) -> str:
            return attempt(ctx)

    class ActorCaller(Actor):
        @handler
        async def try_yield(self, ctx: ActorContext, msg: TryYield) -> str:
            return attempt(ctx)

    class ChannelCaller(ChannelHandler):
        @handler
        async def try_yield(self, ctx: ChannelContext, msg: TryYield) -> str:
            return attempt(ctx)

    host = harness.host(
        spots=[Target, PerActorCaller, SyncCaller],
        actors=[ActorCaller],
        channels={"caller": ChannelCaller},
        cpu_workers=1,
    )
    host.spots.get_or_create("target", Target).submit_sync()
    if caller == "per_actor_spot":
        host.spots.get_or_create("caller", PerActorCaller).submit_sync()
        request = host.request_to_spot("caller", TryYield(call), reply=str)
    elif caller == "sync_spotwide_handler":
        host.spots.get_or_create("caller", SyncCaller).submit_sync()
        request = host.request_to_spot("caller", TryYield(call), reply=str)
    elif caller == "entry_actor":
        host.actors.get_or_create("caller", ActorCaller).submit_sync()
        request = host.request_to_actor("caller", TryYield(call), reply=str)
    else:
        request = host.request_to_channel("caller", TryYield(call), reply=str)

    assert request.submit_sync() == "refused"
    _nothing_was_submitted(host, worker_runs)


@pytest.mark.parametrize("call", CALLS)
def test_yield_from_an_application_thread_raises_invalid_operation_before_submitting(
    harness: HostHarness, call: str
) -> None:
    worker_runs: list[int] = []
    host = harness.host(spots=[Target], cpu_workers=1)
    host.spots.get_or_create("target", Target).submit_sync()
    builder: RequestCall[Any] | CpuWorkerCall[Any] | CreateCall
    if call == "request":
        builder = host.request_to_spot("target", Hit())
    elif call == "cpu_worker":
        builder = host.run_cpu_worker(worker_runs.append, 1)
    else:
        builder = host.spots.get_or_create("never-created", Target)

    with pytest.raises(InvalidOperationError):
        builder.yield_()

    _nothing_was_submitted(host, worker_runs)


def test_spotwide_yield_releases_the_gate_while_it_waits(harness: HostHarness) -> None:
    job = harness.job("worked")

    class Room(Spot):
        @handler
        async def slow(self, ctx: SpotContext, msg: Hold) -> object:
            return await ctx.run_cpu_worker(job).yield_()

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(spots=[Room], app_threads=2)
    host.spots.get_or_create("room", Room).submit_sync()

    slow = host.request_to_spot("room", Hold()).timeout(30.0).submit()
    assert job.started.wait(WAIT)
    # Another record of the same Spot runs while the first one waits for its worker.
    assert host.request_to_spot("room", Ping(1), reply=Pong).submit_sync() == Pong(1)
    assert not slow.done()

    job.release()
    assert slow.result(WAIT) == "worked"


def test_yield_continuation_runs_behind_work_already_queued(harness: HostHarness) -> None:
    job = harness.job()
    latch = harness.latch()
    entered = threading.Event()
    order: list[str] = []

    class Room(Spot):
        @handler
        async def slow(self, ctx: SpotContext, msg: Ping) -> None:
            order.append("slow-start")
            await ctx.run_cpu_worker(job).yield_()
            order.append("slow-resumed")

        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> None:
            order.append("hold")
            entered.set()
            latch.wait(WAIT)

        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            order.append(f"note{msg.n}")

    host = harness.host(spots=[Room], app_threads=2, cpu_workers=1)
    host.spots.get_or_create("room", Room).submit_sync()

    slow = host.request_to_spot("room", Ping()).timeout(30.0).submit()
    assert job.started.wait(WAIT)
    host.send_to_spot("room", Hold()).submit_sync()
    assert entered.wait(WAIT)
    host.send_to_spot("room", Note(1)).submit_sync()
    host.send_to_spot("room", Note(2)).submit_sync()

    job.release()
    # One CPU thread runs jobs in order: once this one has run, the held job finished
    # and its result queued the continuation (behind note1 and note2).
    host.run_cpu_worker(int).submit_sync()
    latch.set()

    assert slow.result(WAIT) is None
    assert order == ["slow-start", "hold", "note1", "note2", "slow-resumed"]


def test_yield_of_a_request_to_your_own_spotwide_spot_is_answered(harness: HostHarness) -> None:
    class Room(Spot):
        @handler
        async def outer(self, ctx: SpotContext, msg: Ping) -> Pong:
            inner = await ctx.request_to_spot(ctx.spot_id, Note(msg.n), reply=int).yield_()
            return Pong(inner + 1)

        @handler
        def inner(self, ctx: SpotContext, msg: Note) -> int:
            return msg.n * 10

    host = harness.host(spots=[Room])
    host.spots.get_or_create("room", Room).submit_sync()

    assert host.request_to_spot("room", Ping(4), reply=Pong).submit_sync() == Pong(41)


def test_await_submit_keeps_the_turn_so_the_next_message_waits(harness: HostHarness) -> None:
    job = harness.job()
    ping_ran = threading.Event()
    order: list[str] = []

    class Room(Spot):
        @handler
        async def slow(self, ctx: SpotContext, msg: Hold) -> None:
            order.append("slow-start")
            await ctx.run_cpu_worker(job).submit()
            order.append("slow-end")

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> None:
            order.append("ping")
            ping_ran.set()

    host = harness.host(spots=[Room], app_threads=2)
    host.spots.get_or_create("room", Room).submit_sync()

    slow = host.request_to_spot("room", Hold()).timeout(30.0).submit()
    assert job.started.wait(WAIT)
    host.send_to_spot("room", Ping()).submit_sync()

    assert not ping_ran.wait(NEGATIVE_WAIT)
    assert host.statistics().queued_records == 1

    job.release()
    assert slow.result(WAIT) is None
    assert ping_ran.wait(WAIT)
    assert order == ["slow-start", "slow-end", "ping"]


def test_await_submit_frees_the_pool_thread_for_other_owners(harness: HostHarness) -> None:
    job = harness.job()

    class Room(Spot):
        @handler
        async def slow(self, ctx: SpotContext, msg: Hold) -> None:
            await ctx.run_cpu_worker(job).submit()

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Pong:
            return Pong(msg.n)

    host = harness.host(spots=[Room], app_threads=1)
    host.spots.get_or_create("busy", Room).submit_sync()
    host.spots.get_or_create("other", Room).submit_sync()

    slow = host.request_to_spot("busy", Hold()).timeout(30.0).submit()
    assert job.started.wait(WAIT)
    # The pool's only thread is free although "busy" still holds its gate.
    assert host.request_to_spot("other", Ping(2), reply=Pong).submit_sync() == Pong(2)
    assert not slow.done()

    job.release()
    assert slow.result(WAIT) is None
