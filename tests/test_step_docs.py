"""What a learner reads: a step file shows its one idea.

A step file's docstring is a few lines (what the step changes, why it should help, what it
costs, where the idea comes from), its first line naming the rung it builds on, with no measured
figure, date or path outside the repository; the explanation at length is the step's section of
docs/steps.md. The diffs beside the ladder (steps/diffs/NN.diff, each against the rung the step
builds on) change few lines, so that a learner sees code, not one docstring swapped for the
next. LADDER.md gives each step's `code --diff BASE FILE`, the code lines of that diff, its
section of docs/steps.md and its measured effect on every results tag. Files only: nothing
trains here."""

import ast
import re

import pytest
from conftest import ROOT

from speed_ladder.ladder import BASELINE, DIFFS, rung, rungs, skips
from speed_ladder.report.pages import ladder_page, tag_page
from speed_ladder.report.pages.ladder_table import STEPS_DOC, diff_command
from speed_ladder.report.summary import find_tags, read_summary

SCRIPTS = [r.rel for r in rungs()] + [r.summary_file for r in rungs() if r.summary_file]
MAX_DOC_LINES = 16  # the run commands included
MAX_FILE_LINES = 450
MAX_CHANGED = 700  # over all the step diffs
MAX_WORDS = 120  # of a section's "why it helps" or "what it costs"


def _rung(script: str):
    return next(r for r in rungs() if script in (r.rel, r.summary_file))


def _docstring(script: str) -> tuple[str, int]:
    """The module docstring's source text and its number of lines."""
    text = (ROOT / script).read_text(encoding="utf-8")
    node = ast.parse(text).body[0]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant), script
    lines = text.splitlines()[node.lineno - 1 : node.end_lineno]
    return "\n".join(lines), len(lines)


def changed_lines(diff: str) -> int:
    """Lines a unified diff changes: starting with + or -, no file header, not blank."""
    return sum(1 for ln in diff.splitlines()
               if ln[:1] in "+-" and ln[:3] not in ("+++", "---") and ln[1:].strip())  # fmt: skip


def test_the_diffs_beside_the_ladder_change_few_lines():
    diffs = sorted((ROOT / DIFFS).glob("*.diff"))
    assert [p.stem for p in diffs] == [r.num for r in rungs() if r.after is not None]
    per = {p.stem: changed_lines(p.read_text(encoding="utf-8")) for p in diffs}
    assert sum(per.values()) < MAX_CHANGED, per
    assert changed_lines("--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n+\n \n") == 2


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_docstring_says_the_step_in_a_few_lines(script):
    """The first line names the step and the rung it builds on; then what changes, why, at what
    cost, from where, and the one pointer to the rest; no figure a table holds, no date."""
    doc, n = _docstring(script)
    assert n <= MAX_DOC_LINES, f"{script}: a docstring of {n} lines"
    r = _rung(script)
    first = f'"""Step {r.num}: ' if r.after is None else f'"""Step {r.num} (after step {r.after}): '
    assert doc.startswith(first + r.title + "."), doc.splitlines()[0]
    heads = ["What:"] if r.num == BASELINE else ["Change:", "Why:", "Cost:"]
    for head in [*heads, "Source:", "More: docs/steps.md"]:
        assert f"\n{head}" in doc, f"{script}: no {head!r} line"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|tok/s|ms a step|results/", doc), script


def test_step_files_stay_short():
    long = {
        s: n for s in SCRIPTS if (n := len((ROOT / s).read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, long


PATHLIKE = re.compile(r"(?<![\w<>/.])((?:\.\.?/|/|~/)?[\w.-]+(?:/[\w.<>*-]+)+)")


def outside_paths(text: str) -> list[str]:
    """Paths in `text` that lie outside the repository: `../x`, `/abs/x`, `~/x`, or a file
    path (with a suffix) that is no file of this checkout."""
    out = []
    for m in PATHLIKE.finditer(text):
        p = m.group(1).rstrip(".,;:)")
        if "<" in p or "*" in p or "://" in text[max(0, m.start() - 8) : m.end()]:
            continue  # a template (`results/<tag>/`), a URL
        if p.startswith(("../", "/", "~/")) or (re.search(r"\.[a-z]+$", p) and
                                                  not (ROOT / p).exists()):  # fmt: skip
            out.append(p)
    return out


def test_no_step_file_names_a_path_outside_the_repository():
    found = {s: outside_paths((ROOT / s).read_text(encoding="utf-8")) for s in SCRIPTS}
    assert not {s: p for s, p in found.items() if p}, found
    text = "see ../shared/runs and /tmp/x/y, ops/fused.py; docs/steps.md, results/<tag>/a.csv"
    assert outside_paths(text) == ["../shared/runs", "/tmp/x/y", "ops/fused.py"]


def _labelled(text: str, label: str) -> str:
    """The paragraph of a docs/steps.md section that starts with `label`."""
    para = next((p for p in text.split("\n\n") if p.startswith(label)), "")
    return " ".join(para.removeprefix(label).split())


def test_docs_steps_md_has_every_step_at_length():
    texts = ladder_page.explanations(ROOT)
    assert list(texts) == [r.num for r in rungs()]
    heads = re.findall(r"^## (.+)$", (ROOT / STEPS_DOC).read_text(encoding="utf-8"), re.M)
    assert heads == [f"{r.num} · {r.title}" for r in rungs()]
    for r in rungs():
        text = texts[r.num]
        labels = ["**What it is.**"] if r.num == BASELINE else ["**Why it helps.**",
                                                                "**What it costs.**"]  # fmt: skip
        for label in [*labels, "**Sources.**"]:
            words = len(_labelled(text, label).split())
            assert 0 < words <= MAX_WORDS, f"step {r.num}: {label} of {words} words"
        assert not re.search(r"tok/s|\d\.\d\dx|\b20\d\d-\d\d-\d\d\b", text), r.num  # no figures
        assert "\n## " not in text and "\n# " not in text


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r"^## ", page, flags=re.M)[1:]
    return {p.split(" ", 1)[0]: p for p in parts}


def _check_page(page: str):
    sections = _sections(page)
    assert list(sections) == [r.num for r in rungs()]
    for r in rungs():
        sec = sections[r.num]
        assert len(sec.splitlines()) <= 45, (r.num, len(sec.splitlines()))  # a step in a minute
        if r.after is not None:
            assert diff_command(r, rung(r.after)) in sec, r.num
            assert f"[diff against step {r.after}]({DIFFS.as_posix()}/{r.num}.diff)" in sec
            for key in ("- **Change.**", "- **Why.**", "- **Cost.**", "- **Source.**", "```diff"):
                assert key in sec, (r.num, key)
            block = sec.split("```diff")[1].split("```")[0]
            assert f"Step {r.num}" not in block and "More: " not in block, r.num  # no docstring
            assert all(any(a in ln for ln in block.splitlines()) for a in r.api), r.num
        assert sec.count("*Published, not measured here*") <= 1, r.num  # Raschka's figure once
        assert f"[{STEPS_DOC}]({STEPS_DOC}#" in sec, r.num
    assert "is_causal=True" in sections["07"]
    assert "checkpoint(block, x, use_reentrant=False)" in sections["13"]
    assert "torch.compile(model)" in sections["08"]
    assert "DDP(model" in sections["11"] and "weights.step(optimizer, scaler)" in sections["15"]
    # the lines that do the work: the process group, the fp32 masters, the micro-batch loop
    assert "dist.init_process_group(" in sections["11"]
    assert "self.master = [nn.Parameter(" in sections["15"]
    assert "in enumerate(micro):" in sections["18"] and ".backward()" in sections["18"]
    assert "run.inactive(" not in page and 'STEP = "' not in page
    # a rung that skips the file before it says why (the registry's after_why), here and in
    # README's ladder table
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for r, skip in zip(rungs(), skips(list(rungs())), strict=True):
        if skip:
            where = f"after step {r.after}* (not the file before it: {r.after_why})"
            assert r.after_why and where in sections[r.num], r.num
            assert f"{r.num} builds on {r.after}: {r.after_why}" in readme, r.num
    assert "18's memory trade" in sections["19"]
    # every tag's measured rows: each step a tag ran has its row in the step's section, marked
    # where it ran an earlier version of its file
    for tag in find_tags(ROOT / "results"):
        rows = read_summary(tag).to_dict("records")
        earlier = tag_page.earlier_version(tag, rows)
        for row in rows:
            if (row.get("status") or "not run") != "not run":
                mark = " †" if row["step"] in earlier else ""
                assert f"| `{tag.name}`{mark} |" in sections[row["step"]], (tag.name, row["step"])


def test_the_ladder_page_shows_each_steps_diff_change_text_and_effect(tmp_path):
    """As generated from this checkout, and as committed (plot_results.py writes it)."""
    page = ladder_page.page_markdown(find_tags(ROOT / "results"), ROOT)
    _check_page(page)
    assert "[`nvidia-h200-x1`](results/nvidia-h200-x1/time_breakdown.png)" in page
    _check_page((ROOT / "LADDER.md").read_text(encoding="utf-8"))


def test_the_ladder_page_reads_a_ladder_without_docs_steps_md(tmp_path):
    assert ladder_page.explanations(tmp_path) == {}
    fixture = ROOT / "tests" / "fixtures" / "ladder_ok"
    page = ladder_page.page_markdown([], tmp_path, root=fixture)
    assert "Not written yet in docs/steps.md." in page
