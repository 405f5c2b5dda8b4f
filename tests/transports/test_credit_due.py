"""`Core.credit_due`: when the I/O thread must next look at the credit it owes.

A released amount is due `CREDIT_DELAY` after it became owed, a large one at once; a
record that carries a peer's credit back takes it (`take_owed_locked`), and once nothing
is owed to anyone the loop has nothing to time. The loop compares this one float per
wake instead of scanning the owing peers (docs/transports.md, "Credit").
"""

from __future__ import annotations

import math
import os
import pathlib
import time

import transports as t
from transports._state import CREDIT_DELAY, Core, PeerState

from .helpers import FAST, Owner, pair, wait_until


def _core() -> Core:
    core = Core(b"A", t.TransportConfig(credit_window=1024 * 1024))
    for name in (b"P", b"Q"):
        core.peers[name] = PeerState(name, outbound=True, unreleased=1_000_000)
    return core


def test_nothing_owed_nothing_due_and_a_release_is_due_after_the_delay() -> None:
    core = _core()
    try:
        assert core.credit_due == math.inf
        core.release(b"P", 300)
        first = core.credit_due
        assert core.peers[b"P"].owed_since + CREDIT_DELAY == first
        core.release(b"Q", 300)  # later: the earlier due stands
        assert core.credit_due == first
        core.release(b"P", 300)  # already owing: its due does not move
        assert core.credit_due == first
    finally:
        os.close(core.waker)


def test_a_large_release_is_due_at_once() -> None:
    core = _core()
    try:
        core.release(b"P", core.wake_credit)
        assert core.credit_due == 0.0
    finally:
        os.close(core.waker)


def test_credit_carried_back_clears_the_due_only_when_nothing_is_owed_any_more() -> None:
    core = _core()
    try:
        core.release(b"P", 300)
        core.release(b"Q", 200)
        due = core.credit_due
        with core.lock:
            assert core.take_owed_locked(core.peers[b"P"]) == 300
        assert core.credit_due == due  # Q still owes: one look too many, never too few
        with core.lock:
            assert core.take_owed_locked(core.peers[b"Q"]) == 200
            assert core.take_owed_locked(core.peers[b"Q"]) == 0
        assert core.credit_due == math.inf
        assert core.credit_dirty == set()
    finally:
        os.close(core.waker)


def test_a_released_message_credit_goes_back_in_a_credit_frame_after_the_delay(
    tmp_path: pathlib.Path,
) -> None:
    """No reply carries a one-way message's credit: the timed CREDIT frame does (the
    heartbeat is slow here, so no PING or PONG can carry it meanwhile)."""
    b_owner = Owner(auto_release=False)
    slow = t.TransportConfig(heartbeat_interval=20.0, heartbeat_timeout=60.0)
    with pair("tcp", tmp_path, slow, slow, b_owner=b_owner) as (a, _, b, _):
        assert a.submit(b"B", [b"x" * 1000]).status is t.SubmitStatus.OK
        assert b_owner.wait(lambda: len(b_owner.records) == 1)
        assert a.peer_statistics(b"B").credit_in_use == 1000
        b.release(b"A", b_owner.records[0].charge)
        # Due 1 ms after the release; the loop looks at least every 64 ms meanwhile.
        assert wait_until(lambda: a.peer_statistics(b"B").credit_in_use == 0, 1.0)
        assert wait_until(lambda: b._core.credit_due == math.inf)  # nothing left to time


def test_credit_that_cannot_go_yet_is_looked_at_again_on_the_next_wake() -> None:
    """A peer whose completion connection is not up takes no CREDIT frame: its credit
    stays owed, and it is due at once again, never forgotten."""
    with t.Transport(b"B", lambda batch: None, config=FAST) as b:
        core = b._core
        with core.lock:
            state = PeerState(b"P", outbound=False, owed=500, owed_since=0.0)
            core.peers[b"P"] = state
            core.credit_dirty.add(b"P")  # `credit_due` untouched: the loop leaves it be
        b._io._flush_credit(time.monotonic())  # the loop's step, run here
        with core.lock:
            assert state.owed == 500
            assert core.credit_dirty == {b"P"}
            assert core.credit_due == 0.0
            del core.peers[b"P"]  # (not a real peer: gone before the loop looks)
            core.credit_dirty.clear()
