"""`Transport(before_sleep=...)`: called on the I/O thread after the callbacks of each
wake, before it sleeps, and once more as the thread ends (the owner makes there the
wakes its callbacks kept: docs/transports.md, "The owner's controls")."""

from __future__ import annotations

import itertools
import logging
import pathlib
import threading
from collections.abc import Sequence

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


def _receiver(owner: Sleeper) -> t.Transport:
    tr = t.Transport(
        b"B",
        owner.on_receive,
        on_event=owner.on_event,
        config=FAST,
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


def test_before_sleep_runs_once_more_after_the_last_callback_as_the_thread_ends(
    tmp_path: pathlib.Path,
) -> None:
    b_owner = Sleeper()
    b = _receiver(b_owner)
    with transport(b"A", Owner()) as a:
        a.connect(b"B", b.bind(*addresses("tcp", tmp_path, "b")))
        assert wait_until(lambda: a.peer_statistics(b"B").ready)
        assert a.submit(b"B", [b"m"]).status is t.SubmitStatus.OK
        assert b_owner.wait(lambda: len(b_owner.records) == 1)
        b.close()  # joins the I/O thread
    with b_owner.changed:
        log = list(b_owner.log)
    assert log[-1][0] == "sleep"
    assert not log[-1][2].is_alive()


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
