"""Error model contract.

Digest §5 (ErrorKind table, "errors carry no retry hint", "classify by type, never by
text"), SC §14 and SC §17 (cancellation, timeout and shutdown results are told apart by
type, not message), digest §9 Tier 1 *Errors*.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import NoReturn

import msgspec
import pytest

import zlink_actors
from zlink_actors import (
    AlreadyExistsError,
    CancelledError,
    CapacityExceededError,
    CompletionSource,
    ConfigurationError,
    DataLostError,
    DeadlineExceededError,
    ErrorKind,
    Host,
    HostState,
    InternalFailureError,
    InvalidOperationError,
    ManualClock,
    NotConfiguredError,
    NotFoundError,
    ProtocolError,
    RejectedError,
    ShuttingDownError,
    Spot,
    SpotContext,
    TimerTick,
    TypeMismatchError,
    UnavailableError,
    ZlinkError,
    handler,
)
from zlink_actors._core.errors import error_for_kind
from zlink_actors.testing import WAIT

UPSTREAM_KINDS = [
    ("NOT_FOUND", 0),
    ("ALREADY_EXISTS", 1),
    ("TYPE_MISMATCH", 2),
    ("NOT_CONFIGURED", 3),
    ("REJECTED", 4),
    ("UNAVAILABLE", 5),
    ("CAPACITY_EXCEEDED", 6),
    ("DEADLINE_EXCEEDED", 7),
    ("SHUTTING_DOWN", 8),
    ("PROTOCOL_ERROR", 9),
    ("INVALID_OPERATION", 10),
    ("DATA_LOST", 11),
    ("INTERNAL_FAILURE", 12),
]

CLASS_FOR_KIND: dict[ErrorKind, type[ZlinkError]] = {
    ErrorKind.NOT_FOUND: NotFoundError,
    ErrorKind.ALREADY_EXISTS: AlreadyExistsError,
    ErrorKind.TYPE_MISMATCH: TypeMismatchError,
    ErrorKind.NOT_CONFIGURED: NotConfiguredError,
    ErrorKind.REJECTED: RejectedError,
    ErrorKind.UNAVAILABLE: UnavailableError,
    ErrorKind.CAPACITY_EXCEEDED: CapacityExceededError,
    ErrorKind.DEADLINE_EXCEEDED: DeadlineExceededError,
    ErrorKind.SHUTTING_DOWN: ShuttingDownError,
    ErrorKind.PROTOCOL_ERROR: ProtocolError,
    ErrorKind.INVALID_OPERATION: InvalidOperationError,
    ErrorKind.DATA_LOST: DataLostError,
    ErrorKind.INTERNAL_FAILURE: InternalFailureError,
}


def test_error_kind_has_exactly_the_thirteen_upstream_kinds_numbered_zero_to_twelve() -> None:
    assert [(kind.name, kind.value) for kind in ErrorKind] == UPSTREAM_KINDS
    assert issubclass(ErrorKind, int)
    assert ErrorKind(7) is ErrorKind.DEADLINE_EXCEEDED


def test_every_kind_has_exactly_one_error_class() -> None:
    public_classes = [
        obj
        for name in zlink_actors.__all__
        if isinstance(obj := getattr(zlink_actors, name), type)
        and issubclass(obj, ZlinkError)
        and obj is not ZlinkError
        # A kind's own refinements (`HttpStatusError` is an `InternalFailureError`)
        # carry that kind; the kind's class is the direct subclass of the root.
        and ZlinkError in obj.__bases__
    ]
    kinds = [cls.kind for cls in public_classes]

    assert sorted(kinds) == list(ErrorKind)
    assert set(public_classes) == set(CLASS_FOR_KIND.values())


@pytest.mark.parametrize(("kind", "cls"), list(CLASS_FOR_KIND.items()), ids=str)
def test_each_error_class_carries_its_kind_and_derives_from_zlink_error(
    kind: ErrorKind, cls: type[ZlinkError]
) -> None:
    error = cls("message")

    assert isinstance(error, ZlinkError)
    assert isinstance(error, Exception)
    assert error.kind is kind
    assert cls.kind is kind


@pytest.mark.parametrize("kind", list(ErrorKind), ids=lambda k: k.name)
def test_an_error_rebuilt_from_its_kind_has_that_kinds_class(kind: ErrorKind) -> None:
    error = error_for_kind(kind, "from the wire")

    assert type(error) is CLASS_FOR_KIND[kind]
    assert error.kind is kind
    assert str(error) == "from the wire"


def test_deadline_exceeded_is_also_a_timeout_error() -> None:
    assert issubclass(DeadlineExceededError, TimeoutError)
    with pytest.raises(TimeoutError):
        raise DeadlineExceededError("late")


def test_invalid_operation_is_also_a_runtime_error() -> None:
    assert issubclass(InvalidOperationError, RuntimeError)
    with pytest.raises(RuntimeError):
        raise InvalidOperationError("misuse")


@pytest.mark.parametrize(
    "cls",
    [c for c in CLASS_FOR_KIND.values() if c not in (DeadlineExceededError, InvalidOperationError)],
    ids=lambda c: c.__name__,
)
def test_other_error_classes_are_neither_timeout_nor_runtime_errors(
    cls: type[ZlinkError],
) -> None:
    assert not issubclass(cls, TimeoutError)
    assert not issubclass(cls, RuntimeError)


def test_configuration_error_is_not_a_zlink_error_and_has_no_kind() -> None:
    assert issubclass(ConfigurationError, Exception)
    assert not issubclass(ConfigurationError, ZlinkError)
    assert not hasattr(ConfigurationError("bad option"), "kind")


def test_cancelled_error_is_the_concurrent_futures_cancelled_error() -> None:
    assert CancelledError is concurrent.futures.CancelledError
    assert not issubclass(CancelledError, ZlinkError)


@pytest.mark.parametrize("cls", [ZlinkError, *CLASS_FOR_KIND.values()], ids=lambda c: c.__name__)
def test_errors_carry_no_retry_hint(cls: type[ZlinkError]) -> None:
    error = cls("message")
    names = set(dir(cls)) | set(vars(error))

    assert not [name for name in names if "retry" in name.lower()]


def test_host_configuration_mistakes_raise_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        Host(cpu_workers=0)
    with pytest.raises(ConfigurationError):
        Host(cpu_workers=True)
    with pytest.raises(ConfigurationError):
        Host(cpu_workers="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        Host(clock=object())  # type: ignore[arg-type]


# -- outcomes are classified by type, never by message (SC §14, §17) -------------------


def test_cancellation_timeout_and_shutdown_outcomes_are_distinct_types() -> None:
    clock = ManualClock()
    host = Host(cpu_workers=1, clock=clock).start()
    release = threading.Event()
    try:
        running = host.run_cpu_worker(release.wait, WAIT).submit()
        cancelled = host.run_cpu_worker(lambda: None).submit()
        timed_out = host.run_cpu_worker(lambda: None).timeout(1.0).submit()
        stopped = host.run_cpu_worker(lambda: None).submit()
        assert cancelled.cancel()
        clock.advance(1.0)
        assert timed_out.wait(WAIT)
        result = host.shutdown(deadline=0.05)
    finally:
        release.set()

    outcomes: list[type[BaseException]] = []
    with pytest.raises(CancelledError):
        cancelled.result()
    outcomes.append(CancelledError)
    timeout_error = timed_out.exception()
    shutdown_error = stopped.exception()
    assert isinstance(timeout_error, DeadlineExceededError)
    assert isinstance(shutdown_error, ShuttingDownError)
    assert isinstance(running.exception(), ShuttingDownError)
    outcomes += [type(timeout_error), type(shutdown_error)]
    for index, first in enumerate(outcomes):
        for second in outcomes[index + 1 :]:
            assert not issubclass(first, second)
            assert not issubclass(second, first)
    assert result.forced_operations == 2


def test_a_failure_whose_message_mentions_cancellation_is_not_a_cancellation(
    host: Host,
) -> None:
    def business_failure() -> None:
        raise ValueError("order cancelled by customer; timeout; shutting down")

    completion = host.run_cpu_worker(business_failure).submit()
    error = completion.exception(timeout=WAIT)

    assert not completion.cancelled()
    assert type(error) is InternalFailureError
    assert error.kind is ErrorKind.INTERNAL_FAILURE
    assert isinstance(error.__cause__, ValueError)


def test_usage_errors_are_distinguishable_from_operational_failures(host: Host) -> None:
    call = host.run_cpu_worker(lambda: 1)
    call.submit().result(WAIT)
    usage: Callable[[], object] = call.submit

    with pytest.raises(InvalidOperationError) as raised:
        usage()
    assert raised.value.kind is ErrorKind.INVALID_OPERATION

    def failing() -> None:
        raise OSError("disk")

    operational = host.run_cpu_worker(failing).submit()
    error = operational.exception(timeout=WAIT)
    assert not isinstance(error, InvalidOperationError)
    assert isinstance(error, InternalFailureError)


# -- BaseExceptions raised in handlers (docs/errors.md) ----------------------------------

BASE_EXCEPTIONS: dict[str, Callable[[], BaseException]] = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
}


class Bomb:
    """Raises a fresh exception of one `BASE_EXCEPTIONS` kind per call and keeps it."""

    def __init__(self, name: str) -> None:
        self._make = BASE_EXCEPTIONS[name]
        self.raised: list[BaseException] = []

    def __call__(self, *args: object) -> NoReturn:
        exc = self._make()
        self.raised.append(exc)
        raise exc


class Explode(msgspec.Struct, frozen=True):
    """Asks a plain handler to raise."""


class ExplodeAfterAwait(msgspec.Struct, frozen=True):
    """Asks an `async def` handler to raise after an `await`."""


class ArmBomb(msgspec.Struct, frozen=True):
    """Asks a handler to arm a timer callback or a done-callback that raises."""

    where: str


class Ask(msgspec.Struct, frozen=True):
    """Answered only by a Host that still serves the Spot."""


def exploder(bomb: Bomb) -> type[Spot]:
    class Exploder(Spot):
        @handler
        def explode(self, ctx: SpotContext, msg: Explode) -> None:
            bomb()

        @handler
        async def explode_after_await(self, ctx: SpotContext, msg: ExplodeAfterAwait) -> None:
            await ctx.run_cpu_worker(sum, [1]).submit()
            bomb()

        @handler
        def arm(self, ctx: SpotContext, msg: ArmBomb) -> None:
            if msg.where == "timer callback":

                def tick(ctx: SpotContext, tick: TimerTick) -> None:
                    ctx.timers.cancel("bomb")
                    bomb()

                ctx.timers.start("bomb", 0.001, tick)
            else:
                ctx.run_cpu_worker(sum, [1]).submit().add_done_callback(bomb)

        @handler
        def ask(self, ctx: SpotContext, msg: Ask) -> str:
            return "serving"

    return Exploder


class LogWatch(logging.Handler):
    """Keeps the records that carry one of `bomb`'s exceptions and signals the first."""

    def __init__(self, bomb: Bomb) -> None:
        super().__init__(logging.DEBUG)
        self._bomb = bomb
        self.records: list[logging.LogRecord] = []
        self.logged = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] in self._bomb.raised:
            self.records.append(record)
            self.logged.set()


@pytest.mark.parametrize("payload", [Explode(), ExplodeAfterAwait()], ids=["plain", "async"])
@pytest.mark.parametrize("name", sorted(BASE_EXCEPTIONS))
def test_a_base_exception_raised_in_a_request_handler_reaches_the_caller_as_internal_failure(
    make_host: Callable[..., Host], name: str, payload: object
) -> None:
    bomb = Bomb(name)
    room = exploder(bomb)
    host = make_host(spots=[room])
    host.spots.get_or_create("room", room).submit_sync()

    error = host.request_to_spot("room", payload).submit().exception(timeout=WAIT)

    assert type(error) is InternalFailureError
    assert len(bomb.raised) == 1
    assert error.__cause__ is bomb.raised[0]
    assert host.state is HostState.SERVING
    assert host.request_to_spot("room", Ask(), reply=str).submit_sync() == "serving"


@pytest.mark.parametrize(
    "where", ["one-way handler", "timer callback", "done-callback in a turn", "dispatcher"]
)
@pytest.mark.parametrize("name", sorted(BASE_EXCEPTIONS))
def test_a_base_exception_raised_where_no_caller_waits_is_logged_and_the_host_keeps_serving(
    make_host: Callable[..., Host], name: str, where: str
) -> None:
    bomb = Bomb(name)
    room = exploder(bomb)
    host = make_host(spots=[room])
    host.spots.get_or_create("room", room).submit_sync()
    watch = LogWatch(bomb)
    logger = logging.getLogger("zlink_actors")
    logger.addHandler(watch)
    try:
        if where == "one-way handler":
            host.send_to_spot("room", Explode()).submit_sync()
        elif where == "dispatcher":  # a done-callback added outside any turn
            source = CompletionSource[None]()
            source.completion.add_done_callback(bomb)
            source.set_result(None)
        else:
            host.send_to_spot("room", ArmBomb(where)).submit_sync()
        assert watch.logged.wait(WAIT)
    finally:
        logger.removeHandler(watch)

    assert len(bomb.raised) == 1
    assert [record.levelno for record in watch.records] == [logging.ERROR]
    assert host.state is HostState.SERVING
    assert host.request_to_spot("room", Ask(), reply=str).submit_sync() == "serving"
