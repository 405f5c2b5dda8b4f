"""zlink-actors: stateful, addressable Spots and Actors that talk by messages.

The public surface is what this module exports in `__all__`.
"""

from ._cancellation import CancellationRegistration as CancellationRegistration
from ._cancellation import CancellationSource as CancellationSource
from ._cancellation import CancellationToken as CancellationToken
from ._completion import Completion as Completion
from ._completion import CompletionSource as CompletionSource
from ._contexts import ActorContext as ActorContext
from ._contexts import ChannelContext as ChannelContext
from ._contexts import SpotContext as SpotContext
from ._create import ActorManager as ActorManager
from ._create import CloseCall as CloseCall
from ._create import CreateCall as CreateCall
from ._create import SpotManager as SpotManager
from ._dispatcher import DispatcherStatistics as DispatcherStatistics
from ._dispatcher import completion_dispatcher as completion_dispatcher
from ._driver import YieldAwaitable as YieldAwaitable
from ._errors import AlreadyExistsError as AlreadyExistsError
from ._errors import CancelledError as CancelledError
from ._errors import CapacityExceededError as CapacityExceededError
from ._errors import ConfigurationError as ConfigurationError
from ._errors import DataLostError as DataLostError
from ._errors import DeadlineExceededError as DeadlineExceededError
from ._errors import ErrorKind as ErrorKind
from ._errors import InternalFailureError as InternalFailureError
from ._errors import InvalidOperationError as InvalidOperationError
from ._errors import NotConfiguredError as NotConfiguredError
from ._errors import NotFoundError as NotFoundError
from ._errors import ProtocolError as ProtocolError
from ._errors import RejectedError as RejectedError
from ._errors import ShuttingDownError as ShuttingDownError
from ._errors import TypeMismatchError as TypeMismatchError
from ._errors import UnavailableError as UnavailableError
from ._errors import ZlinkError as ZlinkError
from ._handlers import handler as handler
from ._host import Host as Host
from ._host import HostStatistics as HostStatistics
from ._membership import JoinCall as JoinCall
from ._membership import LeaveCall as LeaveCall
from ._messaging import RequestCall as RequestCall
from ._messaging import SendCall as SendCall
from ._multicast import PublishCall as PublishCall
from ._multicast import PublisherStatistics as PublisherStatistics
from ._objects import Actor as Actor
from ._objects import ActorRef as ActorRef
from ._objects import ChannelHandler as ChannelHandler
from ._objects import CloseReason as CloseReason
from ._objects import Created as Created
from ._objects import Existing as Existing
from ._objects import InstanceSpot as InstanceSpot
from ._objects import JoinResult as JoinResult
from ._objects import Rejected as Rejected
from ._objects import Spot as Spot
from ._objects import SpotConfig as SpotConfig
from ._objects import SpotMode as SpotMode
from ._objects import SpotRef as SpotRef
from ._operation import OperationId as OperationId
from ._operation import ReplyRouteId as ReplyRouteId
from ._scheduler import PoolStatistics as PoolStatistics
from ._spot_timers import OverrunPolicy as OverrunPolicy
from ._spot_timers import TimerSet as TimerSet
from ._spot_timers import TimerTick as TimerTick
from ._state import HostState as HostState
from ._state import ShutdownOutcome as ShutdownOutcome
from ._state import ShutdownResult as ShutdownResult
from ._timer import Clock as Clock
from ._timer import Deadline as Deadline
from ._timer import ManualClock as ManualClock
from ._timer import SystemClock as SystemClock
from ._timer import TimerStatistics as TimerStatistics
from ._workers import CpuPoolStatistics as CpuPoolStatistics
from ._workers import CpuWorkerCall as CpuWorkerCall
from ._workers import IoStatistics as IoStatistics
from ._workers import IoWorkerCall as IoWorkerCall

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
    "DataLostError",
    "Deadline",
    "DeadlineExceededError",
    "DispatcherStatistics",
    "ErrorKind",
    "Existing",
    "Host",
    "HostState",
    "HostStatistics",
    "InstanceSpot",
    "InternalFailureError",
    "InvalidOperationError",
    "IoStatistics",
    "IoWorkerCall",
    "JoinCall",
    "JoinResult",
    "LeaveCall",
    "ManualClock",
    "NotConfiguredError",
    "NotFoundError",
    "OperationId",
    "OverrunPolicy",
    "PoolStatistics",
    "ProtocolError",
    "PublishCall",
    "PublisherStatistics",
    "Rejected",
    "RejectedError",
    "ReplyRouteId",
    "RequestCall",
    "SendCall",
    "ShutdownOutcome",
    "ShutdownResult",
    "ShuttingDownError",
    "Spot",
    "SpotConfig",
    "SpotContext",
    "SpotManager",
    "SpotMode",
    "SpotRef",
    "SystemClock",
    "TimerSet",
    "TimerStatistics",
    "TimerTick",
    "TypeMismatchError",
    "UnavailableError",
    "YieldAwaitable",
    "ZlinkError",
    "completion_dispatcher",
    "handler",
]
