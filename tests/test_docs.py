"""Every citation of the contract resolves, and every anchored link between the docs lands.

The contract is cited by short names (docs/contract.md, "How to cite"): `SC`, `CS`, `HX`
(the seed pages), `digest` and `design/<page>.md`, each followed by a section sign and a
number, and `design/<page>.md` alone. None of those pages is in the repository;
docs/contract.md has an anchor for each cited section. The checks:

1. every citation in code, tests, docs and benchmarks names a section that has an anchor in
   docs/contract.md (`SC 10` -> `sc-10`, `HX 5.3` -> `hx-5-3`, ranges and lists expanded);
2. every section sign names its source right before it (a sign with no source, or with a
   source this page does not know, such as a bare `mesh.md`, is an error);
3. a section of one of the repository's own pages (`docs/location.md` and a number) is a
   numbered heading of that page;
4. every path docs/contract.md names in its "Code" and "Tests" lines exists;
5. every Markdown link with an anchor in README.md and docs/ lands on a heading or an
   `<a id>` of its target page.

The last tests plant each kind of fault in a small tree and check that it is reported: a
check that cannot fail would be worth nothing. This file spells the section sign as
`SIGN`, so that it cites nothing itself.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIGN = "\u00a7"
CONTRACT = "docs/contract.md"

#: What is scanned for citations: text files of the repository, outside hidden and
#: generated directories.
SUFFIXES = frozenset({".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml"})
SKIP_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist"})

_NUM = r"\d+(?:\.\d+)*"
_ITEM = rf"{SIGN}\s?{_NUM}(?:\s?[-\u2013]\s?\d+)?"
#: A source, then one or more sections: `SC 4-5, 7, 9-11` (each with its sign).
_CITE = re.compile(
    rf"(?P<src>\b(?:SC|CS|HX|[Dd]igest)|(?<![\w/.])design/[a-z_-]+\.md|docs/[a-z_-]+\.md"
    rf"|\bRFC \d+|\bissue \d+)`?\s?"
    rf"(?P<items>{_ITEM}(?:\s?(?:,|/|and)\s?{_ITEM})*)"
)
_ITEMS = re.compile(rf"{SIGN}\s?(?P<num>{_NUM})(?:\s?[-\u2013]\s?(?P<end>\d+))?")
#: A design page named without a section: `design/http.md "Rules"`.
_DESIGN_PAGE = re.compile(r"(?<![\w/.])design/(?P<page>[a-z_-]+)\.md")
_ANCHOR = re.compile(r'<a id="(?P<id>[^"]+)"')
_PATH = re.compile(r"`(?P<path>(?:zlink_actors|transports|tests|benchmarks|samples)/[\w/.-]*)`")
_LINK = re.compile(r"\]\((?P<file>[^)#\s]*)#(?P<anchor>[^)\s]+)\)")


def text_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    """The files scanned for citations, sorted."""
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if any(p.startswith(".") or p in SKIP_DIRS or p.endswith(".egg-info") for p in parts):
            continue
        if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile"):
            yield path


def anchor_of(source: str, number: str) -> str | None:
    """The docs/contract.md anchor of `source` + section `number`; None when the source is
    outside the contract (an RFC, an issue, a page of this repository)."""
    number = number.replace(".", "-")
    if source in ("SC", "CS", "HX"):
        return f"{source.lower()}-{number}"
    if source.lower() == "digest":
        return f"digest-{number}"
    if source.startswith("design/"):
        return f"design-{source[len('design/') : -len('.md')]}-{number}"
    return None


def sections(items: str) -> Iterator[str]:
    """Each section an item list names, ranges expanded: `4-5, 7` -> 4, 5, 7."""
    for m in _ITEMS.finditer(items):
        num, end = m.group("num"), m.group("end")
        if end is None:
            yield num
            continue
        head, _, first = num.rpartition(".")
        prefix = f"{head}." if head else ""
        for n in range(int(first), int(end) + 1):
            yield f"{prefix}{n}"


def numbered_headings(page: pathlib.Path) -> set[str]:
    """The numbers of a page's numbered headings (`## 8. Design choices` -> "8")."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#+\s+(\d+(?:\.\d+)*)\.?\s", line)
        if m:
            found.add(m.group(1))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    """Every anchor a page offers: its headings' slugs (numbered when repeated, as GitHub
    does) and its `<a id>` tags; headings inside code fences do not count."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        m = re.match(r"#+\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        found.update(a.group("id") for a in _ANCHOR.finditer(line))
    return found


def citation_faults(root: pathlib.Path) -> list[str]:
    """Checks 1 - 3 over the tree at `root`: one line per fault, `path:line: what`."""
    contract = anchors(root / CONTRACT)
    faults = []
    for path in text_files(root):
        rel = path.relative_to(root).as_posix()
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            covered: set[int] = set()
            for m in _CITE.finditer(line):
                src = m.group("src")
                covered.update(i for i in range(m.start("items"), m.end("items")))
                for number in sections(m.group("items")):
                    anchor = anchor_of(src, number)
                    if anchor is not None and anchor not in contract:
                        faults.append(
                            f"{rel}:{lineno}: {src} {SIGN}{number} has no anchor "
                            f"#{anchor} in {CONTRACT}"
                        )
                    if src.startswith("docs/"):
                        page = root / src
                        if not page.exists() or number not in numbered_headings(page):
                            faults.append(f"{rel}:{lineno}: {src} has no section {number}")
            for i, char in enumerate(line):
                if char == SIGN and i not in covered:
                    faults.append(
                        f"{rel}:{lineno}: a section sign without a known source before "
                        f"it: {line.strip()[:100]!r} (write SC, CS, HX, digest, "
                        f"design/<page>.md or docs/<page>.md before it; {CONTRACT})"
                    )
            for m in _DESIGN_PAGE.finditer(line):
                if f"design-{m.group('page')}" not in contract:
                    faults.append(
                        f"{rel}:{lineno}: {m.group(0)} has no anchor "
                        f"#design-{m.group('page')} in {CONTRACT}"
                    )
    return faults


def path_faults(root: pathlib.Path) -> list[str]:
    """Check 4: the paths docs/contract.md names exist."""
    faults = []
    for lineno, line in enumerate((root / CONTRACT).read_text(encoding="utf-8").splitlines(), 1):
        for m in _PATH.finditer(line):
            if not (root / m.group("path")).exists():
                faults.append(f"{CONTRACT}:{lineno}: {m.group('path')} does not exist")
    return faults


def link_faults(root: pathlib.Path) -> list[str]:
    """Check 5: anchored links in README.md and docs/ land."""
    faults = []
    pages = [*sorted((root / "docs").glob("*.md")), root / "README.md"]
    for page in pages:
        if not page.exists():
            continue
        for m in _LINK.finditer(page.read_text(encoding="utf-8")):
            target = (page.parent / m.group("file")) if m.group("file") else page
            rel = page.relative_to(root).as_posix()
            if not target.exists():
                faults.append(f"{rel}: {m.group(0)}: no such page")
            elif m.group("anchor") not in anchors(target):
                faults.append(f"{rel}: {m.group(0)}: no such anchor")
    return faults


def test_every_citation_resolves_in_contract_md() -> None:
    assert citation_faults(ROOT) == []


def test_contract_md_names_only_paths_that_exist() -> None:
    assert path_faults(ROOT) == []


def test_every_anchored_link_between_the_docs_lands() -> None:
    assert link_faults(ROOT) == []


def test_the_repository_cites_the_contract() -> None:
    # The scan sees the files it should: a scan that found nothing would pass vacuously.
    cited = [
        path
        for path in text_files(ROOT)
        if _CITE.search(path.read_text(encoding="utf-8"))
        and path.relative_to(ROOT).as_posix() != CONTRACT
    ]
    assert len(cited) >= 40, cited


# -- the checker, on planted faults -------------------------------------------------------


def _tree(tmp: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    contract = (
        '# c\n<a id="sc-4"></a> <a id="sc-5"></a> <a id="sc-7"></a>\n'
        '<a id="hx-5-3"></a> <a id="digest-3"></a> <a id="design-mesh"></a>\n'
        '<a id="design-mesh-2"></a>\n'
        "- Code: `zlink_actors/core.py`.\n"
    )
    (tmp / "docs").mkdir()
    (tmp / CONTRACT).write_text(contract, encoding="utf-8")
    (tmp / "docs" / "guide.md").write_text("# Guide\n\n## 8. Choices\n", encoding="utf-8")
    (tmp / "zlink_actors").mkdir()
    (tmp / "zlink_actors" / "core.py").write_text("", encoding="utf-8")
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    return tmp


def test_citations_that_resolve_pass(tmp_path: pathlib.Path) -> None:
    root = _tree(
        tmp_path,
        {
            "ok.py": f'"""SC {SIGN}4-5, {SIGN}7 and SC {SIGN}5/{SIGN}7; HX {SIGN}5.3;\n'
            f'digest {SIGN}3 "Timers"; design/mesh.md {SIGN}2, design/mesh.md "Wire";\n'
            f'docs/guide.md {SIGN}8; RFC 9110 {SIGN}15.4; issue 3 {SIGN}1."""\n'
        },
    )
    assert citation_faults(root) == []


def test_an_unknown_section_is_reported(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path, {"bad.py": f"# SC {SIGN}4-6 and digest {SIGN}99\n"})
    faults = citation_faults(root)
    assert len(faults) == 2, faults
    assert f"SC {SIGN}6 has no anchor #sc-6" in faults[0]
    assert f"digest {SIGN}99 has no anchor #digest-99" in faults[1]


def test_a_sign_without_a_known_source_is_reported(tmp_path: pathlib.Path) -> None:
    root = _tree(
        tmp_path,
        {
            "bad.md": f"mesh.md {SIGN}2\n`mesh.md` {SIGN}4\nGATE {SIGN}6\n"
            f'digest {SIGN}3 "Timers"; {SIGN}9 Tier 1\n'
        },
    )
    faults = citation_faults(root)
    assert [f.split(":")[1] for f in faults] == ["1", "2", "3", "4"], faults
    assert all("without a known source" in f for f in faults)


def test_an_unknown_design_page_and_a_missing_doc_section_are_reported(
    tmp_path: pathlib.Path,
) -> None:
    root = _tree(
        tmp_path,
        {"bad.py": f"# design/edges.md; design/mesh.md {SIGN}9; docs/guide.md {SIGN}2\n"},
    )
    faults = citation_faults(root)
    assert len(faults) == 3, faults
    assert "design/edges.md has no anchor #design-edges" in faults[2]
    assert f"design/mesh.md {SIGN}9 has no anchor #design-mesh-9" in faults[0]
    assert "docs/guide.md has no section 2" in faults[1]


def test_a_missing_path_and_a_broken_link_are_reported(tmp_path: pathlib.Path) -> None:
    root = _tree(tmp_path, {"README.md": "[a](docs/guide.md#8-choices) [b](docs/guide.md#gone)\n"})
    with (root / CONTRACT).open("a", encoding="utf-8") as out:
        out.write("- Tests: `tests/contract/test_gone.py`.\n")
    assert path_faults(root) == [f"{CONTRACT}:6: tests/contract/test_gone.py does not exist"]
    assert link_faults(root) == ["README.md: ](docs/guide.md#gone): no such anchor"]
