"""`@handler` and the per-class dispatch table.

A handler is a method `(self, ctx, msg: MsgType) -> ReplyType`, plain or `async def`.
Dispatch is by the annotated message type; the return annotation is the reply type. The
table is built once per class, at registration, so every mistake is a
`ConfigurationError` before anything runs.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from .._core.errors import ConfigurationError

__all__ = ["HandlerInfo", "HandlerTable", "handler"]

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__zlink_handler__"
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def handler(fn: F) -> F:
    """Mark a method as the handler for the type of its message parameter.

    The method takes `(self, ctx, msg)`, positionally; `msg` must be annotated with a
    class, which is what the method handles. The return annotation is the reply type
    (`None` for one-way use). It may be `async def`: then `await` on a call keeps the
    turn, and `await call.yield_()` releases the gate where eligible. A generator (plain
    or async) is refused when the class is registered (`ConfigurationError`).
    """
    if not callable(fn):
        raise TypeError("@handler decorates a method")
    setattr(fn, _MARK, True)
    return fn


class HandlerInfo:
    """One registered handler."""

    __slots__ = ("fn", "is_async", "msg_type", "name", "reply_type")

    def __init__(
        self, fn: Callable[..., Any], msg_type: type, reply_type: Any, is_async: bool
    ) -> None:
        self.fn = fn
        self.msg_type = msg_type
        self.reply_type = reply_type
        self.is_async = is_async
        self.name = fn.__qualname__


class HandlerTable:
    """Message type -> handler for one user class."""

    __slots__ = ("_by_type", "_cache")

    def __init__(self, by_type: dict[type, HandlerInfo]) -> None:
        self._by_type = by_type
        self._cache: dict[type, HandlerInfo | None] = dict(by_type)

    def find(self, msg_type: type) -> HandlerInfo | None:
        """The handler for `msg_type`, or for its nearest registered base class."""
        try:
            return self._cache[msg_type]
        except KeyError:
            pass
        found = None
        for base in msg_type.__mro__[1:]:
            found = self._by_type.get(base)
            if found is not None:
                break
        self._cache[msg_type] = found
        return found

    def __len__(self) -> int:
        return len(self._by_type)

    def types(self) -> list[type]:
        return list(self._by_type)

    def handlers(self) -> list[HandlerInfo]:
        return list(self._by_type.values())

    @classmethod
    def build(cls, owner_cls: type) -> HandlerTable:
        """Collect the `@handler` methods of `owner_cls` and its bases.

        Raises:
            ConfigurationError: a handler is a generator, does not take exactly
                `(self, ctx, msg)` positionally, lacks the message or the return
                annotation, its message annotation is not a class, or two handlers take
                the same message type.
        """
        by_type: dict[type, HandlerInfo] = {}
        seen: set[str] = set()
        for klass in owner_cls.__mro__:
            for name, fn in vars(klass).items():
                if name in seen or not getattr(fn, _MARK, False):
                    continue
                seen.add(name)
                info = _inspect(owner_cls, fn)
                other = by_type.get(info.msg_type)
                if other is not None:
                    raise ConfigurationError(
                        f"{owner_cls.__qualname__}: {other.name} and {info.name} both "
                        f"handle {info.msg_type.__qualname__}"
                    )
                by_type[info.msg_type] = info
        return cls(by_type)


def _inspect(owner_cls: type, fn: Callable[..., Any]) -> HandlerInfo:
    where = f"{owner_cls.__qualname__}.{fn.__name__}"
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        # Calling it would only make a generator: the handler's body would never run.
        raise ConfigurationError(
            f"{where} is a generator; a handler is a plain or an async def method that "
            "returns its reply"
        )
    params = list(inspect.signature(fn).parameters.values())
    if len(params) != 3:
        raise ConfigurationError(f"{where} must take (self, ctx, msg), got {len(params)} params")
    for param in params:
        if param.kind not in _POSITIONAL:
            # The runtime calls fn(instance, ctx, msg): each must take a positional value.
            raise ConfigurationError(
                f"{where} must take (self, ctx, msg) positionally; {param.name!r} is "
                f"{param.kind.description}"
            )
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigurationError(f"{where}: cannot resolve annotations: {exc}") from exc
    msg_name = params[2].name
    if msg_name not in hints:
        raise ConfigurationError(f"{where}: the message parameter {msg_name!r} needs a type")
    msg_type = hints[msg_name]
    if not isinstance(msg_type, type):
        raise ConfigurationError(
            f"{where}: the message annotation must be a class, got {msg_type!r}"
        )
    if "return" not in hints:
        raise ConfigurationError(f"{where}: the return annotation (the reply type) is missing")
    reply = hints["return"]
    if reply is type(None):
        reply = None
    return HandlerInfo(fn, msg_type, reply, inspect.iscoroutinefunction(fn))
