"""The HTTP client tier (seed HX §5; docs/http.md): named aiohttp clients on the Host's
I/O executor, called from handlers with the framework's turn rules.

It imports `_calls`, `_engine` and `_core` only, and nothing below it imports it: the
Host plugs it in through the tier-services seam (`HTTP_CLIENTS`).
"""

from .call import HttpCall
from .client import HttpClient
from .config import HttpClientConfig
from .hosted import HostScheduler, HttpClients
from .response import HttpResponse, HttpStatusError
from .scheduler import CompletionScheduler, LoopScheduler

__all__ = [
    "CompletionScheduler",
    "HostScheduler",
    "HttpCall",
    "HttpClient",
    "HttpClientConfig",
    "HttpClients",
    "HttpResponse",
    "HttpStatusError",
    "LoopScheduler",
]
