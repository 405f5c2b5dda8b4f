"""What the contract areas share beyond `zlink_actors.testing`: `NEGATIVE_WAIT`,
`ShutdownThread`, `CtrlC` and `blocked_in_a_wait`.

`WAIT` (the kit's) bounds every wait that is expected to succeed. `NEGATIVE_WAIT` is the
other kind: how long a test watches for something that must *not* happen, where its
absence cannot be observed any other way (a FIFO probe, a marker behind it). A correct
runtime passes such a check whatever the value; a wrong one is caught only if it
misbehaves within it.
"""

import linecache
import signal
import sys
import threading
from collections.abc import Callable

from zlink_actors import Host, ShutdownResult
from zlink_actors.testing import WAIT

__all__ = ["NEGATIVE_WAIT", "CtrlC", "ShutdownThread", "blocked_in_a_wait"]

#: How long a test watches for something that must not happen.
NEGATIVE_WAIT = 0.2


class ShutdownThread:
    """Runs `host.shutdown(deadline)` on its own thread so the test can watch it drain.

    `returned` is set once `shutdown()` returned, with its result in `result`. The thread
    is a daemon: a shutdown that never returns fails the test and does not keep the
    process alive.
    """

    def __init__(self, host: Host, deadline: float) -> None:
        self.result: ShutdownResult | None = None
        self.returned = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(host, deadline), daemon=True)
        self._thread.start()

    def _run(self, host: Host, deadline: float) -> None:
        self.result = host.shutdown(deadline=deadline)
        self.returned.set()

    def join(self) -> ShutdownResult:
        """Wait for `shutdown()` to return (bounded, asserted) and return its result."""
        assert self.returned.wait(WAIT + 5), "shutdown did not return"
        self._thread.join(WAIT)
        assert self.result is not None
        return self.result


class CtrlC:
    """Ctrl-C for the main thread: a real SIGINT, which wakes a blocked lock wait
    (`_thread.interrupt_main()` only sets the flag, and a blocked wait notices that only
    when it ends). Install `handle` as the SIGINT handler (with the suite's
    `default_sigint` fixture around the test), then `send` from another thread.

    A signal that lands after the caller released the GIL but before its wait began is
    noticed only when that wait ends too, so `send` repeats the signal until the handler
    has run; the handler raises `KeyboardInterrupt` once and ignores the repeats.
    """

    def __init__(self) -> None:
        self.raised = threading.Event()
        self.signals = 0

    def handle(self, signum: int, frame: object) -> None:
        if not self.raised.is_set():
            self.raised.set()
            raise KeyboardInterrupt

    def send(self, thread_id: int) -> None:
        while self.signals * 0.05 < WAIT:
            signal.pthread_kill(thread_id, signal.SIGINT)
            self.signals += 1
            if self.raised.wait(0.05):
                return


def blocked_in_a_wait(thread_id: int) -> Callable[[], bool]:
    """A predicate for `wait_until`: True once the thread's innermost Python frame is at a
    lock's `acquire(...)` or a `wait(...)`, and still at the same place one poll later
    (a thread blocked there, not one passing by)."""
    last: list[tuple[int, int]] = []

    def blocked() -> bool:
        frame = sys._current_frames().get(thread_id)
        if frame is None:
            return False
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        here = (id(frame), frame.f_lineno)
        if "acquire(" not in line and "wait(" not in line:
            last.clear()
            return False
        if last and last[0] == here:
            return True
        last[:] = [here]
        return False

    return blocked
