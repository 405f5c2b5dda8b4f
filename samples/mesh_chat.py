"""A multi-process sample: chat rooms on a RouteMesh of three processes and one Redis.

`make demo-mesh` runs it on loopback. It starts a `redis-server` of its own (unless given
`--redis-url`) and two **Object Servers**: this file again, run with the `server` role,
each registering the `Room` Spot and the `Player` Actor. This process is the **Object
Client** front end: a Host with `location=` and no Spot or Actor types of its own. The
three find each other through the Location Store (each publishes a node descriptor in
Redis), so no node is given another's address.

- `spots.get_or_create(id, Room)` on the client places each room on a server (a READY
  peer that registers `Room`, by placement weight); `ref.routing_id` says which. Players
  are placed the same way.
- A request to a room or a player is routed to its owner, wherever it lives; the replies
  say which node handled them. A player's handler asks a room on the other server.
- `publish()` reaches the subscribed rooms on every node.
- One server is SIGKILLed: requests to its objects end with `UnavailableError` (once the
  mesh sees the node gone, within `liveness_timeout`; the client and the other server
  each log that on stderr), an id never created is `NotFoundError`, and the objects on
  the other server keep serving.

Its own `redis-server` runs without persistence (it lives as long as the demo): were it
restarted, every node would lose its lease and every record, be fenced at once, and
recover by itself within about a second (a new lease; each node writes back the records
of the objects it holds). A Redis that outlives the processes should keep an append-only
file (README.md, "What a Redis restart costs").

Routing ids are random; the transcript names the servers "server-1", "server-2", ... in
the order they first appear in it. Every child process has ended when this one returns,
also after an error (try/finally, every wait bounded).

The same mesh on two machines (README.md, "A mesh across processes"): Redis on one, then
`python samples/mesh_chat.py server --redis-url URL --listen-host 0.0.0.0
--advertise-host THIS_MACHINE` on each, and `python samples/mesh_chat.py client
--redis-url URL ...` anywhere for the front end (it kills nothing: the servers are not
its children).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

import zlink_actors as z
from zlink_actors.testing import RedisServer, redis_server_binary

MESH = "chat"
#: The bound for each start-up step (a Python process starting, nodes finding each other):
#: about 2 s on an idle 2-core machine, far more when it is busy.
START_WAIT = 30.0
#: Every request's deadline.
CALL_TIMEOUT = 5.0
ROOMS = ("lobby", "games")
PLAYERS = ("ana", "bo")


class Post(msgspec.Struct, frozen=True):
    author: str
    text: str


class Posted(msgspec.Struct, frozen=True):
    room: str
    node: str  # the routing id of the node whose handler ran
    line: int


class Say(msgspec.Struct, frozen=True):
    room: str
    text: str


class Said(msgspec.Struct, frozen=True):
    player: str
    node: str  # the player's node
    posted: Posted  # the room's reply


class Announcement(msgspec.Struct, frozen=True):
    text: str


class History(msgspec.Struct, frozen=True):
    pass


def node_id(ctx: z.SpotContext | z.ActorContext) -> str:
    return str(ctx.node.routing_id)  # the NodeInfo of the Host running this handler


class Room(z.Spot):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def configure(self, cfg: z.SpotConfig) -> None:
        cfg.subscribe("news", "all-rooms")

    @z.handler
    def post(self, ctx: z.SpotContext, msg: Post) -> Posted:
        self.lines.append(f"{msg.author}: {msg.text}")
        return Posted(ctx.spot_id, node_id(ctx), len(self.lines))

    @z.handler
    def announcement(self, ctx: z.SpotContext, msg: Announcement) -> None:
        self.lines.append(f"[news] {msg.text}")

    @z.handler
    def history(self, ctx: z.SpotContext, msg: History) -> list[str]:
        return list(self.lines)


class Player(z.Actor):
    @z.handler
    async def say(self, ctx: z.ActorContext, msg: Say) -> Said:
        # The room may live on another node: the request is routed to its owner. `await`
        # keeps this player's turn until the reply (or the error) is back.
        call = ctx.request_to_spot(msg.room, Post(ctx.actor_id, msg.text), reply=Posted)
        posted = await call.submit()
        return Said(ctx.actor_id, node_id(ctx), posted)


def mesh_config(args: argparse.Namespace) -> z.MeshConfig:
    return z.MeshConfig(
        MESH,
        listen=f"tcp://{args.listen_host}:0",  # any free port: peers learn it from Redis
        advertise_host=args.advertise_host,
        liveness_interval=0.25,
        liveness_timeout=1.5,  # how soon a SIGKILLed node is known to be gone
    )


# -- the `server` role: an Object Server -----------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """Serve rooms and players until SIGTERM, Ctrl-C, or (`--until-stdin-closes`, how the
    front end runs its children) stdin closing; prints "ready ROUTING_ID" once
    `--expect-peers` peers are READY."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.until_stdin_closes:  # also when the front end dies: its end of the pipe closes
        threading.Thread(target=stop_at_eof, args=(stop,), daemon=True).start()
    store = z.RedisLocationStore(args.redis_url, key_prefix=args.key_prefix)
    host = z.Host(spots=[Room], actors=[Player], mesh=mesh_config(args), location=store)
    try:
        host.start()
        while not stop.is_set() and not peers_ready(host, args.expect_peers):
            pass
        if not stop.is_set():
            print("ready", host.node.routing_id, flush=True)
        while not stop.wait(0.5):  # wakes now and then so that signal handlers run
            pass
    except KeyboardInterrupt:
        pass
    finally:
        outcome = host.shutdown(5.0).outcome
        store.close()
    return 0 if outcome is z.ShutdownOutcome.STOPPED else 1


def peers_ready(host: z.Host, count: int) -> bool:
    try:
        host.wait_for_peers(count, timeout=0.5)
    except z.DeadlineExceededError:
        return False
    return True


def stop_at_eof(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


class Server:
    """A server child of the front end: this file, run with the `server` role."""

    def __init__(self, args: argparse.Namespace) -> None:
        command = [sys.executable, os.path.abspath(__file__), "server", "--until-stdin-closes"]
        command += ["--redis-url", args.redis_url, "--key-prefix", args.key_prefix]
        command += ["--listen-host", args.listen_host, "--expect-peers", "2"]
        if args.advertise_host:
            command += ["--advertise-host", args.advertise_host]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.routing_id = ""
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # end of output: the child exited

    def wait_ready(self) -> str:
        """Its routing id, from its "ready" line (a bounded wait)."""
        try:
            words = self._lines.get(timeout=START_WAIT).split()
        except queue.Empty:
            raise SystemExit(f"a server printed no 'ready' in {START_WAIT:g} s") from None
        if words[:1] != ["ready"]:
            raise SystemExit(f"a server exited before it was ready ({self.proc.poll()})")
        self.routing_id = words[1]
        return self.routing_id

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no shutdown, no goodbye to its peers
        self.proc.wait(START_WAIT)

    def stop(self) -> int:
        """Close its stdin, so it shuts down; SIGKILL it if it has not exited in time."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(START_WAIT)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait(START_WAIT)


# -- the front end: an Object Client ---------------------------------------------------

#: Routing id -> "server-N", in the order each first appears in the transcript.
names: dict[str, str] = {}


def name(routing_id: str) -> str:
    return names.setdefault(routing_id, f"server-{len(names) + 1}")


def describe(reply: object) -> str:
    if isinstance(reply, Said):
        return f"{reply.player} on {name(reply.node)} -> {describe(reply.posted)}"
    if isinstance(reply, Posted):
        return f"{reply.room} on {name(reply.node)}, line {reply.line}"
    return repr(reply)


def attempt(what: str, call: z.RequestCall[Any]) -> None:
    """Run one request and print its reply, or the kind of error it ended with."""
    try:
        reply = call.submit_sync()
    except (z.UnavailableError, z.NotFoundError) as exc:
        print(f"{what}: {type(exc).__name__}")  # typed: never read the message to decide
        return
    print(f"{what}: {describe(reply)}")


def history(host: z.Host, room: str, until: str) -> list[str]:
    """The room's lines once `until` is one of them. `publish()` completes when the
    multicast commits, before the rooms have handled it: ask again (bounded)."""
    deadline = time.monotonic() + CALL_TIMEOUT
    while True:
        lines: list[str] = host.request_to_spot(room, History(), reply=list).submit_sync()
        if until in lines or time.monotonic() > deadline:
            return lines


def chat(host: z.Host, kill: Callable[[str], None] | None) -> None:
    """The transcript; `kill(routing_id)` SIGKILLs that server (None: not our servers)."""
    print("--- placement: the client registers no types, so each object goes to a server")
    owners: dict[str, str] = {}
    for room in ROOMS:
        ref = host.spots.get_or_create(room, Room).submit_sync().ref
        owners[room] = ref.routing_id
        print(f"room {room}: on {name(ref.routing_id)}")
    for player in PLAYERS:
        ref = host.actors.get_or_create(player, Player).submit_sync().ref
        owners[player] = ref.routing_id
        print(f"player {player}: on {name(ref.routing_id)}")

    def post(room: str) -> z.RequestCall[Posted]:
        return host.request_to_spot(room, Post("client", "anyone?"), reply=Posted)

    def say(player: str, room: str) -> z.RequestCall[Said]:
        return host.request_to_actor(player, Say(room, f"hi from {player}"), reply=Said)

    print("--- requests go to the owner's node; a player's handler asks the room")
    for room in ROOMS:
        attempt(f"post to {room}", post(room))
    attempt("ana posts to games", say("ana", "games"))
    attempt("bo posts to lobby", say("bo", "lobby"))

    print("--- publish reaches the rooms on every node")
    news = "maintenance at 10"
    host.publish("news", "all-rooms", Announcement(news)).submit_sync()
    for room in ROOMS:
        for line in history(host, room, until=f"[news] {news}"):
            print(f"{room} | {line}")

    if kill is None:
        print("--- (the servers are not this process's children: nothing is killed)")
        return
    victim = owners["games"]
    print(f"--- SIGKILL {name(victim)}, the node of games")
    kill(victim)
    for room in ROOMS:
        attempt(f"post to {room}", post(room))
    attempt("ana posts to games", say("ana", "games"))  # the error comes back through ana
    attempt("bo posts to lobby", say("bo", "lobby"))
    attempt("ana posts to lobby", say("ana", "lobby"))
    attempt("post to nowhere (never created)", post("nowhere"))


def front_end(args: argparse.Namespace) -> int:
    """The default role: Redis (unless given), two server children, and the transcript."""
    started = time.monotonic()
    redis: RedisServer | None = None
    servers: list[Server] = []
    try:
        if args.redis_url is None:
            binary = redis_server_binary()
            if binary is None:
                raise SystemExit(
                    "needs redis-server: `make demo-mesh` gets one, or pass --redis-url"
                )
            redis = RedisServer(binary)
            redis.start()
            args.redis_url = redis.url
            # No persistence: a restart would fence every node until it recovered (see
            # the module docstring).
            print("redis-server: started on a free loopback port")
        if args.role == "demo":
            args.key_prefix = f"mesh-chat-{uuid.uuid4().hex[:8]}"  # a fresh namespace per run
            for _ in range(2):  # they start while our Host does
                servers.append(Server(args))
        store = z.RedisLocationStore(args.redis_url, key_prefix=args.key_prefix)
        try:
            # No spots, no actors: an Object Client that can create and reach everything.
            with z.Host(
                mesh=mesh_config(args), location=store, default_request_timeout=CALL_TIMEOUT
            ) as host:
                children = {server.wait_ready(): server for server in servers}
                host.wait_for_peers(2, timeout=START_WAIT)
                print("mesh: the client and 2 Object Servers are READY")
                chat(host, (lambda rid: children[rid].kill()) if servers else None)
        finally:
            store.close()
        print("--- stopping")
        for server in sorted(servers, key=lambda server: name(server.routing_id)):
            status = server.stop()
            how = "killed (SIGKILL)" if status == -signal.SIGKILL else f"stopped (exit {status})"
            print(f"{name(server.routing_id)}: {how}")
    finally:
        for server in servers:  # after an error: still every child ends
            server.stop()
        if redis is not None:
            redis.stop()
    if redis is not None:
        print("redis-server: stopped")
    print(f"--- done in {time.monotonic() - started:.1f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="demo", choices=("demo", "server", "client"))
    parser.add_argument("--redis-url", help="default: start a redis-server of our own")
    parser.add_argument("--key-prefix", default="mesh-chat", help="the store's namespace")
    parser.add_argument("--listen-host", default="127.0.0.1", help="e.g. 0.0.0.0")
    parser.add_argument("--advertise-host", help="the address other machines dial")
    parser.add_argument("--expect-peers", type=int, default=1, help="server: wait for N peers")
    parser.add_argument("--until-stdin-closes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role != "demo" and args.redis_url is None:
        parser.error(f"the {args.role} role needs --redis-url")
    if args.role == "server":
        return serve(args)
    return front_end(args)


if __name__ == "__main__":
    sys.exit(main())
