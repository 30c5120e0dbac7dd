"""The package's layout: folders by concern, and the imports between them.

- speed_ladder/ holds the core (errors, files, records, the runs store, ladder discovery, step
  flags, presets, machine fingerprint, the RunSpec, parity and gains); measure/, sweep/ and
  report/ each say in their __init__ what belongs there.
- measure never imports sweep or report; report never imports sweep; the core imports neither
  (the entry point, __main__.py, may).
- No two modules are named one letter apart, and none is much over 400 lines.
"""

import ast
from itertools import combinations
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "speed_ladder"
MODULES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every speed_ladder module a file imports, at its top or inside a function."""
    here = dotted(path)
    pkg = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("speed_ladder")}


def concern(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[-1] in ("measure", "sweep", "report") else "core"


FORBIDDEN = {"measure": {"sweep", "report"}, "report": {"sweep"}, "core": {"sweep", "report"}}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: dotted(p))
def test_imports_follow_the_layers(path):
    me = concern(dotted(path))
    if path.name == "__main__.py" or me == "sweep":
        return  # the entry point and the sweep may import anything
    bad = {m for m in imports(path) if concern(m) in FORBIDDEN.get(me, set())}
    assert not bad, f"{dotted(path)} ({me}) imports {sorted(bad)}"


def test_every_folder_says_what_belongs_there():
    for folder in ("measure", "sweep", "report"):
        doc = ast.get_docstring(ast.parse((PKG / folder / "__init__.py").read_text()))
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
