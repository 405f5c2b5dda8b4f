"""The records one wake sends to one peer travel packed in few wire messages, in order;
a receiver hands its owner no more than its read budget and holds the rest of a
message, first in line, until the owner takes more."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import transports as t
from transports._wire import RECORDS_PER_MESSAGE

from .helpers import WAIT, Owner, pair, transport, wait_until

# pings only every second: these tests count the wire messages of a few milliseconds
QUIET = t.TransportConfig(heartbeat_interval=1.0, heartbeat_timeout=5.0)


@contextmanager
def io_held(tr: t.Transport) -> Iterator[None]:
    """Keep `tr`'s I/O thread busy in a call until the block ends, so that everything
    submitted meanwhile is taken in its next wake, all at once."""
    entered, release = threading.Event(), threading.Event()

    def hold(_: object) -> None:
        entered.set()
        release.wait(WAIT)

    holder = threading.Thread(target=tr._call, args=(hold,))
    holder.start()
    try:
        assert entered.wait(WAIT)
        yield
    finally:
        release.set()
        holder.join(WAIT)


def test_the_records_of_one_wake_to_a_peer_travel_packed_and_in_order(
    tmp_path: pathlib.Path,
) -> None:
    count = 2 * RECORDS_PER_MESSAGE + 22
    with pair("tcp", tmp_path, QUIET, QUIET) as (a, _, b, b_owner):
        sent, received = a.statistics().sent_messages, b.statistics().received_messages
        with io_held(a):
            for i in range(count):
                assert a.submit(b"B", [b"%d" % i]).status is t.SubmitStatus.OK
        assert b_owner.wait(lambda: len(b_owner.records) == count)
        assert [r.frames[0] for r in b_owner.records] == [b"%d" % i for i in range(count)]
        # three messages carried them (64 + 64 + 22); a ping may have gone meanwhile
        assert a.statistics().sent_messages - sent in (3, 4)
        assert b.statistics().received_messages - received in (3, 4)
        assert max(b_owner.batches) <= b.config.batch
        assert b.statistics().received_frames >= count


class Budget:
    """An owner with inbound permits, as the mesh has: the transport may read at most
    `free` more records; at 0 the owner pauses its senders."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.records: list[t.Inbound] = []
        self.over: list[int] = []  # batches larger than the budget (none, if it holds)
        self.transport: t.Transport | None = None
        self.changed = threading.Condition()

    def budget(self) -> int:
        with self.changed:
            return self.free

    def on_receive(self, batch: Sequence[t.Inbound]) -> None:
        assert self.transport is not None
        with self.changed:
            if len(batch) > self.free:
                self.over.append(len(batch))
            self.free -= len(batch)
            self.records.extend(batch)
            paused = self.free <= 0
            self.changed.notify_all()
        for record in batch:
            self.transport.release(record.peer, record.charge)
        if paused:
            self.transport.set_flow(t.FlowState.PAUSED)

    def give(self, permits: int) -> None:
        with self.changed:
            self.free += permits
        assert self.transport is not None
        self.transport.set_flow(t.FlowState.RUNNING)

    def wait(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.records) >= count, WAIT)


@contextmanager
def budgeted_pair(free: int) -> Iterator[tuple[t.Transport, t.Transport, Budget]]:
    """A connected to B, READY; B's owner has `free` inbound permits; and ten records
    from A, packed in one message, already on their way (three handed over, seven held)."""
    owner = Budget(free)
    b = t.Transport(b"B", owner.on_receive, config=QUIET, read_budget=owner.budget)
    owner.transport = b
    a_owner = Owner()
    try:
        with transport(b"A", a_owner, QUIET) as a:
            a.connect(b"B", b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
            assert a_owner.wait(lambda: t.PeerEventKind.READY in a_owner.event_kinds(b"B"))
            with io_held(a):  # ten records, packed in one message
                for i in range(10):
                    a.submit(b"B", [b"%d" % i])
            assert owner.wait(free)
            # all ten were read (one message) but only `free` handed over: the owner's
            # budget; the others are held while the owner has paused
            assert wait_until(lambda: b.statistics().received_frames >= 10)
            yield a, b, owner
    finally:
        b.close()


def test_a_receiver_hands_over_no_more_than_its_read_budget_and_holds_the_rest_in_order(
    tmp_path: pathlib.Path,
) -> None:
    with budgeted_pair(free=3) as (_, _, owner):
        assert len(owner.records) == 3
        owner.give(4)
        assert owner.wait(7)
        owner.give(100)
        assert owner.wait(10)
        assert [r.frames[0] for r in owner.records] == [b"%d" % i for i in range(10)]
        assert owner.over == []


def test_packing_keeps_each_frame_within_what_the_receivers_hello_said_it_accepts(
    tmp_path: pathlib.Path,
) -> None:
    # B accepts frames of at most 64 KiB + 1: five records of 60,000 bytes each fit it
    # alone, but one body of all five would not (libzmq would drop the connection)
    b_config = t.TransportConfig(
        max_message_size=64 * 1024,
        hard_message_cap=64 * 1024 + 1,
        heartbeat_interval=1.0,
        heartbeat_timeout=5.0,
    )
    with pair("tcp", tmp_path, QUIET, b_config) as (a, a_owner, b, b_owner):
        before = b.statistics().received_messages
        with io_held(a):
            for i in range(5):
                a.submit(b"B", [bytes([i]) * 60_000])
        assert b_owner.wait(lambda: len(b_owner.records) == 5)
        assert b.statistics().received_messages - before >= 5  # one message each
        assert [r.frames[0][:1] for r in b_owner.records] == [bytes([i]) for i in range(5)]
        assert t.PeerEventKind.LOST not in a_owner.event_kinds(b"B")


def test_packing_bounds_the_head_too(tmp_path: pathlib.Path) -> None:
    # records with no payload bytes but 400 empty frames each: 1,624 bytes of head apiece,
    # so five of them would make a head above B's 4 KiB frame cap
    b_config = t.TransportConfig(
        max_message_size=1024, hard_message_cap=4096, heartbeat_interval=1.0, heartbeat_timeout=5.0
    )
    with pair("tcp", tmp_path, QUIET, b_config) as (a, a_owner, b, b_owner):
        before = b.statistics().received_messages
        with io_held(a):
            for _ in range(5):
                a.submit(b"B", [b""] * 400)
        assert b_owner.wait(lambda: len(b_owner.records) == 5)
        assert b.statistics().received_messages - before >= 5  # two heads would pass its cap
        assert all(len(r.frames) == 400 for r in b_owner.records)
        assert t.PeerEventKind.LOST not in a_owner.event_kinds(b"B")


def test_held_records_of_a_lost_peer_are_never_handed_over(tmp_path: pathlib.Path) -> None:
    with budgeted_pair(free=3) as (_, b, owner):  # seven held
        b.disconnect(b"A")
        owner.give(100)
        # two round trips through B's I/O thread: the wake that ran RUNNING, and its
        # read of what was held, are over
        b._call(lambda io: None)
        b._call(lambda io: None)
        assert len(owner.records) == 3
        assert b.statistics().credit_in_use == 0
