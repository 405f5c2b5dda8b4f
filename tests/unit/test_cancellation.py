"""Code that runs on a thread while that thread is inside a framework critical section.

A signal handler runs on the main thread between two bytecodes, and a finalizer runs
wherever a collection starts (on any allocation): either can land inside a token's or a
result's critical section and cancel or settle a call. Such a landing is simulated
deterministically, by a constructor or method that runs inside the section. Every wait is
bounded, so a self-deadlock fails instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from zlink_actors import CancellationSource, CancelledError, Host, Spot, SpotContext, handler
from zlink_actors import _cancellation as cancellation
from zlink_actors._completion import Completion
from zlink_actors._operation import PendingTable, Request
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


# -- results ------------------------------------------------------------------------


def _request(table: PendingTable) -> Request:
    return Request(None, None, None, None, None, table, None)


def test_code_run_inside_a_results_critical_section_can_settle_another_request() -> None:
    # A finalizer run by the collector while a result is being published, or a signal
    # handler, runs on the thread that holds the lock the results share.
    table = PendingTable()
    held = _request(table)
    other = _request(table)

    def nested() -> None:
        with held._lock:
            assert other.cancel() is True

    assert finishes(nested)
    assert other.done()
    assert not held.done()


def _settle_while_registering(
    monkeypatch: pytest.MonkeyPatch, settle: Callable[[], object]
) -> None:
    """Run `settle` once inside the next handle registration's critical section, before
    the handle is listed: what a signal handler that cancels the call can do."""
    listen = Completion._listen
    landed: list[bool] = []

    def interrupted(self: Completion[Any]) -> None:
        if not landed:
            landed.append(True)
            settle()
        listen(self)

    monkeypatch.setattr(Completion, "_listen", interrupted)


def test_a_result_published_while_the_caller_starts_waiting_wakes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = PendingTable()
    req = _request(table)
    handle = Completion(req, req)
    _settle_while_registering(monkeypatch, req.cancel)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            handle.result()  # no timeout: a missed wake-up would block it for good
        except BaseException as exc:
            outcome.append(exc)

    assert finishes(wait)
    assert len(outcome) == 1
    assert isinstance(outcome[0], CancelledError)


def test_a_result_published_while_a_callback_registers_still_calls_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = PendingTable()
    req = _request(table)
    handle = Completion(req, req)
    _settle_while_registering(monkeypatch, lambda: req.reply("pong", None))
    called = threading.Event()

    handle.add_done_callback(lambda done: called.set())

    assert called.wait(WAIT)
    assert handle.result() == "pong"
