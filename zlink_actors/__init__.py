"""zlink-actors: stateful, addressable Spots and Actors that talk by messages.

The public surface is what this module exports in `__all__`.
"""

from ._calls.contexts import ActorContext as ActorContext
from ._calls.contexts import ChannelContext as ChannelContext
from ._calls.contexts import NodeContext as NodeContext
from ._calls.contexts import SpotContext as SpotContext
from ._calls.create import ActorManager as ActorManager
from ._calls.create import CloseCall as CloseCall
from ._calls.create import CreateCall as CreateCall
from ._calls.create import SpotManager as SpotManager
from ._calls.membership import JoinCall as JoinCall
from ._calls.membership import LeaveCall as LeaveCall
from ._calls.messaging import RequestCall as RequestCall
from ._calls.messaging import SendCall as SendCall
from ._calls.publish import PublishCall as PublishCall
from ._calls.workers import CpuWorkerCall as CpuWorkerCall
from ._calls.workers import IoWorkerCall as IoWorkerCall
from ._core.cancellation import CancellationRegistration as CancellationRegistration
from ._core.cancellation import CancellationSource as CancellationSource
from ._core.cancellation import CancellationToken as CancellationToken
from ._core.clock import Clock as Clock
from ._core.clock import Deadline as Deadline
from ._core.clock import ManualClock as ManualClock
from ._core.clock import SystemClock as SystemClock
from ._core.clock import TimerStatistics as TimerStatistics
from ._core.completion import Completion as Completion
from ._core.completion import CompletionSource as CompletionSource
from ._core.dispatcher import DispatcherStatistics as DispatcherStatistics
from ._core.dispatcher import completion_dispatcher as completion_dispatcher
from ._core.errors import AlreadyExistsError as AlreadyExistsError
from ._core.errors import CancelledError as CancelledError
from ._core.errors import CapacityExceededError as CapacityExceededError
from ._core.errors import ConfigurationError as ConfigurationError
from ._core.errors import DataLostError as DataLostError
from ._core.errors import DeadlineExceededError as DeadlineExceededError
from ._core.errors import ErrorKind as ErrorKind
from ._core.errors import InternalFailureError as InternalFailureError
from ._core.errors import InvalidOperationError as InvalidOperationError
from ._core.errors import NotConfiguredError as NotConfiguredError
from ._core.errors import NotFoundError as NotFoundError
from ._core.errors import ProtocolError as ProtocolError
from ._core.errors import RejectedError as RejectedError
from ._core.errors import ShuttingDownError as ShuttingDownError
from ._core.errors import TypeMismatchError as TypeMismatchError
from ._core.errors import UnavailableError as UnavailableError
from ._core.errors import UnavailableReason as UnavailableReason
from ._core.errors import ZlinkError as ZlinkError
from ._core.pending import OperationId as OperationId
from ._core.pending import ReplyRouteId as ReplyRouteId
from ._core.pool import PoolStatistics as PoolStatistics
from ._core.state import HostState as HostState
from ._core.state import ShutdownOutcome as ShutdownOutcome
from ._core.state import ShutdownReason as ShutdownReason
from ._core.state import ShutdownResult as ShutdownResult
from ._core.workers import CpuPoolStatistics as CpuPoolStatistics
from ._core.workers import IoStatistics as IoStatistics
from ._engine.driver import YieldAwaitable as YieldAwaitable
from ._engine.handlers import handler as handler
from ._engine.multicast import PublisherStatistics as PublisherStatistics
from ._engine.objects import Actor as Actor
from ._engine.objects import ActorRef as ActorRef
from ._engine.objects import ChannelHandler as ChannelHandler
from ._engine.objects import CloseReason as CloseReason
from ._engine.objects import Created as Created
from ._engine.objects import Existing as Existing
from ._engine.objects import InstanceSpot as InstanceSpot
from ._engine.objects import JoinResult as JoinResult
from ._engine.objects import NodeHandler as NodeHandler
from ._engine.objects import Rejected as Rejected
from ._engine.objects import Spot as Spot
from ._engine.objects import SpotConfig as SpotConfig
from ._engine.objects import SpotMode as SpotMode
from ._engine.objects import SpotRef as SpotRef
from ._engine.spot_timers import OverrunPolicy as OverrunPolicy
from ._engine.spot_timers import TimerSet as TimerSet
from ._engine.spot_timers import TimerTick as TimerTick
from ._host import Host as Host
from ._host import HostStatistics as HostStatistics
from .http.call import HttpCall as HttpCall
from .http.client import HttpClient as HttpClient
from .http.config import HttpClientConfig as HttpClientConfig
from .http.response import HttpResponse as HttpResponse
from .http.response import HttpStatusError as HttpStatusError
from .location import LeaseConfig as LeaseConfig
from .location import MemoryLocationStore as MemoryLocationStore
from .location import RedisLocationStore as RedisLocationStore
from .mesh import ChannelServer as ChannelServer
from .mesh import CurveConfig as CurveConfig
from .mesh import MeshConfig as MeshConfig
from .mesh import MeshStatistics as MeshStatistics
from .mesh import NodeInfo as NodeInfo
from .mesh import PeerInfo as PeerInfo
from .mesh import PeerState as PeerState
from .mesh import StateChange as StateChange
from .mesh import StateChangeKind as StateChangeKind

__all__ = [
    "Actor",
    "ActorContext",
    "ActorManager",
    "ActorRef",
    "AlreadyExistsError",
    "CancellationRegistration",
    "CancellationSource",
    "CancellationToken",
    "CancelledError",
    "CapacityExceededError",
    "ChannelContext",
    "ChannelHandler",
    "ChannelServer",
    "Clock",
    "CloseCall",
    "CloseReason",
    "Completion",
    "CompletionSource",
    "ConfigurationError",
    "CpuPoolStatistics",
    "CpuWorkerCall",
    "CreateCall",
    "Created",
    "CurveConfig",
    "DataLostError",
    "Deadline",
    "DeadlineExceededError",
    "DispatcherStatistics",
    "ErrorKind",
    "Existing",
    "Host",
    "HostState",
    "HostStatistics",
    "HttpCall",
    "HttpClient",
    "HttpClientConfig",
    "HttpResponse",
    "HttpStatusError",
    "InstanceSpot",
    "InternalFailureError",
    "InvalidOperationError",
    "IoStatistics",
    "IoWorkerCall",
    "JoinCall",
    "JoinResult",
    "LeaseConfig",
    "LeaveCall",
    "ManualClock",
    "MemoryLocationStore",
    "MeshConfig",
    "MeshStatistics",
    "NodeContext",
    "NodeHandler",
    "NodeInfo",
    "NotConfiguredError",
    "NotFoundError",
    "OperationId",
    "OverrunPolicy",
    "PeerInfo",
    "PeerState",
    "PoolStatistics",
    "ProtocolError",
    "PublishCall",
    "PublisherStatistics",
    "RedisLocationStore",
    "Rejected",
    "RejectedError",
    "ReplyRouteId",
    "RequestCall",
    "SendCall",
    "ShutdownOutcome",
    "ShutdownReason",
    "ShutdownResult",
    "ShuttingDownError",
    "Spot",
    "SpotConfig",
    "SpotContext",
    "SpotManager",
    "SpotMode",
    "SpotRef",
    "StateChange",
    "StateChangeKind",
    "SystemClock",
    "TimerSet",
    "TimerStatistics",
    "TimerTick",
    "TypeMismatchError",
    "UnavailableError",
    "UnavailableReason",
    "YieldAwaitable",
    "ZlinkError",
    "completion_dispatcher",
    "handler",
]
