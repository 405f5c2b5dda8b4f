"""The layering of docs/architecture.md, over every import the package has.

import-linter (`lint-imports`, run by `make test`) checks the layer contracts on every
import it finds, `TYPE_CHECKING` and function-level ones included. This test reads the
source too and adds what the contracts do not say: no import of the package inside a
function at all (not even one pointing down), no cycle inside a layer, the rules of the
tiers not written yet, and no layered module importing the package's top (`__init__`,
`testing`). The rules:

1. every intra-package import points down the table `ALLOWED` (a module may always
   import from its own sub-package; the package's `__init__` and the public test kit
   `testing` sit on top: they may import anything, and no layer may import them);
2. no import of the package sits inside a function;
3. the graph of all those imports, `TYPE_CHECKING` ones included, has no cycle;
4. `transports` imports nothing of `zlink_actors`, and of other libraries only pyzmq and
   msgspec;
5. no class of `mesh/` inherits a class of another module of `mesh/`, and no private name
   is imported from another module (tests/layering_rules.py, which import-linter runs too
   as the contract `mesh_composition`; its `ALLOWLIST` of code not yet moved only shrinks).

The last tests plant each kind of violation in a copy of a small tree and check that the
checker reports it: a check that cannot fail would be worth nothing.
"""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import grimp
import pytest

from .layering_rules import (
    ALLOWLIST,
    PACKAGES,
    CompositionContract,
    composition_violations,
    imports,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Layer -> the layers it may import (besides itself). Tiers not written yet are listed
#: so that the rule holds from their first module on (docs/architecture.md).
ALLOWED: dict[str, frozenset[str]] = {
    "_core": frozenset(),
    "_engine": frozenset({"_core"}),
    "_calls": frozenset({"_engine", "_core"}),
    "location": frozenset({"_core"}),
    "http": frozenset({"_calls", "_engine", "_core"}),
    "mesh": frozenset({"location", "_calls", "_engine", "_core", "transports"}),
    "_host": frozenset({"_calls", "_engine", "_core", "location", "mesh", "http"}),
}
#: Modules of `zlink_actors` outside the layers: they may import any of them.
UNLAYERED = frozenset({"", "testing"})


def _layer(module: str) -> str | None:
    """The layer of a `zlink_actors` module (None: outside the layers)."""
    parts = module.split(".")
    if parts[0] != "zlink_actors":
        return parts[0]
    rest = parts[1] if len(parts) > 1 else ""
    return None if rest in UNLAYERED else rest


def violations(root: pathlib.Path, packages: tuple[str, ...]) -> list[str]:
    """What breaks the rules of the module docstring, one line each."""
    found: list[str] = []
    edges: dict[str, set[str]] = {}
    for imp in imports(root, packages):
        if imp.where == "function":
            found.append(f"{imp.source}:{imp.line} imports {imp.target} inside a function")
        if imp.source.split(".")[0] == "transports" and imp.target.split(".")[0] != "transports":
            found.append(f"{imp.source}:{imp.line} imports {imp.target}: transports is standalone")
        src, dst = _layer(imp.source), _layer(imp.target)
        if imp.source.startswith("zlink_actors") and src is not None and dst is None:
            found.append(
                f"{imp.source}:{imp.line} imports {imp.target} ({imp.where}): "
                f"{src} may not import the package's top"
            )
        if (
            imp.source.startswith("zlink_actors")
            and src is not None
            and dst is not None
            and dst != src
            and dst not in ALLOWED.get(src, frozenset())
        ):
            found.append(
                f"{imp.source}:{imp.line} imports {imp.target} ({imp.where}): "
                f"{src} may not import {dst}"
            )
        if imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    found.extend(f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(edges))
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan).

    An import of a package (`from . import x` resolving to the package itself, or of an
    `__init__` that re-exports) is an edge to that package's `__init__` module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


# -- the package as it is ----------------------------------------------------------------


def test_the_package_keeps_its_layers() -> None:
    assert violations(ROOT, ("zlink_actors", "transports")) == []


def test_the_checker_sees_every_module_of_the_package() -> None:
    seen = {imp.source for imp in imports(ROOT, ("zlink_actors",))}
    # Every module that imports anything of the package is read (sanity: the walk ran).
    assert {"zlink_actors._core.pool", "zlink_actors._engine.runner", "zlink_actors._host"} <= seen


# -- the checker fails on each kind of violation -----------------------------------------


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = tmp_path.joinpath(*name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


_CLEAN = {
    "zlink_actors/__init__.py": "from ._host import Host\n",
    "zlink_actors/_host.py": "from ._calls.call import Call\nclass Host: ...\n",
    "zlink_actors/_core/__init__.py": "",
    "zlink_actors/_core/errors.py": "class E(Exception): ...\n",
    "zlink_actors/_core/pool.py": "from .errors import E\n",
    "zlink_actors/_engine/__init__.py": "",
    "zlink_actors/_engine/kernel.py": "from .._core.pool import E\n",
    "zlink_actors/_calls/__init__.py": "",
    "zlink_actors/_calls/call.py": "from .._engine.kernel import E\nclass Call: ...\n",
    "zlink_actors/mesh/__init__.py": "",
    "zlink_actors/mesh/a.py": "class A: ...\n",
    "transports/__init__.py": "import zmq\n",
}


def test_a_clean_tree_has_no_violation(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path, _CLEAN)
    assert violations(root, ("zlink_actors", "transports")) == []


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "zlink_actors/_core/pool.py",
            "from .._engine.kernel import E\n",
            "zlink_actors._core.pool:1 imports zlink_actors._engine.kernel (top): "
            "_core may not import _engine",
        ),
        (
            "zlink_actors/_core/pool.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from .._calls.call import Call\n",
            "zlink_actors._core.pool:3 imports zlink_actors._calls.call (type-checking): "
            "_core may not import _calls",
        ),
        (
            "zlink_actors/_engine/kernel.py",
            "def f():\n    from .._core.errors import E\n",
            "zlink_actors._engine.kernel:2 imports zlink_actors._core.errors inside a function",
        ),
        (
            "transports/__init__.py",
            "from zlink_actors import Host\n",
            "transports:1 imports zlink_actors: transports is standalone",
        ),
        (
            "zlink_actors/_engine/kernel.py",
            "from .. import Host\n",
            "zlink_actors._engine.kernel:1 imports zlink_actors (top): "
            "_engine may not import the package's top",
        ),
        (
            "zlink_actors/_core/errors.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .pool import E\n",
            "import cycle: zlink_actors._core.errors -> zlink_actors._core.pool",
        ),
    ],
    ids=["upward", "upward-type-checking", "function-level", "transports", "top", "cycle"],
)
def test_the_checker_reports_a_planted_violation(
    tmp_path: pathlib.Path, name: str, text: str, expected: str
) -> None:
    root = _tree(tmp_path, {**_CLEAN, name: text})
    assert expected in violations(root, ("zlink_actors", "transports"))


#: What `transports` may import besides itself (docs/architecture.md).
TRANSPORTS_MAY_USE = frozenset({"zmq", "msgspec"})


def third_party_imports(package: pathlib.Path) -> list[str]:
    """`module:line name` for every import in `package` of a top-level module that is
    neither the standard library, the package itself nor `TRANSPORTS_MAY_USE`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                allowed = top in sys.stdlib_module_names or top == package.name
                if not allowed and top not in TRANSPORTS_MAY_USE:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {name}")
    return found


def test_transports_uses_only_the_standard_library_pyzmq_and_msgspec() -> None:
    assert third_party_imports(ROOT / "transports") == []


def test_the_transports_check_reports_another_library(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path, {"transports/__init__.py": "import zmq\nimport redis\n"})
    assert third_party_imports(root / "transports") == ["transports/__init__.py:2 redis"]


# -- one writer of the admission deadline (issue 27: fencing through one Runtime method) --

#: The one module that may assign `admission_deadline` (`Runtime.__init__` and
#: `Runtime.fence_until`).
FENCE_WRITER = "zlink_actors/_engine/kernel.py"


def fence_writes(root: pathlib.Path) -> list[str]:
    """`path:line` of every assignment to an attribute `admission_deadline` outside
    `FENCE_WRITER`: every other place fences through `Runtime.fence_until`."""
    found = []
    for path in sorted((root / "zlink_actors").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == FENCE_WRITER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "admission_deadline":
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_only_the_runtime_writes_the_admission_deadline() -> None:
    assert fence_writes(ROOT) == []


def test_the_fence_check_reports_another_writer(tmp_path: pathlib.Path) -> None:
    root = _tree(
        tmp_path,
        {
            **_CLEAN,
            "zlink_actors/_engine/kernel.py": "class R:\n    admission_deadline = None\n",
            "zlink_actors/mesh/__init__.py": "",
            "zlink_actors/mesh/b.py": "def f(runtime):\n    runtime.admission_deadline = 0.0\n",
        },
    )
    assert fence_writes(root) == ["zlink_actors/mesh/b.py:2"]


# -- composition: parts are held, private names stay home (issue 27 §1) ------------------


def test_no_class_inherits_across_mesh_modules_and_no_private_name_crosses_a_module() -> None:
    assert composition_violations(ROOT) == []


def test_each_allowlist_entry_is_listed_once_under_a_one_line_reason() -> None:
    entries = [key for keys in ALLOWLIST.values() for key in keys]
    assert len(entries) == len(set(entries))
    assert all(reason and "\n" not in reason for reason in ALLOWLIST)
    assert all(len(key.split()) == 3 for key in entries)


#: A class of `mesh/` whose base is in another module of `mesh/`, written as `b.py`.
_INHERITS = "zlink_actors.mesh.b:2 B inherits zlink_actors.mesh.a.A: a part holds its collaborators"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"zlink_actors/mesh/b.py": "from .a import A\nclass B(A): ...\n"}, _INHERITS),
        ({"zlink_actors/mesh/b.py": "from . import a\nclass B(a.A): ...\n"}, _INHERITS),
        (
            {
                "zlink_actors/mesh/b.py": "import zlink_actors.mesh.a\n"
                "class B(zlink_actors.mesh.a.A): ...\n"
            },
            _INHERITS,
        ),
        (
            {
                "zlink_actors/mesh/__init__.py": "from .a import A\n",
                "zlink_actors/mesh/b.py": "from . import A\nclass B(A): ...\n",
            },
            _INHERITS,
        ),
        (
            {
                "zlink_actors/mesh/a.py": "from typing import Generic, TypeVar\n"
                "T = TypeVar('T')\nclass A(Generic[T]): ...\n",
                "zlink_actors/mesh/b.py": "from .a import A\nclass B(A[int]): ...\n",
            },
            _INHERITS,
        ),
        (
            {
                "zlink_actors/mesh/a.py": "#: base:\nclass A: ...\n",
                "zlink_actors/mesh/b.py": "from .a import A\nclass B(A): ...\n",
            },
            _INHERITS,
        ),
        (
            {"zlink_actors/mesh/b.py": "from .a import _x\n"},
            "zlink_actors.mesh.b:1 imports zlink_actors.mesh.a._x: "
            "a private name stays in its module",
        ),
        (
            {
                "zlink_actors/_core/pool.py": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .errors import _E\n"
            },
            "zlink_actors._core.pool:3 imports zlink_actors._core.errors._E: "
            "a private name stays in its module",
        ),
        (
            {
                "transports/_errors.py": "class _Silent(Exception): ...\n",
                "transports/_io.py": "from ._errors import _Silent\n",
            },
            "transports._io:1 imports transports._errors._Silent: "
            "a private name stays in its module",
        ),
        (
            {"zlink_actors/mesh/b.py": "from . import a\ndef f():\n    return a._x\n"},
            "zlink_actors.mesh.b:3 reads zlink_actors.mesh.a._x: "
            "a private name stays in its module",
        ),
        (
            {"zlink_actors/mesh/b.py": "import zlink_actors.mesh.a\nx = zlink_actors.mesh.a._x\n"},
            "zlink_actors.mesh.b:2 reads zlink_actors.mesh.a._x: "
            "a private name stays in its module",
        ),
    ],
    ids=[
        "inherits",
        "inherits-module-attribute",
        "inherits-absolute",
        "inherits-re-exported",
        "inherits-generic",
        "base-marker-without-reason",
        "private-name",
        "private-name-type-checking",
        "private-name-transports",
        "private-name-read",
        "private-name-read-absolute",
    ],
)
def test_the_composition_check_reports_a_planted_violation(
    tmp_path: pathlib.Path, files: dict[str, str], expected: str
) -> None:
    root = _tree(tmp_path, {**_CLEAN, **files})
    assert composition_violations(root, allowlist={}) == [expected]


@pytest.mark.parametrize(
    "files",
    [
        {
            "zlink_actors/mesh/a.py": "from typing import Protocol\nclass A(Protocol): ...\n",
            "zlink_actors/mesh/b.py": "from .a import A\nclass B(A): ...\n",
        },
        {
            "zlink_actors/mesh/a.py": "import typing\nclass A(typing.Protocol): ...\n",
            "zlink_actors/mesh/b.py": "from .a import A\nclass B(A): ...\n",
        },
        {
            "zlink_actors/mesh/a.py": "#: base: a small base that exists to be inherited\n"
            "class A: ...\n",
            "zlink_actors/mesh/b.py": "from .a import A\nclass B(A): ...\n",
        },
        {"zlink_actors/mesh/a.py": "class A: ...\nclass B(A): ...\n"},
        {"zlink_actors/mesh/b.py": "from .._core.errors import E\nclass B(E): ...\n"},
        {"zlink_actors/_core/pool.py": "from .errors import E as _E\n"},
        {
            "transports/_errors.py": "",
            "transports/_io.py": "from . import _errors\n",
        },
        {"zlink_actors/mesh/b.py": "from .a import __doc__\n"},
        {"zlink_actors/mesh/b.py": "class B:\n    def f(self):\n        return self._x\n"},
    ],
    ids=[
        "protocol-base",
        "typing-protocol-base",
        "marked-base",
        "same-module",
        "base-outside-mesh",
        "private-alias",
        "private-module",
        "dunder",
        "own-private-attribute",
    ],
)
def test_the_composition_check_passes_what_the_rules_allow(
    tmp_path: pathlib.Path, files: dict[str, str]
) -> None:
    root = _tree(tmp_path, {**_CLEAN, **files})
    assert composition_violations(root, allowlist={}) == []


def test_the_allowlist_hides_a_listed_violation_and_reports_a_stale_entry(
    tmp_path: pathlib.Path,
) -> None:
    listed = {"moved later": ("zlink_actors.mesh.b.B inherits zlink_actors.mesh.a.A",)}
    planted = _tree(
        tmp_path / "planted",
        {**_CLEAN, "zlink_actors/mesh/b.py": "from .a import A\nclass B(A): ...\n"},
    )
    clean = _tree(tmp_path / "clean", _CLEAN)
    assert composition_violations(planted, allowlist=listed) == []
    assert composition_violations(clean, allowlist=listed) == [
        "allowlist: zlink_actors.mesh.b.B inherits zlink_actors.mesh.a.A no longer occurs: "
        "delete its entry"
    ]


def _lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports --no-cache` run in `root`, with `tests.layering_rules` from here."""
    # lint-imports puts its cwd first on sys.path, so it reads the packages under `root`.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_import_linter_contract_is_broken_by_a_planted_violation(
    tmp_path: pathlib.Path,
) -> None:
    # A copy of the package and of its import-linter configuration, as they are: kept.
    for package in ("zlink_actors", "transports"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=_NOT_SOURCE)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert f"{_COMPOSITION} KEPT" in kept.stdout
    # Plus a class inheriting a class of another mesh module, and a private name imported.
    _tree(
        tmp_path,
        {
            "zlink_actors/mesh/planted_a.py": "class A: ...\n_x = 1\n",
            "zlink_actors/mesh/planted_b.py": "from .planted_a import A, _x\nclass B(A): ...\n",
        },
    )
    broken = _lint_imports(tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert f"{_COMPOSITION} BROKEN" in broken.stdout
    assert ", 1 broken." in broken.stdout
    problems = [line for line in broken.stdout.splitlines() if line.startswith("- ")]
    assert problems == [
        "- zlink_actors.mesh.planted_b:2 B inherits zlink_actors.mesh.planted_a.A: "
        "a part holds its collaborators",
        "- zlink_actors.mesh.planted_b:1 imports zlink_actors.mesh.planted_a._x: "
        "a private name stays in its module",
    ]


def test_the_import_linter_contract_checks_the_tree_of_its_graph_only() -> None:
    graph = grimp.build_graph(*PACKAGES)
    contract = CompositionContract("composition", {"root_packages": list(PACKAGES)}, {})
    assert contract.check(graph, verbose=False).kept
    graph.remove_module("zlink_actors.mesh.peers")
    graph.add_module("zlink_actors.mesh.elsewhere")
    check = contract.check(graph, verbose=False)
    assert not check.kept
    assert check.metadata["problems"] == [
        "import-linter's graph has zlink_actors.mesh.elsewhere, which the checker did not read",
        "the checker read zlink_actors.mesh.peers, which is not in import-linter's graph",
    ]


_NOT_SOURCE = shutil.ignore_patterns("__pycache__")
_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
#: The name pyproject.toml gives the contract that runs tests/layering_rules.py.
(_COMPOSITION,) = [
    contract["name"]
    for contract in _PYPROJECT["tool"]["importlinter"]["contracts"]
    if contract["type"] == "mesh_composition"
]
