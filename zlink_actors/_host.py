"""`Host`: the public face of one runtime, and the one place that builds and wires it.

`Host.__init__` is the composition root: it makes the timer service, the application
pool, the registry, the workers and the publisher, hands them to the runtime kernel,
provides the tier services (`_engine/services.py`) and gives the record runner the
context class of each object kind. Below it, a part builds only what it owns outright
(the runtime its pending table, the pool its stall watch, the registry the Entry Spot).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from ._calls.contexts import (
    ACTOR_MANAGER,
    HTTP_CLIENTS,
    MESH_NODE,
    SPOT_MANAGER,
    ActorContext,
    CallSurface,
    ChannelContext,
    NodeContext,
    SpotContext,
)
from ._calls.create import ActorManager, SpotManager
from ._core import context as _context
from ._core.clock import Clock, SystemClock, TimerService, TimerStatistics
from ._core.completion import Completion
from ._core.dispatcher import DispatcherStatistics, get_dispatcher
from ._core.errors import (
    ConfigurationError,
    InvalidOperationError,
    NotConfiguredError,
    shutting_down,
)
from ._core.pool import AppPool, PoolStatistics
from ._core.state import HostState, ShutdownOutcome, ShutdownResult
from ._core.validation import check_seconds
from ._core.workers import CpuPool, CpuPoolStatistics, IoExecutor, IoStatistics
from ._engine import shutdown as _shutdown
from ._engine.kernel import Runtime
from ._engine.multicast import Publisher, PublisherStatistics
from ._engine.objects import Actor, ChannelHandler, NodeHandler, ObjectKind, Spot
from ._engine.registry import Engine
from ._engine.remote import LOCAL_ONLY, LocalChannels, node_key
from ._engine.runner import RecordRunner
from ._engine.services import Services
from .http.client import HttpClient
from .http.config import HttpClientConfig
from .http.hosted import HostScheduler, HttpClients
from .location.spi import LocationStore
from .mesh.codec import Codec, TypeRegistry
from .mesh.config import ChannelServer, MeshConfig, NodeInfo, PeerInfo, StateChange
from .mesh.node import MeshNode, MeshStatistics

__all__ = ["Host", "HostStatistics"]

_host_numbers = itertools.count(1)
#: Seconds a shutdown waits for the HTTP clients' sessions to close.
_HTTP_CLOSE = 5.0
log = logging.getLogger("zlink_actors")

# The defaults of `HostStatistics`' later fields: frozen, so one instance serves all.
_NO_CPU = CpuPoolStatistics(threads=0, busy_threads=0, queued_jobs=0, max_threads=0)
_NO_IO = IoStatistics(running=0, tasks=0, threads=0)
_NO_TIMERS = TimerStatistics(pending=0, entries=0, delays=0, threads=0)
_NO_PUBLISHER = PublisherStatistics(running=0, waiting=0, concurrency=0)


@dataclass(frozen=True, slots=True)
class HostStatistics:
    """A snapshot of one Host (see `Host.statistics()`). The runtime makes it; do not
    construct it yourself.

    Attributes:
        state: the Host's lifecycle state when the snapshot was taken.
        spots: the User Spots and Instance Spots registered now (Ready and not yet
            removed by a close). The Entry Spot is not counted.
        actors: the Actors registered now, whatever Spot they are members of.
        channels: the channel handlers, one per channel name.
        queued_records: records waiting in the lanes of those Spots, Actors and channel
            handlers (both lanes), not counting records that run or are suspended.
        waiting_sends: one-way sends waiting for an application-lane slot, all owners.
        pending_calls: calls started and not yet completed: requests waiting for their
            reply, CPU and I/O worker calls, and create calls. A shutdown completes what
            is still pending at its deadline with `ShuttingDownError`.
        handler_failures: since the Host was made: every handler, lifecycle hook after
            creation (`on_closing`, `on_actor_join`, `on_actor_leave`,
            `on_join_completed`), timer callback and done-callback run in one of its
            turns that raised, a `ZlinkError`
            included (done-callbacks on the process-shared dispatcher belong to no Host
            and are only logged).
        dropped_records: since the Host was made: one-way messages (and other records no
            caller waits for) discarded unrun because their owner closed first, or
            because a shutdown stopped the Host before they ran.
        pool: the application pool's `PoolStatistics`.
        dispatcher: the `DispatcherStatistics` of the completion dispatcher, which is
            shared by every Host in the process.
        internal_errors: since the Host was made: errors raised by the runtime's own
            work around a record (logged; the owner kept serving). Always a bug to report.
        cpu: the CPU worker pool's `CpuPoolStatistics`.
        io: the I/O executor's `IoStatistics`.
        timers: the timer service's `TimerStatistics` (deadlines and Spot timers; its
            `pending` count scans the service's entries).
        publisher: the publish admission's `PublisherStatistics`.
        mesh: the RouteMesh node's `MeshStatistics`; None without `mesh=`.

    The last six fields have defaults (0, and all-zero snapshots) only so that the
    class can grow; every snapshot `Host.statistics()` returns sets them all.
    """

    state: HostState
    spots: int
    actors: int
    channels: int
    queued_records: int
    waiting_sends: int
    pending_calls: int
    handler_failures: int
    dropped_records: int
    pool: PoolStatistics
    dispatcher: DispatcherStatistics
    internal_errors: int = 0
    cpu: CpuPoolStatistics = _NO_CPU
    io: IoStatistics = _NO_IO
    timers: TimerStatistics = _NO_TIMERS
    publisher: PublisherStatistics = _NO_PUBLISHER
    mesh: MeshStatistics | None = None


def _classes(name: str, value: object) -> list[type]:
    if isinstance(value, (str, bytes, type)) or not isinstance(value, Iterable):
        raise ConfigurationError(f"{name} must be a list of classes")
    return list(value)


def _positive_int(name: str, value: object, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ConfigurationError(f"{name} must be >= 1, got {value}")
    return value


_OBJECT_KINDS = (ObjectKind.SPOT, ObjectKind.ACTOR)
#: The message size `check_codec=True` enforces without a mesh (MeshConfig's default).
_CHECK_CODEC_LIMIT = 16 * 2**20


def _check_mesh(mesh: object, location: object, node_handler: object, check_codec: object) -> None:
    """`Host(...)` combinations (design/mesh.md §1), checked before anything is made."""
    if mesh is not None and not isinstance(mesh, MeshConfig):
        raise ConfigurationError(f"mesh must be a MeshConfig, got {type(mesh).__name__}")
    if not isinstance(check_codec, bool):
        raise ConfigurationError(f"check_codec must be a bool, got {type(check_codec).__name__}")
    if mesh is None:
        if location is not None:
            raise ConfigurationError("location= needs mesh=: the store serves a mesh's nodes")
        if node_handler is not None:
            raise ConfigurationError("node_handler= needs mesh=: it serves send_to_node()")
        return
    assert isinstance(mesh, MeshConfig)
    if location is not None and mesh.routing_id is not None:
        raise ConfigurationError(
            "a fixed MeshConfig(routing_id=...) is for a manual topology: with location= "
            "every start takes a fresh automatic routing id"
        )
    if location is not None and not all(
        callable(getattr(location, name, None)) for name in ("read", "write", "scan", "close")
    ):
        raise ConfigurationError(f"location must be a LocationStore, got {location!r}")


def _channel_servers(channels: object) -> tuple[dict[str, int], dict[str, type]]:
    """`channels=` values are handler classes or `ChannelServer`s: weights and classes."""
    if channels is None:
        return {}, {}
    if not isinstance(channels, Mapping):
        raise ConfigurationError("channels must be a mapping of name -> handler class")
    weights: dict[str, int] = {}
    classes: dict[str, type] = {}
    for name, value in channels.items():
        server = value if isinstance(value, ChannelServer) else None
        classes[name] = server.handler_cls if server is not None else value
        weights[name] = server.weight if server is not None else 100
    return weights, classes


def _wire_types(engine: Engine, extra: list[type]) -> TypeRegistry:
    """The payload types this Host knows on the wire: every handler's message and reply
    annotations, and `message_types=`."""
    registry = TypeRegistry()
    candidates: list[object] = list(extra)
    for info in engine.types.values():
        for handler in info.table.handlers():
            candidates.extend((handler.msg_type, handler.reply_type))
    for cls in candidates:
        if isinstance(cls, type) and cls.__module__ != "builtins":
            registry.add(cls)
    return registry


class Host(CallSurface):
    """One zlink-actors runtime: its threads, its objects and its calls.

    Use it as a context manager (`with Host(...) as host:` starts it and shuts it down),
    or call `start()` and `shutdown()` yourself. Calls made from application threads hang
    off the Host (`host.request_to_spot(...)`); inside handlers, off the context.

    Args:
        spots: the `Spot` subclasses this Host can create.
        actors: the `Actor` subclasses this Host can create.
        channels: ChannelName -> `ChannelHandler` subclass; one instance each.
        app_threads: threads in the shared application pool that runs every handler
            turn; default `min(4, os.cpu_count())`.
        application_lane_items: the application-lane item limit of every owner (1,024).
        default_request_timeout: seconds a request may take when it sets no `timeout()`;
            more than 0 and at most `threading.TIMEOUT_MAX`.
        cpu_workers: threads in the CPU worker pool (started on demand);
            default `os.cpu_count()`.
        clock: the clock for deadlines and timers; inject a `ManualClock` in tests.
        publish_concurrency: publish transactions running at once; more wait for a slot.
        http_clients: name -> `HttpClientConfig`: the HTTP clients `ctx.http(name)` and
            `host.http(name)` return (docs/http.md).
        mesh: a `MeshConfig`: this Host becomes a node of that RouteMesh (docs/mesh.md).
        location: a Location Store shared by the mesh's nodes (discovery; needs `mesh`).
        node_handler: a `NodeHandler` subclass: the target of `send_to_node` /
            `request_to_node` for this node (needs `mesh`).
        message_types: extra payload types this Host can decode from the wire.
        check_codec: every local payload and reply crosses the wire codec too, so a
            type that could not cross the network fails here (`ProtocolError`).
        on_state_change: called with a `StateChange` when this node's owner lease is
            fenced, recovers, or is lost with `on_lease_lost="shutdown"` (needs
            `mesh`; only a node with `location=` holds a lease). It runs on the
            completion dispatcher, in order: it must not block (what it raises is
            logged).

    Raises:
        ConfigurationError: an option has a wrong type or value, a class is not a
            subclass of the right base, two classes share a type name, or a handler is
            declared wrongly.
    """

    def __init__(
        self,
        *,
        spots: Iterable[type[Spot]] = (),
        actors: Iterable[type[Actor]] = (),
        channels: Mapping[str, type[ChannelHandler] | ChannelServer] | None = None,
        app_threads: int | None = None,
        application_lane_items: int = 1024,
        default_request_timeout: float = 5.0,
        cpu_workers: int | None = None,
        clock: Clock | None = None,
        publish_concurrency: int = 64,
        http_clients: Mapping[str, HttpClientConfig] | None = None,
        mesh: MeshConfig | None = None,
        location: LocationStore | None = None,
        node_handler: type[NodeHandler] | None = None,
        message_types: Iterable[type] = (),
        check_codec: bool = False,
        on_state_change: Callable[[StateChange], object] | None = None,
    ) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise ConfigurationError(f"clock must be a Clock, got {type(clock).__name__}")
        try:
            timeout = check_seconds("default_request_timeout", default_request_timeout)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from None
        cpus = os.cpu_count() or 1
        # Every option is checked before anything is made (the order of the checks is kept).
        cpu_threads = _positive_int("cpu_workers", cpu_workers, cpus)
        pool_threads = _positive_int("app_threads", app_threads, min(4, cpus))
        lane_items = _positive_int("application_lane_items", application_lane_items, 1024)
        publishes = _positive_int("publish_concurrency", publish_concurrency, 64)
        http_configs = HttpClients.check(http_clients)
        _check_mesh(mesh, location, node_handler, check_codec)
        if on_state_change is not None and (mesh is None or not callable(on_state_change)):
            raise ConfigurationError(
                "on_state_change= must be a callable, and needs mesh= (it reports the "
                "node's owner lease)"
            )
        extra_types = _classes("message_types", message_types)
        weights, channel_classes = _channel_servers(channels)
        name = f"zlink-host{next(_host_numbers)}"
        clock = clock if clock is not None else SystemClock()
        pool = AppPool(pool_threads, f"{name}-app", lane_items)
        io = IoExecutor(name=f"{name}-io")
        engine = Engine(name)
        runtime = Runtime(
            name=name,
            clock=clock,
            timers=TimerService(clock, name=f"{name}-timer"),
            default_request_timeout=timeout,
            pool=pool,
            engine=engine,
            cpu_pool=CpuPool(cpu_threads, name=f"{name}-cpu"),
            io=io,
            publisher=Publisher(pool, io, publishes),
            services=Services(),
            remote=LOCAL_ONLY,
        )
        for cls in _classes("spots", spots):
            engine.register(cls, ObjectKind.SPOT)
        for cls in _classes("actors", actors):
            engine.register(cls, ObjectKind.ACTOR)
        engine.add_channels(channel_classes)
        closed = frozenset(name for name, weight in weights.items() if weight == 0)
        if mesh is None and closed:
            runtime.remote = LocalChannels(closed)
        self._mesh: MeshNode | None = None
        routing_id = ""
        if mesh is not None:
            routing_id = mesh.routing_id or f"{mesh.routing_id_prefix}-{uuid.uuid4()}"
            engine.routing_id = routing_id
            if node_handler is not None:
                engine.add_node_handler(node_key(mesh.name, routing_id), node_handler)
        codec: Codec | None = None
        if mesh is not None or check_codec:
            limit = mesh.max_message_size if mesh is not None else _CHECK_CODEC_LIMIT
            codec = Codec(_wire_types(engine, extra_types), limit)
        if check_codec and codec is not None:
            runtime.codec_check = codec.roundtrip
        if mesh is not None:
            assert codec is not None
            object_types = [
                info.name for info in engine.types.values() if info.kind in _OBJECT_KINDS
            ]
            self._mesh = MeshNode(
                runtime,
                mesh,
                routing_id,
                codec,
                channels=weights,
                node_handler=node_handler is not None,
                object_types=object_types,
                location=location,
                on_state_change=on_state_change,
                shut_host_down=self._shut_down_for_lost_lease,
            )
            runtime.remote = self._mesh.remote  # its `Outbound`: no forwarding frame
            if location is not None:
                runtime.objects = self._mesh  # Spots and Actors are global (design/mesh.md §2)
            runtime.services.provide(MESH_NODE, self._mesh)
        runtime.services.provide(SPOT_MANAGER, SpotManager(runtime))
        runtime.services.provide(ACTOR_MANAGER, ActorManager(runtime))
        self._http = HttpClients(http_configs, HostScheduler(runtime, io))
        runtime.services.provide(HTTP_CLIENTS, self._http)
        runtime.services.seal()
        self._runtime = runtime
        self._runner = RecordRunner(
            runtime,
            {
                ObjectKind.SPOT: SpotContext,
                ObjectKind.ACTOR: ActorContext,
                ObjectKind.CHANNEL: ChannelContext,
                ObjectKind.NODE: NodeContext,
            },
        )

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def state(self) -> HostState:
        """The lifecycle state."""
        return self._runtime.state

    def start(self) -> Self:
        """Start serving (PREPARING -> SERVING). Idempotent while serving.

        Raises:
            InvalidOperationError: the Host is draining or stopped.
        """
        node = self._mesh
        if node is None or self._runtime.state is not HostState.PREPARING:
            self._runtime.start(self._runner)
            return self
        node.start()  # binds first: an address in use fails start() with nothing served
        self._runtime.start(self._runner)
        node.serve()
        return self

    def shutdown(self, deadline: float = 30.0) -> ShutdownResult:
        """Stop the Host and return how it ended. Idempotent.

        Seals admission (new calls complete with `ShuttingDownError`), lets accepted work
        run until `deadline` seconds have passed, completes every call still pending once
        with `ShuttingDownError`, drains the completion dispatcher and joins every thread
        the Host started. Teardown after the deadline gets up to one more second
        (`TEARDOWN_GRACE`), so a forced shutdown returns within `deadline + 1` s. A thread
        stuck in user code by then is abandoned (a daemon that ends when its code
        returns); the outcome is then `FORCE_STOPPED`.

        Args:
            deadline: seconds, more than 0 and at most `threading.TIMEOUT_MAX`.

        Raises:
            TypeError: `deadline` is not a real number, or is a bool.
            ValueError: `deadline` is 0, negative, NaN, infinite or too large.
            InvalidOperationError: called inside a runtime context (it blocks).
        """
        seconds = check_seconds("deadline", deadline)
        _context.forbid_blocking("Host.shutdown()")
        # docs/http.md: HTTP requests in flight end now with ShuttingDownError (a handler
        # awaiting one can finish its turn) and every client's connections close, while
        # the I/O executor's loop still runs.
        started = time.monotonic()
        node = self._mesh
        if node is not None:
            node.begin_drain(seconds)  # peers select this node no more
        self._http.close(min(seconds, _HTTP_CLOSE))
        # One deadline for the whole shutdown: what the clients took is not given again.
        left = max(0.0, seconds - (time.monotonic() - started))
        result = _shutdown.shutdown(self._runtime, left)
        if node is not None:
            node.close(max(0.0, seconds - (time.monotonic() - started)))
        return result

    def _shut_down_for_lost_lease(self) -> None:
        """`MeshConfig(on_lease_lost="shutdown")`: the node lost its lease (on a thread of
        its own; the result's reason is `LEASE_LOST`)."""
        self.shutdown()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        result = self.shutdown()
        if result.outcome is not ShutdownOutcome.STOPPED:
            log.warning("Host %s was force-stopped on exit: %s", self._runtime.name, result)

    def http(self, name: str) -> HttpClient:
        """The HTTP client configured as `name` (for application threads:
        `host.http("weather").get("/health").submit_sync()`).

        Raises:
            NotConfiguredError: no client of that name is configured.
        """
        return self._http.client(name)

    # -- the mesh --------------------------------------------------------------------

    def _node(self) -> MeshNode:
        if self._mesh is None:
            raise NotConfiguredError("this Host has no mesh (Host(mesh=MeshConfig(...)))")
        return self._mesh

    @property
    def node(self) -> NodeInfo:
        """This node's `NodeInfo` (mesh name, routing id, advertised endpoint).

        Raises:
            NotConfiguredError: no `mesh=`. InvalidOperationError: before `start()`.
        """
        info = self._node().info
        if info is None:
            raise InvalidOperationError("the Host is not started; call host.start() first")
        return info

    def peers(self) -> list[PeerInfo]:
        """Every peer known now (LOST ones while they are remembered)."""
        return self._node().peers()

    def wait_for_peers(self, count: int, *, timeout: float) -> list[PeerInfo]:
        """Block until at least `count` peers are READY; returns the READY ones.

        Raises:
            DeadlineExceededError: fewer within `timeout` seconds.
            InvalidOperationError: called in a runtime context (it blocks).
        """
        node = self._node()
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        seconds = check_seconds("timeout", timeout)
        _context.forbid_blocking("Host.wait_for_peers()")
        return node.wait_for_peers(count, seconds)

    def wait_ready(self, timeout: float) -> None:
        """Block until this Host serves and its node can reach the mesh it was told of.

        Ready means (docs/mesh.md "Readiness"): the Host is SERVING; with `location=`,
        its owner lease admits work (`statistics().mesh.lease_admitting`), discovery has
        read the Location Store's node list, and every node listed there (every
        channel server and placement target the store names) is READY (or DRAINING)
        here; with `peers=`, every endpoint has led to a live peer. A Host without a
        mesh is ready once it serves. Readiness is a moment, not a promise: a peer may
        be lost right after this returns.

        Args:
            timeout: seconds, more than 0 and at most `threading.TIMEOUT_MAX`.

        Raises:
            DeadlineExceededError: not ready within `timeout`; the message names each
                thing missing (the lease and the store's last error, each node not
                READY with its state, each `peers=` endpoint with no live peer).
            InvalidOperationError: before `start()`, or called in a runtime context (it
                blocks).
            ShuttingDownError: the Host is draining or stopped.
        """
        seconds = check_seconds("timeout", timeout)
        _context.forbid_blocking("Host.wait_ready()")
        state = self._runtime.state
        if state is HostState.PREPARING:
            raise InvalidOperationError("the Host is not started; call host.start() first")
        if state is not HostState.SERVING:
            raise shutting_down()
        if self._mesh is not None:
            self._mesh.wait_ready(seconds)

    def connect_peer(self, endpoint: str) -> Completion[PeerInfo]:
        """Dial `endpoint`; completes with the peer's `PeerInfo` once it is READY, or
        fails with `UnavailableError` (refused, rejected, unreachable)."""
        return self._node().connect_peer(endpoint)

    def set_channel_weight(self, channel: str, weight: int) -> None:
        """Change this node's weight for `channel` (0 = no new selections); this node
        sees it at once, peers as soon as the update reaches them."""
        ChannelServer(ChannelHandler, weight)  # the weight's own check
        self._node().set_channel_weight(channel, weight)

    # -- introspection -----------------------------------------------------------------

    @property
    def entry_spot_id(self) -> str:
        """The id of this Host's Entry Spot (the default membership of Actors)."""
        return self._runtime.engine.entry.id

    def statistics(self) -> HostStatistics:
        """A snapshot of owners, queued records, pool occupancy and pending calls, and of
        the CPU pool, the I/O executor, the timer service and publish admission.

        Counts only what the application made: the Entry Spot is not among `spots`.
        Each part takes only the lock its structure already uses, briefly; the timer
        count is a scan of the timer entries (O(entries)).
        """
        runtime = self._runtime
        engine = runtime.engine
        acts = engine.all_activations()
        entry = engine.entry
        return HostStatistics(
            state=runtime.state,
            spots=sum(1 for a in acts if a.kind is ObjectKind.SPOT and a is not entry),
            actors=sum(1 for a in acts if a.kind is ObjectKind.ACTOR),
            channels=sum(1 for a in acts if a.kind is ObjectKind.CHANNEL),
            queued_records=sum(a.box.queued() for a in acts),
            waiting_sends=sum(len(a.box.waiters or ()) for a in acts),
            pending_calls=len(runtime.pending),
            handler_failures=engine.handler_failures,
            dropped_records=engine.dropped_records,
            pool=runtime.pool.statistics(),
            dispatcher=get_dispatcher().statistics(),
            internal_errors=runtime.pool.internal_errors,
            cpu=runtime.cpu_pool.statistics(),
            io=runtime.io.statistics(),
            timers=runtime.timers.statistics(),
            publisher=runtime.publisher.statistics(),
            mesh=None if self._mesh is None else self._mesh.statistics(),
        )

    def __repr__(self) -> str:
        return f"<Host {self._runtime.name} {self.state.value}>"
