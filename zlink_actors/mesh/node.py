"""`MeshNode`: a Host's place in a RouteMesh (docs/mesh.md): its life (bind, serve,
drain, close), the application's views of its peers, and discovery through the Location
Store and the `peers=` keeper.

The node is built in layers, one module each (see `state.py`); this one adds its life
and its views to the global objects (`objects.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
import time

import zmq

import transports as t

from .._core import handoff
from .._core.errors import (
    DeadlineExceededError,
    UnavailableError,
    UnavailableReason,
    shutting_down,
)
from ..location.nodes import (
    NodeDescriptor,
    NodeDescriptorState,
    list_nodes,
    publish_node,
    withdraw_node,
)
from ..location.spi import LocationStore
from . import codec as wire
from .config import (
    NodeInfo,
    PeerInfo,
    PeerState,
    advertised,
    completion_endpoint,
    parse_endpoint,
)
from .loop_calls import pause
from .objects import GlobalObjects
from .outbound import Outbound
from .peers import Peer
from .shared import (
    CLOSE_POLL,
    DIAL_GRACE,
    ENVELOPE_ROOM,
    POLL,
    REDIAL_MAX,
    WITHDRAW_WAIT,
    log,
)
from .state import MeshStatistics, connection_name

__all__ = ["MeshNode", "MeshStatistics"]

#: Seconds between looks at readiness besides the peer table's wakes (`wait_ready`).
_READY_POLL = 0.05


class MeshNode(GlobalObjects):
    """One Host's node of a RouteMesh; built by `Host(mesh=...)`."""

    #: The nodes the store listed at discovery's last read (routing id -> endpoint; not
    #: this one); None before a first read succeeded.
    _listed: dict[str, str] | None = None
    #: The last error of discovery's store work ("" once it succeeded again).
    _store_error = ""

    @property
    def remote(self) -> Outbound:
        """The engine's remote SPI (`RemoteRoutes`) of this node: its `Outbound`, handed
        to the runtime itself so that a call pays no forwarding frame."""
        return self.outbound

    def start(self) -> None:
        """Bind the two endpoints, then dial `peers=` and start discovery. Runs before
        the runtime serves, so bind errors surface from `Host.start()`."""
        config = self.config
        transport_config = t.TransportConfig(
            credit_window=config.credit_window,
            min_charge=min(256, config.credit_window),
            max_message_size=config.max_message_size + ENVELOPE_ROOM,
            heartbeat_interval=config.liveness_interval,
            heartbeat_timeout=config.liveness_timeout,
            curve=self._curve(),
        )
        # What the I/O thread logs goes to handlers it does not own: its kept wakes are
        # made first (`handoff`; the package's own logger has the filter already).
        handoff.flush_before_logging("zlink_actors.mesh", "transports")
        transport = t.Transport(
            connection_name(self.routing_id, self.generation),
            self._on_receive,
            on_event=self._on_event,
            config=transport_config,
            read_budget=self._free_permits,
            # The wakes the callbacks make (a pool thread handed a request, a caller
            # handed its reply) wait for the I/O thread's sleep: docs/decisions.md.
            before_sleep=handoff.sleeping,
        )
        self.shared.attach(transport)
        try:
            application = self._bind(transport)
        except BaseException:
            transport.close()
            self.shared.attach(None)  # nothing to drain or close: the Host never served
            raise
        endpoint = advertised(application, config.advertise_host)
        if config.curve is not None:  # a dialling peer needs our public key
            endpoint = f"{endpoint}|{config.curve.public_z85()}"
        self.shared.attach(transport, NodeInfo(config.name, self.routing_id, endpoint))

    def _curve(self) -> t.CurveConfig | None:
        curve = self.config.curve
        if curve is None:
            return None
        return t.CurveConfig(curve.public_key, curve.secret_key, frozenset(curve.authorized_keys))

    def _bind(self, transport: t.Transport) -> str:
        listen = parse_endpoint(self.config.listen, allow_any_port=True)
        if listen.scheme == "ipc":
            return _bind_pair(transport, self.config.listen)
        host = "0.0.0.0" if listen.host == "*" else listen.host
        if listen.port:
            return _bind_pair(transport, f"tcp://{host}:{listen.port}")
        last: Exception | None = None
        for _ in range(32):
            port = _free_port_pair(host)
            app = f"tcp://{host}:{port}"
            try:
                return transport.bind(app, completion_endpoint(app)).application
            except Exception as exc:  # taken meanwhile: another pair
                last = exc
        raise UnavailableError(
            f"no free pair of ports on {host}: {last}", reason=UnavailableReason.UNREACHABLE
        )

    def serve(self) -> None:
        """The runtime serves: dial `peers=`, keep them dialled, start discovery."""
        for endpoint in self.config.peers:
            self._dial(endpoint, None)
        self._ticker = threading.Thread(
            target=self._tick, name=f"zlink-mesh-tick-{self.routing_id}", daemon=True
        )
        self._ticker.start()
        if self.config.peers:
            self._keeper = threading.Thread(
                target=self._keep_peers, name=f"zlink-mesh-{self.routing_id}", daemon=True
            )
            self._keeper.start()
        keeper = self.lease_keeper
        if self.location is not None and keeper is not None:
            loop = self.runtime.io.loop
            keeper.acquire(loop)
            self._discovery = asyncio.run_coroutine_threadsafe(self._discover(self.location), loop)
            keeper.start(loop, _LeaseWork(self))
            # A shutdown finisher (every object closed, the I/O loop still runs): the
            # keeper deletes the records still ours and releases the lease.
            self.runtime.finishers.append(keeper.stop)

    def begin_drain(self, seconds: float = 30.0) -> None:
        """Shutdown begins: tell peers we drain (never selected again), wait until each
        has told us (FIN) the last one-way it sent us and every one up to it is admitted
        here (at most `seconds` / 2, and at most `liveness_timeout`), and withdraw the
        descriptor."""
        with self._lock:
            if not self.shared.begin_drain():
                return
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
            silent = [p for p in self._peers.by_rid.values() if p.state is PeerState.LOST]
        # Our requests waiting for a silent peer to resume end now: the drain does not
        # wait for them (docs/mesh.md "Requests across a pause").
        for peer in silent:
            with self._lock:
                routes = list(peer.inflight)
                peer.inflight.clear()
            for route in routes:
                self.runtime.pending.finish(route, exc=shutting_down("the peer answered"))
        update = self._hello_bytes()
        for peer in peers:  # a notice: it must not wait behind credit or a PAUSED peer
            self._notify_quietly(peer.conn, wire.encode_fields(wire.UPDATE), update)
        self._await_fins(peers, min(seconds / 2, self.config.liveness_timeout))
        self.loop_calls.stop_task(self._discovery_stop, self._stopping)
        if self._keeper is not None:
            self._keeper.join(WITHDRAW_WAIT)
        if self._ticker is not None:
            self._ticker.join(WITHDRAW_WAIT)
        if self._discovery is not None:
            with contextlib.suppress(Exception):
                self._discovery.result(WITHDRAW_WAIT * 2)

    def _await_fins(self, peers: list[Peer], seconds: float) -> None:
        """Until `seconds` pass: wait for every peer still connected to have said FIN
        and for its one-ways up to that number to be received and admitted here (what
        it admitted before it learned of the drain is handled, not refused)."""
        end = time.monotonic() + seconds
        while True:
            with self._lock:
                waiting = [
                    p
                    for p in peers
                    if p.state is not PeerState.LOST and (p.fin_seq is None or p.in_seq < p.fin_seq)
                ]
                admitting = self._sends_waiting
            if (not waiting and not admitting) or time.monotonic() >= end:
                break
            # Bounded, shutdown only, as `close`: nothing announces the last arrival.
            time.sleep(CLOSE_POLL)
        if waiting:
            log.info(
                "mesh %s: drain: %d peer(s) did not confirm their last one-way in time",
                self.routing_id,
                len(waiting),
            )

    def close(self, seconds: float) -> None:
        """The runtime stopped: wait (at most `seconds`) until every peer has admitted
        what we sent it (its credit came back), say BYE, then close the transport (what
        is still parked fails, and its calls end with `ShuttingDownError`)."""
        with self._lock:
            if not self.shared.mark_closed():
                return
            transport = self.shared.transport
            peers = [p for p in self._peers.by_rid.values() if p.state is not PeerState.LOST]
        if transport is None:
            return
        end = time.monotonic() + seconds
        # Bounded, shutdown only: the transport has no event for "all credit returned".
        while transport.statistics().credit_in_use and time.monotonic() < end:
            time.sleep(CLOSE_POLL)
        # Held while the lease was fenced, never handed on: their senders count them.
        self._drop_held("the node shut down while its owner lease was fenced")
        for peer in peers:
            self._ack(peer)  # what reached us: before BYE, on the same connection
            self._notify_quietly(peer.conn, wire.encode_fields(wire.BYE), b"")
        transport.close()
        self.link.flush()  # what the last second of dropped records held back
        with self._lock:
            self._changed.notify_all()
            every = list(self._peers.by_rid.values())
        for peer in every:  # one-ways still waiting for a full target never went
            self.delivery.fail_target_waits(peer, shutting_down("the one-way was sent"))
        self.outbound.fail_all()

    def peers(self) -> list[PeerInfo]:
        with self._lock:
            self._peers.purge(time.monotonic())
            return [peer.info() for peer in self._peers.by_rid.values()]

    def wait_for_peers(self, count: int, timeout: float) -> list[PeerInfo]:
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                ready = [
                    p.info() for p in self._peers.by_rid.values() if p.state is PeerState.READY
                ]
                if len(ready) >= count:
                    return ready
                if self.shared.closed or self.shared.draining:
                    raise shutting_down()
                left = end - time.monotonic()
                if left <= 0:
                    raise DeadlineExceededError(
                        f"{len(ready)} of {count} peers READY after {timeout:g} s"
                    )
                self._changed.wait(left)

    def wait_ready(self, timeout: float) -> None:
        """Block until `missing()` is empty (docs/mesh.md "Readiness"); at most `timeout`
        seconds, then `DeadlineExceededError` naming what is still missing."""
        end = time.monotonic() + timeout
        while True:
            missing = self.missing()
            if not missing:
                return
            with self._lock:
                if self.shared.closed or self.shared.draining:
                    raise shutting_down()
                left = end - time.monotonic()
                if left <= 0:
                    break
                # Peers wake us; the lease and the store's node list change elsewhere.
                self._changed.wait(min(left, _READY_POLL))
        raise DeadlineExceededError(
            f"node {self.routing_id!r} is not ready after {timeout:g} s: " + "; ".join(missing)
        )

    def missing(self) -> list[str]:
        """What keeps this node from being ready, one phrase each (empty: ready): its
        owner lease not admitting; the store's node list not read yet, or a node it
        lists that is not READY (or DRAINING) here; a `peers=` endpoint with no live
        peer."""
        missing: list[str] = []
        if self.location is not None:
            # As `statistics().mesh.lease_admitting` says: also before the lease is
            # acquired and while a recovery claims the objects held here again.
            admitting = self._lease_admitting()
            if not admitting:
                why = f" (the Location Store: {self._store_error})" if self._store_error else ""
                missing.append(f"its owner lease is not admitting{why}")
            if self._listed is None:
                told = not admitting  # the store's error is named once
                why = f": {self._store_error}" if self._store_error and not told else ""
                missing.append(f"the Location Store's node list was not read yet{why}")
        with self._lock:
            for rid, endpoint in sorted((self._listed or {}).items()):
                peer = self._peers.by_rid.get(rid)
                if peer is None or peer.state not in (PeerState.READY, PeerState.DRAINING):
                    state = "unknown" if peer is None else peer.state.value
                    missing.append(f"node {rid!r} at {endpoint} is {state}")
            for endpoint in self.config.peers:
                dialled = self._dialled.get(endpoint)
                if (dialled is None or dialled.state is PeerState.LOST) and self._peers.by_endpoint(
                    endpoint
                ) is None:
                    missing.append(f"peers= endpoint {endpoint} has no READY peer")
        return missing

    def set_channel_weight(self, channel: str, weight: int) -> None:
        with self._lock:
            self.shared.set_weight(channel, weight)
        if self.shared.info is None:
            return  # not started: the handshake will carry the weight
        self._tell_update()

    def _lease_admitting(self) -> bool:
        """`LeaseKeeper.lease_admitting` (False without a Location Store: no lease)."""
        keeper = self.lease_keeper
        return keeper is not None and keeper.lease_admitting()

    def statistics(self) -> MeshStatistics:
        transport = self.shared.transport
        link = self.link
        keeper = self.lease_keeper
        with contextlib.ExitStack() as flows:
            # Every peer's one-ways held back for a full target, counted with the
            # transport's parked ones at one moment: FULL moves them from there to here
            # under the peer's `flow` lock, so none is counted twice or missed.
            peers = list(self._peers.by_rid.values())
            for peer in peers:
                flows.enter_context(peer.flow)
            stats = transport.statistics() if transport is not None else None
            waits = sum(len(w) for peer in peers for w in peer.full_targets.values())
        with self._lock:
            counts = {state.value: n for state, n in self._peers.counts().items()}
            return MeshStatistics(
                routing_id=self.routing_id,
                peers=counts,
                lost_peers=self._peers.lost_peers,
                credit_in_use=stats.credit_in_use if stats else 0,
                parked_sends=(stats.parked_messages if stats else 0) + waits,
                paused=self._paused,
                permits_in_use=self._permits_in_use,
                permits=self._permits,
                frames_in=stats.received_frames if stats else 0,
                frames_out=stats.sent_frames if stats else 0,
                decode_errors=link.decode_errors + (stats.dropped_frames if stats else 0),
                dropped_messages=self.dropped_messages,
                late_replies=self.outbound.late_replies,
                lease_admitting=self._lease_admitting(),
                lease_state=self.shared.lease_state,
                lease_generation=0 if keeper is None else keeper.generation,
                lease_recoveries=0 if keeper is None else keeper.recoveries,
                objects_reclaimed=self.objects_reclaimed,
                ownership_lost=self.ownership_lost,
                owned_objects=len(self._owned),
                route_cache_hits=self.route_cache_hits,
                route_cache_misses=self.route_cache_misses,
                route_cache_size=len(self._routes),
                unavailable=dict(link.unavailable),
                target_permits=self._target_cap,
                full_targets=sum(
                    1 for held in self._target_held.values() if held.count >= self._target_cap
                ),
                unpermitted_records=self.unpermitted_records,
                target_waits=waits,
                dropped_after_admission=self.delivery.dropped_after_admission,
                dropped_by_peer=dict(self.delivery.dropped_by_peer),
                duplicate_messages=self.duplicate_messages,
                held_while_fenced=self.held_while_fenced,
                forwarded_messages=self.forwarded_messages,
                replies_lost=self.replies_lost,
            )

    def _tick(self) -> None:
        """Every `_ACK_DELAY`: acknowledge the one-ways that reached us and were not
        acknowledged yet; expire the peers silent past `peer_expiry` (what they had not
        acknowledged is counted lost); close the refused dials (`_close_told`). Ends
        when discovery stops (the node drains; closing the transport closes the rest)."""
        stop = self._discovery_stop
        expiry = self.config.peer_expiry
        while not stop.wait(_ACK_DELAY):
            now = time.monotonic()
            with self._lock:
                peers = list(self._peers.by_rid.values())
            for peer in peers:
                if peer.state is PeerState.READY or peer.state is PeerState.DRAINING:
                    if peer.in_seq > peer.acked_in:
                        self._ack(peer)
                    if self._dropped_untold(peer):
                        self._tell_dropped(peer)
                elif peer.lost_at and not peer.expired and now - peer.lost_at > expiry:
                    self.delivery.expire(peer, f"silent past peer_expiry ({expiry:g} s)")
            self._close_told(now)
            if any(peer.kept_replies for peer in peers):
                self._forget_kept_replies(self._now())

    def _keep_peers(self) -> None:
        """Every liveness interval, dial again each `peers=` endpoint no live peer and
        no dial in progress has (a peer restarted at a fixed address rejoins)."""
        stop = self._discovery_stop
        interval = self.config.liveness_interval
        backoff = {endpoint: (0.0, interval) for endpoint in self.config.peers}
        while not stop.wait(interval):
            now = time.monotonic()
            for endpoint in self.config.peers:
                with self._lock:
                    self._peers.purge(now)
                    peer = self._dialled.get(endpoint)
                    live = peer is not None and peer.state is not PeerState.LOST
                due, delay = backoff[endpoint]
                if live:
                    backoff[endpoint] = (0.0, interval)
                elif now >= due and not stop.is_set():
                    # Again and again while it fails, each time later (up to 30 s): a
                    # peer that refuses us is not asked five times a second.
                    backoff[endpoint] = (now + delay, min(delay * 2, REDIAL_MAX))
                    self._dial(endpoint, None)

    def _descriptor(self, state: NodeDescriptorState) -> NodeDescriptor:
        info = self.shared.info
        assert info is not None
        with self._lock:
            channels = dict(self.shared.weights)
        return NodeDescriptor(
            self.config.name,
            self.routing_id,
            (info.endpoint,),
            self.generation,
            state,
            channels,
        )

    async def _discover(self, store: LocationStore) -> None:
        lease = self.config.lease
        next_publish = 0.0
        published = -math.inf
        stop = self._discovery_stop
        while not stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_publish:
                    await publish_node(
                        store, self._descriptor(NodeDescriptorState.READY), lease.ttl
                    )
                    next_publish = now + lease.renew_interval
                    published = now
                with self._lock:
                    self._peers.purge(now)
                nodes = await list_nodes(store, self.config.name)
                if now - published < lease.ttl / 2 and all(
                    node.routing_id != self.routing_id for node in nodes
                ):
                    # Our descriptor is gone long before its TTL: the store lost its
                    # data (a Redis restarted without persistence). The lease keeper
                    # checks its lease now, not at its next renewal; we publish again.
                    if self.lease_keeper is not None:
                        self.lease_keeper.check_now()
                    next_publish = now
                # Off the loop: a dial waits for the transport's I/O thread, and this loop
                # also runs the store's and the HTTP clients' work.
                await asyncio.to_thread(self._discover_all, nodes, now)
                self._store_error = ""
            except Exception as exc:  # the store is down: keep serving, try again
                self._store_error = f"{type(exc).__name__}: {exc}"
                log.warning("mesh %s: discovery: %s", self.routing_id, exc)
            await pause(POLL, self._stopping)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                withdraw_node(store, self.config.name, self.routing_id), WITHDRAW_WAIT
            )

    def _discover_all(self, nodes: list[NodeDescriptor], now: float) -> None:
        for node in nodes:
            self._discovered(node, now)
        self._listed = {  # what `missing()` waits for: the store's live nodes but this one
            node.routing_id: node.endpoints[0]
            for node in nodes
            if node.routing_id != self.routing_id
            and node.endpoints
            and node.state is NodeDescriptorState.READY
        }
        self._forget_connecting({node.routing_id for node in nodes})

    def _forget_connecting(self, listed: set[str]) -> None:
        """A CONNECTING entry whose descriptor is gone (expired, withdrawn) is forgotten:
        calls to it are `NotFoundError` again. One still listed stays, and is dialled
        again after a failed dial."""
        with self._lock:
            for rid, peer in list(self._peers.by_rid.items()):
                if peer.state is PeerState.CONNECTING and rid not in listed:
                    if peer.lost_at:
                        peer.state = PeerState.LOST  # it was lost: known for the retention
                    else:
                        del self._peers.by_rid[rid]
                    self._changed.notify_all()

    def _discovered(self, node: NodeDescriptor, now: float) -> None:
        rid = node.routing_id
        if (
            rid == self.routing_id
            or not node.endpoints
            or node.state is not NodeDescriptorState.READY
        ):
            return
        endpoint = node.endpoints[0]
        with self._lock:
            peer = self._peers.by_rid.get(rid)
            if peer is not None and peer.state in (PeerState.READY, PeerState.DRAINING):
                return  # connected (a LOST one still listed is dialled again: a broken link)
            if any(d.endpoint == endpoint for d in self._dials.values()):
                return
            if peer is not None and peer.state is PeerState.LOST:
                peer.state = PeerState.CONNECTING  # dialled again; LOST again if it goes
                self._changed.notify_all()
            elif peer is None:
                # Known from its descriptor, not connected yet: calls to it are
                # UnavailableError, not NotFoundError, until it is READY.
                self._peers.by_rid[rid] = Peer(
                    rid,
                    endpoint,
                    node.lease_generation,
                    b"",
                    state=PeerState.CONNECTING,
                    channels=dict(node.channels),
                )
                self._changed.notify_all()
            first = self._first_seen.setdefault(rid, now)
        if rid < self.routing_id and now - first < DIAL_GRACE:
            return  # it dials us; we only step in if it does not
        self._dial(endpoint, None, expect=rid)


#: Seconds between the ticker's rounds (`MeshNode._tick`): the longest an ACK waits.
_ACK_DELAY = 0.05


def _bind_pair(transport: t.Transport, application: str) -> str:
    """Bind the application endpoint and its completion one; `UnavailableError` when the
    system refuses (an address in use, a path that cannot be made)."""
    completion = completion_endpoint(application)
    try:
        return transport.bind(application, completion).application
    except zmq.ZMQError as exc:
        raise UnavailableError(
            f"cannot listen on {application} and {completion}: {exc}",
            reason=UnavailableReason.UNREACHABLE,
        ) from None


def _free_port_pair(host: str) -> int:
    """A port P with P and P+1 free on `host` now (bound, then released)."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first:
            first.bind((host, 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
            return int(port)
    raise UnavailableError(f"no free pair of ports on {host}", reason=UnavailableReason.UNREACHABLE)


class _LeaseWork:
    """What the lease keeper has the node do (`LeaseWork`), while the node is one class:
    each call goes to the layer that holds it."""

    __slots__ = ("_node",)

    def __init__(self, node: MeshNode) -> None:
        self._node = node

    async def reclaim_all(self, wiped: bool) -> None:
        await self._node._reclaim_all(wiped)

    async def release_all(self) -> None:
        await self._node.release_all()

    def take_episode(self) -> tuple[int, int]:
        return self._node.take_episode()

    def tell_update(self) -> None:
        self._node._tell_update()

    def admitting_again(self) -> None:
        node = self._node
        if node._fence_held is not None:
            node._deliver_held()

    def purge(self, now: float) -> None:
        self._node._purge_routes(now)
