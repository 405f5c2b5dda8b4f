"""A slow receiver: the sender parks and resumes, every message arrives exactly once and
in order, and the credit accounting returns to zero on both sides."""

from __future__ import annotations

import pathlib
import queue
import random
import struct
import threading

import transports as t

from .helpers import WAIT, Owner, pair, wait_until

COUNT = 20_000


def sizes(count: int, seed: int = 12) -> list[int]:
    """99% of 1 B..4 KiB, 1% up to 256 KiB (the issue's mix)."""
    rng = random.Random(seed)
    return [
        rng.randint(4097, 256 * 1024) if rng.random() < 0.01 else rng.randint(1, 4096)
        for _ in range(count)
    ]


def test_a_slow_receiver_parks_the_sender_and_everything_arrives_once_in_order(
    tmp_path: pathlib.Path,
) -> None:
    config = t.TransportConfig(
        credit_window=512 * 1024, heartbeat_interval=0.2, heartbeat_timeout=10
    )
    inbox: queue.Queue[t.Inbound] = queue.Queue()
    owner = Owner(auto_release=False)
    owner.on_receive = lambda batch: [inbox.put(r) for r in batch]  # type: ignore[assignment,method-assign,misc]
    plan = sizes(COUNT)
    with pair("tcp", tmp_path, a_config=config, b_config=config, b_owner=owner) as (a, _, b, _b):
        received: list[int] = []
        failures: list[str] = []

        def consume() -> None:
            # the slow owner: takes one record at a time, checks it, then releases
            for _ in range(COUNT):
                record = inbox.get(timeout=WAIT)
                seq = struct.unpack("!Q", record.frames[0])[0]
                if len(record.frames[1]) != plan[seq]:
                    failures.append(f"message {seq}: {len(record.frames[1])} bytes")
                received.append(seq)
                b.release(record.peer, record.charge)

        consumer = threading.Thread(target=consume)
        consumer.start()
        parked = 0
        for seq, size in enumerate(plan):
            result = a.submit(b"B", [struct.pack("!Q", seq), b"p" * size])
            if result.status is t.SubmitStatus.BACKPRESSURED:
                parked += 1
                assert result.admitted is not None
                assert result.admitted.result(WAIT) is None  # resumes when credit returns
            assert a.peer_statistics(b"B").credit_in_use <= config.credit_window + 256 * 1024
        consumer.join(WAIT * 3)
        assert not consumer.is_alive()
        assert failures == []
        assert received == list(range(COUNT))  # exactly once, in order
        assert parked > 100  # the window really bound the sender
        assert wait_until(lambda: a.peer_statistics(b"B").credit_in_use == 0)
        mine, theirs = a.peer_statistics(b"B"), b.peer_statistics(b"A")
        assert (mine.parked_messages, mine.parked_bytes) == (0, 0)
        assert (theirs.unreleased, theirs.credit_owed) == (0, 0)
        assert inbox.empty()
