"""The Location Store tier: the SPI, the memory and Redis providers, authority records,
node descriptors and lease mechanics (docs/location.md). Imports only `_core`."""

from .authority import Authority as Authority
from .authority import AuthorityKind as AuthorityKind
from .authority import AuthorityRecord as AuthorityRecord
from .authority import AuthorityState as AuthorityState
from .authority import OwnerFence as OwnerFence
from .generations import MAX_GENERATION as MAX_GENERATION
from .generations import GenerationExhausted as GenerationExhausted
from .generations import GenerationExhaustedError as GenerationExhaustedError
from .lease import LeaseConfig as LeaseConfig
from .lease import LeaseGrant as LeaseGrant
from .lease import OwnerLease as OwnerLease
from .lease import admission_deadline as admission_deadline
from .memory import MemoryLocationStore as MemoryLocationStore
from .nodes import NodeDescriptor as NodeDescriptor
from .nodes import NodeDescriptorState as NodeDescriptorState
from .nodes import list_nodes as list_nodes
from .nodes import publish_node as publish_node
from .nodes import withdraw_node as withdraw_node
from .redis_store import RedisLocationStore as RedisLocationStore
from .spi import Committed as Committed
from .spi import Conflict as Conflict
from .spi import Delete as Delete
from .spi import Found as Found
from .spi import IfMissing as IfMissing
from .spi import IfVersion as IfVersion
from .spi import LocationStore as LocationStore
from .spi import Missing as Missing
from .spi import Put as Put
from .spi import ScanExpiredError as ScanExpiredError
from .spi import ScanPage as ScanPage
from .spi import WriteDeadlineExceededError as WriteDeadlineExceededError
from .spi import WriteOutcomeUnknownError as WriteOutcomeUnknownError

__all__ = [
    "Authority",
    "AuthorityKind",
    "AuthorityRecord",
    "AuthorityState",
    "Committed",
    "Conflict",
    "Delete",
    "Found",
    "GenerationExhausted",
    "GenerationExhaustedError",
    "IfMissing",
    "IfVersion",
    "LeaseConfig",
    "LeaseGrant",
    "LocationStore",
    "MAX_GENERATION",
    "MemoryLocationStore",
    "Missing",
    "NodeDescriptor",
    "NodeDescriptorState",
    "OwnerFence",
    "OwnerLease",
    "Put",
    "RedisLocationStore",
    "ScanExpiredError",
    "ScanPage",
    "WriteDeadlineExceededError",
    "WriteOutcomeUnknownError",
    "admission_deadline",
    "list_nodes",
    "publish_node",
    "withdraw_node",
]
