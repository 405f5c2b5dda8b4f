"""`set_peer_window`: a sender sends a peer at most the window that peer grants."""

from __future__ import annotations

import pathlib

import pytest

import transports as t

from .helpers import Owner, pair


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
