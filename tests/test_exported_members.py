"""The public surface is `zlink_actors.__all__`: sorted and complete (httpx style).

Style guide, "Modules and public surface": `zlink_actors/__init__.py` re-exports the public
names and keeps one sorted `__all__`; a test asserts it is complete and sorted.
"""

from __future__ import annotations

import inspect

import zlink_actors


def _defined_in_package(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "zlink_actors" or module.startswith("zlink_actors.")


def test_all_is_sorted() -> None:
    # Case-sensitive order (classes before functions), as ruff's RUF022 is disabled for it.
    assert zlink_actors.__all__ == sorted(zlink_actors.__all__)


def test_all_has_no_duplicates() -> None:
    assert len(set(zlink_actors.__all__)) == len(zlink_actors.__all__)


def test_every_name_in_all_is_bound_in_the_package() -> None:
    missing = [name for name in zlink_actors.__all__ if not hasattr(zlink_actors, name)]

    assert missing == []


def test_every_public_class_and_function_of_the_package_is_exported() -> None:
    public = {
        name
        for name, obj in vars(zlink_actors).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and _defined_in_package(obj)
    }

    assert public - set(zlink_actors.__all__) == set()


def test_exported_names_are_public() -> None:
    assert [name for name in zlink_actors.__all__ if name.startswith("_")] == []
