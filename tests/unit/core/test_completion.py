"""`_core/completion.py`: a result published from inside the registering thread's own critical
section.

A signal handler runs on the main thread between two bytecodes, and a finalizer runs
wherever a collection starts (on any allocation): either can land inside a result's
critical section, while a caller starts to wait or a callback registers, and settle the
call. Such a landing is simulated deterministically, by a method that runs inside the
section. Every wait is bounded, so a missed wake-up fails instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from _support import register

from zlink_actors import CancelledError
from zlink_actors._core.completion import Completion
from zlink_actors._core.pending import PendingTable, Request
from zlink_actors.testing import WAIT, finishes


def _request(table: PendingTable) -> Request:
    req = Request(None, None, None, None, None, table)  # type: ignore[arg-type]
    register(table, req)
    return req


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
