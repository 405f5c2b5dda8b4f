"""Fixtures of the Location Store conformance suite: one real redis-server for the
session (started on first use, stopped at the end, also when tests fail or are
interrupted), a server of its own for a test that stops Redis on purpose, and the
`store` factory parametrized over both providers."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from zlink_actors.location import LocationStore, MemoryLocationStore, RedisLocationStore

from ._redis_server import HOW_TO_INSTALL, RedisServer, redis_server_binary


def _new_server() -> RedisServer:
    binary = redis_server_binary()
    if binary is None:
        pytest.fail(HOW_TO_INSTALL, pytrace=False)  # never a silent skip
    server = RedisServer(binary)
    server.start()
    return server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = _new_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which it may kill, pause and restart."""
    server = _new_server()
    try:
        yield server
    finally:
        server.stop()


StoreFactory = Callable[..., LocationStore]


@pytest.fixture(params=["memory", "redis"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(provider: str, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """A factory of fresh stores of the parametrized provider, all closed at the end.

    `make_store(clock=...)` injects a clock into the memory store (ignored by Redis,
    whose clock is `TIME`); each Redis store gets a namespace of its own."""
    made: list[LocationStore] = []

    def make(clock: Callable[[], float] | None = None) -> LocationStore:
        store: LocationStore
        if provider == "memory":
            store = MemoryLocationStore(clock=clock)
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            store = RedisLocationStore(server.url, key_prefix=f"t-{uuid.uuid4().hex}")
        made.append(store)
        return store

    try:
        yield make
    finally:
        for store in made:
            store.close()
