"""`UnavailableError.reason` (issue 26 item 7; docs/errors.md "Why a call is unavailable").

The reason is a closed enum, kept through pickling and copying (subclasses with other
signatures too), and every `UnavailableError` the framework raises names one.
"""

from __future__ import annotations

import ast
import copy
import pathlib
import pickle

import pytest

import zlink_actors
from zlink_actors import ErrorKind, UnavailableError, UnavailableReason
from zlink_actors.location.spi import (
    ScanExpiredError,
    WriteDeadlineExceededError,
    WriteOutcomeUnknownError,
)

#: The names docs/errors.md's table lists, in its order: the enum is closed.
DOCUMENTED = [
    "connecting",
    "peer_lost",
    "peer_paused",
    "draining",
    "closed",
    "lease_lapsed",
    "fenced",
    "queue_full",
    "not_owner",
    "contended",
    "store_unavailable",
    "unreachable",
    "unspecified",
]


def test_the_reasons_are_the_documented_closed_set_with_their_names_as_values() -> None:
    assert [reason.value for reason in UnavailableReason] == DOCUMENTED
    assert all(reason.value == reason.name.lower() for reason in UnavailableReason)
    assert zlink_actors.UnavailableReason is UnavailableReason
    docs = pathlib.Path(zlink_actors.__file__).parent.parent / "docs" / "errors.md"
    text = docs.read_text()
    for value in DOCUMENTED:
        assert f"| `{value}` |" in text, f"docs/errors.md has no row for {value}"


def test_the_reason_defaults_to_unspecified_and_must_be_an_unavailable_reason() -> None:
    assert UnavailableError("x").reason is UnavailableReason.UNSPECIFIED
    assert UnavailableError("x", reason=UnavailableReason.FENCED).reason is UnavailableReason.FENCED
    with pytest.raises(TypeError, match="UnavailableReason"):
        UnavailableError("x", reason="fenced")  # type: ignore[arg-type]
    assert UnavailableError("x").kind is ErrorKind.UNAVAILABLE


@pytest.mark.parametrize("reason", list(UnavailableReason), ids=lambda r: r.value)
def test_the_reason_survives_pickling_and_copying(reason: UnavailableReason) -> None:
    error = UnavailableError("the owner is gone", reason=reason)
    for back in (
        pickle.loads(pickle.dumps(error)),
        copy.copy(error),
        copy.deepcopy(error),
    ):
        assert type(back) is UnavailableError
        assert back.reason is reason
        assert back.args == ("the owner is gone",)
        assert str(back) == "the owner is gone"


def test_the_store_errors_say_store_unavailable_and_pickle_as_themselves() -> None:
    outcome = WriteOutcomeUnknownError("lost the reply", {"k": "v1"})
    deadline = WriteDeadlineExceededError("too slow", {"k": "v2"})
    scan = ScanExpiredError("restart", reason=UnavailableReason.STORE_UNAVAILABLE)
    for error in (outcome, deadline, scan):
        assert error.reason is UnavailableReason.STORE_UNAVAILABLE
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error)
        assert back.reason is UnavailableReason.STORE_UNAVAILABLE
        assert back.args == error.args
    assert pickle.loads(pickle.dumps(outcome)).versions == {"k": "v1"}
    assert pickle.loads(pickle.dumps(deadline)).versions == {"k": "v2"}


def _raise_sites_without_a_reason() -> tuple[int, list[str]]:
    """Every call of `UnavailableError(...)` (or its subclasses built with a message) in
    the package, and those that name no `reason=`."""
    root = pathlib.Path(zlink_actors.__file__).parent
    names = {"UnavailableError", "ScanExpiredError"}
    found = 0
    missing: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in names or path.name == "errors.py":
                continue
            found += 1
            if not any(keyword.arg == "reason" for keyword in node.keywords):
                missing.append(f"{path.relative_to(root)}:{node.lineno}")
    return found, missing


def test_every_unavailable_error_the_framework_raises_names_its_reason() -> None:
    found, missing = _raise_sites_without_a_reason()
    assert found >= 40  # the walk finds the sites (about 45 when this was written)
    assert missing == []
