"""What the contract areas share beyond `zlink_actors.testing`: `NEGATIVE_WAIT`,
`ShutdownThread` and `CtrlC`.

`WAIT` (the kit's) bounds every wait that is expected to succeed. `NEGATIVE_WAIT` is the
other kind: how long a test watches for something that must *not* happen, where its
absence cannot be observed any other way (a FIFO probe, a marker behind it). A correct
runtime passes such a check whatever the value; a wrong one is caught only if it
misbehaves within it.
"""

import signal
import threading

from zlink_actors import Host, ShutdownResult
from zlink_actors.testing import WAIT

__all__ = ["NEGATIVE_WAIT", "CtrlC", "ShutdownThread"]

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
