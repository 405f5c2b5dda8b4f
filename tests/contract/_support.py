"""What the contract areas share beyond `zlink_actors.testing`: `NEGATIVE_WAIT` and
`ShutdownThread`.

`WAIT` (the kit's) bounds every wait that is expected to succeed. `NEGATIVE_WAIT` is the
other kind: how long a test watches for something that must *not* happen, where its
absence cannot be observed any other way (a FIFO probe, a marker behind it). A correct
runtime passes such a check whatever the value; a wrong one is caught only if it
misbehaves within it.
"""

import threading

from zlink_actors import Host, ShutdownResult
from zlink_actors.testing import WAIT

__all__ = ["NEGATIVE_WAIT", "ShutdownThread"]

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
