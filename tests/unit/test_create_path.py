"""The create path of a class without creation hooks (`_create.py`, `_lifecycle.py`).

Such a create runs the constructor and `configure` on the calling thread and is Ready
before `submit()` returns; no turn runs. The attempt it registers meanwhile is still what
concurrent callers join and what a shutdown waits for. Constructors are held on a
`threading.Event` to fix the order; every bounded wait asserts its result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from zlink_actors import Created, Host, ShutdownOutcome, ShutdownResult, Spot

#: Upper bound for every wait that is expected to succeed.
WAIT = 5.0


def eventually(predicate: Callable[[], bool], within: float = WAIT) -> bool:
    """Poll `predicate` until it holds or `within` seconds pass (callers assert it)."""
    pause = threading.Event()
    end = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= end:
            return False
        pause.wait(0.002)
    return True


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
        assert eventually(lambda: engine._attempt_waiters == 1)
    finally:
        held.release.set()
    creator.join(WAIT)
    stopper.join(WAIT)  # told when the attempt ended: long before its 60 s deadline
    assert not creator.is_alive()
    assert not stopper.is_alive()
    assert type(created[0]) is Created
    assert stopped[0].outcome is ShutdownOutcome.STOPPED
