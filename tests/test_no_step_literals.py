"""No code outside the registry (speed_ladder/ladder.py, speed_ladder/data/ladder.json) knows
what a rung is by its number or by grepping its source.

An AST scan of the package, tools/, plot_results.py and the tests. In production code it flags:
a two-digit string constant that is not a docstring (`step >= "10"`, `{"11": ...}`, a default
`step="14"`); `int(...)`/`float(...)` of a step number; a file name's `[:2]` (a number read off a
file name); a regex or an `in` test looking for what a step's source does (a source grep: its
`init_process_group(`, its `torch.compile(`; reading a step's docstring for the ladder page is
its prose, not a fact about the rung). In tests,
where equality with a named rung picks data (a fixture record, a rung with a physical fact),
only an ordering against a step number (`s >= "08"`: a rung fact written as a range), the
`int()` and the `[:2]` are flagged. The step files, the fixtures and this file are not scanned.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM = re.compile(r"^\d{2}$")
# the registry: its loader, and its behaviour in Python (which check each rung asks)
SKIP = {"speed_ladder/ladder.py", "speed_ladder/measure/rung_checks.py",
        "tests/test_no_step_literals.py"}  # fmt: skip
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_GREP = re.compile(r"init_process_group|\bcompile\s*\\?\(|torch\\?\.compile")


def _files(root: Path) -> list[tuple[Path, bool]]:
    """(file, is it a test) for every scanned file under root."""
    prod = [*sorted((root / "speed_ladder").rglob("*.py")), *sorted((root / "tools").glob("*.py"))]
    prod += [root / "plot_results.py"] if (root / "plot_results.py").is_file() else []
    tests = sorted((root / "tests").glob("*.py"))
    out = [(f, False) for f in prod] + [(f, True) for f in tests]
    return [(f, t) for f, t in out if f.relative_to(root).as_posix() not in SKIP]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _is_num(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and NUM.match(node.value)


def _greps(node) -> bool:
    """A regex call, or an `in` test, whose pattern looks for what a step's source does."""
    pats = []
    if isinstance(node, ast.Call) and node.args and re.match(r"re\.\w+$", ast.unparse(node.func)):
        pats = [node.args[0]]
    elif isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops):
        pats = [node.left]
    return any(isinstance(p, ast.Constant) and isinstance(p.value, str) and _GREP.search(p.value)
               for p in pats)  # fmt: skip


def scan_source(text: str, name: str = "<src>", test: bool = False) -> list[str]:
    """`name:line: what` for each rung fact written as a number or a source grep."""
    tree = ast.parse(text)
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if not test and _is_num(node) and id(node) not in docs:
            hits.append(f"{name}:{line}: step number {node.value!r}")
        if test and isinstance(node, ast.Compare) and any(isinstance(o, _ORDER) for o in node.ops):
            if any(_is_num(x) for x in [node.left, *node.comparators]):
                hits.append(f"{name}:{line}: a step range: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("int", "float") and node.args:
                arg = ast.unparse(node.args[0])
                if re.search(r"\bnum\b|\bstep\b|\.num\b|step\[", arg):
                    hits.append(f"{name}:{line}: a step number as a number: {ast.unparse(node)}")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            s = node.slice
            if s.lower is None and s.step is None and isinstance(s.upper, ast.Constant):
                if s.upper.value == 2 and re.search(r"name|stem|script|path|basename|step",
                                                    ast.unparse(node.value)):  # fmt: skip
                    hits.append(f"{name}:{line}: a number off a file name: {ast.unparse(node)}")
        if not test and _greps(node):
            hits.append(f"{name}:{line}: a source grep: {ast.unparse(node)[:80]}")
    return hits


def scan(root: Path = ROOT) -> list[str]:
    hits = []
    for f, test in _files(root):
        rel = f.relative_to(root).as_posix()
        hits += scan_source(f.read_text(encoding="utf-8"), rel, test)
    return hits


def test_the_scan_flags_each_pattern():
    prod = '''"""A docstring naming step "05" is fine."""
def f(step="14"):
    """So is "10" here."""
    a = step >= "10"
    b = {"11": "x"}
    c = int(step.num) + int(path.name[:2])
    d = re.compile(r"^[^#]*init_process_group\\s*\\(")
    e = "torch.compile(" in s.path.read_text()
    ok = "step 12: Liger" + f"{m:02d}" + "torch.compile failed"
'''
    hits = scan_source(prod)
    assert [h.split(": ", 1)[1].split(":")[0] for h in hits].count("step number '14'") == 1
    assert any("'10'" in h for h in hits) and any("'11'" in h for h in hits)
    assert any("as a number" in h for h in hits) and any("off a file name" in h for h in hits)
    assert sum("source grep" in h for h in hits) == 2
    assert not any("'05'" in h or "Liger" in h for h in hits)
    tests = 'COMPILED = [s for s in STEPS if s >= "08"]\nA = r["step"] == "00"\nB = n[:2]\n'
    hits = scan_source(tests, test=True)
    assert len(hits) == 1 and "a step range" in hits[0]


def test_no_rung_fact_outside_the_registry():
    hits = scan()
    assert not hits, "rung facts outside speed_ladder/data/ladder.json:\n" + "\n".join(hits)
