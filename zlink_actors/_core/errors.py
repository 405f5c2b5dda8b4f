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

Errors carry no retry hint (SC §14): callers branch on the type or on `.kind`, never on
the message text.
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
    """Why a call ended `UnavailableError`: a closed set, the same names in logs and
    statistics. Each says what a caller should do (docs/errors.md has the table)."""

    CONNECTING = "connecting"
    """The owner or peer is known but its connection is not up yet: wait, then retry."""
    PEER_LOST = "peer_lost"
    """The peer is gone (killed, expired, replaced by a new lifecycle): fail over."""
    PEER_PAUSED = "peer_paused"
    """The peer went silent but may come back within `peer_expiry`: wait, then retry."""
    DRAINING = "draining"
    """The peer or object is shutting down or closing: retry; it goes elsewhere."""
    LEASE_LAPSED = "lease_lapsed"
    """The owner holds no admitting lease: wait (it recovers) or fail over."""
    FENCED = "fenced"
    """This node's own lease is not admitting: wait for it to recover."""
    QUEUE_FULL = "queue_full"
    """The remote target's queue, or the slots towards that peer, are full: retry later."""
    NOT_OWNER = "not_owner"
    """The route was stale (the node no longer holds the object): retry, it resolves again."""
    STORE_UNAVAILABLE = "store_unavailable"
    """The Location Store did not answer, or its records kept changing: retry."""
    UNREACHABLE = "unreachable"
    """A connection could not be made or listened on (network, address): fix, then retry."""
    UNSPECIFIED = "unspecified"
    """No reason given (an error raised by user code, or by an older peer)."""


class UnavailableError(ZlinkError):
    """The target existed but its route or owner is unusable, or was lost while waiting.

    `reason` (an `UnavailableReason`) says why; `UNSPECIFIED` when the raiser gave none.
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
        return (_unavailable, (self.args, self.reason))


def _unavailable(args: tuple[object, ...], reason: UnavailableReason) -> UnavailableError:
    return UnavailableError(*args, reason=reason)


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
