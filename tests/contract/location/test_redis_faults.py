"""The Redis provider under faults, each on a redis-server of the test's own: a Redis
killed and restarted in the middle of a run, a lost write result, a paused server past
`operation_timeout`, a flushed script cache, more callers than connections, and
compare-and-set from two processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import redis

from zlink_actors import (
    ConfigurationError,
    DeadlineExceededError,
    ShuttingDownError,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.location import (
    Committed,
    Conflict,
    Found,
    IfVersion,
    Missing,
    Put,
    RedisLocationStore,
    ScanExpiredError,
    WriteDeadlineExceededError,
    WriteOutcomeUnknownError,
    scripts,
)
from zlink_actors.location.redis_store import MAX_CONNECTIONS

from ._redis_server import RedisServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _wait_until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)  # polling a condition, bounded by the deadline
    return False


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://", "names no host"),
        ("rediss://", "names no host"),
        ("redis:///0", "names no host"),
        ("redis://:6379", "names no host"),
        ("unix://", "socket path"),
        ("redis://127.0.0.1:0", "port 0"),
        ("redis://127.0.0.1:65536", "Port out of range"),
        ("redis://127.0.0.1:web", "Port could not be cast"),
        ("redis://127.0.0.1:6379/one", "database 'one' is not a number"),
        ("redis://127.0.0.1:6379/-1", "database '-1' is not a number"),
        ("redis://127.0.0.1:6379?db=x", "Invalid value for 'db'"),
        ("http://127.0.0.1:6379", "redis://"),
        ("redis//127.0.0.1:6379", "redis://"),
        ("", "redis://"),
        ("redis://[::1", "IPv6"),
    ],
)
def test_an_unusable_redis_url_is_a_configuration_error_at_construction(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        RedisLocationStore(url, key_prefix="p")


def test_a_password_in_an_unusable_url_is_not_shown() -> None:
    with pytest.raises(ConfigurationError) as caught:
        RedisLocationStore("redis://app:s3cret@:6379/0", key_prefix="p")
    assert "s3cret" not in str(caught.value)
    assert "app:***@" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1", "redis://localhost:1/3", "rediss://h:1/0/", "unix:///tmp/r.sock"],
)
def test_a_usable_redis_url_constructs_without_connecting(url: str) -> None:
    RedisLocationStore(url, key_prefix="p").close()


def test_constructor_refuses_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="redis://"):
        RedisLocationStore("http://127.0.0.1:1", key_prefix="p")
    with pytest.raises(TypeError):
        RedisLocationStore(5, key_prefix="p")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key_prefix"):
        RedisLocationStore("redis://127.0.0.1:1", key_prefix="")
    with pytest.raises(TypeError):
        RedisLocationStore("redis://127.0.0.1:1", key_prefix=b"p")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="operation_timeout"):
        RedisLocationStore("redis://127.0.0.1:1", key_prefix="p", operation_timeout=0)


def test_unreachable_redis_is_unavailable_and_nothing_is_half_written() -> None:
    store = RedisLocationStore("redis://127.0.0.1:1/0", key_prefix="p", operation_timeout=2)
    try:
        with pytest.raises(UnavailableError) as caught:
            run(store.read("k"))
        assert not isinstance(caught.value, WriteOutcomeUnknownError)
        assert caught.value.reason is UnavailableReason.STORE_UNAVAILABLE
        with pytest.raises(UnavailableError) as caught:
            run(store.write([], [Put("k", b"1")]))
        # the connection failed before anything was sent: the outcome is known
        assert not isinstance(caught.value, WriteOutcomeUnknownError)
        assert caught.value.reason is UnavailableReason.STORE_UNAVAILABLE
    finally:
        store.close()


def test_redis_killed_and_restarted_mid_run_gives_typed_errors_then_works(
    own_redis: RedisServer,
) -> None:
    store = RedisLocationStore(own_redis.url, key_prefix="kill", operation_timeout=3)
    try:
        first = run(store.write([], [Put(f"k/{i}", b"1") for i in range(100)]))
        assert isinstance(first, Committed)
        page = run(store.scan("k/", limit=10))
        assert page.cursor is not None
        own_redis.kill()
        for op in (store.read("k/0"), store.write([], [Put("k/0", b"2")]), store.scan("k/")):
            with pytest.raises(UnavailableError) as caught:
                run(op)
            assert caught.value.reason is UnavailableReason.STORE_UNAVAILABLE
        own_redis.start()  # the same port, no persistence: everything is gone
        assert isinstance(run(store.read("k/0")), Missing)
        with pytest.raises(ScanExpiredError) as expired:  # the data the scan walked is gone
            run(store.scan("k/", cursor=page.cursor, limit=10))
        assert expired.value.reason is UnavailableReason.STORE_UNAVAILABLE
        again = run(store.write([], [Put(f"k/{i}", b"3") for i in range(100)]))
        assert isinstance(again, Committed)
        found = run(store.read("k/99"))
        assert isinstance(found, Found)
        assert found.version == again.versions["k/99"]
        assert len(run(store.scan("k/")).items) == 100
    finally:
        store.close()


def test_lost_write_result_is_outcome_unknown_and_an_exact_read_tells(
    own_redis: RedisServer,
) -> None:
    """The batch is on the wire (queued at the paused server) when Redis dies: the
    caller gets `WriteOutcomeUnknownError` with the versions, and an exact read after
    recovery tells that it did not commit."""
    store = RedisLocationStore(own_redis.url, key_prefix="lost", operation_timeout=30)
    outcome: list[BaseException | object] = []
    try:
        warm, paused = threading.Event(), threading.Event()

        async def write_after_pause() -> object:
            await store.write([], [Put("warm", b"1")])  # this loop's connection is open
            warm.set()
            assert await asyncio.to_thread(paused.wait, 10)
            return await store.write([], [Put("k", b"v")])

        writer = threading.Thread(target=lambda: outcome.append(_capture(write_after_pause())))
        writer.start()
        assert warm.wait(10)
        own_redis.pause()
        paused.set()
        assert _wait_until(lambda: own_redis.rx_queued() > 0)  # the batch was sent
        own_redis.kill()
        writer.join(30)
        assert not writer.is_alive()
        (err,) = outcome
        assert isinstance(err, WriteOutcomeUnknownError)
        assert set(err.versions) == {"k"}
        own_redis.start()
        result = run(store.read("k"))
        assert isinstance(result, Missing)  # not committed (and never resent)
    finally:
        own_redis.resume()
        store.close()


def _capture(coro: Any) -> BaseException | object:
    try:
        return run(coro)
    except BaseException as exc:
        return exc


def test_paused_redis_past_operation_timeout_is_deadline_exceeded(
    own_redis: RedisServer,
) -> None:
    store = RedisLocationStore(own_redis.url, key_prefix="slow", operation_timeout=0.3)
    try:

        async def write_on_a_warm_connection() -> object:
            await store.write([], [Put("k", b"1")])
            own_redis.pause()
            return await store.write([], [Put("k", b"2")])

        try:
            with pytest.raises(DeadlineExceededError) as caught:
                run(write_on_a_warm_connection())
            with pytest.raises(DeadlineExceededError):
                run(store.read("k"))
            cause = caught.value  # sent: also the unknown outcome, with the versions
            assert isinstance(cause, WriteDeadlineExceededError)
            assert isinstance(cause, WriteOutcomeUnknownError)
            assert set(cause.versions) == {"k"}
        finally:
            own_redis.resume()
        found = run(store.read("k"))  # works again; the timed-out write may have run
        assert isinstance(found, Found)
        assert found.value == b"1" or found.version == cause.versions["k"]
    finally:
        store.close()


def test_a_write_timed_out_before_sending_is_a_plain_deadline(own_redis: RedisServer) -> None:
    # Every connection holds a sent write at the paused server: the 17th write waits
    # for a connection, times out unsent, and says nothing of an unknown outcome.
    store = RedisLocationStore(own_redis.url, key_prefix="unsent", operation_timeout=0.5)
    try:

        async def go() -> list[BaseException | object]:
            await asyncio.gather(*(store.read(f"w{i}") for i in range(MAX_CONNECTIONS)))
            own_redis.pause()
            writes = (store.write([], [Put(f"k{i}", b"x")]) for i in range(MAX_CONNECTIONS + 1))
            return await asyncio.gather(*writes, return_exceptions=True)

        started = time.monotonic()
        try:
            outcomes = run(go())
        finally:
            own_redis.resume()
        assert time.monotonic() - started < 5.0
        sent = [e for e in outcomes if isinstance(e, WriteDeadlineExceededError)]
        unsent = [e for e in outcomes if not isinstance(e, WriteDeadlineExceededError)]
        assert len(sent) == MAX_CONNECTIONS
        (plain,) = unsent
        assert type(plain) is DeadlineExceededError
        assert plain.__cause__ is None
        assert not isinstance(plain, WriteOutcomeUnknownError)
    finally:
        store.close()


def test_close_during_a_sent_write_gives_the_versions_as_the_cause(
    own_redis: RedisServer,
) -> None:
    store = RedisLocationStore(own_redis.url, key_prefix="closing", operation_timeout=30)
    outcome: list[BaseException | object] = []
    try:
        warm = threading.Event()

        async def write_at_pause() -> object:
            await store.write([], [Put("warm", b"1")])  # this loop's connection is open
            own_redis.pause()
            warm.set()
            return await store.write([], [Put("k", b"v")])

        writer = threading.Thread(target=lambda: outcome.append(_capture(write_at_pause())))
        writer.start()
        assert warm.wait(10)
        assert _wait_until(lambda: own_redis.rx_queued() > 0)  # the batch was sent
        store.close()
        writer.join(10)
        assert not writer.is_alive()
        (err,) = outcome
        assert isinstance(err, ShuttingDownError)
        assert isinstance(err.__cause__, WriteOutcomeUnknownError)
        assert set(err.__cause__.versions) == {"k"}
    finally:
        own_redis.resume()
        store.close()


def test_timed_out_connects_leave_no_connection_in_the_pool(own_redis: RedisServer) -> None:
    store = RedisLocationStore(own_redis.url, key_prefix="connects", operation_timeout=0.2)
    try:

        async def go() -> int:
            for _ in range(6):  # each times out while connecting to the paused server
                with pytest.raises(DeadlineExceededError):
                    await store.read("k")
            return len(store._pools[asyncio.get_running_loop()].all)

        own_redis.pause()
        started = time.monotonic()
        try:
            left = run(go())
        finally:
            own_redis.resume()
        assert time.monotonic() - started < 5.0
        assert left == 0
        assert isinstance(run(store.read("k")), Missing)  # and the store works again
    finally:
        store.close()


def test_script_is_reloaded_after_the_server_forgets_it(redis_server: RedisServer) -> None:
    store = RedisLocationStore(redis_server.url, key_prefix="noscript")
    try:
        run(store.write([], [Put("k", b"1")]))
        _redis_cli(redis_server, "SCRIPT", "FLUSH")
        done = run(store.write([], [Put("k", b"2")]))
        assert isinstance(done, Committed)
        found = run(store.read("k"))
        assert isinstance(found, Found)
        assert found.value == b"2"
    finally:
        store.close()


def test_a_failed_script_reload_is_unavailable(redis_server: RedisServer) -> None:
    # After NOSCRIPT the store loads the script again; when that fails (here: a user
    # without SCRIPT LOAD), nothing ran: UnavailableError, never a raw redis error.
    _redis_cli(redis_server, "ACL", "SETUSER", "noload", "on", "nopass", "~*", "&*", "+@all",
               "-script|load")  # fmt: skip
    url = f"redis://noload@127.0.0.1:{redis_server.port}/0"
    store = RedisLocationStore(url, key_prefix="noload")
    try:
        _redis_cli(redis_server, "SCRIPT", "FLUSH")  # every script answers NOSCRIPT
        for op in (store.read("k"), store.write([], [Put("k", b"2")]), store.scan("")):
            with pytest.raises(UnavailableError) as caught:
                run(op)
            assert not isinstance(caught.value, WriteOutcomeUnknownError)
            assert caught.value.reason is UnavailableReason.STORE_UNAVAILABLE
    finally:
        store.close()
        _redis_cli(redis_server, "SCRIPT", "FLUSH")
        _redis_cli(redis_server, "ACL", "DELUSER", "noload")


def test_write_script_checks_every_argument_before_its_first_write(
    redis_server: RedisServer,
) -> None:
    # The script itself (past the SPI checks): a bad second ttl must leave the first
    # put unwritten.
    store = RedisLocationStore(redis_server.url, key_prefix="argcheck")
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        data, index = store._data, store._index
        for bad in (b"1e23", b"0", b"x"):
            with pytest.raises(redis.ResponseError, match="zla1 bad ttl"):
                client.eval(
                    scripts.WRITE, 3, index, data + b"a", data + b"b",
                    0, store._plen, b"p", b"1", b"v1", b"", b"p", b"2", b"v2", bad,
                )  # fmt: skip
            assert client.exists(data + b"a", data + b"b") == 0
            assert client.zcard(index) == 0
        assert isinstance(run(store.read("a")), Missing)
    finally:
        client.close()
        store.close()


def test_an_error_reply_to_a_sent_write_is_an_unknown_outcome(redis_server: RedisServer) -> None:
    # Redis answers the script with an error midway (its index key has the wrong type, so
    # ZADD fails after the first HSET): a script that fails midway keeps what it wrote,
    # so the caller gets the versions to check, never a plain "nothing written".
    store = RedisLocationStore(redis_server.url, key_prefix="errreply")
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        client.set(store._index, b"not a sorted set")
        with pytest.raises(WriteOutcomeUnknownError) as caught:
            run(store.write([], [Put("k", b"2"), Put("j", b"3")]))
        assert set(caught.value.versions) == {"k", "j"}
        assert caught.value.reason is UnavailableReason.STORE_UNAVAILABLE
        assert client.hget(store._data + b"k", b"r") == caught.value.versions["k"].encode()
    finally:
        client.close()
        store.close()


def _redis_cli(server: RedisServer, *args: str) -> None:

    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        client.execute_command(*args)
    finally:
        client.close()


def test_more_concurrent_callers_than_connections_wait_instead_of_failing(
    redis_server: RedisServer,
) -> None:
    store = RedisLocationStore(redis_server.url, key_prefix="many")

    async def go() -> list[Any]:
        return await asyncio.gather(
            *(store.write([], [Put(f"k/{i}", b"x" * 1000)]) for i in range(200))
        )

    try:
        results = run(go())
        assert all(isinstance(r, Committed) for r in results)
        assert len(run(store.scan("k/")).items) == 200
    finally:
        store.close()


_CHILD = """
import asyncio, sys
from zlink_actors.location import RedisLocationStore, IfVersion, Put, Committed
store = RedisLocationStore(sys.argv[1], key_prefix=sys.argv[2])
async def main():
    await store.read("warm")
    print("ready", flush=True)
    sys.stdin.readline()
    result = await store.write([IfVersion("cas", sys.argv[3])], [Put("cas", sys.argv[4].encode())])
    print("won" if isinstance(result, Committed) else "lost", flush=True)
asyncio.run(main())
store.close()
"""


def test_compare_and_set_from_2_processes_has_exactly_one_winner(
    redis_server: RedisServer,
) -> None:
    store = RedisLocationStore(redis_server.url, key_prefix="procs")
    env = {**os.environ, "PYTHONPATH": ROOT}
    try:
        for round_ in range(3):
            start = run(store.write([], [Put("cas", b"start")]))
            assert isinstance(start, Committed)
            version = start.versions["cas"]
            children = [
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD, redis_server.url, "procs", version, str(i)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                    text=True,
                )
                for i in range(2)
            ]
            try:
                for child in children:
                    assert child.stdout is not None
                    assert child.stdout.readline().strip() == "ready"
                for child in children:  # both go at once
                    assert child.stdin is not None
                    child.stdin.write("go\n")
                    child.stdin.flush()
                answers = [child.communicate(timeout=30)[0].strip() for child in children]
            finally:
                for child in children:
                    if child.poll() is None:
                        child.kill()
                        child.wait(10)
            assert sorted(answers) == ["lost", "won"], (round_, answers)
            final = run(store.read("cas"))
            assert isinstance(final, Found)
            assert final.value == str(answers.index("won")).encode()
            stale = run(store.write([IfVersion("cas", version)], [Put("cas", b"late")]))
            assert isinstance(stale, Conflict)
    finally:
        store.close()


def test_close_releases_the_connections_of_every_loop(own_redis: RedisServer) -> None:
    """Connections of a loop that ended are released when it shuts down; `close()`
    releases those of a loop running in another thread and of the caller's own loop."""
    probe = redis.Redis(host="127.0.0.1", port=own_redis.port)

    def others() -> int:
        return int(probe.info("clients")["connected_clients"]) - 1

    store = RedisLocationStore(own_redis.url, key_prefix="release")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        run(store.write([], [Put("a", b"1")]))
        assert _wait_until(lambda: others() == 0)  # asyncio.run's shutdown released it
        asyncio.run_coroutine_threadsafe(store.read("a"), loop).result(10)
        assert others() == 1

        async def inside() -> None:
            await store.read("a")
            assert others() == 2
            store.close()
            assert _wait_until(lambda: others() == 0)
            with pytest.raises(ShuttingDownError):
                await store.read("a")

        run(inside())
        with pytest.raises(ShuttingDownError):
            asyncio.run_coroutine_threadsafe(store.read("a"), loop).result(10)
    finally:
        store.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        probe.close()
