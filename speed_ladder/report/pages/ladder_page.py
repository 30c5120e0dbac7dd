"""The ladder page (`LADDER.md`, written by plot_results.py beside the README): for every step, the
file and the rung it builds on (its `after`: the file before it unless the registry names
another, and then the section says "after step NN"), its diff (steps/diffs/NN.diff) and the
`code --diff BASE FILE` command that shows it, the change (the code lines of that diff: the
docstring's lines and the harness's calls left out), the step at length (its section of
docs/steps.md: why it helps, what it costs, how it works, its sources), and its measured effect
on every results tag (its gain over the rung it builds on with the interval and verdict, the
same for peak memory, its loss parity with that rung: summary `parity`, ok with the largest
difference and its bound, **off** with the detail, n/c where the rule does not hold on that
preset; "inactive here" with the reason), then the published reference figure, in its own
labelled line, and for each GPU tag (its records ran on CUDA) a line setting that figure and its
step's gain in the published ladder beside the tag's own gain (reference.published). Generated
from the step files, docs/steps.md and results/<tag>/summary.csv; edits are overwritten."""

import ast
import difflib
import os
import re
from pathlib import Path

from speed_ladder.errors import UserError, warn
from speed_ladder.files import ROOT, atomic_write_bytes
from speed_ladder.ladder import BASELINE, DIFFS, Step, discover, skips, tag_processes
from speed_ladder.report.charts.time_chart import TIME_CHART
from speed_ladder.report.compare.reference import (
    is_gpu_tag,
    metric_switch,
    published,
    read_reference,
)
from speed_ladder.report.pages.ladder_table import STEPS_DOC, diff_command
from speed_ladder.report.rows import (
    busy_text,
    effect_text,
    inactive,
    number,
    parity_text,
    percent_text,
)
from speed_ladder.report.summary import read_summary

PAGE = "LADDER.md"
MAX_LINES = 40  # of a step's change; the rest is in its diff
MEASUREMENT = "docs/measurement.md"  # how the numbers are taken, linked from the page's head
# A line of a step's diff that is the harness's plumbing, not the step's idea: a bare call of
# the run or the package (`run.set_model(...)`), or the file's own STEP number. A package call
# tagged `# step NN` is a step's idea behind one call (step 17's attention order), and stays.
_HARNESS = re.compile(r"(?:run\.[\w.]+\(|STEP\s*=|speed_ladder\.[\w.]+\((?!.*# step \d))")
_SECTION = re.compile(r"^## (\d+)\b.*$", re.M)  # a step's heading in docs/steps.md
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def explanations(root: Path = ROOT) -> dict[str, str]:
    """{step: its section of docs/steps.md in `root`, less the heading}: why it helps, what it
    costs and the rest, in Markdown; {} where there is no such file."""
    try:
        text = (Path(root) / STEPS_DOC).read_text(encoding="utf-8")
    except OSError:
        return {}
    heads = list(_SECTION.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return {h.group(1): text[h.end() : e].strip() for h, e in zip(heads, ends, strict=True)}


def _relink(text: str, src: Path, base: Path) -> str:
    """`text` (Markdown written in `src`'s folder) with its relative links made relative to
    `base`, the page's folder."""

    def one(m: re.Match) -> str:
        url = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:|#", url):  # http:, mailto:, an anchor
            return m.group(0)
        path, mark, anchor = url.partition("#")
        return f"]({_rel(src.parent / path, base)}{mark}{anchor})"

    return _LINK.sub(one, text)


def _code(path: Path) -> tuple[list[str], int]:
    """The file's lines, and how many of them its module docstring takes."""
    text = path.read_text(encoding="utf-8")
    body = ast.parse(text).body
    doc = body[0] if body and isinstance(body[0], ast.Expr) else None
    is_doc = doc is not None and isinstance(doc.value, ast.Constant) and isinstance(
        doc.value.value, str)  # fmt: skip
    return text.splitlines(), doc.end_lineno if is_doc else 0


def _plain(lines: list[str]) -> list[str]:
    """A hunk's changed lines without the harness's plumbing (a call that spans lines goes
    whole, with the comment lines right before it), and blank only between code lines, once."""
    out, comments, depth = [], [], 0
    for ln in lines:
        code = ln[1:].strip()
        if depth > 0:  # the rest of a dropped call
            depth += code.count("(") - code.count(")")
            continue
        if not code:
            if out and out[-1][1:].strip() and not comments:
                out.append(ln[0])
            continue
        if _HARNESS.match(code):
            code = code.split("  #")[0]
            depth = code.count("(") - code.count(")")
            comments = [c for c in comments if c[0] != ln[0]]
            continue
        if code.startswith("#"):
            comments.append(ln)
            continue
        out += [*comments, ln]
        comments = []
    out += comments
    while out and not out[-1][1:].strip():
        out.pop()
    return out


def change(step: Step, prev: Step | None) -> list[str]:
    """The code lines of step NN's diff against `prev`, the rung it builds on: each hunk's
    `-` and `+` lines under an `@@ -old +new @@` line (line numbers in the files), without the
    docstrings' lines, blank lines and the harness's plumbing (`run.inactive(...)`, STEP)."""
    if prev is None:
        return []
    try:
        (a, doc_a), (b, doc_b) = _code(prev.path), _code(step.path)
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    matcher = difflib.SequenceMatcher(None, a[doc_a:], b[doc_b:])
    for group in matcher.get_grouped_opcodes(0):
        lines = []
        for _, i1, i2, j1, j2 in group:
            lines += [f"-{x}" for x in a[doc_a + i1 : doc_a + i2]]
            lines += [f"+{x}" for x in b[doc_b + j1 : doc_b + j2]]
        lines = _plain(lines)
        if lines:
            out += [f"@@ -{doc_a + group[0][1] + 1} +{doc_b + group[0][3] + 1} @@", *lines]
    return out


def _measured_row(tag_dir: Path, row: dict) -> str:
    ok = row.get("status") == "ok"
    tps = number(row.get("tokens_per_sec_median"))
    cells = [
        f"`{tag_dir.name}`",
        f"{tps:,.0f}" if ok and tps is not None else "–",
        effect_text(row),
        effect_text(row, "mem_vs_prev", "mem_verdict"),
        parity_text(row),
    ]
    if tag_processes(tag_dir.name) > 1 and ok:
        eff = "scaling efficiency " + percent_text(row.get("scaling_efficiency"),
                                                   row.get("scaling_efficiency_lo"),
                                                   row.get("scaling_efficiency_hi"))  # fmt: skip
        cells[2] = eff if cells[2] == "–" else f"{cells[2]}; {eff}"
    status = row.get("status") or "not run"
    if not ok and row.get("reason"):
        status += ": " + str(row["reason"])[:80]
    for mark in (inactive(row) if ok else None, busy_text(row)):
        if mark:
            status += f"; {mark}"
    cells.append(status)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _measured(step: Step, summaries: list, against: str = "previous step") -> list[str]:
    rows = []
    for tag_dir, df in summaries:
        for r in df.to_dict("records"):
            if r["step"] == step.num and (r.get("status") or "not run") != "not run":
                rows.append(_measured_row(tag_dir, r))
    if not rows:
        return ["Not measured yet in any results tag."]
    short = "previous" if against == "previous step" else against
    head = [f"| tag | tok/s | vs {against} | peak memory vs {short} | loss parity | status |",
            "|---|--:|---|---|---|---|"]  # fmt: skip
    return head + rows


def _reference(step: Step, ref) -> list[str]:
    if ref is None:
        return []
    match = ref[ref["step"] == step.num]
    if not len(match):
        return []
    r = match.iloc[0]
    base = ref[ref["step"] == BASELINE]
    speed = ""
    if len(base):
        speed = f" ({float(r['tokens_per_sec']) / float(base['tokens_per_sec'].iloc[0]):.2f}x " \
                "its step 00)"  # fmt: skip
    return [
        f"*Published reference, not measured here* (Raschka, {r['hardware']}): "
        f"{float(r['tokens_per_sec']):,.0f} tok/s{speed}, {float(r['reserved_memory_gb']):.1f} "
        f"GB reserved ({r['optimization']}).",
        "",
    ]


def _published_line(step: Step, tag_dir: Path, row: dict, ref) -> str:
    """'- `tag`: published A100: 142,156 tok/s, its step's gain 1.12x; this tag's 1.61x.'"""
    n = tag_processes(tag_dir.name)
    fig = published(ref, step.num, n)
    own = number(row.get("gain_vs_prev")) if row.get("status") == "ok" else None
    here = f"; this tag's {own:.2f}x" if own is not None else ""
    if fig is None:
        match = ref[ref["step"] == step.num]
        why = "its ladder has no such step"
        if len(match):
            why = f"its step ran on {match.iloc[0]['hardware']}, this tag on {n} process(es)"
        return f"- `{tag_dir.name}`: published A100: – ({why}){here}."
    if fig[1] is not None:
        gain = f"its step's gain {fig[1]:.2f}x"
    elif step.num == metric_switch(ref):
        gain = "its step's gain – (its metric changes here: average to step tok/s)"
    else:
        gain = "its step's gain – (its first step)"
    return f"- `{tag_dir.name}`: published A100: {fig[0]:,.0f} tok/s, {gain}{here}."


def _published(step: Step, summaries, ref) -> list[str]:
    """A line per GPU tag that measured the step: the published figure beside its own gain."""
    if ref is None:
        return []
    lines = [_published_line(step, t, r, ref) for t, df in summaries if is_gpu_tag(t)
             for r in df.to_dict("records")
             if r["step"] == step.num and (r.get("status") or "not run") != "not run"]  # fmt: skip
    if not lines:
        return []
    switch = metric_switch(ref)
    metric = f"; average tok/s before step {switch}, step tok/s from it" if switch else ""
    return [f"*Beside the published A100 ladder* (Raschka's figures, not measured here; PyTorch "
            f"2.6{metric}):", "", *lines, ""]  # fmt: skip


def _where(step: Step, prev: Step | None, base: Path, root: Path, skip: bool) -> str:
    """The section's second line: its file, and the rung it builds on with its diff and the
    command that shows it."""
    where = f"[`{step.rel}`]({_rel(step.path, base)})"
    if prev is None:
        return where + " · the first rung, which every step builds on"
    if skip:
        where += f" · *after step {prev.num}* (not the file before it)"
    diff = Path(root) / DIFFS / f"{step.num}.diff"
    against = f"diff against step {prev.num}"
    where += f" · [{against}]({_rel(diff, base)})" if diff.is_file() else f" · {against}"
    return f"{where}: {diff_command(step, prev)}"


def _section(step: Step, prev: Step | None, summaries, ref, base: Path, skip: bool = False,
             root: Path = ROOT, texts: dict | None = None):  # fmt: skip
    """A step's section; `prev` the rung it builds on, `skip` when that is not the file before
    it (the section then says "after step NN"); `texts` docs/steps.md's sections."""
    out = [f"## {step.num} · {step.title}", "", _where(step, prev, base, root, skip), ""]
    lines = change(step, prev)
    if lines:
        more = len(lines) - MAX_LINES
        rest = [f"  ... {more} more lines in the diff"] if more > 0 else []
        out += ["**The change** (its diff's code; the docstring and the harness's calls left "
                "out):", "", "```diff", *lines[:MAX_LINES], *rest, "```", ""]  # fmt: skip
    text = (texts or {}).get(step.num)
    if text:
        out += [_relink(text, Path(root) / STEPS_DOC, base), ""]
    else:
        head = "**What it is.**" if step.num == BASELINE else "**Why it helps.**"
        out += [f"{head} Not written yet in {STEPS_DOC}.", ""]
    against = f"step {prev.num}" if skip and prev is not None else None
    out += ["**Measured effect.**", "", *_measured(step, summaries, against or "previous step"), ""]
    return out + _reference(step, ref) + _published(step, summaries, ref)


def _breakdowns(summaries, base: Path) -> str:
    """' Where each step's time goes ...: [`tag`](results/tag/time_breakdown.png), ...' for
    the tags that profiled some step; '' where none did."""
    links = [f"[`{t.name}`]({_rel(t / TIME_CHART, base)})" for t, df in summaries
             if any(c.startswith("time_") and df[c].notna().any() for c in df.columns)]  # fmt: skip
    if not links:
        return ""
    return (" Where each step's time goes (matmuls, attention, normalization, loss, optimizer, "
            "communication, data and host), as profiled: " + ", ".join(links) + ".")  # fmt: skip


def page_markdown(tag_dirs, base: Path, root: Path = ROOT) -> str:
    """The whole page: a section per step of the ladder in `root`."""
    summaries = []
    for t in tag_dirs:
        try:
            summaries.append((Path(t), read_summary(t)))
        except UserError as e:
            warn(f"{e}; left out of {PAGE}")
    ref = read_reference()
    out = [
        "# The ladder, step by step",
        "",
        f"<!-- generated by plot_results.py from the step files, {STEPS_DOC} and "
        "results/<tag>/summary.csv; edits here are overwritten -->",
        "",
        "Every step is the rung it builds on plus one idea: the file before it, unless its "
        "section says *after step NN*. For each: the command that shows its diff, the code "
        "lines of that diff, why it should help, what it costs and where the idea comes from "
        f"([{STEPS_DOC}]({_rel(ROOT / STEPS_DOC, base)})), and what it did on each machine "
        "measured here: its gain over the rung it builds on (median of the per-round ratios, "
        "[min-max] over the rounds) and a verdict, *no change* when the interval holds 1.00x "
        "or the change is under the noise floor or 1%. *Inactive here* marks a step that "
        "changes nothing on that device. *Loss parity*: its per-step training losses against "
        "that rung's (same seed, same data), under its rule (`speed_ladder/data/ladder.json`, "
        "`speed_ladder/parity.py`); *n/c*: the rule does not hold on that preset (say, dropout "
        "masks drawn otherwise). How the numbers are taken: "
        f"[docs/measurement.md]({_rel(ROOT / MEASUREMENT, base)}).{_breakdowns(summaries, base)}",
        "",
    ]
    steps = discover(root)
    by_num = {s.num: s for s in steps}
    skipping = skips(steps)
    texts = explanations(root)
    for step, skip in zip(steps, skipping, strict=True):
        out += _section(step, by_num.get(step.after), summaries, ref, base, skip, root, texts)
    return "\n".join(out).rstrip() + "\n"


def write_page(path: Path, tag_dirs) -> Path:
    path = Path(path)
    atomic_write_bytes(path, page_markdown(tag_dirs, path.resolve().parent).encode("utf-8"))
    return path
