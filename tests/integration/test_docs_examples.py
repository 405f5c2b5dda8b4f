"""Every example in README.md and docs/ still runs, and prints what it shows.

An example with output is a ```python block followed by a plain (or ```text) block, with
the word "output" in the prose between them: the python block is run as a script and its
stdout compared with the second block. Every other python block that imports
zlink_actors is a complete script too (its checks are `assert`s): it must run and exit 0.
Blocks that do not import zlink_actors are fragments and are not run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)


def python_blocks() -> list[tuple[str, str, str | None]]:
    """(id, code, expected output or None) for each python block of the pages."""
    found: list[tuple[str, str, str | None]] = []
    for path in PAGES:
        text = path.read_text()
        blocks = list(FENCE.finditer(text))
        for index, block in enumerate(blocks):
            if block.group(1) != "python":
                continue
            expected = None
            if index + 1 < len(blocks):
                after = blocks[index + 1]
                between = text[block.end() : after.start()]
                if after.group(1) in ("", "text") and "output" in between.lower():
                    expected = after.group(2)
            line = text.count("\n", 0, block.start()) + 1
            found.append((f"{path.name}:{line}", block.group(2), expected))
    return found


def examples() -> list[tuple[str, str, str]]:
    """(id, code, expected output) for each python block followed by an output block."""
    return [(where, code, out) for where, code, out in python_blocks() if out is not None]


def scripts() -> list[tuple[str, str]]:
    """(id, code) for each complete script that shows no output."""
    return [
        (where, code)
        for where, code, out in python_blocks()
        if out is None and "import zlink_actors" in code
    ]


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(("where", "code", "expected"), examples(), ids=lambda v: str(v)[:40])
def test_documented_example_prints_its_documented_output(
    where: str, code: str, expected: str
) -> None:
    proc = run(code)
    assert proc.returncode == 0, f"{where}: {proc.stderr}"
    assert proc.stdout.strip() == expected.strip(), where


@pytest.mark.parametrize(("where", "code"), scripts(), ids=lambda v: str(v)[:40])
def test_documented_script_runs_and_its_assertions_hold(where: str, code: str) -> None:
    proc = run(code)
    assert proc.returncode == 0, f"{where}: {proc.stderr}"


def test_the_docs_have_examples_to_check() -> None:
    assert len(examples()) >= 10
    assert len(scripts()) >= 10


def test_the_readme_example_is_checked_too() -> None:
    assert [where for where, _, _ in examples() if where.startswith("README.md:")]
