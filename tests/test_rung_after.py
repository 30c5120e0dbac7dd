"""A rung may name the rung it builds on: `after` in speed_ladder/data/ladder.json.

Without it a rung is the file before it plus one idea; with `"after": "12"` it is step 12 plus one
idea (a single-GPU speed rung that must not carry 13's checkpointing or 14's sharding), and
everything that pairs a rung with the rung before uses 12 instead: the fold of the registry's
state, the golden diff, `propagate`, the README's ladder table, LADDER.md, and a summary's effect
and loss parity. The first tests load small registries in-process (milliseconds); the last adds a
dummy rung after 12 (numbered after the last rung) to a copy of the repository, as
tests/test_add_rung.py adds one after the last, with a results tag of relabelled committed
records (no step trains)."""

import json
import os
import shutil
import sys

import pytest
from conftest import ROOT
from test_add_rung import LAST, NEW, TEMPLATES, _copy, _run

from speed_ladder import ladder
from speed_ladder.errors import UserError


def _small(tmp_path, after):
    """Rungs 00-02 of this checkout and a rung 03 that copies 01, with `after` in its entry."""
    root = tmp_path / "ladder"
    (root / "steps").mkdir(parents=True)
    for r in ladder.rungs()[:3]:
        shutil.copy(r.path, root / r.rel)
    shutil.copy(ladder.rungs()[1].path, root / "steps" / "03_x.py")
    reg = json.loads(ladder.REGISTRY.read_text())
    reg["rungs"] = reg["rungs"][:3]
    entry = {"num": "03", "file": "steps/03_x.py", "summary": "x", "changes": {},
             "parity": reg["rungs"][1]["parity"]}  # fmt: skip
    if after is not None:
        entry["after"] = after
    reg["rungs"].append(entry)
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(reg))
    return root, path


def test_a_rung_folds_its_state_from_the_rung_it_names(tmp_path):
    """02 turns TF32 on; 03 after 01 keeps 01's fp32, 03 without `after` inherits 02's TF32."""
    steps = {s.num: s for s in ladder.discover(*_small(tmp_path, "01"))}
    assert [steps[n].after for n in ("00", "01", "02", "03")] == [None, "00", "01", "01"]
    assert steps["02"].memory.precision == "tf32"
    assert steps["03"].memory == steps["01"].memory and steps["03"].memory.precision == "fp32"
    assert ladder.skips(list(steps.values())) == [False, False, False, True]
    assert [s.num for s in ladder.descendants("01", list(steps.values()))] == ["02", "03"]
    assert [s.num for s in ladder.descendants("02", list(steps.values()))] == []
    linear = {s.num: s for s in ladder.discover(*_small(tmp_path / "linear", None))}
    assert linear["03"].after == "02" and linear["03"].memory.precision == "tf32"
    assert not any(ladder.skips(list(linear.values())))


@pytest.mark.parametrize("after", ["16", "xx", "03", 1, None, ""])
def test_an_after_that_is_no_earlier_rung_is_one_error(tmp_path, after):
    root, path = _small(tmp_path, "01")
    reg = json.loads(path.read_text())
    reg["rungs"][-1]["after"] = after
    path.write_text(json.dumps(reg))
    with pytest.raises(UserError) as e:
        ladder.discover(root, path)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"rung 03: after {after!r} is not a rung before it in file order (steps 00-02)" in msg
    # the first rung builds on none
    reg["rungs"][-1]["after"] = "01"
    reg["rungs"][0]["after"] = "00"
    path.write_text(json.dumps(reg))
    with pytest.raises(UserError, match="rung 00: after '00' is not a rung before it in file "
                       r"order \(none: it is the first rung\)"):  # fmt: skip
        ladder.discover(root, path)


def test_this_checkouts_rungs_build_on_the_file_before_except_the_speed_rungs():
    """Each rung builds on the file before, but 15 (bf16 weights) on 12, not on 13 and 14, and
    19 (fused QKV) on 17, not on 18: speed rungs skip the memory trades; 21 (CPU offload) on 14,
    a memory trade on the memory trades; foreign steps keep their order."""
    nums = [r.num for r in ladder.rungs()]
    afters = {r.num: r.after for r in ladder.rungs()}
    before = {n: (nums[i - 1] if i else None) for i, n in enumerate(nums)}
    assert afters == before | {"15": "12", "19": "17", "21": "14"}
    steps = list(ladder.rungs())
    skipping = [s.num for s, skip in zip(steps, ladder.skips(steps), strict=True) if skip]
    assert skipping == ["15", "19", "21"]
    assert ladder.bases(["10", "11", "12", "13", "14", "15"]) == [
        "09",
        "10",
        "11",
        "12",
        "13",
        "12",
    ]
    assert ladder.bases(["a", "b", nums[1]]) == [None, "a", nums[0]]
    assert [s.num for s in ladder.descendants("13")] == ["14", "21"]
    assert [s.num for s in ladder.descendants("12")] == nums[nums.index("13") :]  # all after 12


ENTRY = {  # a dummy rung after the last one (NEW), built on 12
    "num": NEW,
    "file": f"steps/{NEW}_dummy.py",
    "after": "12",
    "summary": "a dummy rung: step 12 and one harmless line",
    "changes": {},
    "parity": {
        "cpu": {"rule": "exact", "why": "a copy of step 12: the same floats"},
        "cuda": {"why": "a copy of step 12", "holds": {
            "tiny": {"steps": 4, "atol": 1e-4, "source": "tests/test_rung_after.py, a dummy"}}},
    },
}  # fmt: skip

# Run in the copy: the registry, a summary of a tag that measured the dummy, LADDER.md.
CHECKS = r"""
import hashlib, json, subprocess
from pathlib import Path

from speed_ladder import ladder
from speed_ladder.files import ROOT

r12, r13, rnew = ladder.rung("12"), ladder.rung("13"), ladder.rung("NEW")
assert rnew.after == "12" and r13.after == "12", (rnew.after, r13.after)
assert (rnew.memory, rnew.distributed, rnew.compiled) == (r12.memory, r12.distributed, r12.compiled)
assert not rnew.memory.checkpointing and r13.memory.checkpointing
assert ladder.bases(["11", "12", "13", "14", "NEW"]) == ["10", "11", "12", "13", "12"]

# a results tag: the committed records, step 12's copied as NEW's (the same numbers)
from speed_ladder.report.checks import check
from speed_ladder.report.summary import read_summary, rebuild, write_summary
head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                      check=True).stdout.strip()
sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()

def relabelled(recs, step, script):
    out = []
    for r in recs:
        r = json.loads(json.dumps(r))
        r["step"], r["script"] = step, script
        r["sweep"]["run_id"] += "-" + step
        out.append(r)
    return out

recs = [json.loads(line) for line in Path("TEMPLATES").read_text().splitlines()]
recs += relabelled([r for r in recs if r["step"] == "12"], "NEW", "steps/NEW_dummy.py")
for r in recs:
    r["git_sha"] = head
    r["script_sha256"] = r["sweep"]["script_sha256"] = sha(r["script"])
    r["sweep"].pop("command", None)

def summary(name, records):
    tag = ROOT / name / "cpu-amd-epyc-2c-x1"  # the records' machine's tag name
    tag.mkdir(parents=True)
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_summary(tag, rebuild(tag, ladder.expected_steps(ladder.discover(ROOT), tag.name))[0])
    return tag, {r["step"]: r for r in read_summary(tag).to_dict("records")}

tag, rows = summary("measured", recs)
assert rows["NEW"]["status"] == "ok" and rows["NEW"]["prev_step"] == "12", rows["NEW"]
assert rows["NEW"]["gain_vs_prev"] == 1.0 and rows["NEW"]["mem_vs_prev"] == 1.0, rows["NEW"]
assert rows["NEW"]["parity"] == "ok", rows["NEW"]
detail = rows["NEW"]["parity_detail"]
assert detail.startswith("max |loss difference| 0.00e+00 exact (a copy of step 12"), detail
assert rows["14"]["gain_vs_prev"] < 0.95  # NEW's 1.0 is over 12, not over 14
assert (rows["13"]["prev_step"], rows["14"]["prev_step"]) == ("12", "13")
lines = []
assert check.check([str(tag)], say=lines.append) == 0, lines
# the tag's table names 12 in NEW's effect cell, and only there
from speed_ladder.report.pages import tag_page
table = tag_page.tag_markdown(tag, ROOT)
assert "| NEW | a dummy rung after 12 | 345 | vs 12: 1.00x [1.00-1.00] (inactive here) |" \
    in table, table
assert table.count("vs 12:") == 1, table

# without step 12's runs: no effect, and parity names 12
_, rows = summary("no12", [r for r in recs if r["step"] != "12"])
assert rows["NEW"]["status"] == "ok" and rows["NEW"]["parity"] == "not comparable", rows["NEW"]
assert rows["NEW"]["parity_detail"] == (
    "not comparable without step 12: it was not run in this tag, and a step is judged against "
    "the step it builds on (its `after`)"), rows["NEW"]["parity_detail"]
gain = rows["NEW"]["gain_vs_prev"]
assert gain != gain and not isinstance(rows["NEW"]["prev_step"], str), rows["NEW"]  # none
assert rows["13"]["parity_detail"].startswith("not comparable without step 12: it was not run "
                                              "in this tag, and a step is judged against the "
                                              "step before it")

# LADDER.md: NEW's section says after 12 and shows the line it adds to 12
from speed_ladder.report.pages import ladder_page
page = ladder_page.page_markdown([tag], ROOT)
section = page[page.index("## NEW · "):]
assert "*after step 12* (not the file before it)" in section.splitlines()[2], section[:600]
assert "[diff against step 12](steps/diffs/NEW.diff)" in section
assert "`code --diff steps/12_liger_fused_ce.py steps/NEW_dummy.py`" in section
assert "+DUMMY = True  # step NEW: a harmless line" in section
assert "| tag | tok/s (step 12 → this) | vs step 12 | peak GiB |" in section
assert "unless its section says *after step NN*" in page
section14 = page[page.index("## 14 · "):page.index("## 15 · ")]
assert "*after step" not in section14 and "[diff against step 13](steps/diffs/14.diff)" in section14
print("rung NEW after 12 ok")
"""

MARK = '    """Windows of context_length tokens; the target is the input shifted by one token."""\n'
EDIT = MARK + "    PROPAGATED = True  # a fix carried on by tools/ladder.py propagate\n"
# step 11 and every rung built on it, and the dummy
STEPS = {r.num: r.rel for r in [ladder.rung("11"), *ladder.descendants("11")]} | {
    NEW: ENTRY["file"]
}


def test_a_rung_after_12_is_paired_with_12_everywhere(tmp_path):
    repo = tmp_path / "repo"
    _copy(repo)
    src = (repo / STEPS["12"]).read_text()
    lines = src.splitlines(keepends=True)
    lines[0] = f'"""Step {NEW} (after step 12): a dummy rung after 12.\n'
    text = "".join(lines).replace('STEP = "12"', f'STEP = "{NEW}"', 1)
    text = text.replace(
        f'STEP = "{NEW}"\n', f'STEP = "{NEW}"\nDUMMY = True  # step {NEW}: a harmless line\n'
    )
    assert text.count("DUMMY = True") == 1 and text.count(MARK) == 1
    (repo / STEPS[NEW]).write_text(text)
    reg_path = repo / "speed_ladder" / "data" / "ladder.json"
    reg = json.loads(reg_path.read_text())
    reg["rungs"].append(ENTRY)
    reg_path.write_text(json.dumps(reg, indent=1) + "\n")
    env = dict(os.environ, PYTHONPATH=str(repo), MPLBACKEND="Agg", GIT_CONFIG_GLOBAL=os.devnull)
    tools = [sys.executable, "tools/ladder.py"]
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]

    def commit(msg):
        for args in (["git", "add", "-A"], [*git, "commit", "-qm", msg]):
            assert _run(args, repo, env).returncode == 0

    assert _run(["git", "init", "-q"], repo, env).returncode == 0
    commit("copy")
    res = _run([*tools, "goldens"], repo, env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = _run([*tools, "check"], repo, env)
    assert res.returncode == 0, res.stdout + res.stderr
    # the golden diff is against 12: the title, STEP and the harmless line, nothing of 13 or 14
    diff = (repo / ladder.DIFFS / f"{NEW}.diff").read_text()
    assert diff.startswith(f"--- {STEPS['12']}\n+++ {STEPS[NEW]}\n"), diff[:200]
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert len(changed) == 5, diff
    for n in range(1, int(NEW)):
        name = f"{ladder.DIFFS.as_posix()}/{n:02d}.diff"
        assert (repo / name).read_bytes() == (ROOT / name).read_bytes(), name
    readme = (repo / "README.md").read_text()
    diff_12 = f"`code --diff {STEPS['12']} {STEPS[NEW]}`"
    assert f"| {NEW} | **12** | {ENTRY['summary']} | {diff_12} |" in readme
    assert "| 14 | 13 | FSDP2" in readme  # the others unmarked
    commit(f"rung {NEW}")

    # the registry, a summary, `check` and LADDER.md, in the copy
    script = tmp_path / "checks.py"
    script.write_text(CHECKS.replace("TEMPLATES", TEMPLATES).replace("NEW", NEW))
    res = _run([sys.executable, str(script)], repo, env)
    assert res.returncode == 0 and f"rung {NEW} after 12 ok" in res.stdout, (
        res.stdout[-3000:] + res.stderr
    )

    # propagate: a change to 12 reaches every rung built on it and the dummy; one to 13, the
    # memory rungs built on it only
    def propagate(num):
        path = repo / STEPS[num]
        path.write_text(path.read_text().replace(MARK, EDIT))
        res = _run([*tools, "propagate", STEPS[num]], repo, env)
        assert res.returncode == 0, res.stdout + res.stderr
        got = {n: EDIT in (repo / f).read_text() for n, f in STEPS.items()}
        assert _run(["git", "checkout", "--", "."], repo, env).returncode == 0
        return {n for n, has in got.items() if has}

    assert propagate("12") == {"12", *(r.num for r in ladder.descendants("12")), NEW}
    assert propagate("13") == {"13", *(r.num for r in ladder.descendants("13"))} > {"13", "14"}

    # an `after` that names no earlier rung: one error line, from the tools and the harness
    for bad in (NEW, "xx"):
        reg["rungs"][-1]["after"] = bad
        reg_path.write_text(json.dumps(reg, indent=1) + "\n")
        for cmd in ([*tools, "check"], [sys.executable, "-m", "speed_ladder", "check"]):
            res = _run(cmd, repo, env)
            assert res.returncode != 0 and len(res.stderr.splitlines()) == 1, res.stderr
            assert res.stderr.startswith(f"error: speed_ladder/data/ladder.json, rung {NEW}: after "
                                         f"'{bad}' is not a rung before it in file order "
                                         f"(steps 00-{LAST.num})"), res.stderr  # fmt: skip
