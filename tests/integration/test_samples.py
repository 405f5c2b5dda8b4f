"""The samples are documentation: each one runs here and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def run_sample(name: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(SAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout.splitlines()


def test_chat_sample_prints_the_same_transcript_every_run() -> None:
    lines = run_sample("chat.py")
    assert lines[:-1] == [
        "room lobby is ready",
        "room games is ready",
        "ana knocks on lobby",
        "bo knocks on lobby",
        "cy knocks on games",
        "bot-7 knocks on games",
        "bot-7 cannot speak: it is not in a room",
        "--- lobby",
        "* lobby is open",
        "* ana joined",
        "* bo joined",
        "ana: hi all",
        "bo: HELLO!",
        "[announcement] server restarts at 10",
        "--- games",
        "* games is open",
        "* cy joined",
        "* bot-7 was turned away",
        "cy: anyone for chess?",
        "[announcement] server restarts at 10",
    ]
    assert lines[-1].startswith("--- host stopped (stopped) in ")


def test_matchmaking_sample_matches_players_through_the_lobby_and_stops_cleanly() -> None:
    lines = run_sample("matchmaking.py")
    assert lines[:4] == [
        "ana: queued at position 1",
        "bo: matched at once with ana",
        "cy: queued at position 1",
        "di: matched at once with cy",
    ]
    assert "lobby: timer: ana is still waiting" in lines
    assert "lobby: rating ana vs bo (gate released)" in lines
    assert "ana plays bo (fairness 0.85)" in lines
    assert "di plays cy (fairness 0.98)" in lines
    assert any(
        line.startswith("turns run:") and line.endswith("handler failures: 0") for line in lines
    )
    assert lines[-1].startswith("host stopped (stopped)")


def test_readme_example_runs_and_prints_the_balance() -> None:
    readme = (SAMPLES.parent / "README.md").read_text()
    blocks = readme.split("```python\n")[1:]
    assert blocks, "README has no python example"
    code = blocks[0].split("```")[0]
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["12"]


def test_weather_sample_calls_its_local_service_with_each_terminator() -> None:
    lines = run_sample("weather.py")
    assert lines[:-1] == [
        "health: ok",
        "Oslo: 4.5 C",
        "Rome: 21.0 C",
        "slow station: no answer within 0.2 s",
        "ask Oslo: waiting, gate kept",
        "ask Oslo: 4.5 C, visitors seen: 0",
        "visit by ana",
        "refresh Rome: waiting, gate released",
        "visit by bo",
        "refresh Rome: 21.0 C, visitors 1 -> 2",
    ]
    assert lines[-1].startswith("--- host stopped in ")
