"""The ladder page (`LADDER.md`, written by plot_results.py beside the README): for every step, the
change (the lines its golden diff adds with a `# step NN` tag), why it helps (its docstring's
first paragraph after the title), what it costs (a docstring paragraph starting `Costs:`, else
one starting `The cost`), and its measured effect on every results tag (its gain over the
previous step with the interval and verdict, the same for peak memory, its loss parity with the
previous step: summary `parity`, ok with the largest difference and its bound, **off** with the
detail, n/c where the rule does not hold on that preset; "inactive here" with the reason), then
the published reference figure, in its own labelled line, and for each GPU tag (its records
ran on CUDA) a line setting that figure and its step's gain in the published ladder beside the
tag's own gain (reference.published). Generated from the step files (each diffed against the rung
it builds on, its `after`: the one before unless the registry names another, as
tests/golden/NN.diff holds it in a checkout; the section says "after step NN" where that is not
the file before) and results/<tag>/summary.csv; edits are overwritten."""

import ast
import os
from pathlib import Path

from speed_ladder.errors import UserError, warn
from speed_ladder.files import ROOT, atomic_write_bytes
from speed_ladder.ladder import BASELINE, Step, discover, skips, tag_processes, unified
from speed_ladder.report.reference import is_gpu_tag, metric_switch, published, read_reference
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
GOLDEN = ROOT / "tests" / "golden"  # linked from the page where the checkout has it
MAX_LINES = 10
MEASUREMENT = "docs/measurement.md"  # how the numbers are taken, linked from the page's head


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def paragraphs(step: Step) -> list[str]:
    """The step's docstring in paragraphs (lines joined), the title line first."""
    try:
        doc = ast.get_docstring(ast.parse(step.path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, ValueError):
        return []
    return [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]


def why(paras: list[str]) -> str | None:
    """The first paragraph after the title that is not the `Run ...` usage block."""
    for p in paras[1:]:
        if not p.startswith(("Run ", "Run(", "Costs:")):
            return p
    return None


def costs(paras: list[str]) -> str | None:
    """A `Costs:` paragraph; else the part of a paragraph from `The cost` on; else None."""
    for p in paras:
        if p.startswith("Costs:"):
            return p.removeprefix("Costs:").strip()
    for p in paras:
        i = p.find("The cost")
        if i >= 0:
            return p[i:]
    return None


def change(step: Step, prev: Step | None) -> list[str]:
    """The `+` lines step NN's diff against `prev`, the rung it builds on, adds with a
    `# step NN` tag (a tagged comment brings the lines that follow it)."""
    if prev is None:
        return []
    try:
        lines = unified(prev.path, step.path).splitlines()
    except OSError:
        return []
    tag, out, follow = f"# step {step.num}", [], 0
    for ln in lines:
        added = ln.startswith("+") and not ln.startswith("+++")
        if added and tag in ln:
            out.append(ln)
            follow = 3 if ln[1:].strip().startswith("#") else 0
        elif added and follow and ln[1:].strip():
            out.append(ln)
            follow -= 1
        else:
            follow = 0
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


def _section(step: Step, prev: Step | None, summaries, ref, base: Path, skip: bool = False):
    """A step's section; `prev` the rung it builds on, `skip` when that is not the file before
    it (the section then says "after step NN")."""
    paras = paragraphs(step)
    out = [f"## {step.num} · {step.title}", ""]
    where = f"[`{step.rel}`]({Path(os.path.relpath(step.path, base)).as_posix()})"
    diff = GOLDEN / f"{step.num}.diff"
    against = f"step {prev.num}" if skip and prev is not None else None
    if against:
        where = f"*after {against}* (not the file before it) · {where}"
    if diff.is_file():
        link = os.path.relpath(diff, base)
        where += f" · [diff against {against or 'the previous step'}]({link})"
    out += [where, ""]
    lines = change(step, prev)
    if lines:
        more = len(lines) - MAX_LINES
        out += [f"**The change** (lines tagged `# step {step.num}`):", "", "```diff",
                *lines[:MAX_LINES], *([f"  ... {more} more in the diff"] if more > 0 else []),
                "```", ""]  # fmt: skip
    head = "**What it is.**" if step.num == BASELINE else "**Why it helps.**"
    out += [f"{head} {why(paras) or 'Not stated in the step docstring.'}", ""]
    cost = costs(paras)
    if cost or step.num != BASELINE:
        out += [f"**What it costs.** {cost or 'Not stated in the step docstring yet.'}", ""]
    out += ["**Measured effect.**", "", *_measured(step, summaries, against or "previous step"), ""]
    return out + _reference(step, ref) + _published(step, summaries, ref)


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
        "<!-- generated by plot_results.py from the step files and "
        "results/<tag>/summary.csv; edits here are overwritten -->",
        "",
        "Every step is the previous file plus one idea. For each: the lines it adds, why it "
        "should help, what it costs, and what it did on each machine measured here: its gain "
        "over the previous step (median of the per-round ratios, [min-max] over the rounds) "
        "and a verdict, *no change* when the interval holds 1.00x or the change is under the "
        "noise floor or 1%. *Inactive here* marks a step that changes nothing on that device. "
        "*Loss parity*: its per-step training losses against the previous step's (same seed, "
        "same data), under its rule (`speed_ladder/data/ladder.json`, `speed_ladder/parity.py`); "
        "*n/c*: the "
        "rule does not hold on that preset (say, dropout masks drawn otherwise). "
        f"How the numbers are taken: [docs/measurement.md]({_rel(ROOT / MEASUREMENT, base)}).",
        "",
    ]
    steps = discover(root)
    by_num = {s.num: s for s in steps}
    skipping = skips(steps)
    if any(skipping):
        out[-2] += (" A step that says *after step NN* is that step's file plus one idea, and "
                    "is measured and diffed against it.")  # fmt: skip
    for step, skip in zip(steps, skipping, strict=True):
        out += _section(step, by_num.get(step.after), summaries, ref, base, skip)
    return "\n".join(out).rstrip() + "\n"


def write_page(path: Path, tag_dirs) -> Path:
    path = Path(path)
    atomic_write_bytes(path, page_markdown(tag_dirs, path.resolve().parent).encode("utf-8"))
    return path
