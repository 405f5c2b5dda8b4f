"""A request that is already terminal never runs its handler; handlers see their call's
deadline and cancellation (docs/completion.md, "Inside the handler").

A request cancelled or expired while it waited in the queue has given its caller its one
result, so its handler must not run later: a refund made after a timeout must not be
undone by the deposit that was still queued. A running handler reads `ctx.deadline` (the
request's; one that never passes for a one-way message) and `ctx.cancellation` (cancelled
once its caller cancelled, its deadline passed or shutdown ended it).
"""

import threading
from typing import Any

import msgspec
import pytest

from zlink_actors import (
    CancellationSource,
    CancelledError,
    DeadlineExceededError,
    ManualClock,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.testing import WAIT, HostHarness

from ._support import Hold, Note, Ping, Probe


class Deposit(msgspec.Struct, frozen=True):
    amount: int


class Bank:
    """A Spot class: `Hold` blocks on a latch; `Deposit` adds to the balance."""

    def __init__(self, harness: HostHarness, name: str = "Account") -> None:
        self.latch = harness.latch()
        self.entered = threading.Event()
        self.balance = 100
        self.deposits = 0
        bank = self

        class Account(Spot):
            type_name = name

            @handler
            def hold(self, ctx: SpotContext, msg: Hold) -> None:
                bank.entered.set()
                assert bank.latch.wait(WAIT)

            @handler
            def deposit(self, ctx: SpotContext, msg: Deposit) -> int:
                bank.deposits += 1
                bank.balance += msg.amount
                return bank.balance

            @handler
            def probe(self, ctx: SpotContext, msg: Probe) -> int:
                return bank.balance

        self.cls = Account


def _bank(harness: HostHarness, **options: object) -> tuple[Any, Bank]:
    bank = Bank(harness)
    host = harness.host(spots=[bank.cls], **options)
    host.spots.get_or_create("acct", bank.cls).submit_sync()
    return host, bank


def test_a_request_cancelled_while_queued_never_runs_its_handler(harness: HostHarness) -> None:
    host, bank = _bank(harness)
    held = host.send_to_spot("acct", Hold()).submit()
    assert bank.entered.wait(WAIT)
    assert held.result(WAIT) is None

    deposit = host.request_to_spot("acct", Deposit(20), reply=int).submit()
    assert deposit.cancel() is True
    bank.latch.set()

    with pytest.raises(CancelledError):
        deposit.result(WAIT)
    assert host.request_to_spot("acct", Probe(), reply=int).submit_sync() == 100
    assert bank.deposits == 0


def test_a_request_that_expired_in_the_queue_never_runs_its_handler(harness: HostHarness) -> None:
    clock = ManualClock()
    host, bank = _bank(harness, clock=clock)
    host.send_to_spot("acct", Hold()).submit_sync()
    assert bank.entered.wait(WAIT)

    # One on the Host's default deadline (the shared scan), one with a timeout of its own.
    on_default = host.request_to_spot("acct", Deposit(20), reply=int).submit()
    own = host.request_to_spot("acct", Deposit(30), reply=int).timeout(1).submit()
    clock.advance(10)
    with pytest.raises(DeadlineExceededError):
        on_default.result(WAIT)
    with pytest.raises(DeadlineExceededError):
        own.result(WAIT)
    bank.latch.set()

    assert host.request_to_spot("acct", Probe(), reply=int).timeout(60).submit_sync() == 100
    assert bank.deposits == 0


def test_a_blocking_request_that_timed_out_in_the_queue_never_runs_its_handler(
    harness: HostHarness,
) -> None:
    host, bank = _bank(harness)
    host.send_to_spot("acct", Hold()).submit_sync()
    assert bank.entered.wait(WAIT)

    with pytest.raises(DeadlineExceededError):
        host.request_to_spot("acct", Deposit(20), reply=int).timeout(0.05).submit_sync()
    bank.latch.set()

    assert host.request_to_spot("acct", Probe(), reply=int).submit_sync() == 100
    assert bank.deposits == 0


def test_opposite_transfers_that_time_out_and_refund_keep_the_total(harness: HostHarness) -> None:
    """The issue's bank: each transfer withdraws at once, deposits into the other account,
    and refunds when the deposit times out. Queued deposits must not run afterwards."""
    clock = ManualClock()
    banks = [Bank(harness, "A"), Bank(harness, "B")]
    host = harness.host(spots=[banks[0].cls, banks[1].cls], clock=clock)
    for i, bank in enumerate(banks):
        host.spots.get_or_create(f"acct{i}", bank.cls).submit_sync()
        host.send_to_spot(f"acct{i}", Hold()).submit_sync()
        assert bank.entered.wait(WAIT)

    deposits = []
    for src, dst in ((0, 1), (1, 0)):
        banks[src].balance -= 10  # withdrawn from the source (its own state)
        deposits.append((src, host.request_to_spot(f"acct{dst}", Deposit(10)).timeout(1).submit()))
    clock.advance(2)
    for src, deposit in deposits:
        with pytest.raises(DeadlineExceededError):
            deposit.result(WAIT)
        banks[src].balance += 10  # refunded: the deposit did not happen
    for bank in banks:
        bank.latch.set()

    total = sum(
        host.request_to_spot(f"acct{i}", Probe(), reply=int).timeout(60).submit_sync()
        for i in range(2)
    )
    assert total == 200


class Seen(msgspec.Struct, frozen=True):
    finite: bool
    remaining: float
    cancelled: bool


def _reporting_spot(
    harness: HostHarness,
) -> tuple[type, threading.Event, threading.Event, list[Any]]:
    entered = threading.Event()
    cancelled = threading.Event()
    seen: list[Any] = []

    class Reporter(Spot):
        @handler
        def ping(self, ctx: SpotContext, msg: Ping) -> Seen:
            deadline = ctx.deadline
            return Seen(deadline.finite, deadline.remaining(), ctx.cancellation.cancelled)

        @handler
        def note(self, ctx: SpotContext, msg: Note) -> None:
            seen.append((ctx.deadline.finite, ctx.cancellation.cancelled))
            entered.set()

        @handler
        def hold(self, ctx: SpotContext, msg: Hold) -> bool:
            token = ctx.cancellation
            token.register(cancelled.set)
            entered.set()
            # Until the caller gives up; the token tells the handler so.
            assert cancelled.wait(WAIT)
            return token.cancelled

    return Reporter, entered, cancelled, seen


def test_a_handler_sees_its_requests_deadline(harness: HostHarness) -> None:
    clock = ManualClock()
    cls, _, _, _ = _reporting_spot(harness)
    host = harness.host(spots=[cls], clock=clock, default_request_timeout=5)
    host.spots.get_or_create("r", cls).submit_sync()

    own = host.request_to_spot("r", Ping(), reply=Seen).timeout(7).submit().result(WAIT)
    assert own == Seen(finite=True, remaining=7.0, cancelled=False)
    on_default = host.request_to_spot("r", Ping(), reply=Seen).submit().result(WAIT)
    assert on_default == Seen(finite=True, remaining=5.0, cancelled=False)


def test_a_handler_of_a_blocking_request_sees_its_deadline(harness: HostHarness) -> None:
    cls, _, _, _ = _reporting_spot(harness)
    host = harness.host(spots=[cls])
    host.spots.get_or_create("r", cls).submit_sync()

    seen = host.request_to_spot("r", Ping(), reply=Seen).timeout(30).submit_sync()
    assert seen.finite
    assert 0 < seen.remaining <= 30
    assert not seen.cancelled


def test_a_one_way_handler_has_a_deadline_that_never_passes(harness: HostHarness) -> None:
    cls, entered, _, seen = _reporting_spot(harness)
    host = harness.host(spots=[cls])
    host.spots.get_or_create("r", cls).submit_sync()

    host.send_to_spot("r", Note()).submit_sync()
    assert entered.wait(WAIT)
    assert seen == [(False, False)]


def test_the_handlers_token_is_cancelled_when_its_caller_cancels(harness: HostHarness) -> None:
    cls, entered, _, _ = _reporting_spot(harness)
    host = harness.host(spots=[cls])
    host.spots.get_or_create("r", cls).submit_sync()
    source = CancellationSource()

    call = host.request_to_spot("r", Hold(), reply=bool).submit(cancel=source.token)
    assert entered.wait(WAIT)
    source.cancel()

    with pytest.raises(CancelledError):
        call.result(WAIT)
    # The handler saw it and returned; its late reply is dropped.
    assert host.request_to_spot("r", Ping(), reply=Seen).submit_sync().cancelled is False


def test_the_handlers_token_is_cancelled_when_a_blocking_callers_deadline_passes(
    harness: HostHarness,
) -> None:
    cls, entered, cancelled, _ = _reporting_spot(harness)
    host = harness.host(spots=[cls])
    host.spots.get_or_create("r", cls).submit_sync()

    with pytest.raises(DeadlineExceededError):
        host.request_to_spot("r", Hold(), reply=bool).timeout(0.05).submit_sync()
    assert entered.is_set()
    assert cancelled.wait(WAIT)
