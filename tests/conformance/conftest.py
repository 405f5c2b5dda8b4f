"""Fixtures of the request-conformance suite: `world` (parametrised over `PATHS`) and
`terminator` (over `TERMINATORS`), so every test written against them runs on each path
with each terminator; `caller` is the terminator's `Caller` in that world."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from ._paths import PATHS, Path, World
from ._terminators import TERMINATORS, Caller, Terminator


@pytest.fixture(params=PATHS, ids=lambda path: path.name)
def path(request: pytest.FixtureRequest) -> Path:
    param: Path = request.param
    return param


@pytest.fixture
def world(path: Path) -> Iterator[World]:
    """The Hosts of `path`, shut down at the end (held handlers released first)."""
    with ExitStack() as stack:
        yield path.build(stack)


@pytest.fixture(params=TERMINATORS, ids=lambda terminator: terminator.name)
def terminator(request: pytest.FixtureRequest) -> Terminator:
    param: Terminator = request.param
    return param


@pytest.fixture
def caller(world: World, terminator: Terminator) -> Iterator[Caller]:
    """The terminator's `Caller` in `world`; closed before the world shuts down."""
    made = terminator.caller(world)
    try:
        yield made
    finally:
        made.close()
