"""How the package's parts may depend on each other, read from the source (one source for
tests/test_layering.py and the import-linter contract `mesh_composition` of pyproject.toml).

The module graph (import-linter's contracts, and the layers of tests/test_layering.py) says
which module may import which. Two rules of issue 27 §1 need more than that graph, since
they are about what is imported and what is built from it:

1. **No class of `zlink_actors/mesh/` inherits a class defined in another module of
   `mesh/`**: an object made of parts holds them, each handed its collaborators
   (docs/architecture.md). A `typing.Protocol` subclass may be inherited, and so may a class
   marked `#: base: <why>` on the line above its `class` statement (a small base that exists
   to be inherited).
2. **No private name crosses a module boundary**: no `from X import _name` where X is another
   module of `zlink_actors` or `transports`, and no `X._name` read through such a module
   (`from . import codec as wire` ... `wire._DECODER`). `from . import _errors` imports a
   private module, not a name: the layers say who may import a module.

`ALLOWLIST` holds the violations that code not yet moved still has, each with its reason. It
can only shrink: an entry that no longer occurs is itself reported, so whoever removes a
violation deletes its entry in the same commit.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain.contract import Contract, ContractCheck
from rich.markup import escape  # import-linter prints with rich: `[...]` would be markup

#: The package whose classes may not inherit across its modules.
MESH = "zlink_actors.mesh"
#: The packages whose modules may not import each other's private names.
PACKAGES = ("zlink_actors", "transports")

_BASE_MARKER = "#: base:"

#: The violations code not yet moved still has, under the reason they are still there; each
#: reads as its finding does (`Finding.key`). Delete an entry when the code stops doing it
#: (a stale entry fails the check). Never add one: a move that carries a violation to
#: another module renames its entry, and the list only shrinks.
ALLOWLIST: dict[str, tuple[str, ...]] = {
    "MeshNode's mixin chain: each link goes when its class becomes a part the node holds": (
        "zlink_actors.mesh.calls.Calls inherits zlink_actors.mesh.handshake.Handshake",
        "zlink_actors.mesh.handshake.Handshake inherits zlink_actors.mesh.state.NodeState",
        "zlink_actors.mesh.inbound.Inbound inherits zlink_actors.mesh.calls.Calls",
        "zlink_actors.mesh.node.MeshNode inherits zlink_actors.mesh.objects.GlobalObjects",
        "zlink_actors.mesh.objects.GlobalObjects inherits zlink_actors.mesh.ownership.Ownership",
        "zlink_actors.mesh.ownership.Ownership inherits zlink_actors.mesh.routing.Routing",
        "zlink_actors.mesh.routing.Routing inherits zlink_actors.mesh.inbound.Inbound",
    ),
    "the engine's hook defaults, compared to tell a hook a class overrides": (
        "zlink_actors._engine.lifecycle imports zlink_actors._engine.objects._Lifecycle",
    ),
    "NodeState's constants and helpers, shared by the mixins: each goes public or with its part": (
        "zlink_actors.mesh.handshake imports zlink_actors.mesh.state._Dial",
        "zlink_actors.mesh.handshake imports zlink_actors.mesh.state._Hello",
        "zlink_actors.mesh.handshake imports zlink_actors.mesh.state._decode_hello",
    ),
    "the records of the global-object operations, shared by the mixins until they are parts": (
        "zlink_actors.mesh.objects imports zlink_actors.mesh.operations._Inflight",
        "zlink_actors.mesh.objects imports zlink_actors.mesh.operations._Intent",
        "zlink_actors.mesh.objects imports zlink_actors.mesh.operations._RETRY",
        "zlink_actors.mesh.objects imports zlink_actors.mesh.operations._Spec",
        "zlink_actors.mesh.objects imports zlink_actors.mesh.operations._wire_id",
        "zlink_actors.mesh.ownership imports zlink_actors.mesh.operations._Inflight",
        "zlink_actors.mesh.ownership imports zlink_actors.mesh.operations._RETRY",
        "zlink_actors.mesh.ownership imports zlink_actors.mesh.operations._Spec",
        "zlink_actors.mesh.ownership imports zlink_actors.mesh.operations._existing",
        "zlink_actors.mesh.ownership imports zlink_actors.mesh.operations._mismatch",
        "zlink_actors.mesh.ownership imports zlink_actors.mesh.operations._ref",
        "zlink_actors.mesh.routing imports zlink_actors.mesh.operations._Cached",
        "zlink_actors.mesh.routing imports zlink_actors.mesh.operations._HERE",
        "zlink_actors.mesh.routing imports zlink_actors.mesh.operations._Inflight",
        "zlink_actors.mesh.routing imports zlink_actors.mesh.operations._Resolve",
    ),
    "the PeerLost of a silent peer, raised by the I/O thread only (its public type is PeerLost)": (
        "transports._io imports transports._errors._SilentPeerLost",
    ),
}


# -- reading the source ------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One import of a module of the checked packages."""

    source: str  # dotted module name of the importer
    target: str  # dotted name of what it imports (a module, or a package)
    line: int
    where: str  # "top", "type-checking" or "function"


def module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    """The dotted name of the module at `path` (a package's `__init__` names the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name a `from X import ...` in `importer` reads X as."""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, node.module] if node.module else base)
    return node.module or ""


def exists(root: pathlib.Path, dotted: str) -> bool:
    """Whether `dotted` is a module or a package under `root`."""
    return _path(root, dotted) is not None


def _path(root: pathlib.Path, dotted: str) -> pathlib.Path | None:
    path = root.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_paths(root: pathlib.Path, packages: tuple[str, ...]) -> Iterator[pathlib.Path]:
    """Every module file of `packages` under `root`, sorted per package."""
    for package in packages:
        yield from sorted((root / package).rglob("*.py"))


def imports(root: pathlib.Path, packages: tuple[str, ...]) -> Iterator[Import]:
    """Every import, anywhere in a module, of a module of `packages` under `root`."""
    for path in module_paths(root, packages):
        importer = module_name(root, path)
        tree = _parse(path)
        yield from _walk(root, importer, path.name == "__init__.py", tree, "top", packages)


def _walk(
    root: pathlib.Path,
    importer: str,
    is_package: bool,
    node: ast.AST,
    where: str,
    packages: tuple[str, ...],
) -> Iterator[Import]:
    for child in ast.iter_child_nodes(node):
        inner = where
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            inner = "type-checking"
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "function"
        if isinstance(child, ast.ImportFrom):
            target = resolve(importer, is_package, child)
            for alias in child.names:
                # `from . import x` names a sub-module x when one exists.
                sub = f"{target}.{alias.name}"
                named = sub if exists(root, sub) else target
                if named.split(".")[0] in packages:
                    yield Import(importer, named, child.lineno, inner)
        elif isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name.split(".")[0] in packages:
                    yield Import(importer, alias.name, child.lineno, inner)
        yield from _walk(root, importer, is_package, child, inner, packages)


@cache
def _parse_cached(path: pathlib.Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _parse(path: pathlib.Path) -> ast.Module:
    """The module at `path`, parsed once per version of the file (a base is resolved by
    reading the modules it passes through, again for each class)."""
    stat = path.stat()
    return _parse_cached(path, stat.st_mtime_ns, stat.st_size)


# -- what a name at a module's top means -------------------------------------------------


@dataclass(frozen=True)
class _Module:
    name: str
    path: pathlib.Path
    tree: ast.Module
    #: top-level name -> what it is bound to: ("class", module, name) for a class defined
    #: here, ("module", dotted, "") for a module, ("from", module, name) for a name imported.
    bindings: Mapping[str, tuple[str, str, str]]


def _module(root: pathlib.Path, dotted: str) -> _Module | None:
    path = _path(root, dotted)
    if path is None:
        return None
    tree = _parse(path)
    is_package = path.name == "__init__.py"
    bindings: dict[str, tuple[str, str, str]] = {}
    for node in _top_level(tree.body):
        if isinstance(node, ast.ClassDef):
            bindings[node.name] = ("class", dotted, node.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bindings[alias.asname] = ("module", alias.name, "")
                else:
                    top = alias.name.split(".")[0]
                    bindings[top] = ("module", top, "")
        elif isinstance(node, ast.ImportFrom):
            source = resolve(dotted, is_package, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                bound = alias.asname or alias.name
                if exists(root, sub):
                    bindings[bound] = ("module", sub, "")
                else:
                    bindings[bound] = ("from", source, alias.name)
    return _Module(dotted, path, tree, bindings)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import time: the body, and what `if`/`try` blocks hold."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for handler in node.handlers:
                yield from _top_level(handler.body)


@dataclass(frozen=True)
class _Definition:
    module: str  # where the class is defined (for a name outside `root`: where it is read)
    name: str
    node: ast.ClassDef | None  # None: outside `root`, or not a class
    lines: tuple[str, ...] = ()


def _definition(root: pathlib.Path, module: str, name: str, depth: int = 0) -> _Definition:
    """Where `module.name` is defined, following re-exports (`from .x import name`)."""
    found = _module(root, module)
    if found is None or depth > 20:
        return _Definition(module, name, None)
    bound = found.bindings.get(name)
    if bound is None:
        return _Definition(module, name, None)
    kind, where, what = bound
    if kind == "from":
        return _definition(root, where, what, depth + 1)
    if kind == "module":
        return _Definition(where, "", None)
    for node in _top_level(found.tree.body):
        if isinstance(node, ast.ClassDef) and node.name == name:
            lines = tuple(found.path.read_text(encoding="utf-8").splitlines())
            return _Definition(module, name, node, lines)
    return _Definition(module, name, None)


def _base(root: pathlib.Path, module: _Module, expr: ast.expr) -> _Definition | None:
    """The class a base expression of a `class` statement in `module` names."""
    while isinstance(expr, ast.Subscript):  # Generic[T], Cell[None]
        expr = expr.value
    chain: list[str] = []
    while isinstance(expr, ast.Attribute):
        chain.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    bound = module.bindings.get(expr.id)
    if bound is None:
        return None
    kind, where, what = bound
    found = _Definition(where, "", None) if kind == "module" else _definition(root, where, what)
    for attr in chain:  # wire.Envelope, zlink_actors.mesh.a.A: a name read from a module
        if found.node is not None or found.name:
            return None
        sub = f"{found.module}.{attr}"
        found = (
            _Definition(sub, "", None)
            if exists(root, sub)
            else _definition(root, found.module, attr)
        )
    return found


def _is_protocol(root: pathlib.Path, base: _Definition) -> bool:
    if base.node is None:
        return False
    module = _module(root, base.module)
    assert module is not None
    for expr in base.node.bases:
        named = _base(root, module, expr)
        if named is not None and (named.module, named.name) in {
            ("typing", "Protocol"),
            ("typing_extensions", "Protocol"),
        }:
            return True
    return False


def _is_marked(base: _Definition) -> bool:
    if base.node is None:
        return False
    first = min([base.node.lineno, *(d.lineno for d in base.node.decorator_list)])
    above = base.lines[first - 2].strip() if first >= 2 else ""
    return above.startswith(_BASE_MARKER) and bool(above[len(_BASE_MARKER) :].strip())


# -- the two rules -----------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One place that breaks a rule: `who` (a class or a module) `rule` `what`."""

    module: str
    line: int
    who: str  # dotted: the class that inherits, or the module that imports
    rule: str  # "inherits", "imports" or "reads"
    what: str  # dotted: the base class, or the private name

    @property
    def key(self) -> str:
        """The finding without its line: how `ALLOWLIST` names it."""
        return f"{self.who} {self.rule} {self.what}"

    def __str__(self) -> str:
        if self.rule == "inherits":
            short = self.who.rsplit(".", 1)[-1]
            return f"{self.module}:{self.line} {short} inherits {self.what}: {_WHY[self.rule]}"
        return f"{self.module}:{self.line} {self.rule} {self.what}: {_WHY[self.rule]}"


_WHY = {
    "inherits": "a part holds its collaborators",
    "imports": "a private name stays in its module",
    "reads": "a private name stays in its module",
}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def inheritance_violations(root: pathlib.Path, package: str = MESH) -> list[Finding]:
    """Every class of `package` (a package under `root`) with a base defined in another of
    its modules, unless that base is a `typing.Protocol` subclass or marked `#: base:`."""
    found = []
    top = package.split(".", maxsplit=1)[0]
    for path in module_paths(root, (top,)):
        name = module_name(root, path)
        if not _in(name, package):
            continue
        module = _module(root, name)
        assert module is not None
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for expr in node.bases:
                base = _base(root, module, expr)
                if base is None or base.node is None or base.module == name:
                    continue
                if not _in(base.module, package):
                    continue
                if _is_protocol(root, base) or _is_marked(base):
                    continue
                found.append(
                    Finding(
                        name,
                        node.lineno,
                        f"{name}.{node.name}",
                        "inherits",
                        f"{base.module}.{base.name}",
                    )
                )
    return found


def private_import_violations(
    root: pathlib.Path, packages: tuple[str, ...] = PACKAGES
) -> list[Finding]:
    """Every private name of a module of `packages` that another of them takes: `from X
    import _name` anywhere in the module (`TYPE_CHECKING` and function-level imports
    count), and `X._name` read through a module X bound at the module's top
    (`from . import codec as wire` ... `wire._DECODER`)."""
    found = []
    for path in module_paths(root, packages):
        importer = module_name(root, path)
        module = _module(root, importer)
        assert module is not None
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                source = resolve(importer, path.name == "__init__.py", node)
                names = [(source, alias.name) for alias in node.names]
                rule = "imports"
            elif isinstance(node, ast.Attribute):
                source = _module_named(root, module, node.value)
                names = [(source, node.attr)]
                rule = "reads"
            else:
                continue
            if source.split(".", maxsplit=1)[0] not in packages or source == importer:
                continue
            found.extend(
                Finding(importer, node.lineno, importer, rule, f"{source}.{name}")
                for source, name in names
                if _is_private(name) and not exists(root, f"{source}.{name}")
            )
    return found


def _module_named(root: pathlib.Path, module: _Module, expr: ast.expr) -> str:
    """The module `expr` names in `module` (a name bound to a module at its top, or a
    sub-module read from one), or "" if it names none."""
    if isinstance(expr, ast.Name):
        bound = module.bindings.get(expr.id)
        return bound[1] if bound is not None and bound[0] == "module" else ""
    if isinstance(expr, ast.Attribute):
        outer = _module_named(root, module, expr.value)
        sub = f"{outer}.{expr.attr}"
        return sub if outer and exists(root, sub) else ""
    return ""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def composition_violations(
    root: pathlib.Path,
    allowlist: Mapping[str, tuple[str, ...]] = ALLOWLIST,
    package: str = MESH,
    packages: tuple[str, ...] = PACKAGES,
) -> list[str]:
    """What breaks the two rules under `root`, one line each, less the entries of
    `allowlist` (reason -> `Finding.key`s); and each entry that no longer occurs."""
    allowed = {key for keys in allowlist.values() for key in keys}
    findings = [*inheritance_violations(root, package), *private_import_violations(root, packages)]
    seen = {finding.key for finding in findings}
    problems = [str(finding) for finding in findings if finding.key not in allowed]
    problems.extend(
        f"allowlist: {key} no longer occurs: delete its entry"
        for keys in allowlist.values()
        for key in keys
        if key not in seen
    )
    return problems


# -- the same rules as an import-linter contract -----------------------------------------


def source_root(packages: tuple[str, ...] = PACKAGES) -> pathlib.Path:
    """The directory that holds `packages` as Python imports them (where grimp reads them).

    Raises:
        ValueError: a package is not importable, or they sit in different directories.
    """
    roots = set()
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{package} is not an importable package")
        roots.add(pathlib.Path(next(iter(spec.submodule_search_locations))).parent)
    if len(roots) != 1:
        raise ValueError(f"{', '.join(packages)} sit in different directories: {sorted(roots)}")
    return roots.pop()


class CompositionContract(Contract):
    """import-linter contract: the two rules of this module (`MESH`, `PACKAGES`, `ALLOWLIST`)
    over the tree import-linter reads. It takes no options.

    It is broken by each violation of `composition_violations`, and when the modules it read
    are not the modules of import-linter's graph (a check of another tree proves nothing).
    """

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        """Check the source of the packages of `graph` (a grimp `ImportGraph`)."""
        root = source_root()
        read = {module_name(root, path) for path in module_paths(root, PACKAGES)}
        graphed = {module for module in graph.modules if module.split(".")[0] in PACKAGES}
        problems = [
            f"import-linter's graph has {module}, which the checker did not read"
            for module in sorted(graphed - read)
        ]
        problems.extend(
            f"the checker read {module}, which is not in import-linter's graph"
            for module in sorted(read - graphed)
        )
        problems.extend(composition_violations(root))
        return ContractCheck(kept=not problems, metadata={"problems": problems})

    def render_broken_contract(self, check: ContractCheck) -> None:
        """One line per problem."""
        for problem in check.metadata["problems"]:
            output.print_error(f"- {escape(problem)}", bold=False)
        output.new_line()
