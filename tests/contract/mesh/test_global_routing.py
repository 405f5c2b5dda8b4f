"""Routing of Spot and Actor calls to their owner node (issue 16 item 3; design/mesh.md §2
"Global objects", the table's one-way and request rows; "NotFound vs Unavailable").

Real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`) on tcp loopback.
Handlers are held on latches where a test needs an order; every wait is bounded and
asserted.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest

from zlink_actors import (
    Actor,
    ActorContext,
    Completion,
    Created,
    DeadlineExceededError,
    HostState,
    InternalFailureError,
    NotFoundError,
    PeerState,
    RejectedError,
    ShutdownOutcome,
    ShuttingDownError,
    Spot,
    SpotContext,
    UnavailableError,
    UnavailableReason,
    ZlinkError,
    handler,
)
from zlink_actors.testing import WAIT, wait_until

from .._support import NEGATIVE_WAIT, ShutdownThread
from ._global import GlobalMesh, mesh_stats
from ._global_objects import (
    Faulty,
    Hold,
    Note,
    Ping,
    Player,
    Room,
    Where,
    journal,
    where,
)

# -- reaching an object on another node --------------------------------------------------


def test_sends_and_requests_from_an_application_thread_reach_objects_on_another_node(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room], actors=[Player])
    client = mesh.add()
    srid = server.node.routing_id
    server.spots.get_or_create("r1", Room).submit_sync()
    server.actors.get_or_create("ana", Player).submit_sync()

    for n in range(3):
        assert client.send_to_spot("r1", Note(n)).submit_sync() is None
        assert client.send_to_actor("ana", Note(n)).submit_sync() is None
    # A request travels behind the one-ways on the same pipe: once it is answered,
    # they have all run, each once, in order.
    assert client.request_to_spot("r1", Ping(7), reply=int).submit_sync() == 7
    assert client.request_to_actor("ana", Ping(8), reply=int).submit_sync() == 8
    notes = journal().items("note")
    assert [n for s, n, _ in notes if s == "r1"] == [0, 1, 2]  # type: ignore[misc]
    assert [n for s, n, _ in notes if s == "ana"] == [0, 1, 2]  # type: ignore[misc]
    assert {rid for _, _, rid in notes} == {srid}  # type: ignore[misc]
    assert where(client, "r1") == srid


def test_a_one_way_to_a_remote_spot_completes_before_its_handler_runs(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    server.spots.get_or_create("r1", Room).submit_sync()
    held = client.request_to_spot("r1", Hold(), reply=str).timeout(WAIT * 2).submit()
    assert journal().event("entered").wait(WAIT)

    sent = client.send_to_spot("r1", Note(1)).submit()
    assert sent.wait(WAIT)  # local transport admission; the Spot is still held
    assert sent.result() is None
    assert journal().items("note") == []

    journal().latch("hold").set()
    assert held.result(WAIT) == "held"
    assert client.request_to_spot("r1", Ping(), reply=int).submit_sync() == 0
    assert journal().count("note") == 1


def _caller_class(*, yielding: bool) -> type[Spot]:
    class Caller(Spot):
        """Calls the Room "far" on another node from a handler and journals the order."""

        type_name = "g.Caller"

        @handler
        async def slow(self, ctx: SpotContext, msg: Hold) -> str:
            call = ctx.request_to_spot("far", msg, reply=str).timeout(WAIT * 2)
            reply = await (call.yield_() if yielding else call.submit())
            journal().note("order", "slow")
            return reply

        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> int:
            journal().note("order", "ping")
            return msg.n

    return Caller


@pytest.mark.parametrize("yielding", [False, True], ids=["await", "yield_"])
def test_a_request_from_a_handler_to_a_remote_spot_keeps_or_releases_the_callers_turn(
    mesh: GlobalMesh, yielding: bool
) -> None:
    caller_cls = _caller_class(yielding=yielding)
    here = mesh.add(spots=[caller_cls], app_threads=2)
    there = mesh.add(spots=[Room])
    here.spots.get_or_create("caller", caller_cls).submit_sync()
    there.spots.get_or_create("far", Room).submit_sync()
    log = journal()

    slow = here.request_to_spot("caller", Hold(), reply=str).timeout(WAIT * 2).submit()
    assert log.event("entered").wait(WAIT)  # "far" on the other node is held
    assert log.items("entered") == [("far", "hold")]
    ping = here.request_to_spot("caller", Ping(5), reply=int).timeout(WAIT * 2).submit()
    if yielding:
        # yield_() released the gate: the second message runs while "far" is still held.
        assert ping.result(WAIT) == 5
        assert not slow.done()
        assert log.items("order") == ["ping"]
    else:
        # await kept the turn: the second message waits for the remote reply.
        assert not ping.wait(NEGATIVE_WAIT)
        assert log.items("order") == []
    log.latch("hold").set()
    assert slow.result(WAIT) == "held"
    assert ping.result(WAIT) == 5
    assert log.items("order") == (["ping", "slow"] if yielding else ["slow", "ping"])


# -- NotFound vs Unavailable -------------------------------------------------------------


def test_a_never_created_id_is_not_found_from_every_node(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Room], actors=[Player])
    client = mesh.add()
    for host in (server, client):
        with pytest.raises(NotFoundError):
            host.send_to_spot("nobody", Note(1)).submit_sync()
        with pytest.raises(NotFoundError):
            host.request_to_spot("nobody", Ping(), reply=int).submit_sync()
        with pytest.raises(NotFoundError):
            host.send_to_actor("nobody", Note(1)).submit_sync()
        with pytest.raises(NotFoundError):
            host.request_to_actor("nobody", Ping(), reply=int).submit_sync()
    assert mesh_stats(client).route_cache_misses >= 1  # a Missing was looked up...
    with pytest.raises(NotFoundError):  # ...and never cached: still Missing
        client.request_to_spot("nobody", Ping(), reply=int).submit_sync()


def test_an_id_still_being_created_is_not_found(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    creating = server.spots.get_or_create("r", Room).request("hold-create").submit()
    assert journal().event("created").wait(WAIT)  # Reserved: on_create is held
    with pytest.raises(NotFoundError):
        client.send_to_spot("r", Note(1)).submit_sync()
    with pytest.raises(NotFoundError):
        client.request_to_spot("r", Ping(), reply=int).submit_sync()
    journal().latch("create").set()
    assert type(creating.result(WAIT)) is Created
    assert client.request_to_spot("r", Ping(3), reply=int).submit_sync() == 3
    assert journal().items("note") == []


def test_a_closed_id_is_not_found_also_for_a_caller_that_had_its_route_cached(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    server.spots.get_or_create("r", Room).submit_sync()
    assert where(client, "r") == server.node.routing_id  # the route is cached now
    assert server.spots.close("r").submit_sync() is True

    # The stale route reaches the old owner, which no longer has it: NotFound, or
    # "not the owner" (Unavailable) once; then the next call resolves again: Missing.
    with pytest.raises((NotFoundError, UnavailableError)):
        client.request_to_spot("r", Ping(), reply=int).submit_sync()
    with pytest.raises(NotFoundError):
        client.request_to_spot("r", Ping(), reply=int).submit_sync()
    with pytest.raises(NotFoundError):
        client.send_to_spot("r", Note(1)).submit_sync()
    assert journal().items("ping") == []


def test_the_objects_of_a_draining_owner_are_unavailable_and_no_handler_runs(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room])
    client = mesh.add()
    orid = owner.node.routing_id
    owner.spots.get_or_create("busy", Room).submit_sync()
    owner.spots.get_or_create("idle", Room).submit_sync()
    assert where(client, "idle") == orid
    held = client.request_to_spot("busy", Hold(), reply=str).timeout(WAIT * 2).submit()
    assert journal().event("entered").wait(WAIT)

    stopping = ShutdownThread(owner, WAIT)  # waits for the held handler
    assert wait_until(
        lambda: any(p.routing_id == orid and p.state is PeerState.DRAINING for p in client.peers())
    )
    # The Host is DRAINING once the mesh's part of the drain is done: it waits for the
    # accepted work now (the held handler), and has closed nothing yet.
    assert wait_until(lambda: owner.state is HostState.DRAINING)
    with pytest.raises(UnavailableError) as caught:
        client.request_to_spot("idle", Ping(1), reply=int).submit_sync()
    assert caught.value.reason is UnavailableReason.DRAINING
    with pytest.raises(UnavailableError) as caught:
        client.send_to_spot("idle", Note(1)).submit_sync()
    assert caught.value.reason is UnavailableReason.DRAINING

    journal().latch("hold").set()
    assert held.result(WAIT) == "held"  # accepted work finishes
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    assert journal().items("ping") == []
    assert journal().items("note") == []


def test_after_a_graceful_shutdown_the_owners_objects_are_not_found_and_their_ids_free(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room])
    other = mesh.add(spots=[Room])
    owner.spots.get_or_create("r", Room).submit_sync()
    assert where(other, "r") == owner.node.routing_id
    assert owner.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED
    assert mesh.journal.items("closed") == [("r", owner.node.routing_id)]

    # The shutdown deleted the record: a call is Missing (after at most one Unavailable
    # for the route this node had cached), and the id can be created again.
    with pytest.raises((NotFoundError, UnavailableError)):
        other.request_to_spot("r", Ping(), reply=int).submit_sync()
    with pytest.raises(NotFoundError):
        other.request_to_spot("r", Ping(), reply=int).submit_sync()
    made = other.spots.get_or_create("r", Room).submit_sync()
    assert type(made) is Created
    assert made.ref.routing_id == other.node.routing_id


def test_the_objects_of_a_dead_owner_are_unavailable_no_handler_runs_and_nothing_is_resent(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], actors=[Player], cuttable=True)
    client = mesh.add()
    other = mesh.add(spots=[Room], actors=[Player])
    owner.spots.get_or_create("r", Room).submit_sync()
    owner.actors.get_or_create("ana", Player).submit_sync()
    assert where(client, "r") == owner.node.routing_id  # one route cached, one not
    mesh.kill(owner)
    # The record is Ready at a dead owner: get_or_create is no way around it. (Asked
    # first, while the others list the owner LOST; see the next test for later.)
    with pytest.raises(UnavailableError) as caught:
        other.spots.get_or_create("r", Room).submit_sync()
    lost = UnavailableReason.PEER_LOST  # its connections closed: gone, not paused
    assert caught.value.reason is lost

    for host in (client, other):
        with pytest.raises(UnavailableError) as caught:
            host.request_to_spot("r", Ping(1), reply=int).submit_sync()
        assert caught.value.reason is lost
        with pytest.raises(UnavailableError) as caught:
            host.send_to_spot("r", Note(1)).submit_sync()
        assert caught.value.reason is lost
        with pytest.raises(UnavailableError) as caught:
            host.request_to_actor("ana", Ping(2), reply=int).submit_sync()
        assert caught.value.reason is lost
        # The record is Ready at a dead owner whose lease has not expired yet.
        with pytest.raises(UnavailableError) as caught:
            host.spots.close("r").submit_sync()
        assert caught.value.reason is lost
    # Nothing ran anywhere, and nothing was re-placed on a live node.
    assert journal().items("ping") == []
    assert journal().items("note") == []
    assert journal().count("created") == 1
    assert mesh_stats(other).owned_objects == 0


def test_get_or_create_of_an_id_at_a_dead_owner_is_unavailable_while_it_is_dialled_again(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], cuttable=True)
    other = mesh.add(spots=[Room])
    owner.spots.get_or_create("r", Room).submit_sync()
    rid = owner.node.routing_id
    mesh.kill(owner)
    # Its node descriptor outlives it in the store (until its TTL), so the others dial it
    # again: CONNECTING, never READY.
    assert wait_until(
        lambda: any(p.routing_id == rid and p.state is PeerState.CONNECTING for p in other.peers())
    )
    outcome: object
    try:
        outcome = other.spots.get_or_create("r", Room).submit_sync()
    except UnavailableError as exc:
        outcome = exc
    assert isinstance(outcome, UnavailableError), outcome
    # Dialled again from its descriptor, it is still the peer that was lost.
    assert outcome.reason is UnavailableReason.PEER_LOST


# -- shutdown of one node while others send ----------------------------------------------


def test_shutdown_of_an_owner_while_others_send_to_its_objects_ends_every_call_once(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room])
    senders = [mesh.add(), mesh.add()]
    ids = [f"r{i}" for i in range(4)]
    for spot_id in ids:
        owner.spots.get_or_create(spot_id, Room).submit_sync()
    calls: list[tuple[str, int, Completion[object]]] = []
    ended: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    stuck: list[int] = []  # a sender whose oldest call did not end within WAIT
    go = threading.Barrier(len(senders) + 1)

    def on_done(key: int) -> None:
        with lock:
            ended[key] = ended.get(key, 0) + 1

    def send(k: int) -> None:
        host, n = senders[k], k * 1_000_000
        window: deque[Completion[object]] = deque()  # at most 16 calls in flight
        go.wait(WAIT)
        while not stop.is_set():
            spot_id = ids[n % len(ids)]
            kind = "request" if n % 2 else "send"
            try:
                if kind == "request":
                    call: Completion[object] = host.request_to_spot(
                        spot_id, Ping(n), reply=int
                    ).submit()
                else:
                    call = host.send_to_spot(spot_id, Note(n)).submit()
            except ZlinkError:  # refused by the builder: no call to end
                n += 1
                continue
            call.add_done_callback(lambda _c, key=n: on_done(key))
            with lock:
                calls.append((kind, n, call))
            window.append(call)
            if len(window) > 16 and not window.popleft().wait(WAIT):
                stuck.append(n)
                return
            n += 1

    threads = [threading.Thread(target=send, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    go.wait(WAIT)
    assert wait_until(lambda: len(calls) >= 50)
    assert owner.shutdown(WAIT).outcome is ShutdownOutcome.STOPPED
    with lock:
        after = len(calls)
    assert wait_until(lambda: len(calls) >= after + 20)  # and some after it
    stop.set()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert not stuck, f"calls did not end: {stuck}"

    typed = (UnavailableError, NotFoundError, ShuttingDownError)
    replies = 0
    for kind, n, call in calls:
        assert call.wait(WAIT), f"{kind} {n} never ended"
        exc = call.exception()
        if exc is None:
            if kind == "request":
                assert call.result() == n
                replies += 1
            else:
                assert call.result() is None
        else:
            assert isinstance(exc, typed), f"{kind} {n}: {exc!r}"
    assert wait_until(lambda: len(ended) == len(calls))
    assert all(count == 1 for count in ended.values())  # each ended exactly once
    assert replies >= 1
    # No resend: every request the owner handled, it handled once.
    handled = journal().counts("ping")
    assert all(count == 1 for count in handled.values())
    assert replies <= len(handled)


def test_a_draining_owners_objects_keep_their_ids_until_they_closed(mesh: GlobalMesh) -> None:
    owner = mesh.add(spots=[Room])
    other = mesh.add(spots=[Room])
    owner.spots.get_or_create("busy", Room).submit_sync()
    held = other.request_to_spot("busy", Hold(), reply=str).timeout(WAIT * 2).submit()
    assert journal().event("entered").wait(WAIT)
    orid = owner.node.routing_id

    stopping = ShutdownThread(owner, WAIT)  # waits for the held handler
    assert wait_until(
        lambda: any(p.routing_id == orid and p.state is PeerState.DRAINING for p in other.peers())
    )
    assert wait_until(lambda: owner.state is HostState.DRAINING)  # the mesh's part is done
    # "busy" is still running accepted work on the draining owner: its id is not free,
    # so no second "busy" may be created anywhere in the mesh.
    outcome: object
    try:
        outcome = other.spots.get_or_create("busy", Room).submit_sync()
    except UnavailableError as exc:
        outcome = exc
    assert journal().items("closed") == []  # the first "busy" has not closed
    assert type(outcome) is not Created, "a second 'busy' was created while the first ran"
    journal().latch("hold").set()
    assert held.result(WAIT) == "held"
    assert stopping.join().outcome is ShutdownOutcome.STOPPED


def test_a_remote_spots_handler_errors_and_missing_handlers_reach_the_caller_typed(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Faulty])
    client = mesh.add()
    server.spots.get_or_create("f", Faulty).submit_sync()
    with pytest.raises(RejectedError, match="no pings today"):
        client.request_to_spot("f", Ping(0), reply=int).submit_sync()
    with pytest.raises(InternalFailureError):
        client.request_to_spot("f", Ping(1), reply=int).submit_sync()
    with pytest.raises(NotFoundError):  # Faulty has no handler for Where
        client.request_to_spot("f", Where(), reply=str).submit_sync()


def test_requests_queued_at_a_remote_spot_that_closes_end_with_unavailable(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    server.spots.get_or_create("r", Room).submit_sync()
    held = client.request_to_spot("r", Hold(), reply=str).timeout(WAIT * 2).submit()
    assert journal().event("entered").wait(WAIT)
    queued = client.request_to_spot("r", Ping(1), reply=int).timeout(WAIT * 2).submit()
    assert wait_until(lambda: server.statistics().queued_records >= 1)
    closing = client.spots.close("r").submit()
    assert not closing.wait(NEGATIVE_WAIT)  # on_closing runs after the held turn
    journal().latch("hold").set()
    assert held.result(WAIT) == "held"
    assert closing.result(WAIT) is True
    assert isinstance(queued.exception(WAIT), UnavailableError)
    assert journal().items("ping") == []


def test_an_actor_handler_requests_a_spot_on_another_node(mesh: GlobalMesh) -> None:
    class Asker(Actor):
        type_name = "g.Asker"

        @handler
        async def ask(self, ctx: ActorContext, msg: Ping) -> str:
            return await ctx.request_to_spot("far", Where(), reply=str).submit()

    here = mesh.add(actors=[Asker])
    there = mesh.add(spots=[Room])
    there.spots.get_or_create("far", Room).submit_sync()
    here.actors.create("asker", Asker).submit_sync()
    assert here.request_to_actor("asker", Ping(), reply=str).submit_sync() == (
        there.node.routing_id
    )


def test_a_remote_close_whose_deadline_passes_first_does_not_happen(mesh: GlobalMesh) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    server.spots.get_or_create("r", Room).submit_sync()
    held = client.request_to_spot("r", Hold(), reply=str).timeout(WAIT * 2).submit()
    assert journal().event("entered").wait(WAIT)
    closing = client.spots.close("r").timeout(0.3).submit()  # on_closing waits for the turn
    assert isinstance(closing.exception(WAIT), DeadlineExceededError)
    # The owner's part of the close has the budget the caller had left when it was sent,
    # so its deadline has passed too, give or take its timer's latency: wait that out
    # (a time bound, the thing under test) before the turn ends.
    timed_out = time.monotonic()
    assert wait_until(lambda: time.monotonic() > timed_out + 0.3)
    journal().latch("hold").set()
    assert held.result(WAIT) == "held"
    # The close was withdrawn: the Spot admits work again, on its owner, and is Ready.
    assert client.request_to_spot("r", Ping(3), reply=int).submit_sync() == 3
    assert journal().items("closed") == []
    assert mesh_stats(server).owned_objects == 1
    assert client.spots.close("r").submit_sync() is True


def test_a_creation_placed_on_a_node_that_begins_to_shut_down_still_completes(
    mesh: GlobalMesh,
) -> None:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    creating = client.spots.get_or_create("r", Room).request("hold-create").timeout(WAIT * 2)
    made = creating.submit()
    assert journal().event("created").wait(WAIT)  # on_create is held on the server
    stopping = ShutdownThread(server, WAIT)
    assert wait_until(lambda: server.state is HostState.DRAINING)
    journal().latch("create").set()
    # Accepted before the shutdown began: not cut short (then closed by the shutdown).
    result = made.result(WAIT)
    assert type(result) is Created
    assert result.ref.routing_id == server.node.routing_id
    assert stopping.join().outcome is ShutdownOutcome.STOPPED
    assert journal().items("closed") == [("r", server.node.routing_id)]
