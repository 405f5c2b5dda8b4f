"""A bug in the I/O thread closes the transport: what is parked fails with `Closed` (the
transport can do nothing more), and later calls, setup calls included, raise `Closed` at
once. The bug is planted by making one of the thread's
own steps raise (the transport's code, not a library's)."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest

import transports as t
from transports._io import IoThread
from transports._state import Command

from .helpers import WAIT, Owner, pair, wait_until


def test_a_failed_io_thread_fails_what_is_parked_with_closed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = Owner(auto_release=False)
    with pair("tcp", tmp_path, b_owner=holder) as (a, _, _b, _bo):
        a.set_peer_window(b"B", 1024)
        for _ in range(4):
            a.submit(b"B", [bytes(256)])  # the window is full now
        parked = a.submit(b"B", [bytes(256)])
        assert parked.admitted is not None

        armed = threading.Event()
        original = IoThread._run_command

        def failing(self: IoThread, command: Command) -> bool:
            if armed.is_set() and self.core.name == b"A":
                raise RuntimeError("a planted bug")
            return original(self, command)

        monkeypatch.setattr(IoThread, "_run_command", failing)
        armed.set()
        a.set_flow(t.FlowState.PAUSED)  # a command the loop runs: the bug runs
        with pytest.raises(t.Closed):
            parked.admitted.result(WAIT)
        assert wait_until(lambda: not a._io.is_alive())
        with pytest.raises(t.Closed):
            a.submit(b"B", [b"after"])
        started = time.monotonic()
        with pytest.raises(t.Closed):
            a.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        assert time.monotonic() - started < 1.0  # at once, not after its 10 s timeout
