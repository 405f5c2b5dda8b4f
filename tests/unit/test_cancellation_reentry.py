"""Cancelling from code that lands inside a token's own critical section.

A signal handler runs on the main thread between two bytecodes, possibly while that
thread registers a call on the very token the handler cancels. The handler is simulated
deterministically: the registration's constructor, which runs inside the section, calls
`cancel()` once. Every wait is bounded, so a self-deadlock fails instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from _polling import WAIT

from zlink_actors import CancellationSource, CancelledError, Host, Spot, SpotContext, handler
from zlink_actors import _cancellation as cancellation


def _finishes(fn: Callable[[], object]) -> bool:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(WAIT)
    return not thread.is_alive()


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

    assert _finishes(lambda: source.token._register_internal(lambda: ran.append(1)))

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
        assert _finishes(lambda: calls.append(host.request_to_spot("slow", 1).submit(source.token)))
        monkeypatch.undo()
        call = calls[0]
        with pytest.raises(CancelledError):
            call.result(WAIT)  # type: ignore[attr-defined]
        release.set()
