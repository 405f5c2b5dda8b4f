"""`RedisLocationStore`: the official Redis provider of the Location Store SPI.

Design (docs/location.md):

- Every operation runs on the caller's event loop, with a pool of connections per loop
  (redis-py asyncio connections belong to the loop that opened them), so one store
  serves several Hosts' loops with no thread hop. An async generator parked on each
  loop releases that loop's connections when the loop shuts down
  (`shutdown_asyncgens()`, which `asyncio.run` and the Host's I/O executor call);
  `close()` releases the rest from any thread: on a loop running elsewhere it runs the
  release there, and on its own or a stopped loop it shuts the sockets down at once.
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
import contextlib
import re
import socket
import threading
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from .._core.errors import (
    ConfigurationError,
    DeadlineExceededError,
    ShuttingDownError,
    UnavailableError,
    UnavailableReason,
)
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
    WriteDeadlineExceededError,
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
#: How long `close()` waits for a loop running in another thread to release its pool.
_CLOSE_WAIT = 10.0


class _LoopPool:
    """The connections of one event loop (redis-py asyncio connections belong to the loop
    that opened them). Touched only on that loop, except by `close()` once that loop can
    no longer run anything."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.free: list[AbstractConnection] = []
        self.all: set[AbstractConnection] = set()
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.cancelled: set[asyncio.Task[Any]] = set()
        self.closed = False
        self.finaliser: AsyncGenerator[None, None] | None = None


class _Lost(Exception):
    """The connection failed after the command was sent (the outcome is unknown)."""


class _Progress:
    """Whether a script's command has started on the wire (so it may have run)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class _Refused(Exception):
    """Redis answered the script with an error reply (for a write: the outcome is
    unknown, since a script that fails midway keeps what it wrote)."""


def _check_target(url: str, found: dict[str, Any]) -> None:
    """`ConfigurationError` for what redis-py parses without complaint but cannot serve:
    no host (it would use localhost), port 0, a database path that is not a number (it
    would use database 0), a negative database, `unix://` without a path."""
    parts = urllib.parse.urlsplit(url)
    why = ""
    if parts.scheme == "unix":
        if not found.get("path"):
            why = "unix:// needs a socket path (unix:///path/to/redis.sock)"
    elif not found.get("host"):
        why = "it names no host (redis://HOST[:PORT][/DB])"
    elif found.get("port", 6379) == 0:
        why = "port 0 cannot be dialled"
    else:
        path = urllib.parse.unquote(parts.path).strip("/")
        if path and not path.isdigit():
            why = f"the database {path!r} is not a number"
    if not why and isinstance(found.get("db", 0), int) and found.get("db", 0) < 0:
        why = f"the database {found['db']} is negative"
    if why:
        raise ConfigurationError(f"an unusable Redis URL {_shown(url)!r}: {why}")


def _check_options(url: str, pool: aioredis.ConnectionPool) -> None:
    """`ConfigurationError` for a query option redis-py parses but its connections refuse
    (an unknown name, `protocol=9`, `ssl_cert_reqs=bogus`): a connection object is built
    here, which does not connect, instead of failing every operation with a TypeError."""
    try:
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError, RedisError) as exc:
        raise ConfigurationError(f"an unusable Redis URL {_shown(url)!r}: {exc}") from None


#: A `password=` option in a URL's query, up to its value.
_QUERY_PASSWORD: Final = re.compile(r"((?:^|[?&])password=)[^&#]*", re.IGNORECASE)


def _shown(url: str) -> str:
    """`url` for a message, a log line or `repr`: a password in it (`user:PASSWORD@`, or
    a `password=` query option) is replaced by `***`."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:  # redis-py refused it too; keep the scheme, hide what may be one
        scheme, sep, rest = url.partition("://")
        if "@" in rest:
            rest = "***@" + rest.rsplit("@", 1)[1]
        return scheme + sep + _QUERY_PASSWORD.sub(r"\1***", rest)
    if password is not None:  # a netloc: urlunsplit keeps the rest as it was
        user = f"{parts.username}:" if parts.username else ":"
        url = urllib.parse.urlunsplit(
            parts._replace(netloc=f"{user}***@{parts.netloc.rsplit('@', 1)[1]}")
        )
    return _QUERY_PASSWORD.sub(r"\1***", url)


def _now(sec: bytes, usec: bytes) -> float:
    return int(sec) + int(usec) / 1_000_000


def _expiry(raw: bytes) -> float | None:
    return int(raw) / 1_000_000 if raw else None


class RedisLocationStore:
    """A Location Store on a Redis server (design/mesh.md §4), on redis-py's asyncio client
    (with hiredis when installed).

    Args:
        url: a redis-py URL: `redis://host:port/db`, `rediss://...`, `unix:///path`.
        key_prefix: the namespace of every key this store writes (1..255 UTF-8 bytes);
            stores with different prefixes on one server never see each other's keys.
        operation_timeout: seconds each operation may take, waiting for a connection
            included; past it the operation raises `DeadlineExceededError`.

    Raises:
        ConfigurationError: `url` names no server to connect to: not a `redis://`,
            `rediss://` or `unix://` URL, no host (`"redis://"`: redis-py would quietly
            use localhost:6379), port 0 or out of range, a database that is not an int
            >= 0, `unix://` without a path, or a query option redis-py refuses. The URL
            is parsed here (by redis-py); nothing connects before the first operation,
            so a well-formed URL of a server that is down is found by the first
            operation (`UnavailableError`), and by `Host.wait_ready()`.
        TypeError / ValueError: another bad argument.
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
        try:
            pool = aioredis.ConnectionPool.from_url(  # parses and checks the URL only
                url,
                socket_timeout=None,  # our own deadline covers every operation
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 0),
                health_check_interval=0,
            )
        except (ValueError, TypeError) as exc:  # redis-py's own checks of the URL
            raise ConfigurationError(f"an unusable Redis URL {_shown(url)!r}: {exc}") from None
        _check_target(url, pool.connection_kwargs)
        _check_options(url, pool)
        self._connection_class: type[AbstractConnection] = pool.connection_class
        self._connection_kwargs: dict[str, Any] = dict(pool.connection_kwargs)
        self.url = url
        #: `url` with its password hidden: what messages, logs and `repr` show.
        self._shown = _shown(url)
        self.key_prefix = key_prefix
        # Length-prefixed, so no prefix can reach under another's namespace (a prefix
        # may itself contain ":zla1:").
        namespace = b"%d:%s:zla1:" % (len(prefix), prefix)
        self._data = namespace + b"k:"
        self._index = namespace + b"i"
        self._epoch = namespace + b"e"
        self._plen = str(len(self._data)).encode()
        self._cursors = CursorCodec()
        self._lock = threading.Lock()
        self._closed = False
        #: One pool per event loop that used the store (see `_LoopPool`).
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}

    def __repr__(self) -> str:
        return f"RedisLocationStore({self._shown!r}, key_prefix={self.key_prefix!r})"

    # -- the pools, one per event loop -----------------------------------------------

    async def _pool(self) -> _LoopPool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is not None and not pool.closed:
            return pool
        with self._lock:
            if self._closed:
                raise ShuttingDownError("the location store is closed")
            pool = _LoopPool(loop)
            self._pools[loop] = pool
        # An async generator parked on this loop: `shutdown_asyncgens()` (asyncio.run,
        # the Host's I/O executor) closes it while the loop still runs, and its
        # `finally` releases the pool's connections there.
        pool.finaliser = self._finaliser(pool)
        await pool.finaliser.asend(None)
        return pool

    async def _finaliser(self, pool: _LoopPool) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if not pool.closed:
                await self._close_pool(pool)

    async def _close_pool(self, pool: _LoopPool) -> None:
        """On the pool's loop: cancel its operations, release its connections."""
        pool.closed = True
        with self._lock:
            if self._pools.get(pool.loop) is pool:
                del self._pools[pool.loop]
        me = asyncio.current_task()
        for task in list(pool.tasks):
            if task is not me:
                pool.cancelled.add(task)
                task.cancel()
        for conn in list(pool.all):
            await conn.disconnect(nowait=True)
        pool.all.clear()
        pool.free.clear()
        if pool.finaliser is not None and me is not None:
            with contextlib.suppress(RuntimeError):  # closing it from its own finally
                await pool.finaliser.aclose()

    def _close_pool_now(self, pool: _LoopPool, *, foreign: bool = False) -> None:
        """Release a pool whose loop cannot run a coroutine for us: this thread's running
        loop, a loop that stopped or closed, or (`foreign`) a loop stuck in another
        thread. Every socket is shut down at once (the server sees the connection end
        before `close()` returns); the transports drop their file descriptors on their
        loop (thread-safely when `foreign`)."""
        pool.closed = True
        loop = pool.loop
        live = not loop.is_closed()

        def soon(fn: Callable[[], object]) -> None:
            if foreign:
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(fn)
            else:
                fn()

        for task in list(pool.tasks):
            if live:
                pool.cancelled.add(task)
                soon(task.cancel)
        for conn in list(pool.all):
            writer = conn._writer
            if writer is None:
                continue
            sock = writer.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            if live:
                soon(writer.transport.abort)
            conn._reader = conn._writer = None  # what its own synchronous close does
        pool.all.clear()
        pool.free.clear()
        if pool.finaliser is not None and not foreign:
            # Finish it here: its `finally` finds the pool closed and has nothing to do.
            closing = pool.finaliser.aclose()
            with contextlib.suppress(StopIteration, RuntimeError):
                closing.send(None)
            closing.close()

    async def _call(
        self,
        op: Callable[[_LoopPool], Coroutine[Any, Any, T]],
        lost: Callable[[], BaseException | None] | None = None,
    ) -> T:
        pool = await self._pool()
        task = asyncio.current_task()
        assert task is not None
        pool.tasks.add(task)
        try:
            return await op(pool)
        except asyncio.CancelledError:
            if task in pool.cancelled:
                pool.cancelled.discard(task)
                task.uncancel()
                cause = None if lost is None else lost()
                raise ShuttingDownError("the location store closed during the call") from cause
            raise
        finally:
            pool.tasks.discard(task)

    def close(self) -> None:
        """Release every connection; later operations raise `ShuttingDownError`.
        Plain, idempotent, callable from any thread, inside or outside a running loop,
        also after the loops that used the store have ended."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for pool in pools:
            if pool.closed:
                continue
            loop = pool.loop
            if loop is not here and loop.is_running():
                done = asyncio.run_coroutine_threadsafe(self._close_pool(pool), loop)
                try:
                    done.result(_CLOSE_WAIT)
                except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                    self._close_pool_now(pool, foreign=True)  # a stuck loop
                continue
            self._close_pool_now(pool)

    # -- connections -----------------------------------------------------------------

    async def _acquire(self, pool: _LoopPool) -> AbstractConnection:
        await pool.slots.acquire()
        conn: AbstractConnection | None = None
        try:
            if pool.free:
                conn = pool.free.pop()
                try:
                    # A server that restarted closed this socket: reconnect before sending.
                    if conn.is_connected and await conn.can_read():
                        raise RedisConnectionError("unexpected data on an idle connection")
                except (RedisError, OSError):
                    await conn.disconnect(nowait=True)
            else:
                conn = self._connection_class(**self._connection_kwargs)
                pool.all.add(conn)
            if not conn.is_connected:
                try:
                    await conn.connect()  # type: ignore[no-untyped-call]
                except (RedisError, OSError) as exc:
                    pool.all.discard(conn)
                    raise UnavailableError(
                        f"cannot reach Redis at {self._shown}: {exc}",
                        reason=UnavailableReason.STORE_UNAVAILABLE,
                    ) from exc
            return conn
        except BaseException:
            # Also a timeout or cancel while connecting: never leave a half-open
            # connection in the pool.
            if conn is not None:
                pool.all.discard(conn)
                with contextlib.suppress(Exception):
                    await conn.disconnect(nowait=True)
            pool.slots.release()
            raise

    async def _release(self, pool: _LoopPool, conn: AbstractConnection, healthy: bool) -> None:
        try:
            if healthy and not pool.closed:
                pool.free.append(conn)
            else:  # its state is unknown: never reuse it
                pool.all.discard(conn)
                await conn.disconnect(nowait=True)
        finally:
            pool.slots.release()

    async def _script(
        self,
        pool: _LoopPool,
        script: bytes,
        sha: str,
        keys: Sequence[bytes],
        args: list[Any],
        progress: _Progress | None = None,
    ) -> Any:
        """Run one script on one connection: `EVALSHA`, and after `NOSCRIPT` (which
        means it did not run) `SCRIPT LOAD` and `EVALSHA` again. Connection failures
        after the send raise `_Lost`, an error reply `_Refused`."""
        conn = await self._acquire(pool)
        healthy = False
        try:
            for attempt in range(2):
                if progress is not None:
                    progress.sent = True  # from here on the script may run
                try:
                    await conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
                except (RedisError, OSError) as exc:
                    raise _Lost(str(exc)) from exc
                try:
                    reply = await conn.read_response()
                except NoScriptError:
                    if attempt == 1:
                        raise UnavailableError(
                            "Redis lost the store's script twice",
                            reason=UnavailableReason.STORE_UNAVAILABLE,
                        ) from None
                    if progress is not None:
                        progress.sent = False  # NOSCRIPT: it did not run
                    try:
                        await conn.send_command("SCRIPT", "LOAD", script)
                        await conn.read_response()
                    except (RedisError, OSError) as exc:
                        raise UnavailableError(
                            f"cannot load the store's script into Redis at {self._shown}: {exc}",
                            reason=UnavailableReason.STORE_UNAVAILABLE,
                        ) from exc
                    continue
                except ResponseError as exc:
                    healthy = True
                    raise _Refused(str(exc)) from exc
                except (RedisError, OSError) as exc:
                    raise _Lost(str(exc)) from exc
                healthy = True
                return reply
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            await self._release(pool, conn, healthy)

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
        return await self._call(lambda pool: self._read(pool, raw))

    async def _read(self, pool: _LoopPool, raw: bytes) -> Found | Missing:
        try:
            reply = await self._bounded(
                self._script(pool, scripts.READ, _READ_SHA, (self._data + raw,), []), "read"
            )
        except _Lost as exc:
            raise UnavailableError(
                f"lost the connection to Redis at {self._shown}: {exc}",
                reason=UnavailableReason.STORE_UNAVAILABLE,
            ) from None
        except _Refused as exc:
            raise UnavailableError(
                f"Redis refused the read: {exc}", reason=UnavailableReason.STORE_UNAVAILABLE
            ) from None
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
            WriteOutcomeUnknownError: the result was lost after sending, or Redis
                answered the sent batch with an error reply.
            DeadlineExceededError: past `operation_timeout` before the batch was sent
                (nothing written); once it was sent, `WriteDeadlineExceededError`, also a
                `WriteOutcomeUnknownError` with the versions.
            ShuttingDownError: closed; for a sent write in flight at `close()`, its
                `__cause__` is a `WriteOutcomeUnknownError` with the versions.
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
        progress = _Progress()

        def lost() -> BaseException | None:
            if not progress.sent:
                return None
            return WriteOutcomeUnknownError(
                "the location store closed while a sent write waited for its result", versions
            )

        return await self._call(
            lambda pool: self._write(pool, keys, args, versions, progress), lost
        )

    async def _write(
        self,
        pool: _LoopPool,
        keys: list[bytes],
        args: list[Any],
        versions: dict[str, str],
        progress: _Progress,
    ) -> Committed | Conflict:
        try:
            reply = await self._bounded(
                self._script(pool, scripts.WRITE, _WRITE_SHA, keys, args, progress), "write"
            )
        except _Lost as exc:
            raise WriteOutcomeUnknownError(
                f"lost the result of a write to Redis at {self._shown}: {exc}", versions
            ) from None
        except _Refused as exc:
            # A script that fails midway keeps what it wrote: the outcome is unknown.
            raise WriteOutcomeUnknownError(
                f"Redis answered a write at {self._shown} with an error: {exc}", versions
            ) from None
        except DeadlineExceededError as exc:
            if not progress.sent:
                raise  # nothing was sent: nothing written
            # The script may have run: say so, with the versions for an exact read.
            raise WriteDeadlineExceededError(str(exc), versions) from None
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
        return await self._call(lambda pool: self._scan(pool, prefix, args))

    async def _scan(self, pool: _LoopPool, prefix: str, args: list[Any]) -> ScanPage:
        try:
            reply = await self._bounded(
                self._script(pool, scripts.SCAN, _SCAN_SHA, (self._index, self._epoch), args),
                "scan",
            )
        except _Lost as exc:
            raise UnavailableError(
                f"lost the connection to Redis at {self._shown}: {exc}",
                reason=UnavailableReason.STORE_UNAVAILABLE,
            ) from None
        except _Refused as exc:
            raise UnavailableError(
                f"Redis refused the scan: {exc}", reason=UnavailableReason.STORE_UNAVAILABLE
            ) from None
        now = _now(reply[0], reply[1])
        epoch = reply[2].decode()
        if reply[3] == -1:
            raise ScanExpiredError(
                "Redis lost the data this scan walked: restart the scan",
                reason=UnavailableReason.STORE_UNAVAILABLE,
            )
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
