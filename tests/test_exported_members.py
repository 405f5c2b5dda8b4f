"""The public surface is `zlink_actors.__all__`: sorted and complete (httpx style).

Style guide, "Modules and public surface": `zlink_actors/__init__.py` re-exports the public
names and keeps one sorted `__all__`; a test asserts it is complete and sorted.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

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


def _module_name(path: pathlib.Path) -> str:
    """The dotted name of a module file of the package (`zlink_actors._core.pool`)."""
    root = pathlib.Path(zlink_actors.__file__).parent
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, level: int, module: str) -> str:
    """The absolute name a relative `from <level dots><module> import` names."""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module]) if module else ".".join(base)


def _is_submodule(package: str, name: str) -> bool:
    return inspect.ismodule(getattr(importlib.import_module(package), name, None))


def _imports_between_modules() -> list[tuple[str, str, str]]:
    """(importing module, imported module, name) for every relative `from ... import name`
    in the package, at any depth (function-level and `TYPE_CHECKING` imports included).
    Imports of a sub-module itself (`from . import pool`) are left out."""
    found = []
    for path in sorted(pathlib.Path(zlink_actors.__file__).parent.rglob("*.py")):
        importer = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module:
                target = _resolve(importer, path.name == "__init__.py", node.level, node.module)
                found.extend((importer, target, alias.name) for alias in node.names)
    return found


def test_every_name_a_module_takes_from_another_is_in_that_modules_all() -> None:
    """Style guide: private modules declare `__all__`, and it lists what other modules of
    the package import from them (so `__all__` is each module's real interface)."""
    outside = [
        (importer, module, name)
        for importer, module, name in _imports_between_modules()
        if not _is_submodule(module, name)
        and name not in getattr(importlib.import_module(module), "__all__", ())
    ]

    assert outside == []
