"""The errors of the transport layer: one root, one subclass per failure.

`transports` does not know the framework's `ErrorKind`; the mesh maps this tree to
`ZlinkError` in one place. Usage errors (bad arguments) stay distinguishable from
operational failures (a peer lost, the transport closed)::

    TransportError
    ├── TransportUsageError        the caller passed something invalid (also ValueError)
    │   ├── UnknownPeer            no connection to that peer name (ROUTER_MANDATORY)
    │   ├── PayloadTooLarge        frames above `TransportConfig.max_message_size`
    │   └── InvalidRelease         release() of more bytes than were delivered
    ├── PeerLost                   the peer was lost (heartbeat, disconnect, send failure)
    ├── Closed                     the transport was closed
    ├── Withdrawn                  its owner took a parked message back before it went
    └── MalformedFrame             an envelope that does not decode (counted, then dropped)
"""

from __future__ import annotations

__all__ = [
    "Closed",
    "InvalidRelease",
    "MalformedFrame",
    "PayloadTooLarge",
    "PeerLost",
    "TransportError",
    "TransportUsageError",
    "UnknownPeer",
    "Withdrawn",
]


class TransportError(Exception):
    """Root of every error the transport layer raises or sets on a future."""


class TransportUsageError(TransportError, ValueError):
    """The caller passed an invalid argument; nothing was accepted."""


class UnknownPeer(TransportUsageError):
    """No connection exists to the named peer, so a send could only be a silent drop."""


class PayloadTooLarge(TransportUsageError):
    """The frames exceed the configured maximum message size."""


class InvalidRelease(TransportUsageError):
    """`release()` returned more bytes than the peer's delivered, unreleased ones."""


class PeerLost(TransportError):
    """The peer was lost: what was parked for it will never be admitted.

    `silent` is True when it was lost because it went silent (`PeerEvent.silent`).
    """

    silent: bool = False


class _SilentPeerLost(PeerLost):
    """A `PeerLost` of a peer that went silent (made by the I/O thread only)."""

    silent = True


class Closed(TransportError):
    """The transport is closed: nothing more is admitted."""


class Withdrawn(TransportError):
    """Set on a parked message's future when its owner withdrew it: it was never sent."""


class MalformedFrame(TransportError):
    """An envelope frame that does not decode: truncated, garbage, or a wrong version."""
