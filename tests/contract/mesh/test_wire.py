"""The wire between meshed Hosts (issue 15 item 7; design/mesh.md §2 "Wire").

A payload crosses under its type name; the receiver decodes only the types it knows, into
the type its handler declares. A request it cannot decode fails with `ProtocolError`, one
that no handler of the target takes with `NotFoundError`; a one-way of either kind is
logged and counted. A payload that cannot be encoded, or is larger than
`max_message_size`, fails the call with `ProtocolError` before anything is sent. Garbage
frames are logged and counted, answered with `ProtocolError` when they were requests, and
never stop the node.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import random
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import msgspec
import pytest
import zmq

import transports as t
from zlink_actors import (
    ErrorKind,
    Host,
    NodeContext,
    NodeHandler,
    NotFoundError,
    PeerState,
    ProtocolError,
    Spot,
    SpotContext,
    handler,
)
from zlink_actors.mesh import codec as wire
from zlink_actors.mesh import completion_endpoint
from zlink_actors.testing import WAIT, HostHarness, wait_until

from ._nodes import (
    MESH,
    SHARED,
    Blob,
    Nodes,
    Ping,
    Pong,
    Probe,
    Recorder,
    Work,
    mesh_stats,
    peer_state,
    recording_gate,
)


@pytest.fixture
def nodes(harness: HostHarness) -> Nodes:
    return Nodes(harness)


#: Liveness probes slow enough that none is sent while a test watches `frames_out`.
QUIET = {"liveness_interval": 30.0, "liveness_timeout": 60.0, "peer_expiry": 120.0}


def _counted(host: Host) -> int:
    """Received records the node logged and counted instead of handling."""
    stats = mesh_stats(host)
    return int(stats.decode_errors + stats.dropped_messages)


def _still_serves(caller: Host, node: Host, rec: Recorder) -> list[object]:
    """The node still answers its peer; returns what its handler saw."""
    assert (
        caller.request_to_node(MESH, node.node.routing_id, Work(42), reply=int).submit_sync() == 42
    )
    seen = caller.request_to_node(MESH, node.node.routing_id, Probe(), reply=list).submit_sync()
    assert isinstance(seen, list)
    assert seen[-1] == "work42"
    return seen


# -- what the receiver does not know ------------------------------------------------------


class Secret(msgspec.Struct, frozen=True):
    code: str


class Orphan(msgspec.Struct, frozen=True):
    n: int


def test_a_request_of_a_type_the_receiver_does_not_know_is_a_protocol_error(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add(message_types=(*SHARED, Secret))
    b = nodes.add(node_handler=recording_gate(rec))

    call = a.request_to_node(MESH, b.node.routing_id, Secret("x")).submit()
    assert type(call.exception(WAIT)) is ProtocolError
    assert _still_serves(a, b, rec) == ["work42"]


def test_a_one_way_of_a_type_the_receiver_does_not_know_is_counted(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add(message_types=(*SHARED, Secret))
    b = nodes.add(node_handler=recording_gate(rec))
    before = _counted(b)

    assert a.send_to_node(MESH, b.node.routing_id, Secret("x")).submit_sync() is None
    assert wait_until(lambda: _counted(b) == before + 1)
    assert _still_serves(a, b, rec) == ["work42"]


def test_a_request_of_a_known_type_no_handler_takes_is_not_found(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add(message_types=(*SHARED, Orphan))
    b = nodes.add(node_handler=recording_gate(rec), message_types=(*SHARED, Orphan))

    call = a.request_to_node(MESH, b.node.routing_id, Orphan(1)).submit()
    assert type(call.exception(WAIT)) is NotFoundError
    assert _still_serves(a, b, rec) == ["work42"]


def test_a_one_way_of_a_known_type_no_handler_takes_is_counted(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add(message_types=(*SHARED, Orphan))
    b = nodes.add(node_handler=recording_gate(rec), message_types=(*SHARED, Orphan))
    before = _counted(b)

    assert a.send_to_node(MESH, b.node.routing_id, Orphan(1)).submit_sync() is None
    assert wait_until(lambda: _counted(b) == before + 1)
    assert _still_serves(a, b, rec) == ["work42"]


class ForgedWork(msgspec.Struct, frozen=True):
    """Crosses under the receiver's type name `Work`, with a field of another type."""

    type_name: ClassVar[str] = "Work"
    n: str


@pytest.mark.parametrize("kind", ["request", "send"])
def test_a_payload_of_the_wrong_shape_for_its_type_name_is_refused(
    harness: HostHarness, nodes: Nodes, kind: str
) -> None:
    rec = Recorder(harness)
    a = nodes.add(message_types=(ForgedWork, Probe))
    b = nodes.add(node_handler=recording_gate(rec))
    rid = b.node.routing_id
    before = _counted(b)

    if kind == "request":
        call = a.request_to_node(MESH, rid, ForgedWork("x"), reply=int).submit()
        assert type(call.exception(WAIT)) is ProtocolError
    else:
        assert a.send_to_node(MESH, rid, ForgedWork("x")).submit_sync() is None
        assert wait_until(lambda: _counted(b) == before + 1)
    assert a.request_to_node(MESH, rid, Probe(), reply=list).submit_sync() == []


# -- what cannot be sent ----------------------------------------------------------------


class Opaque:
    """Not a payload type: msgspec cannot encode it."""


@pytest.mark.parametrize("kind", ["request", "send"])
@pytest.mark.parametrize(
    "payload",
    [Opaque(), Blob(data=Opaque())],  # type: ignore[arg-type]
    ids=["arbitrary-object", "struct-holding-one"],
)
def test_an_unencodable_payload_fails_with_protocol_error_before_anything_is_sent(
    harness: HostHarness, nodes: Nodes, kind: str, payload: object
) -> None:
    rec = Recorder(harness)
    a = nodes.add(mesh=QUIET)
    b = nodes.add(mesh=QUIET, node_handler=recording_gate(rec))
    rid = b.node.routing_id
    frames = mesh_stats(a).frames_out

    if kind == "request":
        call: Any = a.request_to_node(MESH, rid, payload).submit()
    else:
        call = a.send_to_node(MESH, rid, payload).submit()
    assert call.done()  # decided on the spot, before anything went to the transport
    assert type(call.exception()) is ProtocolError
    assert mesh_stats(a).frames_out == frames
    assert _still_serves(a, b, rec) == ["work42"]


@pytest.mark.parametrize("kind", ["request", "send"])
def test_a_payload_over_the_senders_max_message_size_fails_before_anything_is_sent(
    harness: HostHarness, nodes: Nodes, kind: str
) -> None:
    rec = Recorder(harness)
    a = nodes.add(mesh={**QUIET, "max_message_size": 1024})
    b = nodes.add(mesh=QUIET, node_handler=recording_gate(rec))
    rid = b.node.routing_id
    frames = mesh_stats(a).frames_out

    big = Blob(bytes(2048))
    call: Any = (
        a.request_to_node(MESH, rid, big).submit()
        if kind == "request"
        else a.send_to_node(MESH, rid, big).submit()
    )
    assert call.done()
    assert type(call.exception()) is ProtocolError
    assert mesh_stats(a).frames_out == frames
    assert _still_serves(a, b, rec) == ["work42"]


class Sink(NodeHandler):
    @handler
    def blob(self, ctx: NodeContext, msg: Blob) -> int:
        return len(msg.data)

    @handler
    def work(self, ctx: NodeContext, msg: Work) -> int:
        return msg.n


@pytest.mark.parametrize(
    "size",
    [2048, 100_000, 1024 * 1024],  # over B's limit; and over what B's transport reads
    ids=["over-the-limit", "over-the-transport-limit", "over-the-hard-cap"],
)
@pytest.mark.parametrize("kind", ["request", "send"])
def test_a_payload_over_the_receivers_max_message_size_fails_before_anything_is_sent(
    nodes: Nodes, kind: str, size: int
) -> None:
    a = nodes.add(mesh=QUIET)
    b = nodes.add(mesh={**QUIET, "max_message_size": 1024}, node_handler=Sink)
    rid = b.node.routing_id
    frames = mesh_stats(a).frames_out

    big = Blob(bytes(size))
    call: Any = (
        a.request_to_node(MESH, rid, big, reply=int).submit()
        if kind == "request"
        else a.send_to_node(MESH, rid, big).submit()
    )
    assert call.done()  # the handshake told A what B accepts
    assert type(call.exception()) is ProtocolError
    assert mesh_stats(a).frames_out == frames
    assert a.request_to_node(MESH, rid, Blob(bytes(100)), reply=int).submit_sync() == 100


# -- replies -------------------------------------------------------------------------------


class PongTwin(msgspec.Struct, frozen=True):
    """The fields of `Pong`, but another type."""

    n: int = 0


class Answers(NodeHandler):
    @handler
    def ping(self, ctx: NodeContext, msg: Ping) -> Pong:
        return Pong(msg.n)


def test_a_reply_of_another_type_with_the_same_fields_is_a_protocol_error(nodes: Nodes) -> None:
    a = nodes.add()
    b = nodes.add(node_handler=Answers)
    rid = b.node.routing_id

    call = a.request_to_node(MESH, rid, Ping(1), reply=PongTwin).submit()
    assert type(call.exception(WAIT)) is ProtocolError
    assert a.request_to_node(MESH, rid, Ping(2), reply=Pong).submit_sync() == Pong(2)


def test_a_reply_without_reply_decodes_into_the_known_type_it_names(nodes: Nodes) -> None:
    a = nodes.add()  # knows Pong (SHARED)
    b = nodes.add(node_handler=Answers)

    back = a.request_to_node(MESH, b.node.routing_id, Ping(3)).submit_sync()
    assert type(back) is Pong
    assert back == Pong(3)


def test_a_reply_of_a_type_the_caller_does_not_know_arrives_as_plain_values(nodes: Nodes) -> None:
    a = nodes.add(message_types=(Ping,))  # Pong is unknown here
    b = nodes.add(node_handler=Answers)

    back = a.request_to_node(MESH, b.node.routing_id, Ping(3)).submit_sync()
    assert back == {"n": 3}


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4 * 1024, 256 * 1024, 1024 * 1024], ids=str)
def test_bytes_payloads_arrive_intact(nodes: Nodes, size: int) -> None:
    digests: list[str] = []

    class Mirror(NodeHandler):
        @handler
        def echo(self, ctx: NodeContext, msg: bytes) -> bytes:
            digests.append(hashlib.sha256(msg).hexdigest())
            return msg

    a = nodes.add()
    b = nodes.add(node_handler=Mirror)
    data = random.Random(size).randbytes(size)
    digest = hashlib.sha256(data).hexdigest()

    back = a.request_to_node(MESH, b.node.routing_id, data, reply=bytes).submit_sync()
    assert back == data
    assert a.send_to_node(MESH, b.node.routing_id, data).submit_sync() is None
    assert wait_until(lambda: len(digests) == 2)
    assert digests == [digest, digest]


# -- garbage on the wire -------------------------------------------------------------------


@pytest.fixture
def dealer() -> Any:
    """A raw pyzmq DEALER with a routing id of its own; closed after the test."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, b"garbage-dealer")
    try:
        yield sock
    finally:
        sock.close(0)
        context.term()


GARBAGE = [
    [b"garbage"],
    [b""],
    [bytes(24)],  # an envelope's length, version 0
    [b"\x01" * 24, b"payload"],
    [b"\x01\x03" + bytes(22), b"not msgpack"],  # version 1, kind 3, no hello before it
]


def test_garbage_frames_from_a_raw_dealer_are_counted_and_the_node_keeps_serving(
    harness: HostHarness, nodes: Nodes, dealer: Any
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    dealer.connect(b.node.endpoint)

    for frames in GARBAGE:
        before = mesh_stats(b).decode_errors
        dealer.send_multipart(frames)
        assert wait_until(lambda before=before: mesh_stats(b).decode_errors == before + 1), frames
    assert _still_serves(a, b, rec) == ["work42"]
    assert peer_state(b, a.node.routing_id) is PeerState.READY


def test_garbage_records_from_a_peer_without_a_handshake_are_answered_and_counted(
    harness: HostHarness, nodes: Nodes
) -> None:
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    replies: queue.Queue[t.Inbound] = queue.Queue()
    ready: queue.Queue[t.PeerEvent] = queue.Queue()

    def received(batch: Any) -> None:
        for record in batch:
            replies.put(record)

    def event(e: t.PeerEvent) -> None:
        if e.kind is t.PeerEventKind.READY:
            ready.put(e)

    endpoint = b.node.endpoint
    rogue = t.Transport(b"rogue", received, on_event=event)
    try:
        # A transport-level peer that never says the mesh's hello.
        rogue.connect(b"b", t.Endpoints(endpoint, completion_endpoint(endpoint)))
        ready.get(timeout=WAIT)
        before = mesh_stats(b).decode_errors
        rogue.submit_request(b"b", 7, [b"\xc1 not an envelope"])
        request = wire.Envelope(
            wire.REQUEST,
            op=bytes(16),
            route=8,
            target_kind="node",
            target=b.node.routing_id,
            mesh=MESH,
            deadline=5.0,
            type_name="Work",
        )
        rogue.submit_request(
            b"b", 8, [wire.encode_envelope(request), msgspec.msgpack.encode(Work(1))]
        )
        rogue.submit(b"b", [b"\xc1 a one-way"])

        answers = {}
        for _ in range(2):
            record = replies.get(timeout=WAIT)
            assert record.kind is t.InboundKind.REPLY
            answers[record.route_id] = wire.decode_envelope(record.frames[0])
        assert sorted(answers) == [7, 8]
        assert all(env.error_kind == ErrorKind.PROTOCOL_ERROR for env in answers.values())
        assert wait_until(lambda: mesh_stats(b).decode_errors == before + 3)
    finally:
        rogue.close()
    assert _still_serves(a, b, rec) == ["work42"]


def _warnings(caplog: pytest.LogCaptureFixture, about: str) -> int:
    return sum(
        1 for r in caplog.records if r.levelno >= logging.WARNING and about in r.getMessage()
    )


def test_a_garbage_flood_is_counted_each_and_logged_a_bounded_number_of_times(
    harness: HostHarness, nodes: Nodes, dealer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: one WARNING per malformed message (2,000 here).
    caplog.set_level(logging.WARNING)
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    dealer.connect(b.node.endpoint)
    before = mesh_stats(b).decode_errors
    count = 2000
    start = time.monotonic()
    for i in range(count):
        dealer.send_multipart(GARBAGE[i % len(GARBAGE)])
    assert wait_until(lambda: mesh_stats(b).decode_errors == before + count)  # every one
    elapsed = time.monotonic() - start
    # One line per (event, peer, reason) a second, and at most one reason per kind of
    # garbage (some share theirs).
    lines = _warnings(caplog, "garbage-dealer")
    assert 1 <= lines <= len(GARBAGE) * (elapsed + 2), (lines, elapsed)
    assert _still_serves(a, b, rec) == ["work42"]


@contextlib.contextmanager
def _rogue(node: Host) -> Iterator[t.Transport]:
    """A bare transport named b"rogue" connected to `node` (READY at the transport level,
    no mesh handshake); closed at the end, also when the test failed."""
    ready: queue.Queue[t.PeerEvent] = queue.Queue()

    def event(e: t.PeerEvent) -> None:
        if e.kind is t.PeerEventKind.READY:
            ready.put(e)

    endpoint = node.node.endpoint
    rogue = t.Transport(b"rogue", lambda batch: None, on_event=event)
    try:
        rogue.connect(b"b", t.Endpoints(endpoint, completion_endpoint(endpoint)))
        ready.get(timeout=WAIT)
        yield rogue
    finally:
        rogue.close()


def test_a_flood_of_undecodable_records_from_a_peer_without_a_handshake_is_logged_bounded(
    harness: HostHarness, nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    rec = Recorder(harness)
    a = nodes.add()
    b = nodes.add(node_handler=recording_gate(rec))
    with _rogue(b) as rogue:
        before = mesh_stats(b).decode_errors
        count = 1000
        start = time.monotonic()
        for _ in range(count):
            rogue.submit(b"b", [b"\xc1 not an envelope"])  # parked ones go as b admits
        assert wait_until(lambda: mesh_stats(b).decode_errors == before + count)
        elapsed = time.monotonic() - start
    lines = _warnings(caplog, "bad record from b'rogue'")
    assert 1 <= lines <= elapsed + 2, (lines, elapsed)
    assert _still_serves(a, b, rec) == ["work42"]


def test_the_count_of_a_flood_that_stopped_is_logged_within_about_a_second(
    harness: HostHarness, nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the node logged the first bad record at once and the count of the rest
    # only at the next bad record or at its close (hours later, or never seen).
    caplog.set_level(logging.WARNING)
    b = nodes.add()
    with _rogue(b) as rogue:
        before = mesh_stats(b).decode_errors
        count = 200
        for _ in range(count):
            rogue.submit(b"b", [b"\xc1 not an envelope"])
        assert wait_until(lambda: mesh_stats(b).decode_errors == before + count)

        def held() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if "bad record from b'rogue'" in r.getMessage()
                and "more like this" in r.getMessage()
            ]

        assert wait_until(lambda: held() != [], 3.0), caplog.text[-2000:]  # b still runs
        lines = [r for r in caplog.records if "bad record from b'rogue'" in r.getMessage()]
        assert len(lines) == 2, [r.getMessage() for r in lines]  # the first, then the count
        assert held()[0].startswith(f"{count - 1} more like this"), held()


# -- check_codec -------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["payload", "reply"])
def test_check_codec_fails_locally_what_could_not_cross_the_network(
    harness: HostHarness, what: str
) -> None:
    class Room(Spot):
        @handler
        def blob(self, ctx: SpotContext, msg: Blob) -> Any:
            return Opaque() if what == "reply" else "ran"

    host = harness.host(spots=[Room], check_codec=True)
    host.spots.get_or_create("room", Room).submit_sync()
    payload = Blob(Opaque()) if what == "payload" else Blob(b"ok")  # type: ignore[arg-type]

    call = host.request_to_spot("room", payload).submit()
    assert type(call.exception(WAIT)) is ProtocolError


class Loose(msgspec.Struct, frozen=True):
    """A message with fields typed `object`: msgspec carries them as it does `Any`."""

    value: object
    items: list[object] = []
    extra: dict[str, object] = {}


@pytest.mark.parametrize("kind", ["request", "send"])
def test_check_codec_takes_a_field_typed_object_and_fails_only_the_call_it_cannot_encode(
    harness: HostHarness, kind: str
) -> None:
    seen: list[object] = []

    class Room(Spot):
        @handler
        def loose(self, ctx: SpotContext, msg: Loose) -> object:
            seen.append(msg.value)
            return [msg.value, msg.items, msg.extra]

    # Before the fix the Host refused to start: "it holds object, which is not a type
    # msgspec can encode and decode".
    host = harness.host(spots=[Room], check_codec=True)
    host.spots.get_or_create("room", Room).submit_sync()
    good = Loose({"n": (1, 2)}, [b"x", 3.5], {"k": None})

    def call(msg: Loose) -> Any:
        if kind == "request":
            return host.request_to_spot("room", msg).submit()
        return host.send_to_spot("room", msg).submit()

    first = call(good)
    bad = call(Loose(Opaque()))
    bad_inside = call(Loose(1, [Opaque()]))
    after = call(Loose("after"))
    assert type(bad.exception(WAIT)) is ProtocolError
    assert type(bad_inside.exception(WAIT)) is ProtocolError
    if kind == "request":
        # As the wire carries it: a tuple comes back a list.
        assert first.result(WAIT) == [{"n": [1, 2]}, [b"x", 3.5], {"k": None}]
        assert after.result(WAIT) == ["after", [], {}]
    else:
        assert first.result(WAIT) is None
        assert after.result(WAIT) is None
        assert wait_until(lambda: len(seen) == 2)
    assert seen == [{"n": [1, 2]}, "after"]  # the refused ones never reached the handler


def test_a_field_typed_object_crosses_the_mesh(harness: HostHarness, nodes: Nodes) -> None:
    class Echo(NodeHandler):
        @handler
        def loose(self, ctx: NodeContext, msg: Loose) -> object:
            return [msg.value, msg.items]

    a = nodes.add(message_types=(Loose,))
    b = nodes.add(node_handler=Echo)
    rid = b.node.routing_id
    msg = Loose({"a": [1, "two"]}, [None, 2.5])
    assert a.request_to_node(MESH, rid, msg).submit_sync() == [{"a": [1, "two"]}, [None, 2.5]]
    call = a.request_to_node(MESH, rid, Loose(Opaque())).submit()
    assert call.done()  # refused at the sender, before anything was sent
    assert type(call.exception()) is ProtocolError
    assert a.request_to_node(MESH, rid, Loose(7)).submit_sync() == [7, []]
