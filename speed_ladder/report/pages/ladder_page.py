"""The ladder page (`LADDER.md`, written by plot_results.py beside the README): a section per step,
each a minute's read. Its file and the rung it builds on (its `after`: the file before it unless
the registry names another, and then the section says "after step NN"), with its diff
(steps/diffs/NN.diff) and the `code --diff BASE FILE` command; its change, why it helps, what it
costs and where it comes from, from the step's own docstring; the lines of its diff that show the
idea (`excerpt`: those that use the API the registry names, then those tagged `# step NN`); one
table of what it did on each results tag (tok/s and peak GiB before -> after, its gain over its
base with the interval and verdict, its loss parity, a short status linking the tag's page; a
row measured with an earlier version of its file marked †); the published reference figure once,
labelled; and its time to a target loss where a time-to-loss tag measured it. Generated from the
step files, docs/steps.md's headings and results/<tag>/; edits are overwritten."""

import ast
import difflib
import os
import re
from pathlib import Path

from speed_ladder.errors import UserError, warn
from speed_ladder.files import ROOT, atomic_write_bytes
from speed_ladder.ladder import BASELINE, DIFFS, Step, discover, skips, tag_processes
from speed_ladder.measure import fit
from speed_ladder.report import to_loss
from speed_ladder.report.charts.time_chart import TIME_CHART
from speed_ladder.report.compare.reference import (
    counterpart,
    metric_switch,
    published,
    read_reference,
    records,
    rungs_of,
)
from speed_ladder.report.pages.excerpt import FIELDS, docstring_fields, excerpt
from speed_ladder.report.pages.ladder_table import STEPS_DOC, diff_command
from speed_ladder.report.pages.tag_page import PAGE as TAG_PAGE
from speed_ladder.report.pages.tag_page import earlier_version
from speed_ladder.report.rows import (
    busy_text,
    effect_text,
    inactive,
    number,
    parity_cell,
    percent_text,
    text,
)
from speed_ladder.report.summary import read_summary

PAGE = "LADDER.md"
MEASUREMENT = "docs/measurement.md"  # how the numbers are taken, linked from the page's head
# A line of a step's diff that is the harness's plumbing, not the step's idea: a bare call of
# the run or the package (`run.set_model(...)`), or the file's own STEP number. A package call
# tagged `# step NN` is a step's idea behind one call (step 17's attention order), and stays.
_HARNESS = re.compile(r"(?:run\.[\w.]+\(|STEP\s*=|speed_ladder\.[\w.]+\((?!.*# step \d))")
_SECTION = re.compile(r"^## (\d+)\b.*$", re.M)  # a step's heading in docs/steps.md


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


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _row_of(df, num: str | None) -> dict | None:
    if num is None:
        return None
    rows = [r for r in df.to_dict("records") if r["step"] == num]
    return rows[0] if rows else None


def _before_after(before: dict | None, after: dict, key: str, fmt) -> str:
    """'37,128 -> 73,580' (the base rung's figure, then this rung's), or this one alone."""
    now = number(after.get(key)) if after.get("status") == "ok" else None
    if now is None:
        return "–"
    was = number(before.get(key)) if before and before.get("status") == "ok" else None
    return f"{fmt(was)} → {fmt(now)}" if was is not None else fmt(now)


def _linked(cell: str, word: str, page: str) -> str:
    """`cell`, linked to the tag's page where it is `word` (the detail is there)."""
    return f"[{cell}]({page})" if cell == word else cell


def _kernel_change(before: dict | None, row: dict) -> str:
    """'; attention flash -> cudnn' where the records show another SDPA kernel than the base's
    ran (the gain is then the kernel's too), else ''."""
    was, now = (text((r or {}).get("attention_kernel")) for r in (before, row))
    if not was or not now or was == now or "materialized" in (was, now):
        return ""
    return f"; attention {was} → {now}"


def _status(row: dict, page: str) -> str:
    """The verdict in a few words, the detail on the tag's page."""
    status = row.get("status") or "not run"
    if status != "ok":
        return f"[{status}]({page})"
    if inactive(row):
        return f"[inactive here]({page})"
    return f"[busy]({page})" if busy_text(row) else "ok"


def _measured(step: Step, prev: Step | None, summaries, base: Path, root: Path) -> list[str]:
    rows = []
    for tag_dir, df in summaries:
        r = _row_of(df, step.num)
        if r is None or (r.get("status") or "not run") == "not run":
            continue
        earlier = earlier_version(tag_dir, [r], root)
        mark = " †" if earlier else ""
        before = _row_of(df, prev.num if prev else None)
        gain = effect_text(r, one_round=False)
        if tag_processes(tag_dir.name) > 1 and r.get("status") == "ok":
            gain = "scaling " + percent_text(r.get("scaling_efficiency"),
                                             r.get("scaling_efficiency_lo"),
                                             r.get("scaling_efficiency_hi"))  # fmt: skip
        page = _rel(tag_dir / TAG_PAGE, base)
        cells = [f"`{tag_dir.name}`{mark}",
                 _before_after(before, r, "tokens_per_sec_median", lambda v: f"{v:,.0f}"),
                 gain,
                 _before_after(before, r, "peak_reserved_gib", lambda v: f"{v:.2f}"),
                 _linked(parity_cell(r), "**off**", page),
                 _status(r, page) + _kernel_change(before, r)]  # fmt: skip
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if not rows:
        return ["Not measured yet in any results tag.", ""]
    was = f"step {prev.num} → " if prev else ""
    head = [f"| tag | tok/s ({was}this) | vs step {prev.num if prev else '–'} | peak GiB "
            "| loss parity | status |", "|---|--:|---|--:|---|---|"]  # fmt: skip
    return [*head, *rows, ""]


def _reference(step: Step, ref) -> list[str]:
    """Raschka's published figure beside the rung that does what his step did (the first of
    the rungs his step bundles), once, labelled: not measured here; where his step of this
    number, or his step that bundles this rung, is another rung's, a line says whose."""
    r = counterpart(ref, step.num)
    if r is None or rungs_of(r)[0] != step.num:
        if r is not None:
            line = f"*Raschka's step {r['step']}* bundles this rung with step {rungs_of(r)[0]}"
        else:
            r = next((x for x in records(ref) if x["step"] == step.num), None)
            line = r and f"*Raschka's step {step.num}* {r['like']}"
        where = r and f": its published figure is in step {rungs_of(r)[0]}'s section."
        return [line + where, ""] if r else []
    base = next(x for x in records(ref) if x["step"] == BASELINE)
    speed = float(r["tokens_per_sec"]) / float(base["tokens_per_sec"])
    fig = published(ref, step.num, 4 if "4x" in str(r["hardware"]) else 1)
    gain = f", his step's gain {fig[1]:.2f}x" if fig is not None and fig[1] is not None else ""
    metric = " (step tok/s from here on)" if r["step"] == metric_switch(ref) else ""
    like = f" His step {r['step']} {r['like']}." if r.get("like") else ""
    return [
        f"*Published, not measured here* (Raschka's step {r['step']}, {r['hardware']}): "
        f"{float(r['tokens_per_sec']):,.0f} tok/s{metric}, {speed:.2f}x his step 00{gain}; "
        f"{float(r['reserved_memory_gb']):.1f} GB reserved.{like}",
        "",
    ]


def _time_to_target(step: Step, tag_dirs, base: Path) -> list[str]:
    """'Time to validation loss L (preset P, `tag`): 42.0 s of training over N tokens, its
    warm-up (compiling, where it compiles) 3.1 s apart; 1.31x as soon as step 10 (tokens
    x1.10, tok/s x1.44): sooner.' An inactive rung's verdict is `inactive here`."""
    out = []
    for t in tag_dirs:
        row = next((r for r in to_loss.read(t) if r["step"] == step.num), None)
        if row is None:
            continue
        where = f"[`{t.name}`]({_rel(t / TAG_PAGE, base)})"
        if row.get("preset"):
            where = f"preset {row['preset']}, {where}"
        head = f"*Time to validation loss {row['target']:g}* ({where})"
        if row["time_s"] is None:
            out.append(f"{head}: not reached ({row['reached']} runs).")
            continue
        line = f"{head}: {row['time_s']:.1f} s of training over {row['tokens']:,.0f} tokens"
        if row["warmup_s"] is not None:
            line += f", its warm-up (compiling, where it compiles) {row['warmup_s']:.1f} s apart"
        if row["time_speedup"] is not None:
            verdict = row["verdict"] + (", no verdict" if row.get("inactive") else "")
            line += (f"; {row['time_speedup']:.2f}x as soon as step {row['after']} (tokens "
                     f"x{row['tokens_ratio']:.2f}, tok/s x{row['tps_ratio']:.2f}): "
                     f"{verdict}")  # fmt: skip
        out.append(line + ".")
    return [*out, ""] if out else []


def _where(step: Step, prev: Step | None, base: Path, root: Path, skip: bool) -> str:
    """The section's second line: its file, and the rung it builds on with its diff and the
    command that shows it."""
    where = f"[`{step.rel}`]({_rel(step.path, base)})"
    if prev is None:
        return where + " · the first rung, which every step builds on"
    if skip:
        why = f": {step.after_why}" if step.after_why else ""
        where += f" · *after step {prev.num}* (not the file before it{why})"
    diff = Path(root) / DIFFS / f"{step.num}.diff"
    against = f"diff against step {prev.num}"
    where += f" · [{against}]({_rel(diff, base)})" if diff.is_file() else f" · {against}"
    return f"{where}: {diff_command(step, prev)}"


def _section(step: Step, prev: Step | None, summaries, ref, base: Path, skip: bool = False,
             root: Path = ROOT, tag_dirs=(), texts: dict | None = None):  # fmt: skip
    """A step's section; `prev` the rung it builds on, `skip` when that is not the file before
    it (the section then says "after step NN"): its change, why, cost and source from its
    docstring, the lines of its diff that show the idea, one table of what it did on each tag,
    the published figure once, and its time to target where a tag measured it."""
    heading = f"{step.num} · {step.title}"
    out = [f"## {heading}", "", _where(step, prev, base, root, skip), ""]
    fields = docstring_fields(step.path)
    if step.num in (texts or {}):  # its section of docs/steps.md: how it works, caveats
        steps_doc = _rel(Path(root) / STEPS_DOC, base)
        more = f"At length: [{STEPS_DOC}]({steps_doc}#{_anchor(heading)})."
    else:
        more = f"Not written yet in {STEPS_DOC}."
    keys = [k for k in FIELDS if fields.get(k)]
    for key in keys:
        text = fields[key][:1].upper() + fields[key][1:]
        out.append(f"- **{key}.** {text}" + (f" {more}" if key == keys[-1] else ""))
    out += [""] if keys else [more, ""]
    made = fit.room(step.num) if Path(root) == ROOT else None  # a memory rung's, predicted
    if made:
        (was, now), (gb, n) = made, fit.ROOM
        out += [
            f"*Room it makes* (*predicted*, `python -m speed_ladder fit`, {n} GPUs of {gb} GB, "
            f"batch {now.batch} per GPU): the largest model {was.model} → {now.model}, the "
            f"largest batch of gpt2-124m {was.batches['gpt2-124m']} → "
            f"{now.batches['gpt2-124m']}.",
            "",
        ]
    lines = excerpt(step, change(step, prev))
    if lines:
        out += ["```diff", *lines, "```", ""]
    out += _measured(step, prev, summaries, base, root)
    return out + _reference(step, ref) + _time_to_target(step, tag_dirs, base)


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
        "section says *after step NN*. For each: what it changes, why, what it costs and where "
        "the idea comes from (its docstring; at length in "
        f"[{STEPS_DOC}]({_rel(ROOT / STEPS_DOC, base)})), the lines of its diff that show it, "
        "and what it did on each machine measured here: tok/s and peak GiB before → after, its "
        "gain over the rung it builds on (median of the per-round ratios, [min-max] over the "
        "rounds) and a verdict, *no change* when the interval holds 1.00x or the change is under "
        "the noise floor or 1%. *Inactive here*: the step changes nothing on that device. *Loss "
        "parity*: its per-step training losses and final validation loss against that rung's "
        "under its rule (ok, **off**, or n/c where the rule cannot apply); † a row measured with "
        "an earlier version of its code. "
        f"Words: [docs/glossary.md]({_rel(ROOT / 'docs/glossary.md', base)}). How the numbers are "
        "taken: "
        f"[docs/measurement.md]({_rel(ROOT / MEASUREMENT, base)}).{_breakdowns(summaries, base)}",
        "",
    ]
    steps = discover(root)
    by_num = {s.num: s for s in steps}
    skipping = skips(steps)
    texts = explanations(root)
    for step, skip in zip(steps, skipping, strict=True):
        out += _section(step, by_num.get(step.after), summaries, ref, base, skip, root,
                        tag_dirs, texts)  # fmt: skip
    return "\n".join(out).rstrip() + "\n"


def write_page(path: Path, tag_dirs) -> Path:
    path = Path(path)
    atomic_write_bytes(path, page_markdown(tag_dirs, path.resolve().parent).encode("utf-8"))
    return path
