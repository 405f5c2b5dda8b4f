"""The multi-process sample (issue 16, item 8): `samples/mesh_chat.py` starts a
redis-server and two Object Server processes of its own, prints the transcript it
promises, exits 0, and leaves no process behind."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import uuid

import pytest

from zlink_actors.testing import WAIT

ROOT = pathlib.Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "samples" / "mesh_chat.py"
#: The environment variable that marks every process of one run: the sample's children
#: (its servers and its redis-server) inherit it.
MARK = "ZLINK_MESH_CHAT_RUN"
#: The sample takes about 10 s on the 2-core development machine.
RUN_WAIT = 12 * WAIT


def _marked(run: str) -> list[int]:
    """The live processes whose environment carries this run's mark."""
    mark = f"{MARK}={run}".encode()
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()  # empty for a zombie
        except OSError:  # gone meanwhile, or not ours
            continue
        if mark in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


@pytest.mark.timeout(RUN_WAIT + 4 * WAIT)
def test_mesh_chat_sample_places_routes_survives_a_killed_node_and_cleans_up() -> None:
    run = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{MARK: run})
    proc = subprocess.Popen(
        [sys.executable, str(SAMPLE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=RUN_WAIT)
    finally:
        if proc.poll() is None:  # timed out: end it, and whatever it started
            proc.kill()
            proc.communicate(timeout=WAIT)
        left = _marked(run)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the sample still running: {left}"
    assert proc.returncode == 0, err
    assert err == ""
    lines = out.splitlines()
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
        "lobby | host: anyone?",
        "lobby | bo: hi from bo",
        "lobby | [news] maintenance at 10",
        "games | host: anyone?",
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
