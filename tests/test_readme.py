"""README.md and the tags' pages: README is short and opens on the ladder on a GPU beside the
published A100 ladder, its headline ratio computed from the records; every committed tag has its
own page, results/<tag>/README.md, exactly as plot_results.py generates it, linked from README; a
row measured with an earlier version of its step file is marked."""

import json
import re
import shutil

import pytest
from conftest import ROOT
from test_docs import relative_links

from speed_ladder.ladder import rungs
from speed_ladder.records import code_sha256, file_sha256
from speed_ladder.report.compare.reference import read_reference, single_gpu
from speed_ladder.report.pages import readme, tag_page
from speed_ladder.report.summary import find_tags, read_summary

README = ROOT / "README.md"
TAGS = find_tags(ROOT / "results")
GPU = ROOT / "results" / "nvidia-h200-x1"


def _text():
    return README.read_text(encoding="utf-8")


def _results(text: str) -> str:
    return text.split(readme.BEGIN)[1].split(readme.END)[0]


def test_the_readme_is_at_most_200_lines_and_opens_on_the_gpu_ladder():
    """Its first screen (30 lines): what the ladder is, the GPU headline beside the published
    A100 ladder (generated), the CPU-only torch hint, then the two commands."""
    text = _text()
    assert len(text.splitlines()) <= 200
    first = "\n".join(text.splitlines()[:30])
    headline = first.split(readme.HEAD_BEGIN)[1].split(readme.HEAD_END)[0]
    assert headline == "\n" + readme.headline_markdown(TAGS) + "\n"
    assert "On one **NVIDIA H200**" in headline and "Raschka's published A100 ladder" in headline
    commands = [ln for ln in first.splitlines() if ln.startswith("pip install")]
    assert commands[0].startswith("pip install -e . && python -m speed_ladder run")
    assert commands[1].startswith('pip install -e ".[test]" && python -m pytest')
    assert first.index("download.pytorch.org/whl/cpu") < first.index(commands[0])
    order = ["## Quick start", "<!-- ladder:begin", "## Results", "### On a GPU",
             "### Every results tag", "## Learn it step by step", "## How we measure"]  # fmt: skip
    at = [text.index(s) for s in order]
    assert at == sorted(at), order
    last = [r.rel for r in rungs()][-1]
    learn = text.split("## Learn it step by step")[1].split("## ")[0]
    assert f"python {last}" in learn  # every rung, up to the last


def test_the_readme_results_are_generated():
    """The block between README's markers is what plot_results.py writes from the summaries."""
    assert _results(_text()) == "\n" + readme.results_markdown(TAGS, ROOT) + "\n"


@pytest.mark.parametrize("tag", TAGS, ids=lambda p: p.name)
def test_each_tag_has_its_generated_page_linked_from_the_readme(tag):
    page = tag / tag_page.PAGE
    assert page.is_file(), f"{page} is missing: run python plot_results.py"
    assert page.read_text(encoding="utf-8") == tag_page.page_markdown(tag), "regenerate it"
    assert f"- [`{tag.name}`](results/{tag.name}/README.md): " in _results(_text())
    broken = [u for u in relative_links(page) if not (tag / u.partition("#")[0]).exists()]
    assert not broken, broken


def test_the_headline_ratio_comes_from_the_records():
    """Step 00 to the best step on the GPU, and on the published A100 ladder (one GPU)."""
    rows = [r for r in read_summary(GPU).to_dict("records") if r["status"] == "ok"]
    base = next(r["tokens_per_sec_median"] for r in rows if r["step"] == "00")
    best = max(rows, key=lambda r: r["tokens_per_sec_median"])
    ref = single_gpu(read_reference())
    a100 = dict(zip(ref["step"], ref["tokens_per_sec"], strict=True))
    top = max(a100, key=a100.get)
    text = _results(_text())
    ours = f"**{best['tokens_per_sec_median'] / base:.2f}x**"
    assert f"(step {best['step']}): {ours}" in text
    assert f"**{base / 1000:.1f}K tok/s** (step 00)" in text
    theirs = f"{a100[top] / 1000:.1f}K (step {top}): {a100[top] / a100['00']:.2f}x"
    assert theirs in text and "11.35x" in theirs  # the published csv as committed
    assert "![Speedup over step 00 per step" in text and "(results/gpu_vs_a100.png)" in text
    # his figures beside the rung that does what his step did: not his 05 beside our autocast
    rows = [ln.split(" | ") for ln in text.splitlines() if re.match(r"\| \d\d \|", ln)]
    his = {cells[0][2:]: cells[5] for cells in rows}
    assert his["05"] == "–" and his["07"] == "07 (our 07 + 19)" and his["10"] == "10"
    assert "His step 05 (our 15) casts the whole model to bf16" in text


def test_the_readme_and_pages_speak_to_users():
    """Jargon said once and explained; no maintainer notes, no issue numbers."""
    text = _text()
    assert text.lower().count("one round: no interval") == 1
    assert "**noise floor**, the largest change" in text and "**A/A control** measures" in text
    for doc in [README, *(t / tag_page.PAGE for t in TAGS)]:
        body = doc.read_text(encoding="utf-8")
        assert "Corrected by hand" not in body and not re.search(r"\bissue \d", body), doc
        assert "(one round: no interval)" not in body, doc  # in the note, not every cell
    assert "never drains the GPU" in text and "device synchronize before the clock" not in text


def test_a_row_measured_with_an_earlier_step_file_is_marked(tmp_path):
    """The mark follows the records' script_sha256 against today's file, row by row."""
    tag = tmp_path / GPU.name
    tag.mkdir()
    for name in ("summary.csv", "runs.jsonl"):
        shutil.copy(GPU / name, tag / name)
    rows = read_summary(tag).to_dict("records")
    earlier = tag_page.earlier_version(tag, rows)

    def marked(md):
        return {ln.split(" | ")[0][2:] for ln in md.splitlines() if " † |" in ln}

    md = tag_page.tag_markdown(tag, tmp_path)
    assert marked(md) == earlier and tag_page.EARLIER_NOTE in md
    recs = [json.loads(ln) for ln in (tag / "runs.jsonl").read_text().splitlines()]
    today = {r["step"]: tag_page._digests(ROOT / r["script"]) for r in rows if r["script"]}
    for r in recs:  # every record of these rows measured today's file
        r["script_sha256"] = sorted(today[r["step"]])[0]
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    md = tag_page.tag_markdown(tag, tmp_path)
    assert marked(md) == set() and tag_page.EARLIER_NOTE not in md
    recs[0]["script_sha256"] = "0" * 64  # step 00's only record: another version
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert marked(tag_page.tag_markdown(tag, tmp_path)) == {recs[0]["step"]}


def test_a_docstring_edit_keeps_a_row_current_and_a_code_edit_marks_it(tmp_path):
    """† follows the records' code_sha256 (the script less docstrings and comments); an older
    record without one, its script_sha256."""
    script = "steps/01_dynamic_causal_mask.py"
    path, tag = tmp_path / script, tmp_path / "tag"
    path.parent.mkdir()
    tag.mkdir()
    shutil.copy(ROOT / script, path)
    text = path.read_text(encoding="utf-8")
    shas = {"script_sha256": file_sha256(path), "code_sha256": code_sha256(path)}
    rec = {"step": "01", "script": script, **shas}
    rows = [{"step": "01", "script": script, "status": "ok"}]

    def stale(record: dict, now: str) -> bool:
        (tag / "runs.jsonl").write_text(json.dumps(record) + "\n")
        path.write_text(now, encoding="utf-8")
        return tag_page.earlier_version(tag, rows, tmp_path) == {"01"}

    doc_only = text.replace("a dynamic causal mask.", "a causal mask per batch.", 1) + "# a note\n"
    assert doc_only != text and not stale(rec, doc_only)
    assert stale(rec, text.replace("diagonal=1", "diagonal=2"))
    older = {k: v for k, v in rec.items() if k != "code_sha256"}
    assert not stale(older, text) and stale(older, doc_only)


def test_code_sha256_leaves_out_docstrings_comments_and_blank_lines_only(tmp_path):
    path = tmp_path / "a.py"

    def sha(text: str) -> str:
        path.write_text(text, encoding="utf-8")
        return code_sha256(path)

    code = 'x = "é"  # c\nclass A:\n    """Doc."""\n\n    def f(self):\n        """Doc."""\n'
    code += '        return f"{x!r}"  # f\n'
    edited = code.replace('"""Doc."""', '"""Other.\n\n    More."""').replace("# c", "# d")
    assert sha(code) == sha(edited) == sha(code.replace("\n", "\n\n"))
    assert sha(code) != sha(code.replace("!r", "!s")) and sha(code) != sha(code + "y = 1\n")
