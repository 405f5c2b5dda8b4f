"""Wakes the transport's I/O thread keeps until it sleeps (docs/decisions.md, "A wake
from the I/O thread waits for its sleep"): the node wires them, and a caller blocked in
`submit_sync()` that holds a lock the I/O thread then needs still gets its reply.

Both scenarios plant a step on the caller's I/O thread right after it settled the
caller's reply (the reply's wake is kept by then): what a later record of the same wake
may do. Every wait is bounded, so a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import msgspec
import pytest

import zlink_actors as z
from zlink_actors._core import handoff
from zlink_actors.testing import WAIT, HostHarness

from ._mesh import MESH, mesh_hosts

#: How long the planted step waits for the caller's lock before it gives up.
HOLD = 8.0


class Ping(msgspec.Struct):
    n: int


class Echo(z.NodeHandler):
    @z.handler
    def ping(self, ctx: z.NodeContext, msg: Ping) -> int:
        return msg.n


def _hosts(harness: HostHarness) -> tuple[z.Host, z.Host]:
    server, client = mesh_hosts(harness, 2, each=[{"node_handler": Echo}, {}])
    return server, client


def _after_each_reply(monkeypatch: pytest.MonkeyPatch, host: z.Host, step: Any) -> None:
    """Run `step()` on `host`'s I/O thread right after it handled each reply."""
    outbound = host._node().outbound
    receive = outbound.receive_reply

    def receive_then_step(rec: Any, env: Any) -> None:
        receive(rec, env)
        if threading.current_thread().name.startswith("transports-io"):
            step()

    monkeypatch.setattr(outbound, "receive_reply", receive_then_step)


def test_the_nodes_io_thread_keeps_its_wakes_until_it_sleeps(harness: HostHarness) -> None:
    _, client = _hosts(harness)
    io = client._node().shared.transport._io  # type: ignore[union-attr]
    assert io.before_sleep is handoff.sleeping


def test_a_caller_blocked_in_a_log_handler_gets_its_reply_when_the_io_thread_logs_there(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller holds a handler's lock while it waits (it ships records with a remote
    call); the I/O thread logs to that handler after settling the caller's reply, in the
    same wake. The kept wake is made before the record reaches the handler."""
    server, client = _hosts(harness)
    rid = server.node.routing_id
    waited: list[float] = []
    io_logged = threading.Event()  # the I/O thread's record went through the handler

    class Shipper(logging.Handler):
        def handle(self, record: logging.LogRecord) -> bool:
            # `Handler.handle` with a bounded lock wait, so that a deadlock ends.
            on_io = threading.current_thread().name.startswith("transports-io")
            start = time.monotonic()
            if not self.lock.acquire(timeout=HOLD):
                waited.append(HOLD)
                io_logged.set()
                return False
            try:
                if on_io:
                    waited.append(time.monotonic() - start)
                self.emit(record)
            finally:
                self.lock.release()
                if on_io:
                    io_logged.set()
            return True

        result: object = None

        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "test.app":
                call = client.request_to_node(MESH, rid, Ping(7), reply=int)
                self.result = call.timeout(WAIT).submit_sync()

    shipper = Shipper(logging.WARNING)
    mesh_log = logging.getLogger("zlink_actors.mesh")
    app_log = logging.getLogger("test.app")
    _after_each_reply(monkeypatch, client, lambda: mesh_log.warning("another record"))
    mesh_log.addHandler(shipper)
    app_log.addHandler(shipper)
    try:
        caller = threading.Thread(target=lambda: app_log.warning("ship me"))
        caller.start()
        caller.join(WAIT + HOLD)
        assert not caller.is_alive()
        # The caller may return before the I/O thread, which waited for the caller's
        # lock, has run the handler: wait for that before the handlers are removed.
        assert io_logged.wait(WAIT + HOLD)
    finally:
        mesh_log.removeHandler(shipper)
        app_log.removeHandler(shipper)
    assert shipper.result == 7
    assert len(waited) == 1
    assert waited[0] < HOLD / 2  # the I/O thread waited for the caller, not for its give-up


def test_a_caller_past_its_deadline_reads_the_reply_already_stored_for_it(
    harness: HostHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After settling the caller's reply the I/O thread waits for a lock the caller holds
    (user code it runs, say a payload type's `__post_init__`): the node's I/O stalls
    until the caller's deadline, and the caller then returns the reply it got."""
    server, client = _hosts(harness)
    rid = server.node.routing_id
    held = threading.Lock()
    gave_up: list[bool] = []

    def wait_for_the_callers_lock() -> None:
        if held.acquire(timeout=HOLD):
            held.release()
        else:
            gave_up.append(True)

    _after_each_reply(monkeypatch, client, wait_for_the_callers_lock)
    deadline = 0.5
    outcome: list[object] = []

    def call() -> None:
        with held:
            start = time.monotonic()
            outcome.append(
                client.request_to_node(MESH, rid, Ping(9), reply=int)
                .timeout(deadline)
                .submit_sync()
            )
            outcome.append(time.monotonic() - start)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(WAIT + HOLD)
    assert not caller.is_alive()
    assert outcome[0] == 9
    assert deadline <= outcome[1] < HOLD / 2  # at its deadline, not at the give-up
    assert gave_up == []
