"""The multi-process sample (issue 16, item 8): `samples/mesh_chat.py` starts a
redis-server and two Object Server processes of its own, prints the transcript it
promises, exits 0, and leaves no process behind (Linux: /proc and a child subreaper)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from zlink_actors.testing import WAIT

ROOT = pathlib.Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "samples" / "mesh_chat.py"
#: The warning a node logs when a peer is lost (a SIGKILL closes its connections: the
#: reason its calls fail with is peer_lost; what it saw varies: a disconnect, or a send
#: finding no route).
LOST = re.compile(r"mesh node-\S+: peer node-\S+ LOST \(peer_lost\): .+")
#: The sample takes about 4 s on the idle 2-core development machine, 15 s when it is
#: busy; its own start-up bounds are 30 s a step.
RUN_WAIT = 24 * WAIT
PR_SET_CHILD_SUBREAPER = 36


def _children() -> dict[int, str]:
    """This process's children: pid -> state (R, S, Z, ...)."""
    me = str(os.getpid())
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[1] == me:  # fields: state, ppid, ...
            found[int(entry.name)] = fields[0]
    return found


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """While inside, what the sample leaves running when it exits is reparented to this
    process (PR_SET_CHILD_SUBREAPER) instead of init, so the test can see it."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, ctypes.get_errno()
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0)


@pytest.mark.timeout(RUN_WAIT + 4 * WAIT)
def test_mesh_chat_sample_places_routes_survives_a_killed_node_and_cleans_up() -> None:
    before = set(_children())
    # Files, not pipes: the sample's children share them, and the test must see the
    # sample itself exit, not only the last writer close.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with _subreaper():
            proc = subprocess.Popen(
                [sys.executable, str(SAMPLE)],
                stdout=out,
                stderr=err,
                text=True,
                cwd=ROOT,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
            try:
                proc.wait(RUN_WAIT)
            finally:
                if proc.poll() is None:  # timed out: end it, and below whatever it started
                    proc.kill()
                    proc.wait(WAIT)
                # The sample has exited: its servers and its redis-server, were they still
                # running, are our children now.
                left = {pid: state for pid, state in _children().items() if pid not in before}
                for pid, state in left.items():
                    if state != "Z":
                        os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        lines, logged = out.read().splitlines(), err.read().splitlines()
    assert [pid for pid, state in left.items() if state != "Z"] == [], f"left running: {left}"
    assert proc.returncode == 0, (lines, logged)
    # stderr holds nothing but the mesh's warnings that the killed node was lost (the
    # client's and the other server's): no traceback.
    assert all(LOST.fullmatch(line) for line in logged), logged
    assert lines[:-1] == [
        "redis-server: started on a free loopback port",
        "mesh: the client and 2 Object Servers are READY",
        "--- placement: the client registers no types, so each object goes to a server",
        "room lobby: on server-1",
        "room games: on server-2",
        "player ana: on server-1",
        "player bo: on server-2",
        "--- requests go to the owner's node; a player's handler asks the room",
        "post to lobby: lobby on server-1, line 1",
        "post to games: games on server-2, line 1",
        "ana posts to games: ana on server-1 -> games on server-2, line 2",
        "bo posts to lobby: bo on server-2 -> lobby on server-1, line 2",
        "--- publish reaches the rooms on every node",
        "lobby | client: anyone?",
        "lobby | bo: hi from bo",
        "lobby | [news] maintenance at 10",
        "games | client: anyone?",
        "games | ana: hi from ana",
        "games | [news] maintenance at 10",
        "--- SIGKILL server-2, the node of games",
        "post to lobby: lobby on server-1, line 4",
        "post to games: UnavailableError",
        "ana posts to games: UnavailableError",
        "bo posts to lobby: UnavailableError",
        "ana posts to lobby: ana on server-1 -> lobby on server-1, line 5",
        "post to nowhere (never created): NotFoundError",
        "--- stopping",
        "server-1: stopped (exit 0)",
        "server-2: killed (SIGKILL)",
        "redis-server: stopped",
    ]
    assert lines[-1].startswith("--- done in ")
