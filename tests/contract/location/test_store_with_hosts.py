"""One store shared by two Hosts, called on each Host's I/O executor loop
(`run_io_worker`), as the tiers above will call it; a Host's shutdown releases the
connections its loop opened, and the store outlives both Hosts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

import zlink_actors as z
from zlink_actors.location import Committed, Found, IfMissing, Put

from ._redis_server import RedisServer
from .conftest import StoreFactory


def test_two_hosts_share_one_store_through_their_io_executors(make_store: StoreFactory) -> None:
    store = make_store()
    with z.Host() as one, z.Host() as two:

        async def claim(_token: z.CancellationToken) -> Any:
            return await store.write([IfMissing("owner")], [Put("owner", b"one")])

        async def look(_token: z.CancellationToken) -> Any:
            return await store.read("owner")

        assert isinstance(one.run_io_worker(claim).submit_sync(), Committed)
        found = two.run_io_worker(look).submit_sync()
        assert isinstance(found, Found)
        assert found.value == b"one"
    # both Hosts are gone; the store they were given still works
    again = asyncio.run(store.read("owner"))
    assert isinstance(again, Found)


def test_host_shutdown_releases_the_connections_of_its_loop(own_redis: RedisServer) -> None:
    store = z.RedisLocationStore(own_redis.url, key_prefix="hosts")
    probe = redis.Redis(host="127.0.0.1", port=own_redis.port)

    def others() -> int:
        return int(probe.info("clients")["connected_clients"]) - 1

    try:
        with z.Host() as host:

            async def read(_token: z.CancellationToken) -> Any:
                return await store.read("k")

            host.run_io_worker(read).submit_sync()
            assert others() == 1
        deadline = time.monotonic() + 10
        while others() != 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a condition, bounded by the deadline
        assert others() == 0
    finally:
        store.close()
        probe.close()
    with pytest.raises(z.ShuttingDownError):
        asyncio.run(store.read("k"))
