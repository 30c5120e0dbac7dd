"""What a step's section of LADDER.md shows of its file (pages/ladder_page.py): its docstring's
What, Change, Why, Cost and Source lines (`docstring_fields`), and the lines of its diff that show
its idea (`excerpt`): those that use the API the registry names for it, then those tagged with
its number, whole statements, within a budget."""

import ast
from pathlib import Path

from speed_ladder.ladder import Step

FIELDS = ("What", "Change", "Why", "Cost", "Source")  # a step docstring's lines, in order
EXCERPT = 20  # lines of a step's change shown, its "..." included; the whole is its diff


def docstring_fields(path: Path) -> dict[str, str]:
    """{What/Change/Why/Cost/Source: its text on one line} of a step file's docstring."""
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, ValueError):
        return {}
    out, key = {}, None
    for line in doc.splitlines()[1:]:
        head = line.split(":", 1)[0]
        if head in FIELDS and ":" in line:
            key = head
            out[key] = line.split(":", 1)[1].strip()
        elif not line.strip() or head in ("More", "Run"):
            key = None
        elif key is not None:
            out[key] += " " + line.strip()
    return out


def excerpt(step: Step, lines: list[str], budget: int = EXCERPT) -> list[str]:
    """The lines of a step's change that show its idea: the hunks that use its API (the
    registry's `api`; a long one cut to the lines around each use), then those that carry its
    `step NN` tag, in file order, `...` where lines are left out, within `budget` lines."""
    hunks, cur = [], None
    for ln in lines:
        if ln.startswith("@@"):
            cur = []
            hunks.append(cur)
        elif cur is not None:
            cur.append(ln)
    names = [a.rstrip("(") for a in step.api]  # its import too
    uses = lambda ln: any(a in ln[1:].split("  #")[0] for a in names)  # noqa: E731
    tag = f"step {step.num}"
    chosen: dict[int, list[str]] = {}
    left = budget
    for want in (uses, lambda ln: tag in ln):
        for i, h in enumerate(hunks):
            if i in chosen or not any(want(ln) for ln in h):
                continue
            part = h
            if len(h) > left:  # each use's statement alone
                near = {k for j, ln in enumerate(h) if want(ln) for k in _statement(h, j)}
                part = [ln for j, ln in enumerate(h) if j in near]
            if len(part) + 1 <= left:  # with its "..." line
                chosen[i], left = part, left - len(part) - 1
    out = []
    for i in sorted(chosen):
        if out or i > 0:
            out.append("  ...")
        out += chosen[i]
    if out and max(chosen) < len(hunks) - 1:
        out.append("  ...")
    return out


def _statement(hunk: list[str], j: int) -> range:
    """The lines of the statement that diff line `j` is in: the comment lines right above it,
    back over the lines it continues (an open bracket, a trailing comma), on to where its
    brackets close, and the block it opens (a line ending in `:`); a comment line's statement
    is the one it comments."""
    code = lambda k: hunk[k][1:].split("  #")[0].rstrip()  # noqa: E731
    comment = lambda k: hunk[k][1:].lstrip().startswith("#")  # noqa: E731
    indent = lambda k: len(hunk[k][1:]) - len(hunk[k][1:].lstrip())  # noqa: E731
    while comment(j) and j + 1 < len(hunk):
        j += 1
    start = j
    while start > 0 and (code(start - 1).endswith(("(", "[", "{", ",")) or comment(start - 1)):
        start -= 1
    end, depth = j, 0
    for k in range(start, len(hunk)):
        depth += sum(code(k).count(c) for c in "([{") - sum(code(k).count(c) for c in ")]}")
        end = k
        if k >= j and depth <= 0:
            break
    if code(end).endswith(":"):  # the block it opens
        while end + 1 < len(hunk) and code(end + 1) and indent(end + 1) > indent(j):
            end += 1
    return range(start, end + 1)
