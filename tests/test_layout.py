"""The package's layout: folders by concern, and the imports between them.

- speed_ladder/ holds the core (errors, files, records, the runs store and which records count,
  ladder discovery, step flags, presets, machine fingerprint, the RunSpec, parity and gains);
  measure/, report/ (and its checks/, charts/, compare/ and pages/) and sweep/ each say in their
  __init__ what belongs there.
- The layers are core < measure < report < sweep: a module imports its own layer and those
  before it, never one after it (the entry point, __main__.py, may import anything).
- No import closes a cycle, counting the imports inside functions.
- A module imports another of the project inside a function only where that keeps torch out of
  an import that must not need it, and a comment there says so.
- No two modules are named one letter apart, and none is much over 400 lines.

ALLOWED lists the imports those rules would refuse today, each with its reason; an entry that
is no longer needed fails test_every_allowed_import_is_still_needed, so that it gets deleted.
"""

import ast
from itertools import combinations
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "speed_ladder"
MODULES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)
LAYERS = ("core", "measure", "report", "sweep")

# (importer, imported) pairs the rules below would refuse
ALLOWED: set[tuple[str, str]] = set()


def dotted(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {dotted(p) for p in MODULES}


def _module(name: str) -> str:
    """The module an imported name lives in: `speed_ladder.report.by_hand` for both
    `speed_ladder.report.by_hand` and `speed_ladder.report.by_hand.records`."""
    while name not in NAMES:
        name = name.rsplit(".", 1)[0]
    return name


def _comment_above(lines: list[str], lineno: int) -> str:
    """The comment on an import's line and on the comment lines right above it."""
    out = [lines[lineno - 1].partition("#")[2]]
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.append(lines[i].strip())
        i -= 1
    return " ".join(out)


def imports(path: Path) -> list[tuple[str, bool, str]]:
    """(module, inside a function, the comment there) for every speed_ladder module a file
    imports, at its top or inside a function; `from package import module` is that module."""
    here = dotted(path)
    pkg = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    text = path.read_text()
    lines, out = text.splitlines(), []

    def visit(node, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = pkg.split(".")[: len(pkg.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in child.names]
            for name in names:
                if name.split(".")[0] == "speed_ladder" and _module(name) != here:
                    out.append((_module(name), inner, _comment_above(lines, child.lineno)))
            visit(child, inner)

    visit(ast.parse(text), False)
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


IMPORTS = [(dotted(p), m, local, note) for p in MODULES for m, local, note in imports(p)]
EDGES = {(a, m) for a, m, _, _ in IMPORTS}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: dotted(p))
def test_imports_follow_the_layers(path):
    me = dotted(path)
    if path.name == "__main__.py":
        return  # the entry point may import anything
    up = sorted(
        m
        for (a, m) in EDGES
        if a == me and LAYERS.index(layer(m)) > LAYERS.index(layer(me)) and (a, m) not in ALLOWED
    )
    assert not up, f"{me} ({layer(me)}) imports {up}, of a later layer"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: dotted(p))
def test_imports_inside_functions_only_keep_torch_out(path):
    me = dotted(path)
    bad = sorted(
        m
        for a, m, local, note in IMPORTS
        if a == me and local and "torch" not in note and (a, m) not in ALLOWED
    )
    assert not bad, (
        f"{me} imports {bad} inside a function: import it at the top, or say in a comment "
        "there that importing it inside keeps torch out"
    )


def cycles(edges) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_closes_a_cycle():
    """Every import counts, the ones inside functions too."""
    assert not cycles(e for e in EDGES if e not in ALLOWED)


def test_the_cycle_finder_finds_cycles():
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert cycles([("a", "b"), ("b", "c")]) == []


def test_every_allowed_import_is_still_needed():
    stale = sorted(e for e in ALLOWED if e not in EDGES)
    assert not stale, f"no longer imported: delete these from ALLOWED: {stale}"


def test_every_folder_says_what_belongs_there():
    folders = sorted(p.parent for p in MODULES if p.name == "__init__.py" and p.parent != PKG)
    assert {f.relative_to(PKG).as_posix() for f in folders} >= {
        "measure", "sweep", "report", "report/checks", "report/charts", "report/compare",
        "report/pages",
    }  # fmt: skip
    for folder in folders:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc) > 40, folder


def one_apart(a: str, b: str) -> bool:
    """Edit distance of at most one."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) <= 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def test_no_two_modules_are_named_one_letter_apart():
    names = sorted({p.stem for p in MODULES if not p.stem.startswith("__")})
    close = [(a, b) for a, b in combinations(names, 2) if one_apart(a, b)]
    assert not close, close


def test_no_module_is_much_over_400_lines():
    long = {dotted(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > 420}
    assert not long, long
