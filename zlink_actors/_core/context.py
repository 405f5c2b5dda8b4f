"""The runtime-context marker: which framework domain the current code runs in.

It lives in a `ContextVar`, never in thread identity (digest §4, "Cores, not Spots"):
consecutive turns of one owner may run on different threads, and one thread serves many
owners. Code that must not block (a handler turn, a completion callback, a worker) runs
with a marker set; blocking observation checks it and fails fast.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from .errors import InvalidOperationError

__all__ = [
    "CallbackPoster",
    "RuntimeContext",
    "current",
    "forbid_blocking",
    "runtime_var",
]

#: Hands a done-callback to an owner so it runs as a record under that owner's gate.
CallbackPoster = Callable[[Callable[[Any], object], Any], None]


class RuntimeContext:
    """Marker for code running inside the framework; subclasses add what they carry."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def callback_poster(self) -> CallbackPoster | None:
        """Where done-callbacks added in this context run; `None` means the dispatcher."""
        return None

    def __repr__(self) -> str:
        return f"<RuntimeContext {self.kind}>"


runtime_var: ContextVar[RuntimeContext | None] = ContextVar("zlink_actors_runtime", default=None)
current = runtime_var.get


def forbid_blocking(what: str) -> None:
    """Raise `InvalidOperationError` if the caller runs inside any runtime context.

    SC §4 F2-a: a blocking wait on a runtime thread would hold a gate (or the only
    dispatcher lane) while waiting for work that needs it.
    """
    ctx = runtime_var.get()
    if ctx is not None:
        raise InvalidOperationError(
            f"{what} blocks the calling thread and is not allowed inside a {ctx.kind}; "
            "use `await` on the Completion (or `yield_()` where eligible) instead"
        )
