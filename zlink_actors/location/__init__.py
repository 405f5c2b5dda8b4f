"""The Location Store tier: the SPI, the memory and Redis providers, authority records,
node descriptors and lease mechanics (docs/location.md). Imports only `_core`."""

from .memory import MemoryLocationStore as MemoryLocationStore
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
from .spi import WriteOutcomeUnknownError as WriteOutcomeUnknownError

__all__ = [
    "Committed",
    "Conflict",
    "Delete",
    "Found",
    "IfMissing",
    "IfVersion",
    "LocationStore",
    "MemoryLocationStore",
    "Missing",
    "Put",
    "RedisLocationStore",
    "ScanExpiredError",
    "ScanPage",
    "WriteOutcomeUnknownError",
]
