"""plot_results.py (speed_ladder.report.pages.redraw): headless charts from a summary.csv, the
README table, completeness."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from speed_ladder.ladder import descendants, discover, expected_steps, rungs
from speed_ladder.report.charts.bar_charts import CHARTS, plot_tag
from speed_ladder.report.compare.reference import read_reference
from speed_ladder.report.pages.readme import update_readme
from speed_ladder.report.pages.redraw import TAG_CHARTS
from speed_ladder.report.pages.tag_page import tag_markdown
from speed_ladder.report.summary import SUMMARY, find_tags, read_summary
from speed_ladder.store import load_runs

FIXTURE_TAG = Path(__file__).resolve().parent / "fixtures" / "summary" / "cpu-fixture"
PNG = b"\x89PNG\r\n\x1a\n"
LADDER = [s.num for s in discover(ROOT)]


@pytest.fixture
def tags(tmp_path):
    """Two tag folders (the fixture summary, and a copy with other numbers) under results/."""
    results = tmp_path / "results"
    a = results / "cpu-fixture"
    shutil.copytree(FIXTURE_TAG, a)
    b = results / "gpu-fixture-x1"
    b.mkdir()
    text = (a / "summary.csv").read_text().replace("Fixture CPU", "Fixture GPU")
    (b / "summary.csv").write_text(text.replace("1000.0,990.0,1010.0", "9000.0,9000.0,9000.0"))
    return [a, b]


README = """# Title

Intro text.

<!-- results:begin -->
old table
<!-- results:end -->

Outro text.
"""


# plot_results.py run as a user runs it (`python plot_results.py ARGS`, its --help first) where
# torch is not installed: test_cli_renders_headless_without_torch_and_regenerates_readme
NO_TORCH = """
import sys

class NoTorch:  # `import torch` (or a torch submodule) raises, as where torch is not installed
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")

sys.meta_path.insert(0, NoTorch())
sys.path.insert(0, sys.argv[1])
import runpy

for argv in (["--help"], sys.argv[2:]):
    sys.argv = ["plot_results.py", *argv]
    try:
        runpy.run_path(sys.path[0] + "/plot_results.py", run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), e.code
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print("drawn without torch")
"""


def test_cli_renders_headless_without_torch_and_regenerates_readme(tags, tmp_path):
    """plot_results.py with no display and no MPLBACKEND: every tag's charts, the comparison,
    the README's tables between its markers and nothing else of it; and all of it with torch
    blocked (NO_TORCH), as where torch is not installed: one run of the script checks both."""
    readme = tmp_path / "README.md"
    readme.write_text(README)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND")}
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(ROOT), *map(str, tags), "--readme", str(readme)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for tag in tags:
        for png in TAG_CHARTS:
            assert (tag / png).read_bytes()[:8] == PNG
    assert (tmp_path / "results" / "comparison.png").read_bytes()[:8] == PNG
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# Title\n\nIntro text.\n\n")
    assert text.endswith("<!-- results:end -->\n\nOutro text.\n")
    assert "(results/cpu-fixture/README.md)" in text and "results/comparison.png" in text
    assert "(results/gpu-fixture-x1/README.md)" in text  # each tag's page, linked
    for tag in tags:  # the page: the tag's table and its charts
        page = (tag / "README.md").read_text()
        assert page.startswith(f"# `{tag.name}`: ") and "| step | title | tok/s |" in page
        assert "![MFU](mfu.png)" in page and "](../../README.md)" not in page  # not in the repo
    # plot_results.py (--help, and the charts, README and ladder page from runs.jsonl-less
    # summaries) imported nothing of torch: the report is drawn where torch is not installed
    assert "drawn without torch" in proc.stdout and "usage: plot_results.py" in proc.stdout


def test_missing_tag_folder_is_an_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "plot_results.py"), str(tmp_path), "--no-readme"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")


def test_failed_steps_are_labels_not_bars(tags, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    written = plot_tag(tags[0])
    assert [p.name for p in written] == list(CHARTS)
    assert plt.get_backend().lower() == "agg"
    tps, mem, mfu = figures
    try:
        ours = tps.axes[0]
        widths = sorted(round(p.get_width()) for p in ours.patches)
        assert widths == [1000, 1200, 3100]  # a bar for each ok step, none for the others
        texts = [t.get_text() for t in ours.texts]
        assert "failed (oom)" in texts and "failed (error)" in texts and "not run" in texts
        assert any(t.startswith("3.10x") for t in texts)  # speedup label
        assert any(t.startswith("1.20x") for t in texts)
        # the reference: its own panel, labelled as published figures, not ours
        ref_ax = tps.axes[1]
        assert "not our measurement" in ref_ax.get_title()
        assert "REFERENCE" in ref_ax.get_title() and "MEASURED" in ours.get_title()
        assert [round(p.get_width()) for p in ref_ax.patches][:2] == [12525, 12526]
        assert all(p.get_hatch() == "//" for p in ref_ax.patches)
        assert "not our measurement" in ref_ax.get_legend().get_texts()[0].get_text()
        assert len(mem.axes) == 2 and "not our measurement" in mem.axes[1].get_title()
        mem_widths = sorted(round(p.get_width(), 2) for p in mem.axes[0].patches)
        assert mem_widths == [0.31, 0.58, 0.6]
        assert sorted(round(p.get_width(), 1) for p in mfu.axes[0].patches) == [12.0, 14.4, 37.2]
    finally:
        monkeypatch.undo()  # the real plt.close again (it would append to `figures`)
        for f in list(figures):
            plt.close(f)


def test_a_tags_table_notes_and_charts(tags, tmp_path):
    """tag_page.tag_markdown: the table (steps not run left out, and named), notes and charts of
    a tag, its links relative to the page; README's results link each tag's page in one line."""
    block = tag_markdown(tags[0], tmp_path)
    assert "#### `cpu-fixture`: Fixture CPU, preset tiny, torch 2.13.0+cpu" in block
    assert (
        "| step | title | tok/s | vs previous step | speedup | peak reserved GiB | MFU | val loss "
        "| loss parity | status |" in block
    )
    # a summary without gain or parity columns: those cells are empty, the others filled
    assert "| 00 | the baseline | 1,000 | – | 1.00x | 0.60 | 12.0% | 10.957 | – | ok |" in block
    assert "*loss parity*" not in block  # no summary here says: no note
    bf16 = "| 05 | bfloat16 mixed precision (autocast) | 3,100 | – | 3.10x | 0.31 | 37.2% |"
    assert bf16 in block
    oom = "| 02 | tensor cores (TF32) for fp32 matmuls | – | – | – | – | – | – | – | oom: CUDA out"
    assert oom in block
    assert (
        "| 03 | a title \\| with a pipe | – | – | – | – | – | – | – | error: RuntimeError: boom |"
        in block
    )
    assert "![each step's own gain](results/cpu-fixture/gain_vs_prev.png)" in block
    assert "Each row: the median of 3 rounds" in block
    assert "| 04 |" not in block and "Not run in this tag: step 04." in block
    assert "![tok/s](results/cpu-fixture/tokens_per_sec.png)" in block
    assert "![peak memory](results/cpu-fixture/peak_memory.png)" in block
    assert "![MFU](results/cpu-fixture/mfu.png)" in block
    assert "![MFU](mfu.png)" in tag_markdown(tags[0], tags[0])  # the page's own links

    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert update_readme(readme, tags[:1])
    text = readme.read_text()
    block = text.split("<!-- results:begin -->")[1].split("<!-- results:end -->")[0]
    line = "- [`cpu-fixture`](results/cpu-fixture/README.md): Fixture CPU, preset tiny, best "
    assert line + "3,100 tok/s (step 05)" in block
    assert "No GPU ladder in results/ yet" in block and "not our measurement" in block
    assert text.count("<!-- results:begin -->") == 1 and text.endswith("Outro text.\n")
    again = readme.read_text()
    assert update_readme(readme, tags[:1]) and readme.read_text() == again


def test_readme_without_markers_is_left_alone(tags, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# No markers here\n")
    assert not update_readme(readme, tags)
    assert readme.read_text() == "# No markers here\n"
    assert "warning:" in capsys.readouterr().err


def check_complete(tag_dir: Path, steps: list[str] | None = None) -> list[str]:
    """What a tag lacks: a summary row (with a result, ok or failed) per ladder step, and the
    four charts. An empty list means complete (test_committed_results_are_complete)."""
    tag_dir = Path(tag_dir)
    if steps is None:
        steps = [s.num for s in expected_steps(discover(ROOT), tag_dir.name)]
    problems = []
    if not (tag_dir / SUMMARY).is_file():
        return [f"{tag_dir}: no {SUMMARY}"]
    df = read_summary(tag_dir)
    status = dict(zip(df["step"], df["status"], strict=True))
    for s in steps:
        if s not in status:
            problems.append(f"{tag_dir.name}: step {s} has no row in {SUMMARY}")
        elif status[s] in (None, "not run"):
            problems.append(f"{tag_dir.name}: step {s} was not run")
    for png in TAG_CHARTS:
        if not (tag_dir / png).is_file():
            problems.append(f"{tag_dir.name}: {png} is missing")
    return problems


def test_check_complete(tags):
    tag = tags[0]
    steps = ["00", "01", "02", "03", "05"]
    missing_charts = check_complete(tag, steps)
    assert len(missing_charts) == 4 and all("missing" in p for p in missing_charts)
    for png in TAG_CHARTS:
        (tag / png).write_bytes(PNG)
    assert check_complete(tag, steps) == []  # failed steps are results too
    problems = check_complete(tag, [*steps, "04", "13"])
    assert problems == [
        "cpu-fixture: step 04 was not run",
        "cpu-fixture: step 13 has no row in summary.csv",
    ]
    assert LADDER[:2] == ["00", "01"]


def test_multi_process_tags_expect_the_distributed_steps_only(tmp_path):
    held = lambda tag: [s.num for s in expected_steps(discover(ROOT), tag)]
    distributed = [r.num for r in rungs() if r.distributed]
    # 11 (DDP) and every rung built on it set up a process group
    assert held("cpu-2c-x2") == distributed == ["11", *(r.num for r in descendants("11"))]
    assert held("cpu-2c-x1") == held("nvidia-h200-x1") == held("cpu-2c") == LADDER


def test_reference_csv_is_the_published_table():
    ref = read_reference()
    assert list(ref.columns) == [
        "step",
        "optimization",
        "tokens_per_sec",
        "reserved_memory_gb",
        "metric",
        "hardware",
        "source",
        "rungs",
        "like",
    ]
    assert list(ref["step"]) == [f"{n:02d}" for n in range(12)]
    # like with like: his 05 casts the whole model to bf16 (our 15), his 07 bundles our 07 and
    # 19 (fused QKV); every other step is ours of its number, and each says why where it differs
    moved = {r["step"]: r["rungs"] for r in ref.to_dict("records") if r["rungs"] != r["step"]}
    assert moved == {"05": "15", "07": "07 19"}
    assert all(ref[ref["step"].isin([*moved, "10"])]["like"].str.len() > 0)
    assert list(ref["tokens_per_sec"]) == [
        12525, 12526, 27648, 28399, 28402, 45486, 55256, 91901, 112046, 127345, 142156, 419259,
    ]  # fmt: skip
    assert list(ref["reserved_memory_gb"])[:6] == [
        26.2617,
        26.2422,
        26.2422,
        26.2422,
        26.2422,
        13.7871,
    ]
    assert list(ref["metric"]).index("step tok/s") == 8
    assert ref["hardware"].iloc[11].startswith("4x A100")
    assert set(ref["source"]) == {
        "rasbt/LLMs-from-scratch ch05/10_llm-training-speed README "
        "(published figures, not measured by this project)"
    }


# committed tags measured in part, and the steps they lack before their last measured rung: the
# H200's sweep ran neither 11 nor 14 (their runs by hand are in by-hand/, never rows); the f23
# CPU swept 15 and 16, then 10, 12, 15 and 16 (3 rounds each)
PARTIAL = {"nvidia-h200-x1": ["11", "14"],
           "cpu-amd-epyc-f23-m1-2c-x1": [f"{n:02d}" for n in (*range(10), 11, 13, 14)]}  # fmt: skip


def newer(tag) -> list[str]:
    """The rungs after the last one `tag` measured: not run there (added since its runs, or the
    end of the ladder its sweep did not reach)."""
    measured = {r["step"] for r in load_runs(tag)}
    nums = [r.num for r in rungs()]
    return nums[max(nums.index(n) for n in measured) + 1 :]


@pytest.mark.parametrize("tag", find_tags(ROOT / "results"), ids=lambda p: p.name)
def test_committed_results_are_complete(tag):
    """Every ladder step has a result row and every chart exists, for each committed tag (a
    partial one lacks exactly the steps PARTIAL names and the rungs newer than its runs, and its
    page says so)."""
    lacks = sorted({*PARTIAL.get(tag.name, []), *newer(tag)})
    assert check_complete(tag) == [f"{tag.name}: step {s} was not run" for s in lacks]
    if lacks:
        page = (tag / "README.md").read_text()
        s = "s" if len(lacks) > 1 else ""
        assert f"Not run in this tag: step{s} {', '.join(lacks)}." in page


def test_the_ladder_page_gives_change_why_cost_and_effect(tags, tmp_path):
    from speed_ladder.ladder import discover
    from speed_ladder.report.pages import ladder_page

    by = {s.num: s for s in discover(ROOT)}
    assert ladder_page.change(by["02"], by["01"])[1].startswith(
        '+    torch.set_float32_matmul_precision("high")'
    )
    texts = ladder_page.explanations(ROOT)  # docs/steps.md, a section per step
    assert texts["02"].startswith("**Why it helps.** `torch.set_float32_matmul_precision")
    fields = ladder_page.docstring_fields(by["02"].path)
    assert fields["Change"].startswith("torch.set_float32_matmul_precision") or fields["Change"]
    assert set(fields) == {"Change", "Why", "Cost", "Source"}
    # an inactive, busy step with an interval, in a copy of the fixture tag
    import pandas as pd

    df = pd.read_csv(tags[0] / "summary.csv", dtype={"step": str})
    extra = {"gain_vs_prev": 1.2, "gain_vs_prev_lo": 1.1, "gain_vs_prev_hi": 1.3,
             "verdict": "faster", "step_active": False, "inactive_reason": "CUDA only",
             "busy_runs": 1, "other_load_max": 1.5, "parity": "off",
             "parity_detail": "max |loss difference| 3.00e-03 > 0.002 (bf16)"}  # fmt: skip
    for k, v in extra.items():
        df[k] = None
        df.loc[df["step"] == "01", k] = v
    df.to_csv(tags[0] / "summary.csv", index=False)
    text = ladder_page.page_markdown(tags, tmp_path)
    assert text.count("\n## ") == len(LADDER)
    sec01 = text.split("## 01 ")[1].split("\n## ")[0]
    assert "- **Change.**" in sec01 and "- **Why.**" in sec01 and "```diff" in sec01
    assert "`code --diff 00_orig.py steps/01_dynamic_causal_mask.py`" in sec01
    page = f"{tags[0].relative_to(tmp_path).as_posix()}/README.md"
    assert "| `cpu-fixture` | 1,000 → 1,200 | 1.20x [1.10-1.30] (inactive here) |" in sec01
    assert f"| [**off**]({page}) | [inactive here]({page}) |" in sec01  # the detail: its page
    assert "| loss parity | status |" in sec01
    assert "*Published, not measured here* (Raschka's step 01, 1x A100" in sec01
    assert sec01.count("*Published, not measured here*") == 1
    assert "Not measured yet in any results tag." in text.split("## 14 ")[1]
    path = ladder_page.write_page(tmp_path / "LADDER.md", tags)
    assert path.read_text() == text


def test_a_gpu_tag_sets_the_published_a100_figures_beside_its_steps(tmp_path):
    """A GPU tag's table (its records ran on CUDA) has a column with the published A100
    figure of each step and that step's gain over the published step before it, labelled as
    Raschka's figures under the table; LADDER.md says the same per GPU tag. CPU tags: none."""
    from speed_ladder.report.compare.reference import published
    from speed_ladder.report.pages import ladder_page, tag_page

    pub = {r["step"]: r["tokens_per_sec"] for r in read_reference().to_dict("records")}
    cpu, gpu = ROOT / "results" / "cpu-amd-epyc-2c-x1", ROOT / "results" / "nvidia-h200-x1"
    cpu_part, gpu_part = (tag_page.tag_markdown(t, tmp_path) for t in (cpu, gpu))

    def row(part, step):
        return next(ln for ln in part.splitlines() if ln.startswith(f"| {step} |")).split(" | ")

    column = "| vs previous step | published A100 tok/s (its gain) | speedup |"
    assert column in gpu_part and "published A100" not in cpu_part
    assert row(gpu_part, "10")[4] == f"{pub['10']:,.0f} ({pub['10'] / pub['09']:.2f}x)"
    assert row(gpu_part, "10")[4] == "142,156 (1.12x)"  # the csv as committed
    assert row(gpu_part, "08")[4] == "112,046"  # avg tok/s before, step tok/s from 08: no ratio
    assert row(gpu_part, "00")[4] == "12,525" and row(gpu_part, "12")[4] == "–"
    assert row(gpu_part, "05")[4] == "–"  # his 05 is our 15 (not run there), not our autocast
    assert row(gpu_part, "07")[4] == f"his 07 (our 07 + 19): {pub['07']:,.0f} (1.66x)"
    assert published(read_reference(), "15", 1) == (pub["05"], pub["05"] / pub["04"])
    assert published(read_reference(), "19", 1) is None  # bundled: beside 07 only
    assert len(row(cpu_part, "10")) == len(tag_page.HEADER[0].split(" | "))  # no column
    note = next(ln for ln in gpu_part.splitlines() if ln.startswith("*published A100 tok/s"))
    assert "Raschka's **published** figures" in note and "not measured here" in note
    assert "PyTorch 2.6" in note and "average tok/s" in note and "step 08 shows no gain" in note
    # step 11 ran on 4x A100: beside a 4-process tag only
    assert published(read_reference(), "11", 1) is None
    assert published(read_reference(), "11", 4) == (pub["11"], pub["11"] / pub["10"])

    page = ladder_page.page_markdown([cpu, gpu], tmp_path)
    sec10 = page.split("## 10 ")[1].split("\n## ")[0]
    pub10 = "*Published, not measured here* (Raschka's step 10, 1x A100 (PyTorch 2.6)): 142,156"
    assert pub10 in sec10 and "his step's gain 1.12x" in sec10 and sec10.count("Published") == 1
    sections = {n: page.split(f"## {n} ")[1].split("\n## ")[0] for n in ("05", "15", "19")}
    assert "Published" not in sections["05"] and "in step 15's section" in sections["05"]
    assert "(Raschka's step 05, 1x A100" in sections["15"]
    assert "*Raschka's step 07* bundles this rung with step 07" in sections["19"]
    # the GPU tag's row: tok/s and peak GiB before (step 09) -> after, as the published ladder
    row = next(ln for ln in sec10.splitlines() if ln.startswith("| `nvidia-h200-x1`"))
    assert "254,598 → 409,840" in row


def _drawn_texts(fig):
    """Every text the figure draws: titles, axis labels, the tick labels in view, the labels on
    the axes, the legends' texts and the figure's own."""
    from matplotlib.text import Text

    texts = list(fig.texts)
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        texts += [t for t in ax.texts if isinstance(t, Text)]
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lo, hi), max(lo, hi)
            texts += [t.label1 for t in axis.get_major_ticks() if lo <= t.get_loc() <= hi]
        if ax.get_legend() is not None:
            texts += ax.get_legend().get_texts()
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _whole_words_of(label: str, sources) -> bool:
    """Whether `label` (wrapped lines, maybe ending in " …") is one of `sources` or the first
    whole words of one."""
    kept = _flat(label).removesuffix(" …")
    return any(s == kept or s.startswith(kept + " ") for s in map(_flat, sources))


def test_no_label_leaves_the_figure_or_is_cut_mid_word(tags, monkeypatch):
    """Every chart, drawn from the committed CPU results (long inactive reasons, a time
    breakdown, a 2-process tag) and the fixture (failed steps): each text lies inside the
    figure, and a shortened one ends at a word ("words …"), never mid-word."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from speed_ladder.report.pages.redraw import draw_charts

    results = tags[0].parent
    for name in ("cpu-amd-epyc-2c-x1", "cpu-amd-epyc-2c-x2"):
        (results / name).mkdir()
        shutil.copy(ROOT / "results" / name / "summary.csv", results / name / "summary.csv")
    drawn = [results / "cpu-amd-epyc-2c-x1", tags[0]]
    sources = []  # what the labels were made from: step titles, inactive reasons, reference
    for t in [*drawn, results / "cpu-amd-epyc-2c-x2", tags[1]]:
        for r in pd.read_csv(t / "summary.csv", dtype={"step": str}).to_dict("records"):
            sources.append(f"{r['step']}  {r['title']}")
            if isinstance(r.get("inactive_reason"), str):
                sources.append(f"inactive here: {r['inactive_reason']}")
    for r in read_reference().to_dict("records"):
        sources.append(f"{r['step']}  {r['optimization']} ({r['hardware'].split(' (')[0]})")

    x1 = pd.read_csv(drawn[0] / "summary.csv", dtype={"step": str}).to_dict("records")
    notes = [f"inactive here: {r['inactive_reason']}" for r in x1 if r["step_active"] is False]
    assert len(notes) >= 5
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    written = draw_charts(drawn, all_tags=[*drawn, results / "cpu-amd-epyc-2c-x2", tags[1]])
    monkeypatch.undo()
    assert len(figures) == len(written) >= 10  # 5 + 4 charts and the comparison
    try:
        for path, fig in zip(written, figures, strict=True):
            fig.draw_without_rendering()  # the layout as drawn, no pixels
            renderer = fig.canvas.get_renderer()
            box = fig.bbox
            texts = _drawn_texts(fig)
            assert len(texts) > 20, path
            for t in texts:
                e = t.get_window_extent(renderer)
                inside = (e.x0 >= box.x0 - 0.5 and e.x1 <= box.x1 + 0.5
                          and e.y0 >= box.y0 - 0.5 and e.y1 <= box.y1 + 0.5)  # fmt: skip
                assert inside, f"{path.name}: {t.get_text()!r} leaves the figure"
                text = t.get_text()
                assert "…" not in text.replace(" …", ""), f"{path.name}: {text!r} cut mid-word"
            if path.name == "comparison.png" or path == drawn[0] / "tokens_per_sec.png":
                shown = " ".join(" ".join(t.get_text().split()) for t in texts)
                for note in notes:  # wrapped, never cut
                    assert note in shown, f"{path.name}: {note!r} is not shown whole"
            for ax in fig.axes:
                right = ax.get_window_extent(renderer).x1  # a label after a bar ends in its axes
                for t in ax.texts:  # (chart_style.fit_right widens the range to hold it)
                    e = t.get_window_extent(renderer)
                    assert e.x1 <= right + 0.5, f"{path.name}: {t.get_text()!r} leaves its axes"
                # the step labels: a title's first whole words
                for label in ax.get_yticklabels():
                    if label.get_text() and label.get_text()[:2].isdigit():
                        assert _whole_words_of(label.get_text(), sources), label.get_text()
                for t in ax.texts:  # an inactive step's reason: its first whole words
                    for line in [t.get_text().split("\n", 1)[-1]]:
                        if line.startswith("inactive here: "):
                            assert _whole_words_of(line, sources), line
    finally:
        for f in figures:
            plt.close(f)


def test_the_comparison_is_each_tags_speedup_over_its_own_step_00(tags, monkeypatch):
    """comparison.png: per step, each tag's tok/s over its own step 00 (an N-process tag's over
    its 1-process tag's), beside the reference's single-GPU speedups; a step without a
    measurement is a label at 1x, never a bar."""
    import matplotlib.pyplot as plt

    from speed_ladder.report.charts.comparison_chart import plot_comparison
    from speed_ladder.report.compare.reference import REF_LABEL

    x2 = tags[0].parent / "cpu-fixture-x2"  # the distributed steps only: no step 00 of its own
    x2.mkdir()
    lines = (tags[0] / "summary.csv").read_text().splitlines()
    (x2 / "summary.csv").write_text("\n".join([lines[0], lines[2].replace("01,", "11,", 1)]))
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    path = plot_comparison([*tags, x2])
    monkeypatch.undo()
    try:
        assert path.name == "comparison.png" and path.read_bytes()[:8] == PNG
        (ax,) = figures[0].axes
        assert ax.get_xscale() == "log"
        ends = [round(p.get_x() + p.get_width(), 4) for p in ax.patches]  # bars start at 1x
        assert all(p.get_x() == 1.0 for p in ax.patches)
        ref = read_reference()
        one_gpu = dict(zip(ref["step"], ref["tokens_per_sec"], strict=True))
        one_gpu.pop("11")  # 4x A100; his 05 sits beside our 15, last on the axis
        reference = [round(one_gpu[s] / 12525, 4) for s in sorted(one_gpu, key=lambda s: s == "05")]
        assert len(reference) == 11 and round(419259 / 12525, 4) not in ends  # no 4x A100 row
        assert ends == [1.0, 1.2, 3.1,  # cpu-fixture over its step 00 (1000 tok/s)
                        1.0, round(1200 / 9000, 4), round(3100 / 9000, 4),  # gpu-fixture's 9000
                        1.2,  # cpu-fixture-x2's step 11 over cpu-fixture's step 00
                        *reference]  # fmt: skip
        texts = [t.get_text() for t in ax.texts]
        for label in ("failed (oom)", "failed (error)", "not run"):
            assert texts.count(label) == 2  # one per 1-process tag, at 1x
        assert "3.10x" in texts and "0.34x" in texts and "11.3x" in texts
        assert "3.63x (his 05)" in texts  # beside our 15, the rung that does what his 05 did
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "cpu-fixture-x2 (this project; over cpu-fixture's step 00)" in legend
        assert f"{REF_LABEL} (1x A100)" in legend
    finally:
        for f in figures:
            plt.close(f)
