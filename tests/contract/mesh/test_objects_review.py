"""Regressions of global objects found in review (issue 16): an Instance Spot whose
`on_initialize` fails is activated afresh by the next message; a cancelled close with
`location=` is withdrawn as in one process; a close of an id still being created is
`NotFoundError` from every node; a node's factory runs off its I/O loop."""

from __future__ import annotations

import threading

import msgspec
import pytest

import zlink_actors as z
from zlink_actors.testing import WAIT, HostHarness, wait_until

from ._mesh import mesh_config

_fail_once = threading.Event()
_hold = threading.Event()
_entered = threading.Event()
_release = threading.Event()
_factory_threads: list[str] = []


class Ping(msgspec.Struct):
    n: int


class Counter(z.InstanceSpot):
    type_name = "review.Counter"

    def on_initialize(self, ctx: z.SpotContext) -> None:
        if _fail_once.is_set():
            _fail_once.clear()
            raise RuntimeError("init failed once")

    @z.handler
    def ping(self, ctx: z.SpotContext, msg: Ping) -> Ping:
        return msg


class Busy(msgspec.Struct):
    pass


class Room(z.Spot):
    mode = z.SpotMode.SPOT_WIDE
    type_name = "review.Room"

    def __init__(self) -> None:
        _factory_threads.append(threading.current_thread().name)

    def on_create(self, ctx: z.SpotContext, request: object) -> None:
        if request == "hold":
            _entered.set()
            assert _release.wait(WAIT)

    @z.handler
    def busy(self, ctx: z.SpotContext, msg: Busy) -> None:
        _hold.set()
        assert _release.wait(WAIT)


def _store_host(harness: HostHarness, store: z.MemoryLocationStore, **options: object) -> z.Host:
    return harness.host(spots=[Counter, Room], mesh=mesh_config(), location=store, **options)


def test_an_instance_spot_whose_initialize_failed_is_activated_afresh(
    harness: HostHarness,
) -> None:
    host = _store_host(harness, z.MemoryLocationStore())
    _fail_once.set()
    with pytest.raises(z.InternalFailureError):
        host.request_to_spot("c1", Ping(0), reply=Ping).activate(Counter).submit_sync()
    # Its record went with it: the next message activates a fresh one (not "closing").
    for n in (1, 2):
        call = host.request_to_spot("c1", Ping(n), reply=Ping).activate(Counter)
        assert call.submit_sync() == Ping(n)


def test_a_cancelled_close_is_withdrawn_with_location(harness: HostHarness) -> None:
    _hold.clear()
    _release.clear()
    host = _store_host(harness, z.MemoryLocationStore())
    host.spots.get_or_create("r1", Room).submit_sync()
    host.send_to_spot("r1", Busy()).submit_sync()  # holds the gate: on_closing waits
    assert _hold.wait(WAIT)
    source = z.CancellationSource()
    closing = host.spots.close("r1").submit(source.token)
    source.cancel()
    with pytest.raises(z.CancelledError):
        closing.result(WAIT)
    _release.set()
    # Still there, and still its own: a get-or-create finds it.
    assert isinstance(host.spots.get_or_create("r1", Room).submit_sync(), z.Existing)


def test_a_close_of_an_id_being_created_is_not_found_from_every_node(
    harness: HostHarness,
) -> None:
    _entered.clear()
    _release.clear()
    store = z.MemoryLocationStore()
    server = _store_host(harness, store)
    client = harness.host(mesh=mesh_config(peers=(server.node.endpoint,)), location=store)
    client.wait_for_peers(1, timeout=WAIT)
    making = client.spots.get_or_create("r", Room).request("hold").submit()
    assert _entered.wait(WAIT)
    try:
        for host in (server, client):
            with pytest.raises(z.NotFoundError, match="being created"):
                host.spots.close("r").submit_sync()
    finally:
        _release.set()
    made = making.result(WAIT)
    assert isinstance(made, z.Created)
    assert made.ref.routing_id == server.node.routing_id
    # The factory ran on a worker thread, not on the node's I/O loop.
    assert wait_until(lambda: bool(_factory_threads))
    assert not any(name.endswith("-io") for name in _factory_threads)


class News(z.Spot):
    mode = z.SpotMode.SPOT_WIDE
    type_name = "review.News"

    def configure(self, cfg: z.SpotConfig) -> None:
        cfg.subscribe("news", "all")

    @z.handler
    def ping(self, ctx: z.SpotContext, msg: Ping) -> None:
        pass


def test_intent_messages_and_publishes_give_back_their_credit_and_permits(
    harness: HostHarness,
) -> None:
    store = z.MemoryLocationStore()
    server = harness.host(spots=[Counter, News], mesh=mesh_config(), location=store)
    client = harness.host(mesh=mesh_config(peers=(server.node.endpoint,)), location=store)
    client.wait_for_peers(1, timeout=WAIT)
    server.spots.get_or_create("news", News).submit_sync()
    for n in range(20):
        client.send_to_spot(f"c-{n % 4}", Ping(n)).activate(Counter).submit_sync()
        client.publish("news", "all", Ping(n)).submit_sync()
    mesh = server.statistics().mesh
    assert mesh is not None
    assert wait_until(lambda: server.statistics().mesh.permits_in_use == 0)  # type: ignore[union-attr]
    assert wait_until(lambda: client.statistics().mesh.credit_in_use == 0)  # type: ignore[union-attr]
    # Each Instance Spot was activated on the server and answers there.
    for k in range(4):
        assert server.request_to_spot(f"c-{k}", Ping(k), reply=Ping).submit_sync() == Ping(k)
