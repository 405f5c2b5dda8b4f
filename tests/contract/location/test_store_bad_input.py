"""Bad input gets a typed error at the call and writes nothing (design/mesh.md §4 limits),
over both providers."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from zlink_actors.location import Committed, Delete, Found, IfMissing, IfVersion, Missing, Put

from .conftest import StoreFactory

MIB = 1 << 20

BAD_KEYS: list[tuple[Any, type[Exception]]] = [
    ("", ValueError),
    ("k" * 1025, ValueError),
    ("é" * 513, ValueError),  # 1,026 bytes
    ("\udc80", ValueError),  # a lone surrogate: no UTF-8
    (b"bytes", TypeError),
    (None, TypeError),
]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize(("key", "error"), BAD_KEYS)
def test_bad_key_is_refused_by_read_write_and_nothing_is_written(
    make_store: StoreFactory, key: Any, error: type[Exception]
) -> None:
    store = make_store()
    with pytest.raises(error):
        run(store.read(key))
    with pytest.raises(error):
        run(store.write([], [Put("good", b"1"), Put(key, b"x")]))
    with pytest.raises(error):
        run(store.write([IfMissing(key)], [Put("good", b"1")]))
    with pytest.raises(error):
        run(store.write([], [Put("good", b"1"), Delete(key)]))
    assert isinstance(run(store.read("good")), Missing)


def test_keys_of_1_and_1024_bytes_are_accepted(make_store: StoreFactory) -> None:
    store = make_store()
    longest = "é" * 512  # 1,024 bytes
    done = run(store.write([], [Put("k", b"1"), Put(longest, b"2")]))
    assert isinstance(done, Committed)
    found = run(store.read(longest))
    assert isinstance(found, Found)
    assert found.value == b"2"


def test_value_over_1_mib_is_refused_and_1_mib_is_accepted(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(ValueError, match="over 1048576"):
        run(store.write([], [Put("a", b"1"), Put("big", b"x" * (MIB + 1))]))
    assert isinstance(run(store.read("a")), Missing)
    assert isinstance(run(store.write([], [Put("big", b"x" * MIB)])), Committed)
    with pytest.raises(TypeError):
        run(store.write([], [Put("s", "text")]))  # type: ignore[arg-type]


def test_batch_over_4_mib_of_values_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    puts = [Put(f"v/{i}", b"x" * MIB) for i in range(4)] + [Put("v/last", b"y")]
    with pytest.raises(ValueError, match="over 4194304"):
        run(store.write([], puts))
    assert isinstance(run(store.read("v/0")), Missing)


def test_repeated_key_on_one_side_is_refused_but_one_per_side_is_fine(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    with pytest.raises(ValueError, match="twice among the mutations"):
        run(store.write([], [Put("k", b"1"), Delete("k")]))
    with pytest.raises(ValueError, match="twice among the conditions"):
        run(store.write([IfMissing("k"), IfVersion("k", "v")], [Put("j", b"1")]))
    assert isinstance(run(store.read("j")), Missing)
    assert isinstance(run(store.write([IfMissing("k")], [Put("k", b"1")])), Committed)


@pytest.mark.parametrize(
    ("ttl", "error"),
    [(0, ValueError), (-1, ValueError), (math.inf, ValueError), (math.nan, ValueError),
     (True, TypeError), ("5", TypeError)],
)  # fmt: skip
def test_bad_ttl_is_refused(make_store: StoreFactory, ttl: Any, error: type[Exception]) -> None:
    store = make_store()
    with pytest.raises(error):
        run(store.write([], [Put("k", b"1", ttl=ttl)]))
    assert isinstance(run(store.read("k")), Missing)


@pytest.mark.parametrize("ttl", [1e9 + 1, 1e17, 1e303])
def test_ttl_over_the_cap_is_refused_and_the_batch_writes_nothing(
    make_store: StoreFactory, ttl: float
) -> None:
    # Once a partial commit on Redis (`a` written, `b` unindexed, "nothing written"),
    # once an OverflowError; now a ValueError at the call on both providers.
    store = make_store()
    with pytest.raises(ValueError, match="ttl"):
        run(store.write([], [Put("a", b"1"), Put("b", b"2", ttl=ttl)]))
    assert isinstance(run(store.read("a")), Missing)
    assert isinstance(run(store.read("b")), Missing)
    assert run(store.scan("")).items == []


def test_ttl_at_the_cap_is_accepted(make_store: StoreFactory) -> None:
    store = make_store()
    done = run(store.write([], [Put("k", b"1", ttl=1e9)]))
    assert isinstance(done, Committed)
    found = run(store.read("k"))
    assert isinstance(found, Found)
    assert found.expires_at is not None
    assert found.expires_at - found.store_now == pytest.approx(1e9, abs=5)


@pytest.mark.parametrize(
    ("conditions", "mutations", "error"),
    [
        ("k", [], TypeError),
        ([], b"k", TypeError),
        ([Put("k", b"")], [], TypeError),
        ([], [IfMissing("k")], TypeError),
        ([IfVersion("k", "")], [], ValueError),
        ([IfVersion("k", 5)], [], TypeError),
        ([IfVersion("k", "v" * 4097)], [], ValueError),
    ],
)
def test_malformed_batches_are_refused(
    make_store: StoreFactory, conditions: Any, mutations: Any, error: type[Exception]
) -> None:
    store = make_store()
    with pytest.raises(error):
        run(store.write(conditions, mutations))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"limit": 0}, ValueError), ({"limit": 1001}, ValueError), ({"limit": 2.0}, TypeError),
     ({"limit": True}, TypeError)],
)  # fmt: skip
def test_bad_scan_limit_or_prefix_is_refused(
    make_store: StoreFactory, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    store = make_store()
    with pytest.raises(error):
        run(store.scan("p", **kwargs))
    with pytest.raises(ValueError, match="prefix"):
        run(store.scan("p" * 1025))
    with pytest.raises(TypeError):
        run(store.scan(None))  # type: ignore[arg-type]
