"""The turn seam (issue 14 item 6; design/http.md "Rules", last bullet): the client takes
an injectable completion scheduler (execute / resume), runs without a Host, and depends
on the framework's contracts only."""

from __future__ import annotations

import ast
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    HttpClient,
    HttpClientConfig,
    InvalidOperationError,
    ShuttingDownError,
)
from zlink_actors._core.completion import Cell
from zlink_actors.http import LoopScheduler
from zlink_actors.http.exchange import WriteWatch
from zlink_actors.testing import WAIT, wait_until

from ._server import LocalService

T = TypeVar("T")
HTTP = Path(__file__).resolve().parents[3] / "zlink_actors" / "http"


class RecordingScheduler:
    """A scheduler of the test's own: a `LoopScheduler` that records what the client asks."""

    def __init__(self) -> None:
        self.inner = LoopScheduler("test-http")
        self.executed = 0
        self.resumed: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def admission(self) -> BaseException | None:
        return self.inner.admission()

    def execute(self, make: Callable[[], Awaitable[None]]) -> bool:
        with self._lock:
            self.executed += 1
        return self.inner.execute(make)

    def call_soon(self, fn: Callable[[], object]) -> bool:
        return self.inner.call_soon(fn)

    def resume(self, cell: Cell[T], value: T | None, exc: BaseException | None) -> bool:
        won = self.inner.resume(cell, value, exc)
        if won:
            with self._lock:
                outcome = "value" if exc is None else type(exc).__name__
                self.resumed.append((threading.current_thread().name, outcome))
        return won


@pytest.fixture
def scheduler() -> Iterator[RecordingScheduler]:
    sched = RecordingScheduler()
    try:
        yield sched
    finally:
        assert sched.inner.close(WAIT)


def test_the_client_runs_without_a_host_on_an_injected_scheduler(
    scheduler: RecordingScheduler, service: LocalService
) -> None:
    client = HttpClient("svc", HttpClientConfig(service.url), scheduler)
    try:
        assert client.get("/echo").submit_sync().status == 200
        assert client.get("/status/404").submit().result(WAIT).status == 404
    finally:
        assert client.close(WAIT)
    assert scheduler.executed == 3  # two requests and the session's close
    # Each result was delivered once, by the scheduler, on its loop's thread.
    assert scheduler.resumed == [("test-http", "value"), ("test-http", "value")]


def test_without_a_host_yield_outside_a_turn_and_pre_cancelled_calls_send_nothing(
    scheduler: RecordingScheduler, service: LocalService
) -> None:
    client = HttpClient("svc", HttpClientConfig(service.url), scheduler)
    source = CancellationSource()
    source.cancel()
    try:
        with pytest.raises(InvalidOperationError):
            client.get("/echo").yield_()
        assert client.get("/echo").submit(source.token).cancelled()
        assert scheduler.executed == 0
        assert service.hits["/echo"] == 0
    finally:
        assert client.close(WAIT)


def test_closing_the_client_ends_requests_in_flight_once_and_refuses_new_ones(
    scheduler: RecordingScheduler, service: LocalService
) -> None:
    client = HttpClient("svc", HttpClientConfig(service.url), scheduler)
    held = client.get("/hold").submit()
    assert service.wait_held(1)
    assert client.close(WAIT)
    with pytest.raises(ShuttingDownError):
        held.result(WAIT)
    with pytest.raises(ShuttingDownError):
        client.get("/echo").submit_sync()
    assert scheduler.resumed == [(threading.current_thread().name, "ShuttingDownError")]
    assert client.close(WAIT)  # idempotent


def test_a_cancel_without_a_host_ends_the_wait_and_aborts_the_request(
    scheduler: RecordingScheduler, service: LocalService
) -> None:
    client = HttpClient("svc", HttpClientConfig(service.url), scheduler)
    try:
        held = client.get("/hold").submit()
        assert service.wait_held(1)
        assert held.cancel()
        with pytest.raises(CancelledError):
            held.result(WAIT)
        assert not held.cancel()
    finally:
        service.release()
        assert client.close(WAIT)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.add("." * node.level + (node.module or ""))
    return found


@pytest.mark.parametrize(
    "module", sorted(p.name for p in HTTP.glob("*.py") if p.name not in {"hosted.py"})
)
def test_the_client_depends_on_the_frameworks_contracts_not_its_scheduler(module: str) -> None:
    # Only `hosted.py` (the Host's scheduler and registry) may know the runtime kernel.
    # The rest of the tier reads the contracts: errors, Completion, cancellation,
    # validation, the runtime marker, and the turn rules (`driver`, `turn`).
    allowed = {
        "..",
        ".._core",
        ".._core.errors",
        ".._core.completion",
        ".._core.cancellation",
        ".._core.validation",
        ".._core.context",
        ".._engine.driver",
        ".._engine.turn",
    }
    outside = {m for m in _imports(HTTP / module) if m.startswith("..") and m not in allowed}
    assert outside == set()


def test_the_contract_check_would_see_a_kernel_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from .._engine.kernel import Runtime\nfrom .call import HttpCall\n")
    assert _imports(planted) == {".._engine.kernel", ".call"}


def test_a_write_watch_reports_written_where_it_is_set_and_counts_each_attempt_afresh() -> None:
    reported: list[bool] = []
    watch = WriteWatch(10, lambda: reported.append(watch.written))
    # An attempt that wrote its headers and part of its body, then failed.
    watch.begin()
    watch.headers_sent = True
    watch.sent += 6
    watch._check()
    assert reported == []
    # The next attempt starts from nothing: 6 more bytes are not the whole body.
    watch.begin()
    watch.sent += 6
    watch._check()
    assert (reported, watch.written) == ([], False)
    watch.headers_sent = True
    watch._check()
    assert (reported, watch.written) == ([], False)
    watch.sent += 4
    watch._check()
    # Reported at once (not on a later pass of a loop, when a failure could come first).
    assert (reported, watch.written) == ([True], True)
    watch._check()
    assert reported == [True]


class _Exit(msgspec.Struct):
    city: str

    def __post_init__(self) -> None:
        raise SystemExit(3)


class CatchingScheduler(RecordingScheduler):
    """Records what escapes a request's task (instead of it stopping the loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.escaped: list[BaseException] = []
        self.escaped_event = threading.Event()

    def execute(self, make: Callable[[], Awaitable[None]]) -> bool:
        async def guarded() -> None:
            try:
                await make()
            except BaseException as exc:
                self.escaped.append(exc)
                self.escaped_event.set()

        return super().execute(guarded)


def test_system_exit_in_a_request_propagates_and_is_not_an_internal_failure(
    service: LocalService,
) -> None:
    sched = CatchingScheduler()
    client = HttpClient("svc", HttpClientConfig(service.url), sched)
    try:
        completion = client.get("/forecast", reply=_Exit).submit()
        with pytest.raises(ShuttingDownError):
            completion.result(WAIT)
        assert sched.escaped_event.wait(WAIT)
        assert [type(e) for e in sched.escaped] == [SystemExit]
    finally:
        assert client.close(WAIT)
        assert sched.inner.close(WAIT)


class FailingOnceScheduler(RecordingScheduler):
    """Its first `execute` raises (a scheduler's own failure)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def execute(self, make: Callable[[], Awaitable[None]]) -> bool:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the scheduler failed")
        return super().execute(make)


def test_a_failure_while_starting_a_request_ends_it_and_is_raised(
    service: LocalService,
) -> None:
    sched = FailingOnceScheduler()
    client = HttpClient("svc", HttpClientConfig(service.url), sched)
    source = CancellationSource()
    try:
        with pytest.raises(RuntimeError, match="the scheduler failed"):
            client.get("/echo").submit(source.token)
        assert not client._inflight  # not kept as in flight for ever
        source.cancel()  # its registration was removed: nothing to cancel
        assert client.get("/echo").submit_sync().status == 200
    finally:
        assert client.close(WAIT)
        assert sched.inner.close(WAIT)
    assert service.hits["/echo"] == 1


def test_a_request_whose_loop_stops_before_it_started_ends_with_shutting_down(
    service: LocalService,
) -> None:
    sched = LoopScheduler("test-http")
    client = HttpClient("svc", HttpClientConfig(service.url), sched)
    gate = threading.Event()
    # Hold the loop, so the request's start and the loop's stop queue up behind it,
    # in that order: the request's task is made, then the loop stops before it runs.
    assert sched.call_soon(lambda: gate.wait(WAIT))
    completion = client.get("/echo").submit()
    closer = threading.Thread(target=sched.close, args=(WAIT,))
    closer.start()
    try:
        assert wait_until(lambda: sched._closed)
        with sched._lock:  # close() queued the stop under this lock
            pass
    finally:
        gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    with pytest.raises(ShuttingDownError):
        completion.result(WAIT)
    assert service.hits["/echo"] == 0  # it never started
    client.close(WAIT)  # the loop is gone: nothing left to close there
