"""Every example in README.md and docs/ that shows its output still prints exactly that
output.

An example is a ```python block followed by a plain (or ```text) block, with the word
"output" in the prose between them; the python block is run as a script and its stdout
compared with the second block.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)


def examples() -> list[tuple[str, str, str]]:
    """(id, code, expected output) for each python block followed by an output block."""
    found = []
    for path in PAGES:
        text = path.read_text()
        blocks = list(FENCE.finditer(text))
        for block, after in itertools.pairwise(blocks):
            between = text[block.end() : after.start()]
            if block.group(1) != "python" or after.group(1) not in ("", "text"):
                continue
            if "output" not in between.lower():
                continue
            line = text.count("\n", 0, block.start()) + 1
            found.append((f"{path.name}:{line}", block.group(2), after.group(2)))
    return found


@pytest.mark.parametrize(("where", "code", "expected"), examples(), ids=lambda v: str(v)[:40])
def test_documented_example_prints_its_documented_output(
    where: str, code: str, expected: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"{where}: {proc.stderr}"
    assert proc.stdout.strip() == expected.strip(), where


def test_the_docs_have_examples_to_check() -> None:
    assert len(examples()) >= 10


def test_the_readme_example_is_checked_too() -> None:
    assert [where for where, _, _ in examples() if where.startswith("README.md:")]
