"""`Engine.claim` (`_engine/registry.py`): what a create of (kind, id) finds, decided under
the engine lock: a live object (`EXISTING`, or `CLOSING` while its close is in progress),
another caller's attempt to join (`JOIN`), a new attempt this caller owns (`OWN`), or a
Host that no longer serves (`SEALED`). And the engine lock is taken only inside
`_engine`: the call surface asks the engine, it does not lock the engine's tables itself.
"""

from __future__ import annotations

import ast
import pathlib
import threading
from collections.abc import Iterator

import pytest

from zlink_actors import Actor, Spot
from zlink_actors._engine.objects import ObjectKind
from zlink_actors._engine.registry import Activation, Attempt, Claim, Engine, TypeInfo

SPOT = ObjectKind.SPOT
ACTOR = ObjectKind.ACTOR
PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "zlink_actors"


class Room(Spot):
    pass


class Lobby(Spot):
    pass


class Player(Actor):
    pass


class Fixture:
    """One `Engine` with three registered types, the cell lock its attempts get, and a
    `serving` switch that records whether the engine lock was held when it was read."""

    def __init__(self) -> None:
        self.engine = Engine("test")
        self.room = self.engine.register(Room, SPOT)
        self.lobby = self.engine.register(Lobby, SPOT)
        self.player = self.engine.register(Player, ACTOR)
        self.cell_lock = threading.RLock()
        self.is_serving = True
        self.asked: list[bool] = []  # one entry per read: was the engine lock held?

    def serving(self) -> bool:
        self.asked.append(self.engine.lock.locked())
        return self.is_serving

    def claim(
        self, kind: ObjectKind, obj_id: str, info: TypeInfo, generation: int = 0
    ) -> tuple[Claim, Activation | Attempt | None]:
        return self.engine.claim(kind, obj_id, info, self.cell_lock, self.serving, generation)

    def ready_spot(self, spot_id: str, info: TypeInfo) -> Activation:
        act = self.engine.new_spot(spot_id, info, info.cls())
        self.engine.make_ready(act, None)
        return act


@pytest.fixture
def f() -> Fixture:
    return Fixture()


def test_a_free_id_gives_a_new_attempt_the_caller_owns_registered_in_creating(
    f: Fixture,
) -> None:
    found, attempt = f.claim(SPOT, "r", f.room, generation=7)

    assert found is Claim.OWN
    assert isinstance(attempt, Attempt)
    assert (attempt.kind, attempt.obj_id, attempt.info) == (SPOT, "r", f.room)
    assert attempt.generation == 7
    assert attempt._lock is f.cell_lock  # its result cell shares the given lock
    assert not attempt.done()
    assert f.engine.creating == {(SPOT, "r"): attempt}
    assert f.asked == [True]  # serving() was read once, under the engine lock


def test_a_second_create_of_an_id_being_created_joins_that_attempt(f: Fixture) -> None:
    _, first = f.claim(SPOT, "r", f.room)

    # Another type, a stopped Host: neither changes what is found (the caller decides).
    f.is_serving = False
    found, joined = f.claim(SPOT, "r", f.lobby)

    assert found is Claim.JOIN
    assert joined is first
    assert f.engine.creating == {(SPOT, "r"): first}
    assert f.asked == [True]  # not asked again: the id was not free


def test_a_live_object_is_existing_and_no_attempt_starts(f: Fixture) -> None:
    act = f.ready_spot("r", f.room)
    f.is_serving = False

    found, held = f.claim(SPOT, "r", f.lobby)

    assert found is Claim.EXISTING
    assert held is act
    assert f.engine.creating == {}
    assert f.asked == []


def test_a_live_object_whose_close_is_in_progress_is_closing(f: Fixture) -> None:
    act = f.ready_spot("r", f.room)
    act.closing = object()  # a `lifecycle.Closing` in the running Host

    found, held = f.claim(SPOT, "r", f.room)

    assert found is Claim.CLOSING
    assert held is act
    assert f.engine.creating == {}


def test_a_free_id_on_a_host_that_no_longer_serves_is_sealed_and_registers_nothing(
    f: Fixture,
) -> None:
    f.is_serving = False

    found, held = f.claim(ObjectKind.ACTOR, "p", f.player)

    assert found is Claim.SEALED
    assert held is None
    assert f.engine.creating == {}
    assert f.asked == [True]


def test_a_closed_object_leaves_its_id_free(f: Fixture) -> None:
    act = f.ready_spot("r", f.room)
    f.engine.unregister(act)

    found, attempt = f.claim(SPOT, "r", f.room)

    assert found is Claim.OWN
    assert isinstance(attempt, Attempt)
    assert f.engine.creating == {(SPOT, "r"): attempt}


def test_an_ended_attempt_leaves_the_id_free_for_a_new_one(f: Fixture) -> None:
    _, first = f.claim(SPOT, "r", f.room)
    assert isinstance(first, Attempt)
    with f.engine.lock:
        f.engine.end_attempt(first.key)

    found, second = f.claim(SPOT, "r", f.room)

    assert found is Claim.OWN
    assert second is not first
    assert f.engine.creating == {(SPOT, "r"): second}


def test_kinds_have_separate_ids(f: Fixture) -> None:
    f.ready_spot("x", f.room)

    found, attempt = f.claim(ACTOR, "x", f.player)

    assert found is Claim.OWN
    assert isinstance(attempt, Attempt)
    assert attempt.kind is ACTOR
    assert set(f.engine.creating) == {(ACTOR, "x")}


def test_concurrent_claims_of_one_id_give_one_owner_and_joiners_of_its_attempt(
    f: Fixture,
) -> None:
    results: list[tuple[Claim, Activation | Attempt | None]] = []
    start = threading.Barrier(8)

    def claim() -> None:
        start.wait(5.0)
        results.append(f.claim(SPOT, "r", f.room))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5.0)
        assert not thread.is_alive()

    owners = [held for found, held in results if found is Claim.OWN]
    assert len(owners) == 1
    assert sorted(found.value for found, _ in results) == sorted(["own"] + ["join"] * 7)
    assert all(held is owners[0] for _, held in results)


# -- the engine lock stays inside `_engine` ----------------------------------------------


def _engine_lock_uses(source: str) -> Iterator[int]:
    """Lines that read `<...>engine.lock` (a `with`, an acquire, an alias alike)."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr == "lock"):
            continue
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if name == "engine":
            yield node.lineno


def test_no_module_outside_the_engine_takes_the_engine_lock() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "_engine" not in path.relative_to(PACKAGE).parts
        for line in _engine_lock_uses(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_the_engine_lock_check_finds_each_way_of_reaching_the_lock() -> None:
    planted = (
        "with engine.lock:\n"
        "    pass\n"
        "runtime.engine.lock.acquire()\n"
        "lock = self._runtime.engine.lock\n"
        "with gate.lock:\n"  # another lock: not reported
        "    pass\n"
    )
    assert sorted(_engine_lock_uses(planted)) == [1, 3, 4]
