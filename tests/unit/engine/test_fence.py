"""`Runtime.fence_until`: the one writer of the owner lease's admission deadline
(`Runtime.fenced`); a fenced Host's Spots and Actors admit no new message."""

from __future__ import annotations

import math
import time

import msgspec
import pytest

from zlink_actors import Spot, SpotContext, UnavailableError, UnavailableReason, handler
from zlink_actors.testing import HostHarness


class Ping(msgspec.Struct, frozen=True):
    n: int


class Echo(Spot):
    @handler
    def ping(self, ctx: SpotContext, msg: Ping) -> int:
        return msg.n


def test_the_deadline_decides_fenced_and_a_fenced_host_refuses_saying_why(
    harness: HostHarness,
) -> None:
    host = harness.host(spots=[Echo])
    host.spots.get_or_create("e", Echo).submit_sync()
    runtime = host._runtime
    assert runtime.fenced is False  # no lease: never fenced
    assert host.request_to_spot("e", Ping(1), reply=int).submit_sync() == 1

    runtime.fence_until(-math.inf)
    assert runtime.fenced is True
    with pytest.raises(UnavailableError) as refused:
        host.request_to_spot("e", Ping(2), reply=int).submit_sync()
    assert refused.value.reason is UnavailableReason.FENCED

    runtime.fence_until(time.monotonic() + 60.0)  # a lease that admits for a minute
    assert runtime.fenced is False
    assert host.request_to_spot("e", Ping(3), reply=int).submit_sync() == 3

    runtime.fence_until(time.monotonic() - 0.001)  # that deadline passed
    assert runtime.fenced is True
    runtime.fence_until(None)
    assert runtime.fenced is False
