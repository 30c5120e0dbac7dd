"""`check` on copies of the committed H200 tag: the real tag is clean; one record edited so that
it cannot be right, or does not belong to its tag, is one line naming it, and the
summary rebuilt from the records (as `plot_results.py --rebuild`) never shows its step as ok."""

import json
import shutil

import pytest
from conftest import ROOT

from speed_ladder import ladder
from speed_ladder.report import by_hand
from speed_ladder.report.checks import check
from speed_ladder.report.summary import read_summary, rebuild, write_summary

TAG = ROOT / "results" / "nvidia-h200-x1"


def _copy(tmp_path, edit=None):
    tag = tmp_path / TAG.name
    shutil.copytree(TAG, tag, ignore=shutil.ignore_patterns("*.png"))
    recs = [json.loads(x) for x in (tag / "runs.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in recs}
    if edit:
        edit(by_step)
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps = ladder.expected_steps(ladder.discover(ROOT), tag.name)
    write_summary(tag, rebuild(tag, steps)[0])
    return tag


def _check(tag):
    lines = []
    rc = check.check([str(tag)], say=lines.append)
    return rc, [x for x in lines[:-1] if not x.startswith("note:")], lines


def test_the_committed_tag_is_clean_and_its_runs_by_hand_are_no_rows(tmp_path):
    rc, problems, lines = _check(TAG)
    assert (rc, problems) == (0, []), lines
    assert any("git_sha corrected by hand" in x and "was ffc5486c" in x for x in lines)
    assert any("by-hand/step11-1proc.jsonl: run by hand, not a sweep run" in x for x in lines)
    rows = {r["step"]: r for r in read_summary(TAG).to_dict("records")}
    assert rows["11"]["status"] == rows["14"]["status"] == "not run"
    assert {r["step"] for r in by_hand.records(TAG)} == {"11", "14"}
    said = by_hand.line(TAG)
    assert "step 11 398.5K tok/s (1 process, 40 steps)" in said
    assert "step 14 266.1K tok/s (1 process, 40 steps)" in said
    page = (TAG / "README.md").read_text()  # the tag's page
    assert said in page and "| 11 |" not in page


def _tenfold(s):
    r = s["10"]
    r["tokens_per_sec"] *= 10
    r["mfu"] *= 10
    r["step_time_ms"] /= 10


def _set(step, **fields):
    def edit(s):
        s[step].update(fields)

    return edit


def _nan_losses(s):
    s["07"]["losses"] = [float("nan")] * len(s["07"]["losses"])


def _short_losses(s):
    s["06"]["losses"] = s["06"]["losses"][:40]


def _big_memory(s):
    s["05"]["peak_mem_reserved_bytes"] = 200 * 2**30
    s["05"]["peak_mem_reserved_per_rank"] = [200 * 2**30]


CASES = {
    "MFU above the datasheet peak": ("10", _tenfold,
                                     "MFU 354% of the NVIDIA H200's datasheet peak"),
    "NaN losses": ("07", _nan_losses, "63 of its 63 losses are not finite numbers"),
    "another GPU's name": ("08", _set("08", device_name="NVIDIA H100 80GB HBM3"),
                           "device_name 'NVIDIA H100 80GB HBM3' is not its machine's"),
    "memory above the GPU's": ("05", _big_memory, "peak memory 200.0 GiB above the device's 139.8"),
    "tokens not batch x context": ("03", _set("03", batch_size=16),
                                   "tokens_per_step 8192 is not batch x context x processes"),
    "tok/s not tokens over time": ("04", _set("04", tokens_per_sec=90000.0),
                                   "tokens_per_sec 90000 is not tokens_per_step / step time"),
    "a missing field": ("02", _set("02", step_time_ms=None), "step_time_ms is missing"),
    "a negative loss": ("01", _set("01", val_loss=-1.0), "val_loss -1.0 is not a finite"),
    "a loss count": ("06", _short_losses, "40 losses for 60 steps (+ 3 profiled)"),
    "a script that is not the step": ("09", _set("09", script="steps/09_mine.py"),
                                      "script 'steps/09_mine.py' is not step 09's file"),
    "another preset": ("12", _set("12", preset="gpt2-medium"),
                       "preset 'gpt2-medium' is not its sweep's 'gpt2-124m'"),
    "two processes in an x1 tag": ("13", _set("13", world_size=2),
                                   "world_size 2 in a tag of 1 process(es)"),
    "another torch": ("00", _set("00", torch_version="2.13.0"),
                      "torch 2.13.0 is not its machine's"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_an_impossible_or_foreign_record(tmp_path, case):
    step, edit, said = CASES[case]
    tag = _copy(tmp_path, edit)
    rc, problems, lines = _check(tag)
    assert rc == 1, lines
    named = [p for p in problems if f"step {step} round 1 run " in p and said in p]
    assert named, problems
    row = next(r for r in read_summary(tag).to_dict("records") if r["step"] == step)
    assert row["status"] == "invalid" and row["reason"].startswith("invalid record: "), row


def _uncorrected(s):
    for r in s.values():
        r["git_sha"] = r.pop("corrections")[0]["was"]


def _incoherent(s):
    s["05"]["corrections"][0]["now"] = "0" * 40


def test_the_foreign_sha_uncorrected_and_a_correction_that_does_not_hold(tmp_path):
    rc, problems, _ = _check(_copy(tmp_path / "a", _uncorrected))
    assert rc == 1 and len(problems) == 13, problems
    assert all("git_sha ffc5486c is not this project's commit" in p for p in problems)
    rc, problems, _ = _check(_copy(tmp_path / "b", _incoherent))
    assert rc == 1 and len(problems) == 1, problems
    assert (
        "step 05 round 1 run " in problems[0] and "a correction says git_sha is now" in problems[0]
    )
