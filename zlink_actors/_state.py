"""Host lifecycle states and the shutdown result."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["HostState", "ShutdownOutcome", "ShutdownResult"]


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


@dataclass(frozen=True, slots=True)
class ShutdownResult:
    """What `Host.shutdown()` returns.

    Attributes:
        outcome: `STOPPED` or `FORCE_STOPPED`.
        forced_operations: pending calls completed with `ShuttingDownError` at the deadline.
        abandoned_threads: runtime threads still inside user code when shutdown returned.
        callbacks_pending: completion callbacks that had not run when shutdown returned
            (the process-shared dispatcher was busy past the deadline).
    """

    outcome: ShutdownOutcome
    forced_operations: int = 0
    abandoned_threads: int = 0
    callbacks_pending: int = 0
