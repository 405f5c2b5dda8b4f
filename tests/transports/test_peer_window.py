"""The owner's controls of credit and reading: `set_peer_window` (a sender sends a peer at
most the window that peer grants) and `read_budget` (a receiver reads at most what its
owner can admit)."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Sequence

import pytest

import transports as t

from .helpers import FAST, WAIT, Owner, pair, transport


def test_a_smaller_peer_window_parks_sooner_and_a_larger_one_admits(
    tmp_path: pathlib.Path,
) -> None:
    holder = Owner(auto_release=False)
    with pair("tcp", tmp_path, b_owner=holder) as (a, _, _b, _bo):
        a.set_peer_window(b"B", 1024)
        assert a.peer_statistics(b"B").credit_window == 1024
        results = [a.submit(b"B", [bytes(300)]) for _ in range(4)]
        # 300 B each (above the 256 B minimum charge): three fit in 1,024, the fourth parks.
        assert [r.status for r in results] == [t.SubmitStatus.OK] * 3 + [
            t.SubmitStatus.BACKPRESSURED
        ]
        parked = results[3].admitted
        assert parked is not None
        assert not parked.done()
        a.set_peer_window(b"B", 4096)  # more room: what is parked is admitted now
        assert parked.result(5) is None
        assert a.peer_statistics(b"B").credit_in_use == 1200


@pytest.mark.parametrize("nbytes", [0, 255, 2**40, True, 1.5])
def test_a_window_outside_min_charge_to_the_configured_window_is_refused(
    tmp_path: pathlib.Path, nbytes: object
) -> None:
    with pair("tcp", tmp_path) as (a, _, _b, _bo):
        with pytest.raises(t.TransportUsageError):
            a.set_peer_window(b"B", nbytes)  # type: ignore[arg-type]
        with pytest.raises(t.UnknownPeer):
            a.set_peer_window(b"nobody", 1024)


def test_the_read_budget_caps_what_one_wake_reads(tmp_path: pathlib.Path) -> None:
    """The owner's free permits bound the application records read; at 0 it pauses, and
    RUNNING lets the rest in."""
    got: list[t.Inbound] = []
    changed = threading.Condition()
    limit = [3]
    holder: list[t.Transport] = []

    def on_receive(batch: Sequence[t.Inbound]) -> None:
        with changed:
            got.extend(batch)
            changed.notify_all()
        if len(got) >= limit[0]:
            holder[0].set_flow(t.FlowState.PAUSED)

    b = t.Transport(b"B", on_receive, config=FAST, read_budget=lambda: limit[0] - len(got))
    holder.append(b)
    owner = Owner()
    try:
        with transport(b"A", owner) as a:
            a.connect(b"B", b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
            for i in range(10):
                a.submit(b"B", [b"%d" % i])
            with changed:
                assert changed.wait_for(lambda: len(got) >= 3, WAIT)
            # Paused at the budget: nothing more is read (the PAUSED frame also parks
            # A's later sends); a bounded look finds exactly 3.
            assert not owner.wait(lambda: len(got) > 3, 0.3)
            assert [r.frames[0] for r in got] == [b"0", b"1", b"2"]
            limit[0] = 100
            b.set_flow(t.FlowState.RUNNING)
            with changed:
                assert changed.wait_for(lambda: len(got) == 10, WAIT)
            assert [r.frames[0] for r in got] == [b"%d" % i for i in range(10)]
    finally:
        b.close()
