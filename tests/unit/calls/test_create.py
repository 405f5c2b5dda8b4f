"""The create path of a class without creation hooks (`_calls/create.py`, `_engine/lifecycle.py`).

Such a create runs the constructor and `configure` on the calling thread and is Ready
before `submit()` returns; no turn runs. The attempt it registers meanwhile is still what
concurrent callers join and what a shutdown waits for. Constructors are held on a
`threading.Event` to fix the order; every bounded wait asserts its result.
"""

from __future__ import annotations

import threading

import pytest

from zlink_actors import (
    Created,
    Existing,
    Host,
    ShutdownOutcome,
    ShutdownResult,
    Spot,
    SpotConfig,
)
from zlink_actors._engine import objects as _objects
from zlink_actors._engine.objects import configure_spot
from zlink_actors.testing import WAIT, wait_until


class HeldConstructor:
    """Makes Spot classes whose constructor reports that it runs, then waits for release."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def spot_class(self) -> type[Spot]:
        held = self

        class Slow(Spot):
            def __init__(self) -> None:
                super().__init__()
                held.entered.set()
                if not held.release.wait(WAIT * 6):
                    raise TimeoutError("the constructor was never released")

        return Slow


def test_shutdown_waiting_for_a_creation_held_in_its_constructor_ends_when_it_does() -> None:
    held = HeldConstructor()
    slow = held.spot_class()
    host = Host(spots=[slow]).start()
    created: list[object] = []
    creator = threading.Thread(
        target=lambda: created.append(host.spots.get_or_create("s", slow).submit_sync())
    )
    creator.start()
    assert held.entered.wait(WAIT)
    stopped: list[ShutdownResult] = []
    stopper = threading.Thread(target=lambda: stopped.append(host.shutdown(deadline=60.0)))
    stopper.start()
    try:
        # The shutdown waits for the attempt (it accepted the create before sealing).
        engine = host._runtime.engine
        assert wait_until(lambda: engine._attempt_waiters == 1)
    finally:
        held.release.set()
    creator.join(WAIT)
    stopper.join(WAIT)  # told when the attempt ended: long before its 60 s deadline
    assert not creator.is_alive()
    assert not stopper.is_alive()
    assert type(created[0]) is Created
    assert stopped[0].outcome is ShutdownOutcome.STOPPED


def test_a_caller_joining_a_creation_held_in_its_constructor_gets_the_same_created() -> None:
    held = HeldConstructor()
    slow = held.spot_class()
    with Host(spots=[slow]) as host:
        created: list[object] = []
        creator = threading.Thread(
            target=lambda: created.append(host.spots.get_or_create("s", slow).submit_sync())
        )
        creator.start()
        try:
            assert held.entered.wait(WAIT)
            joined = host.spots.get_or_create("s", slow).submit()
            assert not joined.done()  # it joined the attempt: no second constructor
        finally:
            held.release.set()
        creator.join(WAIT)
        assert not creator.is_alive()
        assert type(created[0]) is Created
        assert joined.result(WAIT) is created[0]  # the attempt's one terminal
        assert host.statistics().spots == 1


def test_a_create_of_a_class_without_hooks_is_settled_when_submit_returns() -> None:
    class Plain(Spot):
        pass

    with Host(spots=[Plain]) as host:
        first = host.spots.get_or_create("p", Plain).submit()
        second = host.spots.get_or_create("p", Plain).submit()

        assert first.done()
        assert second.done()
        assert type(first.result()) is Created
        assert second.result() == Existing(first.result().ref)
        assert first.cancel() is False  # settled: nothing left to cancel


class _Counted(SpotConfig):
    made = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).made += 1


def test_configure_spot_makes_a_config_only_for_a_configure_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_objects, "SpotConfig", _Counted)
    _Counted.made = 0

    class Plain(Spot):
        pass

    class Subscribed(Spot):
        def configure(self, cfg: SpotConfig) -> None:
            cfg.subscribe("news", "all")

    assert configure_spot(Plain()) == ()
    assert _Counted.made == 0  # the base configure declares nothing: not called
    assert configure_spot(Subscribed()) == [("news", "all")]
    assert _Counted.made == 1

    patched = Plain()
    patched.configure = lambda cfg: cfg.subscribe("c", "t")  # type: ignore[method-assign]
    assert configure_spot(patched) == [("c", "t")]  # an instance's own is honoured too
