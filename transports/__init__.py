"""The network layer over pyzmq: one I/O thread per transport, byte credit per peer, and
submit results where a message is admitted, waits, or fails, and is never dropped.

See docs/transports.md. This package never imports `zlink_actors`.
"""

from ._errors import Closed as Closed
from ._errors import InvalidRelease as InvalidRelease
from ._errors import MalformedFrame as MalformedFrame
from ._errors import PayloadTooLarge as PayloadTooLarge
from ._errors import PeerLost as PeerLost
from ._errors import TransportError as TransportError
from ._errors import TransportUsageError as TransportUsageError
from ._errors import UnknownPeer as UnknownPeer
from ._errors import Withdrawn as Withdrawn
from ._logs import RateLimitedLog as RateLimitedLog
from ._transport import Transport as Transport
from ._types import CurveConfig as CurveConfig
from ._types import Endpoints as Endpoints
from ._types import FlowState as FlowState
from ._types import Inbound as Inbound
from ._types import InboundKind as InboundKind
from ._types import PeerEvent as PeerEvent
from ._types import PeerEventKind as PeerEventKind
from ._types import PeerStatistics as PeerStatistics
from ._types import SubmitResult as SubmitResult
from ._types import SubmitStatus as SubmitStatus
from ._types import TransportConfig as TransportConfig
from ._types import TransportStatistics as TransportStatistics

__all__ = [
    "Closed",
    "CurveConfig",
    "Endpoints",
    "FlowState",
    "Inbound",
    "InboundKind",
    "InvalidRelease",
    "MalformedFrame",
    "PayloadTooLarge",
    "PeerEvent",
    "PeerEventKind",
    "PeerLost",
    "PeerStatistics",
    "RateLimitedLog",
    "SubmitResult",
    "SubmitStatus",
    "Transport",
    "TransportConfig",
    "TransportError",
    "TransportStatistics",
    "TransportUsageError",
    "UnknownPeer",
    "Withdrawn",
]
