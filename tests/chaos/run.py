"""The chaos run: a redis-server, three node processes (node.py) and a driver (this
process's Host, an Object Client), steady one-way and request traffic to global Spots and
Actors, random faults for a while, then the checks of check.py over every process's log.

`run_chaos(ChaosConfig(...))` returns the `Report`; `python -m tests.chaos` is its command
line. Every process, the Redis and the log directory are removed on the way out, also on
an exception or Ctrl-C. The fault loop runs on the calling (main) thread: a node or Redis
it restarts dies with the thread that started it (`PR_SET_PDEATHSIG`), so that thread
lives as long as the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import zlink_actors as z
from tests.contract.location._redis_server import RedisServer, redis_server_binary
from tests.integration.mesh.netns import NetnsUnavailable, Network
from tests.integration.mesh.nodes import FAST, START_WAIT, NodeProcess, NodeProcesses

from .check import Report, check
from .events import EventLog, read_events
from .model import ALL_TYPES, Hit, Hitted, MakeHere, Ping, Pong, Tally, Walker, mesh_figures

__all__ = [
    "FAULTS",
    "FENCE_FAULTS",
    "SHORT_FAULTS",
    "ChaosConfig",
    "partition_unavailable",
    "run_chaos",
]

MESH = "chaos"
NODES = 3
#: The node's liveness (the mesh tests' FAST) and lease timings. A `pause-long` outlasts
#: the liveness timeout and stays inside the lease (ttl - fencing margin); a
#: `pause-lease` outlasts the lease's ttl.
LEASE = {"renew_interval": 0.25, "ttl": 3.0, "renew_timeout": 0.25, "fencing_margin": 0.5}
#: How long each fault lasts (seconds, drawn uniformly).
PAUSES = {"pause-short": (0.2, 0.8), "pause-long": (1.3, 2.3), "pause-lease": (3.5, 5.0)}
PARTITION = (0.5, 4.0)
#: What each fault does (docs/testing.md, "The chaos run").
FAULTS = (
    "pause-short",  # SIGSTOP / SIGCONT of a node, shorter than its liveness timeout
    "pause-long",  # longer than the liveness timeout, shorter than the lease
    "pause-lease",  # longer than the lease's ttl
    "kill",  # SIGKILL of a node and a new node process in its place
    "redis-restart",  # SIGKILL of Redis, started again on its append-only file
    "redis-wipe",  # SIGKILL of Redis, started again with nothing (no persistence)
    "partition",  # a node's namespace cut off the bridge (from everything), then healed
)
#: The faults of the two short runs in `make test` (tests/chaos/test_chaos_run.py): the
#: pauses and kills, and what fences a node (a pause past its lease, Redis restarted
#: with or without its data) with kills. Partitions need network namespaces: `make
#: chaos` has them.
SHORT_FAULTS = ("pause-short", "pause-long", "kill")
FENCE_FAULTS = ("pause-lease", "redis-restart", "redis-wipe", "kill")
#: `MeshConfig(peer_expiry=...)` for the nodes and the driver where the mesh has it
#: (issue 26 item 1): a killed node's undelivered one-ways are counted this long after.
PEER_EXPIRY = 6.0


@dataclasses.dataclass
class ChaosConfig:
    """One run: `seconds` of faults drawn from `faults` with `seed`."""

    seed: int
    seconds: float
    faults: tuple[str, ...] = FAULTS
    objects: int = 6  # Spots, and as many Actors
    rate: float = 80.0  # calls a second (half one-way, half request)
    in_flight: int = 300  # calls at most unfinished at once
    request_timeout: tuple[float, float] = (0.3, 2.0)  # each request's, drawn uniformly
    gap: tuple[float, float] = (0.5, 2.0)  # seconds between two faults
    settle: float = 30.0  # bound for the calls to end and the nodes to serve again
    log_dir: str | None = None  # kept when given, else a temporary one (removed)
    say: Callable[[str], None] = print


def partition_unavailable() -> str | None:
    """Why the `partition` fault cannot run here, or None (it may still fail to create
    its namespaces: the run then says so and goes on without it)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on the PATH"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    return None


def run_chaos(config: ChaosConfig) -> Report:
    """Run it and check it; the `Report` says what held."""
    directory = config.log_dir or tempfile.mkdtemp(prefix="zlchaos-")
    pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
    try:
        with _Run(config, pathlib.Path(directory)) as run:
            run.go()
        events, torn = read_events(directory)
        return check(events, torn=torn)
    finally:
        if config.log_dir is None:
            shutil.rmtree(directory, ignore_errors=True)


def _mesh_options() -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(z.MeshConfig)}
    return {"peer_expiry": PEER_EXPIRY} if "peer_expiry" in fields else {}


class _Run:
    def __init__(self, config: ChaosConfig, directory: pathlib.Path) -> None:
        self.config = config
        self.dir = directory
        self.rng = random.Random(config.seed)
        self.log = EventLog(directory / "driver.jsonl")
        self.stop_traffic = threading.Event()
        self.stop_recovery = threading.Event()
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("the chaos run needs redis-server (see docs/testing.md)")
        self.redis_dir = directory / "redis"
        self.redis_dir.mkdir()
        self.net: Network | None = None
        if "partition" in config.faults:  # every node in a namespace of its own
            try:
                self.net = Network(NODES, host_link=True).create()
            except NetnsUnavailable as exc:
                config.say(f"chaos: partition skipped: network namespaces unavailable: {exc}")
                config.faults = tuple(f for f in config.faults if f != "partition")
                if not config.faults:
                    raise
        also_bind = () if self.net is None else (self.net.host_address,)
        self.redis = RedisServer(binary, persist_dir=str(self.redis_dir), also_bind=also_bind)
        self.cut: set[int] = set()
        self.prefix = f"zlchaos-{uuid.uuid4().hex[:8]}"
        self.processes = NodeProcesses()
        self.nodes: list[NodeProcess] = []
        self.incarnations = [0] * NODES
        self.host: z.Host | None = None
        self.store: z.RedisLocationStore | None = None
        self.targets = [f"spot:tally-{n}" for n in range(config.objects)] + [
            f"actor:walker-{n}" for n in range(config.objects)
        ]
        self.owner: dict[str, str] = {}
        self.broken: set[str] = set()
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(config.in_flight)
        self.calls = 0
        self.last_kill = 0.0
        self.threads: list[threading.Thread] = []

    # -- life ------------------------------------------------------------------------

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_traffic.set()
        self.stop_recovery.set()
        for node in self.nodes:  # never leave a node stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGCONT)
        if self.net is not None:
            for index in self.cut:
                with contextlib.suppress(NetnsUnavailable):
                    self.net.heal(index)
        for thread in self.threads:
            thread.join(10.0)
        try:
            left = self.processes.close()
            if left:
                self.config.say(f"chaos: node processes still running: {[n.pid for n in left]}")
        finally:
            try:
                if self.host is not None:
                    self.host.shutdown(5.0)
                if self.store is not None:
                    self.store.close()
            finally:
                self.redis.stop()
                self.log.close()
                if self.net is not None:
                    self.net.remove()

    def _launch(self, index: int) -> NodeProcess:
        self.incarnations[index] += 1
        url, wrap, listen = self.redis.url, [], "tcp://127.0.0.1:0"
        if self.net is not None:  # in namespace `index`, reaching Redis over the bridge
            url = f"redis://{self.net.host_address}:{self.redis.port}/0"
            wrap, listen = self.net.prefix(index), f"tcp://{self.net.namespaces[index].address}:0"
        return self.processes.launch(
            wrap,
            module="tests.chaos.node",
            mesh=MESH,
            listen=listen,
            lease=LEASE,
            mesh_options=_mesh_options(),
            redis={"url": url, "key_prefix": self.prefix},
            log=str(self.dir / f"node{index}-{self.incarnations[index]}.jsonl"),
            stderr_to=str(self.dir / f"node{index}-{self.incarnations[index]}.log"),
        )

    def _up(self, node: NodeProcess) -> None:
        self.processes.ready(node, timeout=START_WAIT)
        self.log.write("node_up", node=node.routing_id, pid=node.pid)

    def go(self) -> None:
        config = self.config
        if self.net is not None:
            self.log.write("network", tag=self.net.tag, namespaces=NODES)
        self.redis.start()
        self.nodes = [self._launch(i) for i in range(NODES)]
        for node in self.nodes:
            self._up(node)
        self.store = z.RedisLocationStore(self.redis.url, key_prefix=self.prefix)
        listen = "tcp://127.0.0.1:0" if self.net is None else f"tcp://{self.net.host_address}:0"
        self.host = z.Host(
            mesh=z.MeshConfig(
                MESH,
                listen=listen,
                liveness_interval=FAST["liveness_interval"],
                liveness_timeout=FAST["liveness_timeout"],
                lease=z.LeaseConfig(**LEASE),
                **_mesh_options(),
            ),
            location=self.store,
            message_types=ALL_TYPES,
        ).start()
        self.host.wait_for_peers(NODES, timeout=START_WAIT)
        for target in self.targets:
            self._create(target, 10.0)
        config.say(f"chaos: {NODES} nodes, {len(self.targets)} objects, traffic started")
        self._thread(self._traffic)
        self._thread(self._recover)
        self._faults()
        self._finish()

    def _thread(self, fn: Callable[[], None]) -> None:
        thread = threading.Thread(target=fn, daemon=True, name=f"chaos-{fn.__name__}")
        thread.start()
        self.threads.append(thread)

    # -- traffic -----------------------------------------------------------------------

    def _call_id(self) -> str:
        with self.lock:
            self.calls += 1
            return f"c{self.calls}"

    def _submit(self, target: str, kind: str, timeout: float = 2.0) -> z.Completion[Any] | None:
        """Log and submit one call (a request with `timeout`); its end is logged when it
        completes."""
        assert self.host is not None
        call_id = self._call_id()
        obj_kind, obj_id = target.split(":", 1)
        self.log.write(
            "call", id=call_id, kind=kind, target=target, deadline=time.monotonic() + timeout
        )
        payload = Hit(call_id)
        try:
            if kind == "send":
                send = self.host.send_to_spot if obj_kind == "spot" else self.host.send_to_actor
                completion: z.Completion[Any] = send(obj_id, payload).submit()
            else:
                request = (
                    self.host.request_to_spot if obj_kind == "spot" else self.host.request_to_actor
                )
                completion = request(obj_id, payload, reply=Hitted).timeout(timeout).submit()
        except Exception as exc:  # a call refused before it started ends here
            self._ended(call_id, target, None, exc)
            return None
        completion.add_done_callback(lambda c: self._ended(call_id, target, c, None))
        return completion

    def _ended(
        self,
        call_id: str,
        target: str,
        completion: z.Completion[Any] | None,
        refused: BaseException | None,
    ) -> None:
        exc = refused if completion is None else completion.exception(0)
        if exc is None:
            assert completion is not None
            value = completion.result(0)
            if isinstance(value, Hitted):
                with self.lock:
                    self.owner[target] = value.node
            self.log.write("end", id=call_id, outcome="ok")
        else:
            reason = getattr(getattr(exc, "reason", None), "value", None)
            self.log.write("end", id=call_id, outcome=type(exc).__name__, reason=reason)
            if isinstance(exc, z.UnavailableError | z.NotFoundError):
                with self.lock:
                    self.broken.add(target)
        self.slots.release()

    def _traffic(self) -> None:
        rng = random.Random(self.config.seed + 1)
        pace = 1.0 / self.config.rate
        due = time.monotonic()
        while not self.stop_traffic.is_set():
            if not self.slots.acquire(timeout=0.1):
                continue  # bounded: as many calls unfinished as `in_flight`
            timeout = rng.uniform(*self.config.request_timeout)
            self._submit(rng.choice(self.targets), rng.choice(("send", "request")), timeout)
            due += pace
            self.stop_traffic.wait(max(0.0, due - time.monotonic()))

    # -- the application's take-over --------------------------------------------------

    def _create(self, target: str, timeout: float) -> bool:
        """get-or-create `target` (placed by the mesh); True once it exists. Logs where
        (`placed`: whether this call created it, and when the call began)."""
        assert self.host is not None
        obj_kind, obj_id = target.split(":", 1)
        manager = self.host.spots if obj_kind == "spot" else self.host.actors
        cls: Any = Tally if obj_kind == "spot" else Walker
        end = time.monotonic() + timeout
        while True:
            since = time.monotonic()
            try:
                made = manager.get_or_create(obj_id, cls).timeout(3.0).submit_sync()
            except z.ZlinkError:
                if time.monotonic() > end:
                    return False
                time.sleep(0.1)  # retrying a create whose store or owner is away
                continue
            node = str(made.ref.routing_id)
            with self.lock:
                self.owner[target] = node
            created = isinstance(made, z.Created)
            self.log.write("placed", target=target, node=node, created=created, since=since)
            return True

    def _recover(self) -> None:
        """What an application does after a node crash (docs/mesh.md, "A crashed
        owner"): an object whose owner is not READY here is closed (the store allows it
        once the owner's lease expired) and created again; a missing one is created."""
        assert self.host is not None
        while not self.stop_recovery.wait(0.5):
            with self.lock:
                broken, self.broken = self.broken, set()
            ready = {p.routing_id for p in self.host.peers() if p.state is z.PeerState.READY}
            for target in sorted(broken):
                obj_kind, obj_id = target.split(":", 1)
                manager = self.host.spots if obj_kind == "spot" else self.host.actors
                try:
                    if self.owner.get(target) not in ready:
                        manager.close(obj_id).timeout(3.0).submit_sync()
                except z.NotFoundError:
                    pass  # no record: create it
                except z.ZlinkError:
                    continue  # its owner's lease is still live, or the store is away
                self._create(target, 0.0)

    # -- faults ------------------------------------------------------------------------

    def _faults(self) -> None:
        config = self.config
        end = time.monotonic() + config.seconds
        bag: list[str] = []  # each fault once in a shuffled round, then the next round
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(*config.gap))  # the schedule, not a synchronisation
            if not bag:
                bag = list(config.faults)
                self.rng.shuffle(bag)
            fault = bag.pop()
            index = self.rng.randrange(NODES)
            started = time.monotonic()
            node = self.nodes[index].routing_id
            if fault in PAUSES:
                self._pause(index, self.rng.uniform(*PAUSES[fault]))
            elif fault == "kill":
                self._kill(index)
            elif fault == "partition":
                self._partition(index, self.rng.uniform(*PARTITION))
            elif fault in ("redis-restart", "redis-wipe"):
                node = "redis"
                self._restart_redis(wipe=fault == "redis-wipe")
            else:
                raise ValueError(f"unknown fault {fault!r}")
            self.log.write("fault", fault=fault, node=node, t0=started, t1=time.monotonic())

    def _pause(self, index: int, seconds: float) -> None:
        pid = self.nodes[index].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the fault itself: the node stays stopped this long
        finally:
            os.kill(pid, signal.SIGCONT)

    def _partition(self, index: int, seconds: float) -> None:
        assert self.net is not None
        self.cut.add(index)
        self.net.cut(index)
        try:
            time.sleep(seconds)  # the fault itself: the node stays cut off this long
        finally:
            self.net.heal(index)
            self.cut.discard(index)

    def _kill(self, index: int) -> None:
        old = self.nodes[index]
        old.kill()
        self.log.write("node_down", node=old.routing_id, pid=old.pid)
        self.last_kill = time.monotonic()
        new = self._launch(index)
        self.nodes[index] = new
        self._up(new)

    def _restart_redis(self, *, wipe: bool) -> None:
        self.redis.kill()
        if wipe:
            for path in self.redis_dir.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        time.sleep(self.rng.uniform(0.05, 1.0))  # the outage
        self.redis.start()

    # -- after the faults ----------------------------------------------------------------

    def _finish(self) -> None:
        """After the faults: every call ends, one request goes to every object, every
        node is probed; all of it within `settle` (a probe gets at least 5 s)."""
        config = self.config
        assert self.host is not None
        config.say("chaos: faults over; waiting for every call to end")
        self.stop_traffic.set()
        self.threads[0].join(10.0)  # the traffic
        end = time.monotonic() + config.settle
        taken = 0  # every call ends (a one-way waiting for credit too): all slots back
        while taken < config.in_flight and time.monotonic() < end:
            if self.slots.acquire(timeout=0.1):
                taken += 1
        for _ in range(taken):
            self.slots.release()
        expiry = _mesh_options().get("peer_expiry")
        if expiry is not None:  # a killed node's one-ways are counted by now
            time.sleep(max(0.0, self.last_kill + expiry + 1.0 - time.monotonic()))
        # One request to every object, behind the one-ways to it (in order), all at once;
        # the take-over goes on meanwhile.
        flush = [
            self._submit(target, "request", 2.0)
            for target in self.targets
            if self.slots.acquire(timeout=0.1)  # (free unless a call never ended)
        ]
        for completion in flush:
            if completion is not None:
                completion.wait(max(0.0, end - time.monotonic()))
        self.stop_recovery.set()
        self.threads[1].join(10.0)
        config.say("chaos: probing every node")
        for node in self.nodes:
            ok, detail = self._probe(node, end)
            self.log.write("probe", node=node.routing_id, ok=ok, detail=detail)
        self.log.write("stats", who="driver", **mesh_figures(self.host))

    def _call_and_wait(self, target: str) -> str:
        """A logged request to `target`, waited for: "ok" or what it ended with."""
        if not self.slots.acquire(timeout=5.0):
            return "no slot"
        completion = self._submit(target, "request")
        if completion is None or not completion.wait(7.0):
            return "refused" if completion is None else "no answer"
        exc = completion.exception(0)
        return "ok" if exc is None else f"{type(exc).__name__}: {exc}"

    def _probe(self, node: NodeProcess, end: float) -> tuple[bool, str]:
        """The node answers, creates an object of its own and serves it (retried until
        `end`, at least 5 s)."""
        assert self.host is not None
        rid = node.routing_id
        detail = "no answer"
        end = max(end, time.monotonic() + 5.0)
        attempt = 0
        while time.monotonic() < end:
            attempt += 1
            obj_id = f"probe-{rid[-8:]}-{attempt}"
            try:
                pong = self.host.request_to_node(MESH, rid, Ping(attempt), reply=Pong)
                pong.timeout(2.0).submit_sync()
                made = self.host.request_to_node(MESH, rid, MakeHere("spot", obj_id), reply=str)
                where = made.timeout(6.0).submit_sync()
                detail = (
                    f"created on {where}" if where != rid else self._call_and_wait(f"spot:{obj_id}")
                )
                if detail == "ok":
                    return True, f"attempt {attempt}"
            except z.ZlinkError as exc:
                detail = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)  # the next probe attempt
        return False, detail


@contextlib.contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM ends the run as Ctrl-C does (its `finally` blocks clean up), and Ctrl-C
    does so even when the run was started with SIGINT ignored (a background job of a
    shell script inherits that, and Python then installs no handler of its own)."""

    def raise_interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    previous_int = signal.signal(signal.SIGINT, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
