"""The four paths a request can take, as a table (`PATHS`): how each builds its world, and
where a path legitimately differs from the others, as data with the doc that says so.

A `World` is what one test gets: the caller's Host, the serving Host (the same one on the
local path), the target's address, the builders of a request and a one-way send to any
address of the path (from a Host or from a handler's context), and `flush()`, a round
trip to another target on the serving Host over the same connection as the target's
calls. The meshed worlds are built with the mesh contract tests' helpers
(`Nodes`, `GlobalMesh`): Hosts in this process on tcp loopback, the global one on a
`MemoryLocationStore`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from zlink_actors import (
    Host,
    HostState,
    NotFoundError,
    PeerState,
    RequestCall,
    SendCall,
    ShuttingDownError,
    SpotContext,
    UnavailableError,
    UnavailableReason,
)
from zlink_actors.testing import WAIT, HostHarness

from ..contract.mesh._global import GlobalMesh
from ..contract.mesh._global_objects import Journal, install
from ..contract.mesh._mesh import peer_state
from ..contract.mesh._nodes import MESH, Nodes
from ._targets import PAYLOADS, Ask, Driver, TargetChannel, TargetNode, TargetSpot

__all__ = ["PATHS", "Api", "Failure", "Path", "World"]

#: Where a call is built: a Host, or the context of the handler it is made in (both have
#: the same call surface; the `Driver`'s is a `SpotContext`).
Api = Host | SpotContext
#: A request builder: (api, address, payload, reply) -> the call.
Request = Callable[[Api, str, object, object], RequestCall[Any]]
#: A one-way builder: (api, address, payload) -> the call.
Send = Callable[[Api, str, object], SendCall]

#: An expected failure: its class, and the `UnavailableError` reason when it is one.
Failure = tuple[type[BaseException], UnavailableReason | None]


@dataclasses.dataclass
class World:
    """The Hosts and addresses of one test on one path."""

    path: Path
    caller: Host
    serving: Host
    request: Request
    send: Send
    flush_target: tuple[Request, str]
    journal: Journal
    target: str = "target"

    def call(
        self, payload: object, reply: object = None, api: Api | None = None
    ) -> RequestCall[Any]:
        """A request to the target, built on `api` (default: the caller's Host)."""
        return self.request(self.caller if api is None else api, self.target, payload, reply)

    def flush(self) -> None:
        """A round trip to another target of the serving Host, on the connection the
        target's calls use: what the caller sent before it (a cancel notice) has been
        read there once it returns."""
        request, address = self.flush_target
        assert request(self.caller, address, Ask(0), int).timeout(WAIT).submit_sync() == 1

    def queued(self) -> int:
        """Records waiting in the serving Host's lanes."""
        return self.serving.statistics().queued_records

    def draining(self) -> bool:
        """True once the caller sees the serving Host's shutdown (`path.draining`)."""
        return self.path.draining(self)


def _local_draining(world: World) -> bool:
    return world.serving.state is not HostState.SERVING


def _peer_draining(world: World) -> bool:
    return peer_state(world.caller, world.serving.node.routing_id) is not PeerState.READY


@dataclasses.dataclass(frozen=True)
class Path:
    """One row of the table: a path, how to build its world, and how it differs."""

    name: str
    build: Callable[[ExitStack], World]
    #: True once the caller can see that the serving Host began its shutdown.
    draining: Callable[[World], bool]
    #: What a request made while the serving Host drains ends with.
    refused_while_draining: Failure
    #: What a request whose handler outlives the serving Host's shutdown deadline may end
    #: with (one of these, once).
    forced_by_shutdown: tuple[Failure, ...]
    #: The caller's Host is the serving Host (its shutdown stops the caller too).
    caller_is_serving: bool = False
    #: What a request racing the start of the serving Host's drain may end with beyond
    #: `refused_while_draining` (one chosen before the drain was heard of, sent after).
    raced_drain: tuple[Failure, ...] = ()


def _harness(stack: ExitStack) -> tuple[HostHarness, Journal]:
    log = Journal()
    install(log)
    harness = stack.enter_context(HostHarness())
    stack.callback(log.release_all)  # runs first: no handler is left held at shutdown
    return harness, log


def _spot(api: Api, address: str, payload: object, reply: object) -> RequestCall[Any]:
    return api.request_to_spot(address, payload, reply)


def _spot_send(api: Api, address: str, payload: object) -> SendCall:
    return api.send_to_spot(address, payload)


def _node(api: Api, address: str, payload: object, reply: object) -> RequestCall[Any]:
    return api.request_to_node(MESH, address, payload, reply)


def _node_send(api: Api, address: str, payload: object) -> SendCall:
    return api.send_to_node(MESH, address, payload)


def _channel(api: Api, address: str, payload: object, reply: object) -> RequestCall[Any]:
    return api.request_to_channel(address, payload, reply)


def _channel_send(api: Api, address: str, payload: object) -> SendCall:
    return api.send_to_channel(address, payload)


def _local(stack: ExitStack) -> World:
    harness, log = _harness(stack)
    host = harness.host(spots=[TargetSpot, Driver], message_types=PAYLOADS, app_threads=4)
    for spot_id in ("target", "flush"):
        host.spots.get_or_create(spot_id, TargetSpot).submit_sync()
    return World(LOCAL, host, host, _spot, _spot_send, (_spot, "flush"), log)


def _node_direct(stack: ExitStack) -> World:
    harness, log = _harness(stack)
    nodes = Nodes(harness)
    caller = nodes.add(spots=[Driver], message_types=PAYLOADS)
    serving = nodes.add(
        node_handler=TargetNode,
        channels={"flush": TargetChannel},
        message_types=PAYLOADS,
        app_threads=4,
    )
    rid = serving.node.routing_id
    return World(NODE, caller, serving, _node, _node_send, (_channel, "flush"), log, rid)


def _channel_path(stack: ExitStack) -> World:
    harness, log = _harness(stack)
    nodes = Nodes(harness)
    caller = nodes.add(spots=[Driver], message_types=PAYLOADS)
    serving = nodes.add(
        node_handler=TargetNode,
        channels={"target": TargetChannel},
        message_types=PAYLOADS,
        app_threads=4,
    )
    flush = (_node, serving.node.routing_id)
    return World(CHANNEL, caller, serving, _channel, _channel_send, flush, log)


def _global(stack: ExitStack) -> World:
    mesh = stack.enter_context(GlobalMesh())
    serving = mesh.add(spots=[TargetSpot], message_types=PAYLOADS, app_threads=4)
    caller = mesh.add(spots=[Driver], message_types=PAYLOADS)  # no TargetSpot here
    for spot_id in ("target", "flush"):
        made = caller.spots.get_or_create(spot_id, TargetSpot).submit_sync()
        assert made.ref.routing_id == serving.node.routing_id  # placed on the serving Host
    return World(GLOBAL, caller, serving, _spot, _spot_send, (_spot, "flush"), mesh.journal)


#: A node that drains or was lost, seen from a caller on another node (docs/mesh.md
#: "Shutdown across nodes": the forced stop answers what is pending `ShuttingDownError`,
#: or the closing transport drops that answer and its BYE makes the caller see the peer
#: lost first: `UnavailableError` `peer_lost`; tests/contract/mesh/test_shutdown.py).
_REMOTE_FORCED: tuple[Failure, ...] = (
    (ShuttingDownError, None),
    (UnavailableError, UnavailableReason.PEER_LOST),
)

LOCAL = Path(
    "local",
    _local,
    _local_draining,
    # docs/completion.md "Terminators and builders": a call on a Host that is shutting
    # down fails with ShuttingDownError (the caller's Host is the serving one).
    refused_while_draining=(ShuttingDownError, None),
    # docs/completion.md "shutdown" step 3: pending calls complete with ShuttingDownError.
    forced_by_shutdown=((ShuttingDownError, None),),
    caller_is_serving=True,
)
NODE = Path(
    "node",
    _node_direct,
    _peer_draining,
    # docs/mesh.md "Shutdown across nodes" step 1 and "Topology" (States): node calls to
    # a DRAINING peer end UnavailableError, reason draining.
    refused_while_draining=(UnavailableError, UnavailableReason.DRAINING),
    forced_by_shutdown=_REMOTE_FORCED,
)
CHANNEL = Path(
    "channel",
    _channel_path,
    _peer_draining,
    # docs/mesh.md "Channels": a draining server is never selected, and with no
    # candidate, whatever the reason, a channel call is NotFoundError.
    refused_while_draining=(NotFoundError, None),
    forced_by_shutdown=_REMOTE_FORCED,
    # docs/mesh.md "Channels": the server is chosen when the call is made; one chosen
    # just before its DRAINING was heard of ends as a node call to it: draining.
    raced_drain=((UnavailableError, UnavailableReason.DRAINING),),
)
GLOBAL = Path(
    "global",
    _global,
    _peer_draining,
    # docs/mesh.md "Reaching an object": the owner node is draining: UnavailableError,
    # reason draining.
    refused_while_draining=(UnavailableError, UnavailableReason.DRAINING),
    forced_by_shutdown=_REMOTE_FORCED,
)

#: The paths every conformance test runs on, in this order (ids: their names).
PATHS: tuple[Path, ...] = (LOCAL, NODE, CHANNEL, GLOBAL)
