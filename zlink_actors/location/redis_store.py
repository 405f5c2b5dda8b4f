"""`RedisLocationStore`: the official Redis provider of the Location Store SPI.

Design (docs/location.md):

- The store owns one small I/O thread with its own asyncio loop, and every Redis
  connection lives there (redis-py asyncio connections belong to one loop). Callers on
  any loop await a future of that thread, so one store serves several Hosts' loops, and
  `close()` can release every connection from any thread, also after the callers' loops
  have ended.
- Connections come from a free list bounded by a semaphore: a caller past the bound
  waits (within `operation_timeout`) instead of failing as redis-py's default pool does.
- Commands go straight to a connection (`send_command` / `read_response`), never through
  a client with retries: a lost reply to a write is reported, never resent
  (`WriteOutcomeUnknownError`). Each script is sent by `EVALSHA` and loaded again after
  `NOSCRIPT` (which means it did not run).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.retry import Retry

from .._core.errors import DeadlineExceededError, ShuttingDownError, UnavailableError
from .._core.validation import check_seconds
from . import scripts
from .cursors import CursorCodec, ScanPosition
from .spi import (
    MAX_BATCH_BYTES,
    Committed,
    Conflict,
    Delete,
    Found,
    IfMissing,
    IfVersion,
    Missing,
    Put,
    ScanExpiredError,
    ScanPage,
    WriteOutcomeUnknownError,
    check_batch,
    check_key,
    check_limit,
    check_prefix,
    new_version,
)

__all__ = ["RedisLocationStore"]

T = TypeVar("T")

#: Connections per store: callers past it wait for one.
MAX_CONNECTIONS: Final = 16
#: How long `close()` waits for the I/O thread to release everything.
_CLOSE_WAIT = 10.0


class _Lost(Exception):
    """The connection failed after the command was sent (the outcome is unknown)."""


def _now(sec: bytes, usec: bytes) -> float:
    return int(sec) + int(usec) / 1_000_000


def _expiry(raw: bytes) -> float | None:
    return int(raw) / 1_000_000 if raw else None


class RedisLocationStore:
    """A Location Store on a Redis server (mesh.md §4), on redis-py's asyncio client
    (with hiredis when installed).

    Args:
        url: a redis-py URL: `redis://host:port/db`, `rediss://...`, `unix:///path`.
        key_prefix: the namespace of every key this store writes (1..255 UTF-8 bytes);
            stores with different prefixes on one server never see each other's keys.
        operation_timeout: seconds each operation may take, waiting for a connection
            included; past it the operation raises `DeadlineExceededError`.

    Raises:
        TypeError / ValueError: a bad argument (the URL is parsed here; nothing connects
            before the first operation).
    """

    def __init__(self, url: str, *, key_prefix: str, operation_timeout: float = 5.0) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {type(url).__name__}")
        if not isinstance(key_prefix, str):
            raise TypeError(f"key_prefix must be a str, got {type(key_prefix).__name__}")
        try:
            prefix = key_prefix.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("key_prefix is not valid UTF-8") from None
        if not 1 <= len(prefix) <= 255:
            raise ValueError(f"key_prefix must be 1..255 UTF-8 bytes, got {len(prefix)}")
        self._timeout = check_seconds("operation_timeout", operation_timeout)
        pool = aioredis.ConnectionPool.from_url(  # parses and checks the URL only
            url,
            socket_timeout=None,  # our own deadline covers every operation
            socket_connect_timeout=self._timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._connection_class: type[AbstractConnection] = pool.connection_class
        self._connection_kwargs: dict[str, Any] = dict(pool.connection_kwargs)
        self.url = url
        self.key_prefix = key_prefix
        namespace = prefix + b":zla1:"
        self._data = namespace + b"k:"
        self._index = namespace + b"i"
        self._epoch = namespace + b"e"
        self._plen = str(len(self._data)).encode()
        self._cursors = CursorCodec()
        self._lock = threading.Lock()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched only on the store's own loop:
        self._free: list[AbstractConnection] = []
        self._all: set[AbstractConnection] = set()
        self._slots: asyncio.Semaphore | None = None
        self._inflight: set[concurrent.futures.Future[Any]] = set()

    def __repr__(self) -> str:
        return f"RedisLocationStore({self.url!r}, key_prefix={self.key_prefix!r})"

    # -- the store's I/O thread ------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ShuttingDownError("the location store is closed")
            if self._loop is not None:
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=run, name="zlink-location-redis", daemon=True)
            thread.start()
            if not ready.wait(_CLOSE_WAIT):  # pragma: no cover - a stuck machine
                raise UnavailableError("the location store's I/O thread did not start")
            self._loop, self._thread = loop, thread
            return loop

    async def _call(self, op: Coroutine[Any, Any, T]) -> T:
        try:
            loop = self._start()
            future = asyncio.run_coroutine_threadsafe(op, loop)
        except BaseException:
            op.close()
            raise
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and future.cancelled() and not (task and task.cancelling()):
                raise ShuttingDownError("the location store closed during the call") from None
            raise

    def close(self) -> None:
        """Release every connection and stop the I/O thread; later operations raise
        `ShuttingDownError`. Plain, idempotent, callable from any thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if threading.current_thread() is thread:  # from a callback on the store's loop
            loop.call_soon(lambda: loop.create_task(self._shutdown(stop=True)))
            return
        done = asyncio.run_coroutine_threadsafe(self._shutdown(stop=True), loop)
        try:
            done.result(_CLOSE_WAIT)
        except (concurrent.futures.TimeoutError, RuntimeError):  # pragma: no cover
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_WAIT)
        if not thread.is_alive():
            loop.close()

    async def _shutdown(self, *, stop: bool) -> None:
        for future in list(self._inflight):
            future.cancel()  # cancels its task on this loop
        await asyncio.sleep(0)  # let the cancelled tasks release their connections
        for conn in list(self._all):
            await conn.disconnect(nowait=True)
        self._all.clear()
        self._free.clear()
        if stop:
            asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

    # -- connections -----------------------------------------------------------------

    async def _acquire(self) -> AbstractConnection:
        assert self._slots is not None
        await self._slots.acquire()
        try:
            if self._free:
                conn = self._free.pop()
                try:
                    # A server that restarted closed this socket: reconnect before sending.
                    if conn.is_connected and await conn.can_read():
                        raise RedisConnectionError("unexpected data on an idle connection")
                except (RedisError, OSError):
                    await conn.disconnect(nowait=True)
            else:
                conn = self._connection_class(**self._connection_kwargs)
                self._all.add(conn)
            if not conn.is_connected:
                try:
                    await conn.connect()  # type: ignore[no-untyped-call]
                except (RedisError, OSError) as exc:
                    self._all.discard(conn)
                    raise UnavailableError(f"cannot reach Redis at {self.url}: {exc}") from exc
            return conn
        except BaseException:
            self._slots.release()
            raise

    async def _release(self, conn: AbstractConnection, healthy: bool) -> None:
        assert self._slots is not None
        try:
            if healthy and not self._closed:
                self._free.append(conn)
            else:  # its state is unknown: never reuse it
                self._all.discard(conn)
                await conn.disconnect(nowait=True)
        finally:
            self._slots.release()

    async def _script(self, script: bytes, sha: str, keys: Sequence[bytes], args: list[Any]) -> Any:
        """Run one script on one connection: `EVALSHA`, and after `NOSCRIPT` (which
        means it did not run) `SCRIPT LOAD` and `EVALSHA` again. Connection failures
        after the send raise `_Lost`."""
        conn = await self._acquire()
        healthy = False
        try:
            for attempt in range(2):
                try:
                    await conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
                except (RedisError, OSError) as exc:
                    raise _Lost(str(exc)) from exc
                try:
                    reply = await conn.read_response()
                except NoScriptError:
                    if attempt == 1:
                        raise UnavailableError("Redis lost the store's script twice") from None
                    await conn.send_command("SCRIPT", "LOAD", script)
                    await conn.read_response()
                    continue
                except ResponseError as exc:
                    healthy = True
                    raise UnavailableError(f"Redis refused the operation: {exc}") from exc
                except (RedisError, OSError) as exc:
                    raise _Lost(str(exc)) from exc
                healthy = True
                return reply
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            await self._release(conn, healthy)

    async def _bounded(self, op: Coroutine[Any, Any, T], what: str) -> T:
        try:
            async with asyncio.timeout(self._timeout):
                return await op
        except TimeoutError:
            raise DeadlineExceededError(
                f"the location store's {what} took more than {self._timeout:g} s"
            ) from None

    # -- the SPI ---------------------------------------------------------------------

    async def read(self, key: str) -> Found | Missing:
        """An exact read of `key` (see `LocationStore.read`).

        Raises:
            ValueError / TypeError: a bad key. UnavailableError: Redis unreachable.
            DeadlineExceededError: past `operation_timeout`. ShuttingDownError: closed.
        """
        raw = check_key(key)
        return await self._call(self._read(raw))

    async def _read(self, raw: bytes) -> Found | Missing:
        try:
            reply = await self._bounded(
                self._script(scripts.READ, _READ_SHA, (self._data + raw,), []), "read"
            )
        except _Lost as exc:
            raise UnavailableError(f"lost the connection to Redis at {self.url}: {exc}") from None
        now = _now(reply[0], reply[1])
        if len(reply) == 2:
            return Missing(now)
        return Found(bytes(reply[2]), reply[3].decode(), _expiry(reply[4]), now)

    async def write(
        self, conditions: Sequence[IfMissing | IfVersion], mutations: Sequence[Put | Delete]
    ) -> Committed | Conflict:
        """Check every condition, then apply every mutation, in one Lua script.

        Raises:
            ValueError / TypeError: a batch over a limit (nothing is sent).
            UnavailableError: Redis unreachable before sending (nothing written).
            WriteOutcomeUnknownError: the result was lost after sending.
            DeadlineExceededError: past `operation_timeout`; when the batch had been
                sent, its `__cause__` is the `WriteOutcomeUnknownError` with the versions.
            ShuttingDownError: closed.
        """
        check_batch(conditions, mutations)
        versions = {m.key: new_version() for m in mutations if isinstance(m, Put)}
        keys: list[bytes] = [self._index]
        args: list[Any] = [len(conditions), self._plen]
        for cond in conditions:
            keys.append(self._data + cond.key.encode())
            if isinstance(cond, IfMissing):
                args += (b"m", b"")
            else:
                args += (b"v", cond.version.encode())
        for mut in mutations:
            keys.append(self._data + mut.key.encode())
            if isinstance(mut, Delete):
                args.append(b"d")
            else:
                ttl = b"" if mut.ttl is None else b"%d" % max(1, round(float(mut.ttl) * 1e6))
                args += (b"p", mut.value, versions[mut.key].encode(), ttl)
        return await self._call(self._write(keys, args, versions))

    async def _write(
        self, keys: list[bytes], args: list[Any], versions: dict[str, str]
    ) -> Committed | Conflict:
        sent = False

        async def run() -> Any:
            nonlocal sent
            try:
                return await self._script(scripts.WRITE, _WRITE_SHA, keys, args)
            except _Lost:
                sent = True
                raise

        try:
            reply = await self._bounded(run(), "write")
        except _Lost as exc:
            raise WriteOutcomeUnknownError(
                f"lost the result of a write to Redis at {self.url}: {exc}", versions
            ) from None
        except DeadlineExceededError as exc:
            # The script may have run: say so, with the versions for an exact read.
            exc.__cause__ = WriteOutcomeUnknownError(str(exc), versions)
            raise
        now = _now(reply[1], reply[2])
        if reply[0] == 1:
            return Committed(now, versions)
        return Conflict(now)

    async def scan(self, prefix: str, *, cursor: str | None = None, limit: int = 1000) -> ScanPage:
        """One page of the keys under `prefix`, in byte order (see `LocationStore.scan`).

        Raises:
            ValueError / TypeError: a bad prefix or limit, or a cursor this store object
                never issued. ScanExpiredError: Redis lost the data the scan walked
                (it restarted): restart the scan. UnavailableError,
                DeadlineExceededError, ShuttingDownError: as for `read`.
        """
        raw = check_prefix(prefix)
        check_limit(limit)
        position = None if cursor is None else self._cursors.decode(cursor, prefix)
        if position is not None:
            low = b"(" + position.after.encode()
        else:
            low = b"[" + raw if raw else b"-"
        high = b"(" + raw + b"\xff" if raw else b"+"
        epoch = b"" if position is None else position.epoch.encode()
        args = [self._data, low, high, limit, epoch, new_version(), MAX_BATCH_BYTES]
        return await self._call(self._scan(prefix, args))

    async def _scan(self, prefix: str, args: list[Any]) -> ScanPage:
        try:
            reply = await self._bounded(
                self._script(scripts.SCAN, _SCAN_SHA, (self._index, self._epoch), args), "scan"
            )
        except _Lost as exc:
            raise UnavailableError(f"lost the connection to Redis at {self.url}: {exc}") from None
        now = _now(reply[0], reply[1])
        epoch = reply[2].decode()
        if reply[3] == -1:
            raise ScanExpiredError("Redis lost the data this scan walked: restart the scan")
        items = [
            (
                reply[i].decode(),
                Found(bytes(reply[i + 1]), reply[i + 2].decode(), _expiry(reply[i + 3]), now),
            )
            for i in range(4, len(reply), 4)
        ]
        next_cursor = (
            self._cursors.encode(ScanPosition(prefix, items[-1][0], epoch))
            if reply[3] == 1
            else None
        )
        return ScanPage(items, next_cursor, now)


_READ_SHA: Final = scripts.sha1(scripts.READ)
_WRITE_SHA: Final = scripts.sha1(scripts.WRITE)
_SCAN_SHA: Final = scripts.sha1(scripts.SCAN)
