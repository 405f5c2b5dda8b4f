"""Direct sends: while the I/O thread sleeps, a submitting thread sends an admitted
record itself (docs/transports.md, "Direct sends"). What must hold: each thread's
records keep their order whichever way they went, a reply sent by a worker thread goes
directly too, and a message the direct sender's EVENTS ask read ahead into is read whole
at once: delivered, or dropped with its peer when the peer goes first (a disconnect with
a message half read aborts libzmq)."""

from __future__ import annotations

import pathlib
import queue
import select
import threading
from collections.abc import Callable, Sequence

import transports as t
from transports._state import DIRECT
from transports._wire import Kind

from .helpers import FAST, WAIT, Owner, pair, transport

THREADS = 4
PER_THREAD = 300
#: sequential round trips tried before a direct send must have happened: the I/O thread
#: sleeps between them, so in practice the first one already goes directly
TRIES = 200


def _direct(tr: t.Transport) -> int:
    return tr.statistics().direct_messages


def _count(owner: Owner, kind: t.InboundKind, count: int) -> Callable[[], bool]:
    return lambda: len(owner.of_kind(kind)) == count


def test_each_threads_records_arrive_in_its_order_whether_sent_directly_or_queued(
    tmp_path: pathlib.Path,
) -> None:
    with pair("tcp", tmp_path) as (a, _, _, b_owner):
        # One at a time first, until one has gone directly (nothing in flight, the I/O
        # thread asleep: in practice the first one already does).
        for i in range(TRIES):
            a.submit(b"B", [b"alone"])
            assert b_owner.wait(_count(b_owner, t.InboundKind.MESSAGE, i + 1))
            if _direct(a):
                break
        assert _direct(a), f"no message went directly in {TRIES} tries"
        warm = len(b_owner.of_kind(t.InboundKind.MESSAGE))
        barrier = threading.Barrier(THREADS)

        def send(n: int) -> None:
            barrier.wait(WAIT)  # all at once: some find the I/O thread awake, some asleep
            for i in range(PER_THREAD):
                result = a.submit(b"B", [f"{n}:{i}".encode()])
                if result.admitted is not None:
                    result.admitted.result(WAIT)

        threads = [threading.Thread(target=send, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        total = THREADS * PER_THREAD
        assert b_owner.wait(_count(b_owner, t.InboundKind.MESSAGE, warm + total))
        seen: dict[int, list[int]] = {n: [] for n in range(THREADS)}
        for record in b_owner.of_kind(t.InboundKind.MESSAGE)[warm:]:
            n, i = record.frames[0].decode().split(":")
            seen[int(n)].append(int(i))
        assert all(order == list(range(PER_THREAD)) for order in seen.values())


def test_a_worker_threads_reply_goes_directly_and_every_request_gets_its_own() -> None:
    inbox: queue.SimpleQueue[t.Inbound] = queue.SimpleQueue()

    def hand_over(batch: Sequence[t.Inbound]) -> None:  # the server's I/O thread
        for record in batch:
            inbox.put(record)

    client_owner = Owner()
    with (
        t.Transport(b"S", hand_over, config=FAST) as server,
        transport(b"C", client_owner, FAST) as client,
    ):

        def work() -> None:  # the worker thread: release, then reply from here
            while (record := inbox.get()).frames != [b"stop"]:
                server.release(record.peer, record.charge)
                server.reply(record.peer, record.route_id, [b"re:" + record.frames[0]])

        worker = threading.Thread(target=work)
        worker.start()
        try:
            client.connect(b"S", server.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
            before = _direct(server)
            for i in range(TRIES):
                client.submit_request(b"S", i, [str(i).encode()])
                assert client_owner.wait(_count(client_owner, t.InboundKind.REPLY, i + 1))
                if _direct(server) > before:
                    break
            replies = client_owner.of_kind(t.InboundKind.REPLY)
            assert [(r.route_id, r.frames) for r in replies] == [
                (j, [b"re:" + str(j).encode()]) for j in range(len(replies))
            ]
            assert _direct(server) > before, f"no reply went directly in {TRIES} round trips"
        finally:
            inbox.put(t.Inbound(b"", t.InboundKind.MESSAGE, 0, [b"stop"], 0))
            worker.join(WAIT)


def _read_ahead(a: t.Transport, b: t.Transport) -> None:
    """With A's sockets held (its I/O thread cannot read), B sends A a message; once A's
    application socket signals it, A sends B a record directly, as `submit` would: its
    EVENTS ask reads ahead into B's message, which must then be read whole at once."""
    io = a._io
    b.submit(b"A", [b"from-b"])
    signal = select.poll()
    signal.register(io.app_fd, select.POLLIN)
    assert signal.poll(WAIT * 1000), "B's message never reached A's socket"
    frames = (b"to-b",)
    assert a._core.submit(b"B", Kind.MESSAGE, 0, frames, 4, None, True) is DIRECT
    assert io.send_direct(io.app, b"B", Kind.MESSAGE, 0, a.config.min_charge, frames)
    assert [peer for peer, _ in io._stash_app] == [b"B"]
    assert not io.can_send_direct(io.app)  # one read-ahead message at most


def test_a_message_read_ahead_by_a_direct_send_is_delivered_whole(
    tmp_path: pathlib.Path,
) -> None:
    with pair("tcp", tmp_path) as (a, a_owner, b, b_owner):
        with a._io.sockets:
            _read_ahead(a, b)
        assert a_owner.wait(lambda: [r.frames for r in a_owner.records] == [[b"from-b"]])
        assert b_owner.wait(lambda: [r.frames for r in b_owner.records] == [[b"to-b"]])


def test_a_peer_lost_with_a_message_read_ahead_takes_it_along_and_the_transport_serves_on(
    tmp_path: pathlib.Path,
) -> None:
    with pair("tcp", tmp_path) as (a, a_owner, b, _):
        with a._io.sockets:
            _read_ahead(a, b)
            # The peer goes before the loop reads: its pipe is disconnected. Had the
            # message stayed half read in libzmq, the next read would abort the process.
            a._io.lose(b"B", "lost by the test")
            assert not a._io._stash_app
        assert a_owner.wait(lambda: t.PeerEventKind.LOST in a_owner.event_kinds(b"B"))
        c_owner = Owner()
        with transport(b"C", c_owner) as c:
            a.connect(b"C", c.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
            a.submit_request(b"C", 7, [b"still here"])
            assert a_owner.wait(lambda: len(a_owner.of_kind(t.InboundKind.REPLY)) == 1)
            assert a_owner.of_kind(t.InboundKind.REPLY)[0].frames == [b"re:still here"]
        # what B sent went with B, as an unread message does
        assert a_owner.of_kind(t.InboundKind.MESSAGE) == []
