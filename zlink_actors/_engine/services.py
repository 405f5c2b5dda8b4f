"""Tier services: what the Host was configured with, found by typed key.

The engine and the call surface never import a tier (the RouteMesh node, the named HTTP
clients) or anything built above them. `_host.py` provides each service under a
`ServiceKey` when it builds the Host; a context looks it up by the same key
(`ctx.spots` finds the Host's `SpotManager` this way; `ctx.http(name)` and `ctx.node`
will too). A key is typed, so what `get` returns is typed.
"""

from __future__ import annotations

from typing import Generic, TypeVar, cast

from .._core.errors import NotConfiguredError

__all__ = ["ServiceKey", "Services"]

T = TypeVar("T")


class ServiceKey(Generic[T]):
    """The name of one service, and (for the type checker) its type."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ServiceKey({self.name!r})"


class Services:
    """The services of one Host. Filled while the Host is built, read-only afterwards."""

    __slots__ = ("_items", "_sealed")

    def __init__(self) -> None:
        self._items: dict[ServiceKey[object], object] = {}
        self._sealed = False

    def provide(self, key: ServiceKey[T], service: T) -> None:
        """Register `service` under `key`; a key is provided once, before `seal()`."""
        if self._sealed:
            raise ValueError(f"{key.name}: the services of this Host are sealed")
        if key in self._items:
            raise ValueError(f"{key.name} is already provided")
        self._items[key] = service  # type: ignore[index]

    def get(self, key: ServiceKey[T]) -> T:
        """The service under `key`.

        Raises:
            NotConfiguredError: the Host was not configured with it.
        """
        try:
            return cast(T, self._items[key])  # type: ignore[index]
        except KeyError:
            raise NotConfiguredError(f"{key.name} is not configured on this Host") from None

    def seal(self) -> None:
        """The Host is built: no service is provided from now on."""
        self._sealed = True

    def __contains__(self, key: object) -> bool:
        return key in self._items
