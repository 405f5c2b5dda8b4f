"""The Location Store conformance suite (design/mesh.md §4), run over both providers.

Every test names the rule it checks; `make_store` gives fresh stores of the
parametrized provider (memory, and Redis on the session's real redis-server).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from zlink_actors import ShuttingDownError, UnavailableError
from zlink_actors.location import (
    Committed,
    Conflict,
    Delete,
    Found,
    IfMissing,
    IfVersion,
    LocationStore,
    MemoryLocationStore,
    Missing,
    Put,
    RedisLocationStore,
    ScanExpiredError,
    WriteOutcomeUnknownError,
)

from .conftest import StoreFactory

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class FakeClock:
    """An epoch clock that moves only when told."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_store_errors_are_unavailable_errors() -> None:
    assert issubclass(ScanExpiredError, UnavailableError)
    assert issubclass(WriteOutcomeUnknownError, UnavailableError)
    err = WriteOutcomeUnknownError("lost", {"k": "v1"})
    assert err.versions == {"k": "v1"}


def test_providers_satisfy_the_protocol(make_store: StoreFactory) -> None:
    assert isinstance(make_store(), LocationStore)


def test_read_of_a_key_never_written_is_missing_with_store_now(make_store: StoreFactory) -> None:
    store = make_store()
    result = run(store.read("nothing"))
    assert isinstance(result, Missing)
    assert result.store_now > 1_600_000_000


def test_put_then_read_returns_value_version_and_no_expiry(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        done = await store.write([IfMissing("a")], [Put("a", b"one"), Put("b", b"two")])
        assert isinstance(done, Committed)
        assert set(done.versions) == {"a", "b"}
        assert done.versions["a"] != done.versions["b"]
        found = await store.read("a")
        assert isinstance(found, Found)
        assert (found.value, found.version, found.expires_at) == (
            b"one",
            done.versions["a"],
            None,
        )
        assert found.store_now >= done.store_now

    run(go())


def test_every_write_gets_a_new_version(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> set[str]:
        seen = set()
        for _ in range(20):
            done = await store.write([], [Put("k", b"same")])
            assert isinstance(done, Committed)
            seen.add(done.versions["k"])
        return seen

    assert len(run(go())) == 20


def test_failed_condition_changes_nothing(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        first = await store.write([], [Put("a", b"1"), Put("b", b"2")])
        assert isinstance(first, Committed)
        conflicts = [
            ([IfMissing("a")], [Put("a", b"x"), Put("c", b"x")]),
            ([IfVersion("a", "not-it")], [Delete("b"), Put("c", b"x")]),
            ([IfMissing("z"), IfVersion("b", first.versions["a"])], [Put("c", b"x")]),
            ([IfVersion("never", first.versions["a"])], [Delete("a")]),
        ]
        for conditions, mutations in conflicts:
            result = await store.write(conditions, mutations)
            assert isinstance(result, Conflict)
            assert result.store_now >= first.store_now
        a, b, c = await store.read("a"), await store.read("b"), await store.read("c")
        assert isinstance(a, Found)
        assert a.version == first.versions["a"]
        assert isinstance(b, Found)
        assert b.version == first.versions["b"]
        assert isinstance(c, Missing)

    run(go())


def test_if_version_succeeds_on_the_current_version_only(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        v1 = await store.write([], [Put("k", b"1")])
        assert isinstance(v1, Committed)
        v2 = await store.write([IfVersion("k", v1.versions["k"])], [Put("k", b"2")])
        assert isinstance(v2, Committed)
        stale = await store.write([IfVersion("k", v1.versions["k"])], [Put("k", b"3")])
        assert isinstance(stale, Conflict)
        gone = await store.write([IfVersion("k", v2.versions["k"])], [Delete("k")])
        assert isinstance(gone, Committed)
        assert gone.versions == {}
        assert isinstance(await store.read("k"), Missing)
        again = await store.write([IfMissing("k")], [Put("k", b"4")])
        assert isinstance(again, Committed)

    run(go())


def test_delete_of_a_missing_key_commits(make_store: StoreFactory) -> None:
    store = make_store()
    assert isinstance(run(store.write([], [Delete("none")])), Committed)


def test_condition_only_batch_checks_without_writing(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        assert isinstance(await store.write([IfMissing("k")], []), Committed)
        await store.write([], [Put("k", b"1")])
        assert isinstance(await store.write([IfMissing("k")], []), Conflict)

    run(go())


def test_big_batch_of_2048_keys_and_4_mib_is_atomic_for_a_concurrent_reader(
    make_store: StoreFactory,
) -> None:
    """Each round rewrites 2,048 keys (4 MiB) in one batch, stamped with the round; a
    reader that reads the first key and then the last must never see the last older
    than the first (half a batch)."""
    store = make_store()
    keys = [f"big/{i:04d}" for i in range(2048)]
    rounds = 6
    stop = threading.Event()
    torn: list[tuple[int, int]] = []
    observed: list[int] = []

    def value(round_: int) -> bytes:
        return round_.to_bytes(4, "big") * 512  # 2,048 bytes: 2,048 keys = 4 MiB

    async def reader() -> None:
        while not stop.is_set():
            first = await store.read(keys[0])
            last = await store.read(keys[-1])
            if isinstance(first, Found):
                assert isinstance(last, Found)
                a = int.from_bytes(first.value[:4], "big")
                b = int.from_bytes(last.value[:4], "big")
                observed.append(a)
                if b < a:
                    torn.append((a, b))

    async def writer() -> None:
        version = None
        for round_ in range(rounds):
            # 2,048 keys, 4 MiB: the limits exactly, guarded by the version of the first
            conditions = [] if version is None else [IfVersion(keys[0], version)]
            done = await store.write(conditions, [Put(k, value(round_)) for k in keys])
            assert isinstance(done, Committed)
            assert len(done.versions) == 2048
            version = done.versions[keys[0]]
            await asyncio.sleep(0)  # let the reader's loop interleave (not a sync point)

    thread = threading.Thread(target=lambda: run(reader()))
    thread.start()
    try:
        run(writer())
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert torn == []
    assert observed  # the reader did read during the run
    final = [run(store.read(k)) for k in (keys[0], keys[1000], keys[-1])]
    assert all(isinstance(f, Found) and f.value == value(rounds - 1) for f in final)


def test_batch_of_2048_keys_passes_and_2049_is_refused(make_store: StoreFactory) -> None:
    store = make_store()
    keys = [f"n/{i}" for i in range(2049)]
    done = run(store.write([IfMissing(keys[0])], [Put(k, b"") for k in keys[:2048]]))
    assert isinstance(done, Committed)
    assert len(done.versions) == 2048
    with pytest.raises(ValueError, match="2049 keys"):
        run(store.write([], [Put(k, b"y") for k in keys]))
    with pytest.raises(ValueError, match="2049 keys"):  # conditions count too
        run(store.write([IfMissing("x")], [Put(k, b"y") for k in keys[:2048]]))
    first = run(store.read(keys[0]))
    assert isinstance(first, Found)
    assert first.value == b""
    assert isinstance(run(store.read(keys[2048])), Missing)
    assert isinstance(run(store.read("x")), Missing)


def _cas_from_threads(store: LocationStore, threads: int) -> list[Committed | Conflict]:
    """`threads` threads, each on its own event loop, read the key, meet at a barrier
    and compare-and-set it against the version they read."""
    barrier = threading.Barrier(threads)
    results: list[Committed | Conflict] = []
    lock = threading.Lock()

    async def one(me: int) -> None:
        current = await store.read("cas")
        assert isinstance(current, Found)
        barrier.wait(10)
        result = await store.write([IfVersion("cas", current.version)], [Put("cas", b"%d" % me)])
        with lock:
            results.append(result)

    workers = [threading.Thread(target=lambda i=i: run(one(i))) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert not any(w.is_alive() for w in workers)
    return results


@pytest.mark.stress
def test_concurrent_compare_and_set_from_8_threads_has_exactly_one_winner(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    for _ in range(10):
        run(store.write([], [Put("cas", b"start")]))
        results = _cas_from_threads(store, 8)
        assert len(results) == 8
        winners = [r for r in results if isinstance(r, Committed)]
        assert len(winners) == 1
        final = run(store.read("cas"))
        assert isinstance(final, Found)
        assert final.version == winners[0].versions["cas"]


def test_expiry_follows_the_injected_clock_of_the_memory_store() -> None:

    clock = FakeClock()
    store = MemoryLocationStore(clock=clock)

    async def go() -> None:
        done = await store.write([], [Put("t", b"v", ttl=10), Put("forever", b"f")])
        assert isinstance(done, Committed)
        assert done.store_now == clock.now
        found = await store.read("t")
        assert isinstance(found, Found)
        assert found.expires_at == clock.now + 10
        clock.now += 9.999
        assert isinstance(await store.read("t"), Found)
        clock.now += 0.001  # expiry at store_now: missing
        assert isinstance(await store.read("t"), Missing)
        assert isinstance(await store.write([IfMissing("t")], []), Committed)
        page = await store.scan("")
        assert [k for k, _ in page.items] == ["forever"]

    try:
        run(go())
    finally:
        store.close()


def test_expiry_follows_the_store_clock(make_store: StoreFactory) -> None:
    """Redis: `TIME`; memory: its clock. The expiry is commit `store_now` + ttl, and a
    key is found exactly while the store's own `store_now` is before it."""
    store = make_store()

    async def go() -> None:
        done = await store.write([], [Put("t", b"v", ttl=0.2)])
        assert isinstance(done, Committed)
        found = await store.read("t")
        assert isinstance(found, Found)
        assert found.expires_at is not None
        assert found.expires_at == pytest.approx(done.store_now + 0.2, abs=2e-6)
        for _ in range(2000):  # bounded poll of the store's own clock
            result = await store.read("t")
            if isinstance(result, Missing):
                assert result.store_now >= found.expires_at
                break
            assert result.store_now < found.expires_at
            await asyncio.sleep(0.005)
        else:
            pytest.fail("the key never expired")
        assert isinstance(await store.write([IfVersion("t", found.version)], []), Conflict)

    run(go())


def test_put_without_ttl_clears_an_earlier_expiry(make_store: StoreFactory) -> None:
    store = make_store()

    async def go() -> None:
        await store.write([], [Put("k", b"1", ttl=1000)])
        await store.write([], [Put("k", b"2")])
        found = await store.read("k")
        assert isinstance(found, Found)
        assert found.expires_at is None

    run(go())


def _scan_all(
    store: LocationStore,
    prefix: str,
    limit: int,
    between: Callable[[], Awaitable[object]] | None = None,
) -> list[list[str]]:
    async def go() -> list[list[str]]:
        pages: list[list[str]] = []
        cursor = None
        while True:
            page = await store.scan(prefix, cursor=cursor, limit=limit)
            assert len(page.items) <= limit
            pages.append([k for k, _ in page.items])
            for key, found in page.items:
                assert key.startswith(prefix)
                assert found.store_now == page.store_now
            if page.cursor is None:
                return pages
            if between is not None:
                await between()
            cursor = page.cursor
            assert len(pages) < 10_000

    return run(go())


@pytest.mark.parametrize("limit", [1, 7, 1000])
def test_scan_pages_cover_every_key_exactly_once_in_order(
    make_store: StoreFactory, limit: int
) -> None:
    store = make_store()
    keys = [f"s/{i:05d}" for i in range(1203)] + ["s/é", "s/\U0001f600"]
    run(store.write([], [Put(k, k.encode()) for k in keys[:1000]]))
    run(store.write([], [Put(k, k.encode()) for k in keys[1000:]]))
    run(store.write([], [Put("t/other", b""), Put("s", b""), Put("r/zzz", b"")]))
    pages = _scan_all(store, "s/", limit)
    flat = [k for page in pages for k in page]
    assert flat == sorted(keys, key=lambda k: k.encode())
    assert all(page for page in pages[:-1])  # only the last page may be empty


def test_scan_under_concurrent_changes_returns_stable_keys_exactly_once(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    stable = [f"p/{i:04d}" for i in range(0, 600, 2)]
    volatile = [f"p/{i:04d}" for i in range(1, 600, 2)]
    run(store.write([], [Put(k, b"s") for k in stable] + [Put(k, b"v") for k in volatile]))
    step = iter(range(1000))

    async def churn() -> None:
        n = next(step)
        await store.write([], [Delete(volatile[n % len(volatile)]), Put(f"p/{n:04d}x", b"new")])

    flat = [k for page in _scan_all(store, "p/", 25, churn) for k in page]
    assert len(flat) == len(set(flat))
    assert [k for k in flat if k in set(stable)] == stable


def test_empty_scan_is_one_empty_page_and_empty_prefix_scans_everything(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    page = run(store.scan("nothing/"))
    assert page.items == []
    assert page.cursor is None
    run(store.write([], [Put("a", b"1"), Put("b/c", b"2")]))
    assert [k for page in _scan_all(store, "", 1) for k in page] == ["a", "b/c"]


def test_scan_cursor_never_issued_or_of_another_prefix_is_value_error(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    run(store.write([], [Put(f"c/{i}", b"") for i in range(5)]))
    page = run(store.scan("c/", limit=2))
    assert page.cursor is not None
    for bad in ["", "garbage", page.cursor[:-4] + "AAAA", "é"]:
        with pytest.raises(ValueError, match="never issued"):
            run(store.scan("c/", cursor=bad))
    with pytest.raises(ValueError, match="prefix"):
        run(store.scan("d/", cursor=page.cursor))
    other = make_store()
    with pytest.raises(ValueError, match="never issued"):
        run(other.scan("c/", cursor=page.cursor))
    with pytest.raises(TypeError):
        run(store.scan("c/", cursor=5))  # type: ignore[arg-type]


def test_memory_store_continues_an_old_cursor_after_many_writes() -> None:

    store = MemoryLocationStore()
    try:
        run(store.write([], [Put(f"m/{i:03d}", b"") for i in range(10)]))
        page = run(store.scan("m/", limit=3))
        assert page.cursor is not None
        for i in range(100):
            run(store.write([], [Put(f"z/{i}", b"")]))
        rest = run(store.scan("m/", cursor=page.cursor, limit=1000))
        assert [k for k, _ in rest.items] == [f"m/{i:03d}" for i in range(3, 10)]
    finally:
        store.close()


def test_two_prefixes_on_one_redis_never_see_each_other(redis_server: Any) -> None:

    one = RedisLocationStore(redis_server.url, key_prefix="iso-one")
    two = RedisLocationStore(redis_server.url, key_prefix="iso-one:x")  # a prefix of it too
    try:
        run(one.write([], [Put("k", b"1"), Put("x", b"1")]))
        run(two.write([], [Put("k", b"2")]))
        a, b = run(one.read("k")), run(two.read("k"))
        assert isinstance(a, Found)
        assert a.value == b"1"
        assert isinstance(b, Found)
        assert b.value == b"2"
        assert [k for k, _ in run(one.scan("")).items] == ["k", "x"]
        assert [k for k, _ in run(two.scan("")).items] == ["k"]
        run(two.write([], [Delete("x")]))
        assert isinstance(run(one.read("x")), Found)
    finally:
        one.close()
        two.close()


def test_prefixes_that_embed_the_namespace_tag_never_see_each_other(redis_server: Any) -> None:
    # Once `prefix + ":zla1:"`: B's key "z" was A's key "y:zla1:k:z".
    one = RedisLocationStore(redis_server.url, key_prefix="x")
    two = RedisLocationStore(redis_server.url, key_prefix="x:zla1:k:y")
    try:
        run(two.write([], [Put("z", b"two")]))
        assert isinstance(run(one.read("y:zla1:k:z")), Missing)
        run(one.write([], [Put("y:zla1:k:z", b"one")]))
        b = run(two.read("z"))
        assert isinstance(b, Found)
        assert b.value == b"two"
        assert [k for k, _ in run(one.scan("")).items] == ["y:zla1:k:z"]
        assert [k for k, _ in run(two.scan("")).items] == ["z"]
    finally:
        one.close()
        two.close()


def test_a_prefix_with_colons_works(redis_server: Any) -> None:
    store = RedisLocationStore(redis_server.url, key_prefix="zlink:game")
    try:
        assert isinstance(run(store.write([IfMissing("k")], [Put("k", b"1")])), Committed)
        found = run(store.read("k"))
        assert isinstance(found, Found)
        assert found.value == b"1"
        assert [k for k, _ in run(store.scan("")).items] == ["k"]
    finally:
        store.close()


def test_one_store_serves_several_event_loops_and_threads(make_store: StoreFactory) -> None:
    store = make_store()
    errors: list[BaseException] = []

    def loop_user(me: int) -> None:
        async def go() -> None:
            for i in range(20):
                await store.write([], [Put(f"loops/{me}/{i}", b"x")])
                assert isinstance(await store.read(f"loops/{me}/{i}"), Found)

        try:
            run(go())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop_user, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len([k for p in _scan_all(store, "loops/", 1000) for k in p]) == 80


def test_closed_store_raises_shutting_down_and_close_is_idempotent(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    run(store.write([], [Put("k", b"1")]))
    store.close()
    store.close()
    with pytest.raises(ShuttingDownError):
        run(store.read("k"))
    with pytest.raises(ShuttingDownError):
        run(store.write([], [Put("k", b"2")]))
    with pytest.raises(ShuttingDownError):
        run(store.scan(""))


def test_close_inside_a_running_loop_and_after_the_loop_ended(make_store: StoreFactory) -> None:
    inside = make_store()
    after = make_store()

    async def go() -> None:
        await inside.write([], [Put("k", b"1")])
        await after.write([], [Put("k", b"1")])
        inside.close()  # plain close on a running loop
        with pytest.raises(ShuttingDownError):
            await inside.read("k")

    run(go())
    after.close()  # the loop that used it has ended
    with pytest.raises(ShuttingDownError):
        run(after.read("k"))


def test_scan_pages_keep_to_4_mib_of_values(make_store: StoreFactory) -> None:
    store = make_store()
    mib = 1 << 20
    run(store.write([], [Put(f"big/{i}", b"x" * mib) for i in range(3)]))
    run(store.write([], [Put(f"big/{i}", b"x" * mib) for i in range(3, 6)]))

    async def go() -> list[int]:
        sizes, cursor = [], None
        while True:
            page = await store.scan("big/", cursor=cursor)
            sizes.append(sum(len(found.value) for _, found in page.items))
            if page.cursor is None:
                return sizes
            cursor = page.cursor

    sizes = run(go())
    assert sizes == [4 * mib, 2 * mib]
