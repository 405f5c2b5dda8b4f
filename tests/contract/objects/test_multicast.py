"""Logical Multicast in one process (digest §2, §5 "Multicast"; CS §4; digest §9 Tier 1 "multicast
with 0 targets succeeds").

Spots subscribe in `configure(cfg)`. `publish(channel, topic, payload)` snapshots the
matching Spots when it starts and delivers the same payload object to each. With
`Host(publish_concurrency=N)` at most N transactions run; more wait, untimed, for a slot.
Before commit cancellation wins and nothing is delivered; after commit it changes
nothing. Shutdown ends a publish still waiting for a slot with `ShuttingDownError`.

Absence of a delivery is shown with a `Marker` publish: with one publish slot it commits
only after every earlier transaction has queued its deliveries, and each Spot's queue is
FIFO, so once a Spot handled the marker it has handled anything published to it before.
"""

import threading

import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    Host,
    InvalidOperationError,
    ShutdownOutcome,
    ShutdownResult,
    ShuttingDownError,
    Spot,
    SpotConfig,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Countdown, Hold, Marker, News, Probe


class Inbox:
    """What one test's Spots received, by Spot id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.news: dict[str, list[News]] = {}
        self.markers: Countdown = Countdown(0)

    def expect_markers(self, n: int) -> None:
        self.markers = Countdown(n)

    def add(self, spot_id: str, msg: News) -> None:
        with self._lock:
            self.news.setdefault(spot_id, []).append(msg)

    def of(self, spot_id: str) -> list[News]:
        with self._lock:
            return list(self.news.get(spot_id, []))


def subscriber(
    inbox: Inbox, name: str, *subscriptions: tuple[str, str], hears_news: bool = True
) -> type:
    """A Spot class registered as `name`, subscribed to `subscriptions` and to the marker
    channel; it records the `News` it handles unless `hears_news` is False."""

    class Base(Spot):
        def configure(self, cfg: SpotConfig) -> None:
            for channel, topic in subscriptions:
                cfg.subscribe(channel, topic)
            cfg.subscribe("marker", "all")

        @handler
        def marker(self, ctx: SpotContext, msg: Marker) -> None:
            inbox.markers.count()

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return len(inbox.of(ctx.spot_id))

    if not hears_news:
        Base.type_name = name
        return Base

    class Listener(Base):
        type_name = name

        @handler
        def news(self, ctx: SpotContext, msg: News) -> None:
            inbox.add(ctx.spot_id, msg)

    return Listener


def _markers_handled(host: Host, inbox: Inbox, spots: int) -> None:
    inbox.expect_markers(spots)
    assert host.publish("marker", "all", Marker()).submit_sync() is None
    assert inbox.markers.done.wait(WAIT)


class Jam:
    """One committed publish stuck delivering, so a later one waits for the only slot.

    Spot "jammed" has a lane of one item, filled by a handler blocked on a latch; the
    publish to ("jam", "x") commits at once and then waits for lane space to deliver.
    """

    def __init__(self, harness: HostHarness, inbox: Inbox, *others: type) -> None:
        self.entered = threading.Event()
        self.latch = harness.latch()
        jam = self

        class Jammed(subscriber(inbox, "Jammed", ("jam", "x"))):  # type: ignore[misc]
            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> None:
                jam.entered.set()
                assert jam.latch.wait(WAIT)

        self.host = harness.host(
            spots=[Jammed, *others], publish_concurrency=1, application_lane_items=1
        )
        self.host.spots.get_or_create("jammed", Jammed).submit_sync()

    def jam(self, cancel: CancellationSource | None = None) -> None:
        self.host.send_to_spot("jammed", Hold()).submit_sync()
        assert self.entered.wait(WAIT)
        token = None if cancel is None else cancel.token
        self.committed = self.host.publish("jam", "x", News("stuck")).submit(cancel=token)
        assert self.committed.result(WAIT) is None

    def release(self) -> None:
        self.latch.set()


def test_publish_delivers_the_same_payload_object_to_every_matching_spot_and_no_other(
    harness: HostHarness,
) -> None:
    inbox = Inbox()
    room = subscriber(inbox, "Room", ("news", "all"))
    other = subscriber(inbox, "Other", ("news", "sports"), ("weather", "all"))

    class Plain(Spot):
        @handler
        def news(self, ctx: SpotContext, msg: News) -> None:
            inbox.add(ctx.spot_id, msg)

        @handler
        def probe(self, ctx: SpotContext, msg: Probe) -> int:
            return len(inbox.of(ctx.spot_id))

    host = harness.host(spots=[room, other, Plain], publish_concurrency=1)
    for i in range(3):
        host.spots.get_or_create(f"r{i}", room).submit_sync()
    host.spots.get_or_create("other", other).submit_sync()
    host.spots.get_or_create("plain", Plain).submit_sync()
    payload = News("hello")

    assert host.publish("news", "all", payload).submit_sync() is None

    _markers_handled(host, inbox, 4)
    assert sorted(inbox.news) == ["r0", "r1", "r2"]
    for i in range(3):
        received = inbox.of(f"r{i}")
        assert len(received) == 1
        assert received[0] is payload
    assert host.request_to_spot("plain", Probe()).submit_sync() == 0


def test_a_publish_with_no_targets_completes_with_none(harness: HostHarness) -> None:
    inbox = Inbox()
    room = subscriber(inbox, "Room", ("news", "sports"))
    host = harness.host(spots=[room], publish_concurrency=1)
    host.spots.get_or_create("r", room).submit_sync()

    nobody = host.publish("news", "all", News()).submit()

    assert nobody.result(WAIT) is None
    assert host.publish("nobody", "here", News()).submit_sync() is None
    _markers_handled(host, inbox, 1)
    assert inbox.of("r") == []


def test_a_target_without_a_handler_for_the_payload_does_not_change_the_result(
    harness: HostHarness,
) -> None:
    inbox = Inbox()
    deaf = subscriber(inbox, "Deaf", ("news", "all"), hears_news=False)
    room = subscriber(inbox, "Room", ("news", "all"))
    host = harness.host(spots=[deaf, room], publish_concurrency=1)
    host.spots.get_or_create("deaf", deaf).submit_sync()
    host.spots.get_or_create("r", room).submit_sync()
    payload = News("hello")

    assert host.publish("news", "all", payload).submit_sync() is None

    _markers_handled(host, inbox, 2)
    assert inbox.of("r") == [payload]
    assert inbox.of("deaf") == []


def test_the_target_set_is_a_snapshot_taken_when_the_publish_starts(harness: HostHarness) -> None:
    inbox = Inbox()
    room = subscriber(inbox, "Room", ("news", "all"))
    jam = Jam(harness, inbox, room)
    host = jam.host
    host.spots.get_or_create("early", room).submit_sync()
    jam.jam()

    waiting = host.publish("news", "all", News("snapshot")).submit()
    assert not waiting.done()
    host.spots.get_or_create("late", room).submit_sync()
    jam.release()

    assert waiting.result(WAIT) is None
    _markers_handled(host, inbox, 3)
    assert inbox.of("early") == [News("snapshot")]
    assert inbox.of("late") == []
    assert inbox.of("jammed") == [News("stuck")]


@pytest.mark.parametrize("how", ["completion", "token"])
def test_cancelling_a_publish_that_waits_for_a_slot_completes_it_cancelled_and_it_never_delivers(
    harness: HostHarness, how: str
) -> None:
    inbox = Inbox()
    room = subscriber(inbox, "Room", ("news", "all"))
    jam = Jam(harness, inbox, room)
    host = jam.host
    host.spots.get_or_create("r", room).submit_sync()
    jam.jam()
    source = CancellationSource()

    waiting = host.publish("news", "all", News("cancelled")).submit(cancel=source.token)
    assert not waiting.done()
    if how == "completion":
        assert waiting.cancel() is True
    else:
        source.cancel()

    assert waiting.cancelled()
    with pytest.raises(CancelledError):
        waiting.result(WAIT)
    jam.release()
    _markers_handled(host, inbox, 2)
    assert inbox.of("r") == []
    assert inbox.of("jammed") == [News("stuck")]


@pytest.mark.parametrize("how", ["completion", "token"])
def test_cancelling_a_committed_publish_returns_false_and_it_still_delivers(
    harness: HostHarness, how: str
) -> None:
    inbox = Inbox()
    jam = Jam(harness, inbox)
    host = jam.host
    source = CancellationSource()
    jam.jam(cancel=source)  # committed; its delivery still waits for lane space

    if how == "completion":
        assert jam.committed.cancel() is False
    else:
        source.cancel()

    assert not jam.committed.cancelled()
    assert jam.committed.result(WAIT) is None
    jam.release()
    _markers_handled(host, inbox, 1)
    assert inbox.of("jammed") == [News("stuck")]


def test_shutdown_completes_a_publish_still_waiting_for_a_slot_with_shutting_down(
    harness: HostHarness,
) -> None:
    inbox = Inbox()
    room = subscriber(inbox, "Room", ("news", "all"))
    jam = Jam(harness, inbox, room)
    host = jam.host
    host.spots.get_or_create("r", room).submit_sync()
    jam.jam()
    waiting = host.publish("news", "all", News("never")).submit()
    assert not waiting.done()
    results: list[ShutdownResult] = []

    stopper = threading.Thread(target=lambda: results.append(host.shutdown(deadline=WAIT)))
    stopper.start()
    try:
        with pytest.raises(ShuttingDownError):
            waiting.result(WAIT)
    finally:
        jam.release()
        stopper.join(WAIT * 2)
    assert not stopper.is_alive()
    assert results[0].outcome is ShutdownOutcome.STOPPED
    assert inbox.of("r") == []


def test_publish_has_no_timeout(harness: HostHarness) -> None:
    inbox = Inbox()
    room = subscriber(inbox, "Room", ("news", "all"))
    host = harness.host(spots=[room], publish_concurrency=1)
    host.spots.get_or_create("r", room).submit_sync()
    call = host.publish("news", "all", News("untimed"))

    with pytest.raises(InvalidOperationError):
        call.timeout(1.0)

    assert call.submit_sync() is None  # the refused option left the call usable
    _markers_handled(host, inbox, 1)
    assert inbox.of("r") == [News("untimed")]
