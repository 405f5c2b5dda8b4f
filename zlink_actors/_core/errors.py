"""Typed errors: one root, one subclass per `ErrorKind`.

The tree::

    Exception
    +-- ZlinkError                      .kind: ErrorKind
    |   +-- NotFoundError               NOT_FOUND (0)
    |   +-- AlreadyExistsError          ALREADY_EXISTS (1)
    |   +-- TypeMismatchError           TYPE_MISMATCH (2)
    |   +-- NotConfiguredError          NOT_CONFIGURED (3)
    |   +-- RejectedError               REJECTED (4)
    |   +-- UnavailableError            UNAVAILABLE (5)
    |   +-- CapacityExceededError       CAPACITY_EXCEEDED (6)
    |   +-- DeadlineExceededError       DEADLINE_EXCEEDED (7)   also a TimeoutError
    |   +-- ShuttingDownError           SHUTTING_DOWN (8)
    |   +-- ProtocolError               PROTOCOL_ERROR (9)
    |   +-- InvalidOperationError       INVALID_OPERATION (10)  also a RuntimeError
    |   +-- DataLostError               DATA_LOST (11)
    |   +-- InternalFailureError        INTERNAL_FAILURE (12)
    +-- ConfigurationError              bad Host / class configuration (no kind)
    concurrent.futures.CancelledError   re-exported as CancelledError

Errors carry no retry hint (SC §14): callers branch on the type or on `.kind` (and on an
`UnavailableError`'s `.reason`, which says why), never on the message text.
"""

from __future__ import annotations

import enum
from concurrent.futures import CancelledError

__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "CapacityExceededError",
    "ConfigurationError",
    "DataLostError",
    "DeadlineExceededError",
    "ErrorKind",
    "InternalFailureError",
    "InvalidOperationError",
    "NotConfiguredError",
    "NotFoundError",
    "ProtocolError",
    "RejectedError",
    "ShuttingDownError",
    "TypeMismatchError",
    "UnavailableError",
    "UnavailableReason",
    "ZlinkError",
    "error_for_kind",
    "internal_failure",
    "shutting_down",
]


class ErrorKind(enum.IntEnum):
    """The thirteen upstream error kinds; the numbers are the same in every language."""

    NOT_FOUND = 0
    ALREADY_EXISTS = 1
    TYPE_MISMATCH = 2
    NOT_CONFIGURED = 3
    REJECTED = 4
    UNAVAILABLE = 5
    CAPACITY_EXCEEDED = 6
    DEADLINE_EXCEEDED = 7
    SHUTTING_DOWN = 8
    PROTOCOL_ERROR = 9
    INVALID_OPERATION = 10
    DATA_LOST = 11
    INTERNAL_FAILURE = 12


class ZlinkError(Exception):
    """Root of every framework error. `kind` says which of the thirteen it is."""

    kind: ErrorKind = ErrorKind.INTERNAL_FAILURE


class NotFoundError(ZlinkError):
    """The logical target (object, channel, handler) does not exist."""

    kind = ErrorKind.NOT_FOUND


class AlreadyExistsError(ZlinkError):
    """The identity or registration already exists (exclusive create)."""

    kind = ErrorKind.ALREADY_EXISTS


class TypeMismatchError(ZlinkError):
    """The existing object has a different type from the one requested."""

    kind = ErrorKind.TYPE_MISMATCH


class NotConfiguredError(ZlinkError):
    """A required role, handler or store is not configured."""

    kind = ErrorKind.NOT_CONFIGURED


class RejectedError(ZlinkError):
    """A filter, admission or policy rejected the call without a typed result."""

    kind = ErrorKind.REJECTED


class UnavailableReason(enum.Enum):
    """Why a call ended `UnavailableError`: a closed set. The values (`reason.value`) are
    the names logs and `MeshStatistics.unavailable` use, and what crosses the wire.

    Each says what a caller should do (docs/errors.md has the table): *retry* (the same
    call again, soon, maybe after a short backoff), *wait* (the condition ends by itself:
    retry after it), *fail over* (the target will not come back: use or create another).
    """

    CONNECTING = "connecting"
    """The owner or peer is known but its connection is not up yet: wait, then retry."""
    PEER_LOST = "peer_lost"
    """The peer is gone (its process ended, its connection closed, or a new lifecycle
    replaced it): fail over (its objects are re-created elsewhere once its lease
    expired)."""
    PEER_PAUSED = "peer_paused"
    """The peer went silent (paused, overloaded or cut off) past its liveness timeout but
    may come back: wait, then retry; fail over if it stays away."""
    DRAINING = "draining"
    """The peer is shutting down (draining): retry; the call goes elsewhere."""
    CLOSED = "closed"
    """The target object closed or is closing before it handled the call: retry once it
    has closed (a get-or-create makes a new one); do not retry a call whose effect must
    not repeat without checking."""
    LEASE_LAPSED = "lease_lapsed"
    """The owner's lease is missing or expired in the Location Store (it died, or lost
    the store): wait; once its lease expired, close the object and create it again,
    which places it on a live node (fail over)."""
    FENCED = "fenced"
    """The node that holds, or was chosen to hold, the object is alive but its own
    lease does not admit work (its renewals failed): wait for it to recover, or retry
    (placement goes elsewhere)."""
    QUEUE_FULL = "queue_full"
    """The remote target's queue, or this node's completion slots towards that peer, are
    full: retry later, with backoff (the target is overloaded, not gone)."""
    NOT_OWNER = "not_owner"
    """The route was stale: the node reached no longer holds the object: retry (the next
    call resolves the owner again)."""
    CONTENDED = "contended"
    """The object's Location Store record, or a lease, changed under every attempt (a
    race with other nodes): retry."""
    STORE_UNAVAILABLE = "store_unavailable"
    """The Location Store did not answer (unreachable, restarted, refused): wait, then
    retry."""
    UNREACHABLE = "unreachable"
    """A connection could not be made, kept or listened on (network, address, refused
    handshake, an HTTP server): check the address, then retry."""
    UNSPECIFIED = "unspecified"
    """No reason given (an error raised by user code, or one that crossed from an older
    peer or with a reason this version does not know)."""


class UnavailableError(ZlinkError):
    """The target existed but its route or owner is unusable, or was lost while waiting.

    `reason` (an `UnavailableReason`) says why; `UNSPECIFIED` when the raiser gave none.
    It is kept through pickling and copying, and across the mesh wire.
    """

    kind = ErrorKind.UNAVAILABLE

    def __init__(
        self, *args: object, reason: UnavailableReason = UnavailableReason.UNSPECIFIED
    ) -> None:
        super().__init__(*args)
        if not isinstance(reason, UnavailableReason):
            raise TypeError(f"reason must be an UnavailableReason, not {type(reason).__name__}")
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        # The class, its args and its attributes, rebuilt without `__init__`: a subclass
        # with another signature (`WriteOutcomeUnknownError`) pickles too.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[UnavailableError], args: tuple[object, ...], state: dict[str, object]
) -> UnavailableError:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class CapacityExceededError(ZlinkError):
    """A local bounded resource (a target's queue, for a request) is full."""

    kind = ErrorKind.CAPACITY_EXCEEDED


class DeadlineExceededError(ZlinkError, TimeoutError):
    """The operation's deadline passed before it had a result."""

    kind = ErrorKind.DEADLINE_EXCEEDED


class ShuttingDownError(ZlinkError):
    """The runtime admits no new work, or a close/shutdown ended a pending call."""

    kind = ErrorKind.SHUTTING_DOWN


class ProtocolError(ZlinkError):
    """Data, payload or reply could not be decoded, or has the wrong type."""

    kind = ErrorKind.PROTOCOL_ERROR


class InvalidOperationError(ZlinkError, RuntimeError):
    """Wrong context or state: a second terminator, an ineligible `yield_()`, a blocking
    call inside the runtime, a reentrant wait."""

    kind = ErrorKind.INVALID_OPERATION


class DataLostError(ZlinkError):
    """A relocation payload is missing or invalid."""

    kind = ErrorKind.DATA_LOST


class InternalFailureError(ZlinkError):
    """Anything else: a handler or worker raised a non-framework exception (kept as
    `__cause__`)."""

    kind = ErrorKind.INTERNAL_FAILURE


class ConfigurationError(Exception):
    """A Host option, handler registration or user class is configured wrongly.

    Raised eagerly, at construction or registration, never from a running call.
    """


_BY_KIND: dict[ErrorKind, type[ZlinkError]] = {
    cls.kind: cls
    for cls in (
        NotFoundError,
        AlreadyExistsError,
        TypeMismatchError,
        NotConfiguredError,
        RejectedError,
        UnavailableError,
        CapacityExceededError,
        DeadlineExceededError,
        ShuttingDownError,
        ProtocolError,
        InvalidOperationError,
        DataLostError,
        InternalFailureError,
    )
}


def shutting_down(before: str | None = None) -> ShuttingDownError:
    """The error of a call that shutdown refused (no argument) or ended before `before`
    happened ("the record ran", "the call finished"): one message format everywhere."""
    if before is None:
        return ShuttingDownError("the Host is shutting down")
    return ShuttingDownError(f"the Host stopped before {before}")


def internal_failure(what: str, exc: BaseException) -> InternalFailureError:
    """Wrap what user code raised (`exc`) as `InternalFailureError`, one message format
    everywhere, with `exc` as its `__cause__` (SC §3: the work itself failed)."""
    failure = InternalFailureError(f"{what} raised {type(exc).__name__}: {exc}")
    failure.__cause__ = exc
    return failure


def error_for_kind(kind: ErrorKind, message: str) -> ZlinkError:
    """Build the exception class that stands for `kind` (used where a kind crosses a wire)."""
    return _BY_KIND[ErrorKind(kind)](message)
