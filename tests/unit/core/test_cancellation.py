"""`_core/cancellation.py`: a cancel that lands inside a token's own critical section.

A signal handler runs on the main thread between two bytecodes, and a finalizer runs
wherever a collection starts (on any allocation): either can land inside a token's
critical section and cancel the call it guards. Such a landing is simulated
deterministically, by a constructor that runs inside the section. Every wait is bounded,
so a self-deadlock fails instead of hanging.
"""

from __future__ import annotations

import threading

import pytest

from zlink_actors import CancellationSource, CancelledError, Host, Spot, SpotContext, handler
from zlink_actors._core import cancellation
from zlink_actors.testing import WAIT, finishes


def _cancel_inside_registration(
    monkeypatch: pytest.MonkeyPatch, source: CancellationSource
) -> None:
    real = cancellation.CancellationRegistration
    landed: list[bool] = []

    class Interrupted(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __init__(self, *args: object) -> None:
            if not landed:
                landed.append(True)
                source.cancel()  # the "signal handler"
            super().__init__(*args)

    monkeypatch.setattr(cancellation, "CancellationRegistration", Interrupted)


def test_a_cancel_that_lands_while_a_hook_registers_runs_that_hook_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = CancellationSource()
    ran: list[int] = []
    _cancel_inside_registration(monkeypatch, source)

    assert finishes(lambda: source.token._register_internal(lambda: ran.append(1)))

    assert source.cancelled
    assert ran == [1]


def test_a_request_registering_its_token_when_the_cancel_lands_ends_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    class Slow(Spot):
        @handler
        def hold(self, ctx: SpotContext, msg: int) -> int:
            release.wait(WAIT)
            return msg

    source = CancellationSource()
    with Host(spots=[Slow]) as host:
        host.spots.get_or_create("slow", Slow).submit_sync()
        _cancel_inside_registration(monkeypatch, source)
        calls: list[object] = []
        assert finishes(lambda: calls.append(host.request_to_spot("slow", 1).submit(source.token)))
        monkeypatch.undo()
        call = calls[0]
        with pytest.raises(CancelledError):
            call.result(WAIT)  # type: ignore[attr-defined]
        release.set()
