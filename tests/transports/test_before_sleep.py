"""`Transport(before_sleep=...)`: called on the I/O thread after the callbacks of each
wake, before it sleeps, and once more as the thread ends (the owner makes there the
wakes its callbacks kept: docs/transports.md, "The owner's controls")."""

from __future__ import annotations

import itertools
import logging
import pathlib
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import pytest

import transports as t

from .helpers import FAST, Owner, addresses, transport, wait_until


class Sleeper(Owner):
    """An owner that also logs, in order, each callback and each `before_sleep` call, and
    the thread each ran on."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.log: list[tuple[str, int, threading.Thread]] = []  # (what, records, thread)

    def on_receive(self, batch: Sequence[t.Inbound]) -> None:
        super().on_receive(batch)
        with self.changed:
            self.log.append(("receive", len(self.records), threading.current_thread()))

    def on_event(self, event: t.PeerEvent) -> None:
        super().on_event(event)
        with self.changed:
            self.log.append(("event", len(self.records), threading.current_thread()))

    def before_sleep(self) -> None:
        with self.changed:
            self.log.append(("sleep", len(self.records), threading.current_thread()))
            self.changed.notify_all()
        if self.fail:
            raise RuntimeError("planted")


#: No heartbeat wakes the I/O thread during a test that counts its sleeps.
SLOW = t.TransportConfig(heartbeat_interval=20.0, heartbeat_timeout=60.0)


def _receiver(owner: Sleeper, config: t.TransportConfig = FAST) -> t.Transport:
    tr = t.Transport(
        b"B",
        owner.on_receive,
        on_event=owner.on_event,
        config=config,
        before_sleep=owner.before_sleep,
    )
    owner.transport = tr
    return tr


def test_before_sleep_runs_on_the_io_thread_after_the_callbacks_of_each_wake(
    tmp_path: pathlib.Path,
) -> None:
    b_owner = Sleeper()
    b = _receiver(b_owner)
    try:
        with transport(b"A", Owner()) as a:
            a.connect(b"B", b.bind(*addresses("tcp", tmp_path, "b")))
            assert wait_until(lambda: a.peer_statistics(b"B").ready)
            for n in range(1, 6):
                assert a.submit(b"B", [b"m%d" % n]).status is t.SubmitStatus.OK
                # The next message goes as soon as this one's callback ran.
                assert b_owner.wait(lambda n=n: len(b_owner.records) == n)
            assert b_owner.wait(lambda: b_owner.log[-1][:2] == ("sleep", 5))
            with b_owner.changed:
                log = list(b_owner.log)
    finally:
        b.close()
    io_threads = {thread for _, _, thread in log}
    assert len(io_threads) == 1
    (io,) = io_threads
    assert io is not threading.current_thread()
    assert io.name.startswith("transports-io-")
    assert log[0][0] == "sleep"  # before the first sleep too: the owner can set up there
    received = [i for i, e in enumerate(log) if e[0] == "receive"]
    assert [log[i][1] for i in received] == [1, 2, 3, 4, 5]  # one message a wake
    for n, (here, there) in enumerate(itertools.pairwise([*received, len(log)]), 1):
        # Between the wake that handed the owner its n-th record and the next one, the
        # thread went to sleep once at least, after that callback.
        assert ("sleep", n) in [e[:2] for e in log[here + 1 : there]]


def _ends_with_a_sleep_after(log: list[tuple[str, int, threading.Thread]], what: str) -> bool:
    """Whether a `before_sleep` call came after the last `what` callback."""
    last = max(i for i, entry in enumerate(log) if entry[0] == what)
    return any(entry[0] == "sleep" for entry in log[last + 1 :])


def test_before_sleep_runs_once_more_after_the_last_callback_as_the_thread_ends(
    tmp_path: pathlib.Path,
) -> None:
    """A peer's loss and the close reach the I/O thread in one wake (both queued before
    it woke): its LOST event is handed over as the thread ends, after its last sleep,
    and a `before_sleep` call still follows it."""
    b_owner = Sleeper()
    b = _receiver(b_owner)
    try:
        with transport(b"A", Owner()) as a:
            a.connect(b"B", b.bind(*addresses("tcp", tmp_path, "b")))
            assert wait_until(lambda: a.peer_statistics(b"B").ready)
            assert b_owner.wait(lambda: t.PeerEventKind.READY in b_owner.event_kinds(b"A"))
            core = b._core
            lost: Future[None] = Future()
            with core.lock:  # what `disconnect` and `close` queue, as one wake's commands
                core.post(("call", lambda io: io.lose(b"A", "planted"), lost))
                parked = core.close_locked()
                core.post(("stop",))
            assert parked == []
            b._io.join(10)
            assert not b._io.is_alive()
    finally:
        b.close()  # (idempotent: already closed, unless an assertion failed first)
    with b_owner.changed:
        log = list(b_owner.log)
    assert b_owner.event_kinds(b"A")[-1] is t.PeerEventKind.LOST
    assert _ends_with_a_sleep_after(log, "event")


def test_a_failed_io_thread_calls_before_sleep_after_its_last_callback(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the loop right after a callback (planted): the thread ends through its
    failure path, and still calls `before_sleep` after that callback."""
    b_owner = Sleeper()
    b = _receiver(b_owner)
    read = b._io._read
    received = threading.Event()

    def failing_read(sock: object, completion: bool, readable: bool) -> None:
        read(sock, completion, readable)  # type: ignore[arg-type]
        if b_owner.records:
            received.set()
            raise RuntimeError("planted: the loop fails after a callback")

    b._io._read = failing_read  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.ERROR, logger="transports"), transport(b"A", Owner()) as a:
            a.connect(b"B", b.bind(*addresses("tcp", tmp_path, "b")))
            assert wait_until(lambda: a.peer_statistics(b"B").ready)
            assert a.submit(b"B", [b"m"]).status is t.SubmitStatus.OK
            assert received.wait(10)
            b._io.join(10)
            assert not b._io.is_alive()
    finally:
        b.close()
    assert "I/O thread of b'B' failed" in caplog.text
    with b_owner.changed:
        log = list(b_owner.log)
    assert _ends_with_a_sleep_after(log, "receive")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_before_sleep_still_runs_when_the_teardown_of_the_thread_fails(
    tmp_path: pathlib.Path,
) -> None:
    b_owner = Sleeper()
    b = _receiver(b_owner, SLOW)
    term = b._io.context.term

    def failing_term() -> None:
        raise RuntimeError("planted: the teardown fails")

    b._io.context.term = failing_term  # type: ignore[method-assign]
    try:
        with transport(b"A", Owner(), SLOW) as a:
            a.connect(b"B", b.bind(*addresses("tcp", tmp_path, "b")))
            assert wait_until(lambda: a.peer_statistics(b"B").ready)
            assert a.submit(b"B", [b"m"]).status is t.SubmitStatus.OK
            assert b_owner.wait(lambda: len(b_owner.records) == 1)
            # asleep after that message (no heartbeat wakes it: `SLOW`)
            assert b_owner.wait(lambda: b_owner.log[-1][:2] == ("sleep", 1))
            with b_owner.changed:
                sleeps = sum(1 for entry in b_owner.log if entry[0] == "sleep")
            b.close()
            assert not b._io.is_alive()
    finally:
        b.close()  # (idempotent: already closed, unless an assertion failed first)
        term()  # the real one: nothing of the context is left behind
    with b_owner.changed:
        log = list(b_owner.log)
    assert sum(1 for entry in log if entry[0] == "sleep") == sleeps + 1  # the last one


def test_a_before_sleep_that_raises_is_logged_and_the_transport_keeps_serving(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    b_owner = Sleeper(fail=True)
    b = _receiver(b_owner)
    try:
        with caplog.at_level(logging.ERROR, logger="transports"), transport(b"A", Owner()) as a:
            a.connect(b"B", b.bind(*addresses("tcp", tmp_path, "b")))
            assert wait_until(lambda: a.peer_statistics(b"B").ready)
            for n in range(1, 4):
                assert a.submit_request(b"B", n, [b"q"]).status is t.SubmitStatus.OK
            assert b_owner.wait(lambda: len(b_owner.records) == 3)
            assert wait_until(lambda: a.peer_statistics(b"B").slots_in_use == 0)  # answered
    finally:
        b.close()
    assert "before_sleep callback of b'B' failed" in caplog.text
    assert "planted" in caplog.text
