"""`UnavailableError.reason` at the mesh's real sites (issue 26 item 7; docs/errors.md
"Why a call is unavailable", docs/mesh.md's failure tables).

Real Hosts sharing one `MemoryLocationStore` (`_global.GlobalMesh`) on tcp loopback: an
owner cut off from the store (fenced, here and at its callers: the reason crosses the
wire), a dead owner whose lease expires (peer lost, then lease lapsed), a stale route
(not owner). The other reasons are asserted where their tests already reach them (see
docs/errors.md). Every wait is bounded and asserted.
"""

from __future__ import annotations

import pytest

from zlink_actors import (
    Host,
    LeaseConfig,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.testing import WAIT, wait_until

from ._global import GlobalMesh, mesh_stats
from ._global_objects import Note, Ping, Room, Where, journal, where

#: Admission stops 1 s after the last renewal, the lease lives 6 s in the store: a node cut
#: off from the store is fenced for about 5 s while the others still see its lease.
FENCING = LeaseConfig(renew_interval=0.2, ttl=6.0, renew_timeout=0.3, fencing_margin=5.0)
#: The lease of a Host that is killed: it expires in the store within about 3 s.
DYING = LeaseConfig(renew_interval=0.2, ttl=3.0, renew_timeout=0.3, fencing_margin=1.0)


def _reason(call: object) -> UnavailableReason | None:
    """The reason `call()` raised `UnavailableError` with; None if it did not raise."""
    try:
        call()  # type: ignore[operator]
    except UnavailableError as exc:
        return exc.reason
    return None


def test_a_fenced_owner_says_fenced_here_and_to_its_callers_and_counts_it(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": FENCING}, cuttable=True)
    client = mesh.add()
    owner.spots.get_or_create("r", Room).submit_sync()
    assert where(client, "r") == owner.node.routing_id
    mesh.cut(owner)
    assert wait_until(lambda: mesh_stats(owner).lease_admitting is False)

    # On the owner itself.
    here = lambda: owner.request_to_spot("r", Ping(1), reply=int).submit_sync()  # noqa: E731
    assert _reason(here) is UnavailableReason.FENCED
    assert _reason(lambda: owner.send_to_spot("r", Note(1)).submit_sync()) is (
        UnavailableReason.FENCED
    )
    # From the client, whose store still lists the owner's lease: the owner refuses, and
    # its reason crosses the wire.
    there = lambda: client.request_to_spot("r", Ping(2), reply=int).submit_sync()  # noqa: E731
    assert _reason(there) is UnavailableReason.FENCED
    # It counts what it answered a peer so (its own callers' refusals are not answers).
    assert mesh_stats(owner).unavailable == {"fenced": 1}
    assert journal().items("ping") == []


def test_a_dead_owner_is_peer_lost_until_its_lease_expires_then_lease_lapsed(
    mesh: GlobalMesh,
) -> None:
    owner = mesh.add(spots=[Room], mesh={"lease": DYING}, cuttable=True)
    client = mesh.add()
    owner.spots.get_or_create("r", Room).submit_sync()
    assert where(client, "r") == owner.node.routing_id
    mesh.kill(owner)

    seen: list[UnavailableReason | None] = []

    def lapsed() -> bool:
        seen.append(_reason(lambda: client.request_to_spot("r", Where(), reply=str).submit_sync()))
        return seen[-1] is UnavailableReason.LEASE_LAPSED

    assert wait_until(lapsed, WAIT + DYING.ttl), seen
    # Before its lease expired, every call found the owner lost; never anything else.
    assert set(seen[:-1]) <= {UnavailableReason.PEER_LOST}, seen
    assert seen[0] is UnavailableReason.PEER_LOST
    # get_or_create: the record is Ready at an owner this node saw lost.
    made = _reason(lambda: client.spots.get_or_create("r", Room).submit_sync())
    assert made is UnavailableReason.PEER_LOST


def _stale_route(mesh: GlobalMesh) -> tuple[Host, Host]:
    server = mesh.add(spots=[Room])
    client = mesh.add()
    server.spots.get_or_create("r", Room).submit_sync()
    assert where(client, "r") == server.node.routing_id  # the route is cached now
    assert server.spots.close("r").submit_sync() is True
    return server, client


@pytest.mark.parametrize("call", ["request", "send"])
def test_a_stale_route_reaches_a_node_that_is_not_the_owner(mesh: GlobalMesh, call: str) -> None:
    server, client = _stale_route(mesh)
    if call == "request":
        stale = lambda: client.request_to_spot("r", Ping(), reply=int).submit_sync()  # noqa: E731
        assert _reason(stale) is UnavailableReason.NOT_OWNER
        assert mesh_stats(server).unavailable == {"not_owner": 1}
    else:
        # A one-way completes at admission here; the server sends it on to the owner
        # the store names: none (it was closed), so it is lost, counted at both ends.
        assert client.send_to_spot("r", Note(1)).submit_sync() is None
        assert wait_until(lambda: mesh_stats(client).dropped_after_admission == 1)
        assert mesh_stats(server).dropped_messages == 1
        assert mesh_stats(server).forwarded_messages == 1
        assert mesh_stats(server).unavailable == {}  # it answered nothing
    assert journal().items("ping") == []


def test_a_one_way_on_a_stale_route_goes_on_to_the_object_s_new_owner(mesh: GlobalMesh) -> None:
    """The object was closed on its first node and made again on another: a one-way
    sent on the route cached before reaches the first node, which is not its owner, and
    goes on to the new owner (before: dropped there, its sender saw it complete)."""
    server, client = _stale_route(mesh)
    other = mesh.add(spots=[Room])
    made = other.spots.get_or_create("r", Room).submit_sync()
    assert made.ref.routing_id == other.node.routing_id
    for n in range(3):
        assert client.send_to_spot("r", Note(n)).submit_sync() is None
    assert wait_until(lambda: len(journal().items("note")) == 3)
    assert journal().items("note") == [("r", n, other.node.routing_id) for n in range(3)]
    assert mesh_stats(server).forwarded_messages >= 1
    assert mesh_stats(server).dropped_messages == 0
    assert mesh_stats(client).dropped_after_admission == 0
