"""A receiver knows which of a peer's requests reached it by their numbers
(`Envelope.seq`, docs/mesh.md "Requests across a pause"): a request sent again after a
pause runs only if its first copy never came, also when two callers' requests crossed
on the way, and never twice when the numbers it remembers as missing overflow."""

from __future__ import annotations

from zlink_actors.mesh.inbound import _MISSING_MAX, Inbound
from zlink_actors.mesh.peers import Peer


def _peer() -> Peer:
    return Peer("node-a", "tcp://127.0.0.1:1", 1, b"node-a@1")


def test_each_number_is_new_once_in_order_or_crossed() -> None:
    peer = _peer()
    assert [Inbound._first_time(peer, n) for n in (1, 2, 3)] == [True] * 3
    assert [Inbound._first_time(peer, n) for n in (1, 2, 3)] == [False] * 3
    # 5 overtook 4 (two callers): 4 is missing until it comes, then known.
    assert Inbound._first_time(peer, 5)
    assert list(peer.req_missing) == [4]
    assert Inbound._first_time(peer, 4)
    assert not Inbound._first_time(peer, 4)
    assert not Inbound._first_time(peer, 5)
    assert peer.req_in == 5
    assert not peer.req_missing


def test_numbers_that_never_come_are_forgotten_oldest_first_and_never_run_twice() -> None:
    peer = _peer()
    # Every other number never comes (ended before it was sent).
    for n in range(2, 2 * _MISSING_MAX + 100, 2):
        assert Inbound._first_time(peer, n)
    assert len(peer.req_missing) == _MISSING_MAX
    oldest = next(iter(peer.req_missing))
    assert oldest > 1
    # Forgotten ones count as received: a late copy is not run (at worst answered as
    # one that may have run); remembered ones are still new.
    assert not Inbound._first_time(peer, 1)
    assert not Inbound._first_time(peer, oldest - 2)
    assert Inbound._first_time(peer, oldest)
    # A jump past the bound keeps only the last `_MISSING_MAX` below it.
    top = peer.req_in
    assert Inbound._first_time(peer, top + 3 * _MISSING_MAX)
    assert len(peer.req_missing) == _MISSING_MAX - 1
    assert not Inbound._first_time(peer, top + 1)
    assert Inbound._first_time(peer, top + 3 * _MISSING_MAX - 1)
