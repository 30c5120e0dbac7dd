"""A new rung is its step file plus one entry in speed_ladder/data/ladder.json.

In a copy of the repository, a dummy rung after the last (the last step with one harmless line)
and its entry, and no other edit: the tools and the harness must take it as they take the
others. tools/ladder.py writes its golden diff and README's row and `check` passes; then the
registry, the parity rule, the memory model, a summary and `python -m speed_ladder check` of a
results tag that measured it, the charts, the README's results table and the scan for rung facts
outside the registry all run with it. No step trains: the tag's records are the committed records
of steps 00 and 01, the latter relabelled as the dummy (as tests/test_check.py builds its tags).
The dummy's number follows the last rung, so a real new rung needs no edit here."""

import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT

from speed_ladder import ladder

KEEP_RESULTS = ("results/reference/", "results/cpu-amd-epyc-2c-x1/")  # the record templates
TEMPLATES = "results/cpu-amd-epyc-2c-x1/runs.jsonl"
# The dummy follows whatever rung is last, so that adding a real rung needs no edit here.
LAST = ladder.rungs()[-1]
NEW = ladder.next_num()
ENTRY = {
    "num": NEW,
    "file": f"steps/{NEW}_dummy.py",
    "summary": f"a dummy rung: step {LAST.num} and one harmless line",
    "changes": {},
    "parity": {
        "cpu": {"rule": "exact", "why": f"a copy of step {LAST.num}: the same floats"},
        "cuda": {"why": f"a copy of step {LAST.num}", "holds": {
            "tiny": {"steps": 4, "atol": 1e-4, "source": "tests/test_add_rung.py, a dummy"}}},
    },
}  # fmt: skip

# Run in the copy: everything a rung must pass, beyond the golden diff and `check`.
CHECKS = r"""
import hashlib, json, subprocess, sys
from pathlib import Path

sys.path.insert(0, "tests")
from speed_ladder import ladder, parity
from speed_ladder.files import ROOT
from speed_ladder.measure import memory_model as mm
from speed_ladder.presets import PRESETS

new, last = ladder.rung("NEW"), ladder.rung("LAST")
assert (new.memory, new.distributed, new.compiled) == (last.memory, last.distributed, last.compiled)
assert new.title == "a dummy rung", new.title

# parity: its own rule, against the last step
assert parity.rule("NEW", "fp32", "fp32")["rule"] == "exact"
assert parity.rule("NEW", None, None, "cuda", "tiny")["atol"] == 1e-4
assert "no CUDA tolerance" in parity.uncovered("NEW", "cuda", "gpt2-124m", 4)

# memory model: the dummy keeps the last step's terms, and its tables have a row for it
p = PRESETS["gpt2-124m"]
assert mm.predict_run(p, "NEW", 4, 32, True, "cuda").total_bytes == \
    mm.predict_run(p, "LAST", 4, 32, True, "cuda").total_bytes
assert "step NEW x4" in mm.breakdown_table(["LAST", "NEW"])
from speed_ladder.measure import fit
assert fit.room("NEW") is None and "| all of them together |" in fit.fit_table()
assert mm.predict("gpt2-124m").line() == mm.predict("gpt2-124m", step="NEW").line()

# a results tag that measured it: summary and check
from speed_ladder.report.checks import check
from speed_ladder.report.pages import tag_page
from speed_ladder.report.summary import rebuild, write_summary, read_summary
head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                      check=True).stdout.strip()
sha = {s: hashlib.sha256(Path(s).read_bytes()).hexdigest()
       for s in ("00_orig.py", "steps/NEW_dummy.py")}
recs = []
for line in Path("TEMPLATES").read_text().splitlines():
    r = json.loads(line)
    if r["step"] not in ("00", "01"):
        continue
    if r["step"] == "01":
        r["step"], r["script"] = "NEW", "steps/NEW_dummy.py"
        r["sweep"]["prev_step"] = "LAST"
    r["git_sha"] = head
    r["script_sha256"] = r["sweep"]["script_sha256"] = sha[r["script"]]
    r["sweep"].pop("command")
    recs.append(r)
tag = ROOT / "measured" / "cpu-amd-epyc-2c-x1"  # the records' machine's tag name
tag.mkdir(parents=True)
(tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
write_summary(tag, rebuild(tag, ladder.expected_steps(ladder.discover(ROOT), tag.name))[0])
row = {r["step"]: r for r in read_summary(tag).to_dict("records")}["NEW"]
assert row["title"] == "a dummy rung" and row["status"] == "ok", row
lines = []
assert check.check([str(tag)], say=lines.append) == 0, lines

# charts and the tag's table
from speed_ladder.report.charts import bar_charts
written = bar_charts.plot_tag(tag)
assert len(written) >= 3 and all(p.stat().st_size for p in written), written
assert "| NEW | a dummy rung |" in tag_page.tag_markdown(tag, ROOT)

# no rung fact outside the registry, in the copy either
from test_no_step_literals import scan
assert scan(ROOT) == [], scan(ROOT)
print("rung NEW ok")
"""


def _copy(dst):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for f in files:
        if not f or (f.startswith("results/") and not f.startswith(KEEP_RESULTS)):
            continue
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)


def _run(args, cwd, env):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_new_rung_is_its_file_and_one_entry(tmp_path):
    repo = tmp_path / "repo"
    _copy(repo)
    # the rung: the last step, its title and number, one harmless line
    src = (repo / LAST.rel).read_text()
    lines = src.splitlines(keepends=True)
    lines[0] = f'"""Step {NEW} (after step {LAST.num}): a dummy rung.\n'
    text = "".join(lines).replace(f'STEP = "{LAST.num}"', f'STEP = "{NEW}"', 1)
    text = text.replace(
        f'STEP = "{NEW}"\n', f'STEP = "{NEW}"\nDUMMY = True  # step {NEW}: a harmless line\n'
    )
    assert text.count("DUMMY = True") == 1
    (repo / ENTRY["file"]).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(repo), MPLBACKEND="Agg", GIT_CONFIG_GLOBAL=os.devnull)
    tools = [sys.executable, "tools/ladder.py"]
    res = _run([*tools, "check"], repo, env)  # the file without its entry: one error line
    assert res.returncode != 0 and res.stderr.startswith(f"error: {ENTRY['file']} has no entry")
    assert len(res.stderr.splitlines()) == 1, res.stderr
    # its one entry
    reg_path = repo / "speed_ladder" / "data" / "ladder.json"
    reg = json.loads(reg_path.read_text())
    reg["rungs"].append(ENTRY)
    reg_path.write_text(json.dumps(reg, indent=1) + "\n")

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "copy"]):
        assert _run(args, repo, env).returncode == 0
    res = _run([*tools, "check"], repo, env)
    assert res.returncode == 1 and f"{NEW}_dummy.py (no golden diff)" in res.stdout  # none yet
    res = _run([*tools, "goldens"], repo, env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = _run([*tools, "check"], repo, env)
    assert res.returncode == 0, res.stdout + res.stderr
    diff = (repo / ladder.DIFFS / f"{NEW}.diff").read_text()
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert len(changed) == 5, diff  # the title, STEP, and the harmless line
    for n in range(1, int(NEW)):
        name = f"{ladder.DIFFS.as_posix()}/{n:02d}.diff"
        assert (repo / name).read_bytes() == (ROOT / name).read_bytes(), name
    readme = (repo / "README.md").read_text()
    row = f"| {NEW} | {LAST.num} | {ENTRY['summary']} | `code --diff {LAST.rel} {ENTRY['file']}` |"
    assert row in readme
    # commit the goldens and the README row, as the author would
    for args in (["git", "add", "-A"], [*git, "commit", "-qm", f"rung {NEW}"]):
        assert _run(args, repo, env).returncode == 0
    script = tmp_path / "checks.py"
    script.write_text(
        CHECKS.replace("TEMPLATES", TEMPLATES).replace("NEW", NEW).replace("LAST", LAST.num)
    )
    res = _run([sys.executable, str(script)], repo, env)
    assert res.returncode == 0 and f"rung {NEW} ok" in res.stdout, res.stdout[-3000:] + res.stderr
