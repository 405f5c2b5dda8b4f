"""Host lifecycle states and the shutdown result."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["HostState", "ShutdownOutcome", "ShutdownReason", "ShutdownResult"]


class HostState(enum.Enum):
    """Where a Host is in its life: PREPARING -> SERVING -> DRAINING -> STOPPED."""

    PREPARING = "preparing"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


class ShutdownOutcome(enum.Enum):
    """How a shutdown ended."""

    #: Every accepted record, callback and worker finished within the deadline.
    STOPPED = "stopped"
    #: The deadline passed: pending calls got `ShuttingDownError`, stuck threads were
    #: abandoned (they are daemons and end when their user code returns).
    FORCE_STOPPED = "force_stopped"


class ShutdownReason(enum.Enum):
    """Why a Host shut down."""

    #: `Host.shutdown()` was called (also by the `with` block's end).
    REQUESTED = "requested"
    #: `MeshConfig(on_lease_lost="shutdown")`: the node's owner lease was lost (expired
    #: or gone from the Location Store), and the Host shut itself down so that a
    #: supervisor restarts it (docs/mesh.md "Owner leases").
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True, slots=True)
class ShutdownResult:
    """What `Host.shutdown()` returns. The runtime makes it; do not construct it yourself.

    Attributes:
        outcome: `STOPPED` if accepted work, every pending call and every `on_closing`
            finished within the deadline, the completion dispatcher drained and the
            Host's threads ended; otherwise `FORCE_STOPPED`.
        forced_operations: calls still pending at the deadline, which the shutdown
            completed with `ShuttingDownError`.
        abandoned_threads: Host threads (application pool, CPU pool, I/O loop) still
            alive when `shutdown()` returned, normally because they are inside user code.
            They are daemon threads; each ends when its user code returns.
        callbacks_pending: completion callbacks still queued on the process-shared
            dispatcher when `shutdown()` returned, because it did not drain in time
            (0 when it drained). They may belong to other Hosts, and they still run: the
            dispatcher outlives the Host.
        reason: why the Host shut down (`ShutdownReason`): `REQUESTED` unless it shut
            itself down.
    """

    outcome: ShutdownOutcome
    forced_operations: int = 0
    abandoned_threads: int = 0
    callbacks_pending: int = 0
    reason: ShutdownReason = ShutdownReason.REQUESTED
