"""The short chaos run of `make test` (the long one is `make chaos`): real node processes,
a real redis-server, real signals, and the checker over every process's log; plus its
command line and its cleanup on Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.mesh.nodes import ROOT, gone

from .run import FENCE_FAULTS, SHORT_FAULTS, ChaosConfig, partition_unavailable, run_chaos

SECONDS = 15.0


@pytest.mark.parametrize(
    ("seed", "faults"),
    [(26, SHORT_FAULTS), (27, FENCE_FAULTS)],
    ids=["pauses-and-kills", "fences-and-kills"],
)
def test_a_short_chaos_run_breaks_no_rule(
    tmp_path: pathlib.Path, seed: int, faults: tuple[str, ...]
) -> None:
    lines: list[str] = []
    started = time.monotonic()
    report = run_chaos(
        ChaosConfig(
            seed=seed,
            seconds=SECONDS,
            faults=faults,
            log_dir=str(tmp_path),
            settle=15.0,
            say=lines.append,
        )
    )
    print(f"seed {seed}, {time.monotonic() - started:.1f} s\n{report.render()}")
    assert report.counts["calls"] > 500, report.render()
    assert sum(n for name, n in report.counts.items() if name.startswith("faults[")) >= 5
    assert report.ok, f"seed {seed}\n{report.render()}"


def _children(pid: int) -> list[tuple[int, str | None]]:
    """The processes whose parent is `pid`, with their start times."""
    found: list[tuple[int, str | None]] = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append((int(entry.name), fields[19]))
    return found


def _chaos(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.chaos", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("fault", ["pause-short", "partition"])
def test_ctrl_c_stops_every_process_the_run_started(tmp_path: pathlib.Path, fault: str) -> None:
    if fault == "partition" and (why := partition_unavailable()) is not None:
        print(f"skipped: {why}")
        pytest.skip(why)
    run = _chaos("--seed", "1", "--minutes", "5", "--faults", fault, "--log-dir", str(tmp_path))
    try:
        assert run.stdout is not None
        first = run.stdout.readline()
        assert first.startswith(f"chaos: seed=1 minutes=5 faults={fault}"), first
        assert "traffic started" in run.stdout.readline()
        children = _children(run.pid)
        assert len(children) >= 4  # redis-server and three nodes
        run.send_signal(signal.SIGINT)
        try:
            out, _ = run.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGUSR1)  # where each of its threads is, then the end
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(1.0)  # the dump has no end to wait for: a second to write it
            run.kill()
            out, _ = run.communicate(timeout=10)
            pytest.fail(f"the run did not stop within 30 s of SIGINT:\n{out}")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert run.returncode == 130, out
    assert "interrupted; everything it started is stopped" in out
    assert all(gone(pid, started) for pid, started in children)
    # Each node logged up to where it stopped; the log stays where it was asked to be.
    assert {path.name for path in tmp_path.glob("node*.jsonl")} == {
        "node0-1.jsonl",
        "node1-1.jsonl",
        "node2-1.jsonl",
    }
    events = [json.loads(line) for line in (tmp_path / "driver.jsonl").read_text().splitlines()]
    assert [e["e"] for e in events if e["e"] != "network"][:3] == ["node_up"] * 3
    # With partitions, every node ran in a namespace of the run's own: all removed.
    tags = [e["tag"] for e in events if e["e"] == "network"]
    assert len(tags) == (fault == "partition")
    for tag in tags:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
        assert f"zl{tag}" not in listed.stdout


def test_an_unknown_fault_is_refused_before_anything_starts() -> None:
    run = _chaos("--faults", "pause-short,meteor")
    out, _ = run.communicate(timeout=30)
    assert run.returncode == 2
    assert "unknown fault(s) ['meteor']" in out
