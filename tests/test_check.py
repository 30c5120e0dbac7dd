"""python -m speed_ladder check: a results folder from another machine, validated. Small synthetic
tag folders in tmp_path: committed records of steps 00-01 (3 rounds, with the A/A control) as
templates, their paths stripped, their scripts pinned to HEAD, and a summary.csv written by the
harness's own summary writer; then one thing broken at a time."""

import copy
import hashlib
import json
import subprocess
import sys

import pytest
from conftest import ROOT

from speed_ladder import ladder, machine
from speed_ladder.errors import UserError
from speed_ladder.report.checks import check, record_checks, validity
from speed_ladder.report.summary import SUMMARY, rebuild, write_summary

TEMPLATES = ROOT / "results" / "cpu-amd-epyc-2c-x1" / "runs.jsonl"


def _head() -> str:
    res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("not a git checkout: the script check needs one")
    return res.stdout.strip()


@pytest.fixture(scope="module")
def records():
    """The committed records of steps 00 and 01, without paths, measuring HEAD's scripts."""
    head = _head()
    out = []
    for line in TEMPLATES.read_text().splitlines():
        r = json.loads(line)
        if r["step"] not in ("00", "01"):
            continue
        blob = subprocess.run(
            ["git", "show", f"HEAD:{r['script']}"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        r["git_sha"] = head
        r["script_sha256"] = r["sweep"]["script_sha256"] = hashlib.sha256(blob).hexdigest()
        r["sweep"].pop("command")
        out.append(r)
    assert len(out) == 9  # 3 rounds of 00, its A/A control and 01
    return out


def make_tag(tmp_path, records, edit=None, name="cpu-amd-epyc-2c-x1"):
    """A tag folder: the records (after `edit(records)`), runs.jsonl and the summary of them."""
    recs = copy.deepcopy(records)
    if edit:
        edit(recs)
    tag = tmp_path / name
    tag.mkdir()
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps = ladder.expected_steps(ladder.discover(ROOT), name)
    write_summary(tag, rebuild(tag, steps)[0])
    return tag


def run_check(*tags):
    lines = []
    rc = check.check([str(t) for t in tags], say=lines.append)
    problems = [x for x in lines[:-1] if not x.startswith("note:")]
    return rc, problems, lines


def test_a_clean_folder_passes(tmp_path, records):
    tag = make_tag(tmp_path, records)
    rc, problems, lines = run_check(tag)
    assert (rc, problems) == (0, []), lines
    assert lines[-1] == "1 tag(s) checked, 0 problem(s)"


def test_tokens_per_sec_that_disagrees_with_tokens_and_step_time(tmp_path, records):
    def edit(recs):
        recs[2]["tokens_per_sec"] = 350.0  # step 01 round 1: 512 tokens / 1.58 s is ~323

    rc, problems, _ = run_check(make_tag(tmp_path, records, edit))
    assert rc == 1
    assert len(problems) == 1, problems
    assert problems[0].startswith("cpu-amd-epyc-2c-x1: step 01 round 1 run ")
    assert "(line 3): tokens_per_sec 350 is not tokens_per_step / step time = 512 / " in problems[0]


def test_a_summary_that_disagrees_with_its_records(tmp_path, records):
    tag = make_tag(tmp_path, records)
    csv = (tag / SUMMARY).read_text().splitlines()
    i = next(i for i, x in enumerate(csv) if x.startswith("01,"))
    cells = csv[i].split(",")
    cells[2] = "999.9"  # tokens_per_sec_median
    csv[i] = ",".join(cells)
    (tag / SUMMARY).write_text("\n".join(csv) + "\n")
    rc, problems, _ = run_check(tag)
    assert rc == 1
    assert any(
        p.startswith(
            "cpu-amd-epyc-2c-x1: summary.csv step 01 disagrees with runs.jsonl: "
            "tokens_per_sec_median 999.9 (records: "
        )
        for p in problems
    ), problems


def test_the_parity_cell_is_checked_and_its_detail_is_not(tmp_path, records):
    """`parity` comes from the records (and speed_ladder/data/ladder.json): a summary that says `ok`
    where they say `off` is a problem; `parity_detail`'s words are the manifest's, not checked.
    (Step 01 is off here: step 00's round-1 run drew other dropout masks,
    speed_ladder/measure/device.py.)"""
    import pandas as pd

    tag = make_tag(tmp_path, records)
    df = pd.read_csv(tag / SUMMARY, dtype={"step": str, "prev_step": str})
    assert df.loc[df["step"] == "01", "parity"].tolist() == ["off"]
    df.loc[df["step"] == "01", "parity_detail"] = "reworded"
    df.to_csv(tag / SUMMARY, index=False)
    rc, problems, _ = run_check(tag)
    assert (rc, problems) == (0, []), problems
    df.loc[df["step"] == "01", "parity"] = "ok"
    df.to_csv(tag / SUMMARY, index=False)
    rc, problems, _ = run_check(tag)
    assert rc == 1 and problems == [
        "cpu-amd-epyc-2c-x1: summary.csv step 01 disagrees with runs.jsonl: parity 'ok' "
        "(records: 'off')"
    ]


def test_a_row_without_records_and_records_without_a_row(tmp_path, records):
    tag = make_tag(tmp_path, records)
    csv = (tag / SUMMARY).read_text().splitlines()
    csv = [x for x in csv if not x.startswith("01,")]
    csv.append(csv[1].replace("00,", "05,", 1))  # step 05: an ok row, no records
    (tag / SUMMARY).write_text("\n".join(csv) + "\n")
    _, problems, _ = run_check(tag)
    assert "cpu-amd-epyc-2c-x1: summary.csv: no row for step 01, which has records" in problems
    assert "cpu-amd-epyc-2c-x1: summary.csv step 05: a row (ok) with no records" in problems


def test_a_record_from_another_machine(tmp_path, records):
    def edit(recs):
        recs[3]["sweep"]["machine"] = dict(recs[3]["sweep"]["machine"], device_count=64)

    rc, problems, _ = run_check(make_tag(tmp_path, records, edit))
    assert rc == 1
    assert all(p.startswith("cpu-amd-epyc-2c-x1: step 00 round 2 run ") for p in problems)
    assert [p.split("(line 4): ")[1] for p in problems] == [
        "its machine is not the sweep's (machine and sweep.machine differ)",
        "its machine writes to cpu-amd-epyc-64c-x1, not cpu-amd-epyc-2c-x1",
        "another machine than the tag's 8 other records: device_count 64 vs 2",
    ]


def test_a_tag_named_for_other_hardware_is_a_problem_of_check_not_of_the_summary(tmp_path, records):
    """A folder named by --tag: its summary counts its records as they are (a sweep's folder is
    its user's), and check, publish's gate to results/, names each record's hardware tag."""
    tag = make_tag(tmp_path, records, name="mine-x1")
    rows = {r["step"]: r for r in rebuild(tag, ladder.discover(ROOT))[0].to_dict("records")}
    assert rows["00"]["status"] == rows["01"]["status"] == "ok"
    rc, problems, _ = run_check(tag)
    assert rc == 1 and len(problems) == len(records)
    assert {p.split("): ")[1] for p in problems} == {
        "its machine writes to cpu-amd-epyc-2c-x1, not mine-x1"
    }


def test_an_apple_gpus_records_belong_to_its_mps_tag(records):
    """An MPS run's fingerprint is its CPU's and its device_name the GPU's ("Apple MPS (arm64)"):
    neither is foreign, and its tag is mps-<the CPU's part>, as machine.tag_base names it."""
    rec = copy.deepcopy(records[0])
    rec.update(device="mps", device_name="Apple MPS (arm64)")
    rec["sweep"]["config"] = dict(rec["sweep"]["config"], device="mps")
    fp = rec["sweep"]["machine"]
    base = "mps-" + machine.cpu_tag_part(fp["device_name"], fp.get("cpu") or {})
    assert validity.tag_base(fp, "mps") == base
    assert validity.foreign(rec, f"{base}-x1") == validity.misnamed(rec, f"{base}-x1") == []
    assert validity.misnamed(rec, "cpu-amd-epyc-2c-x1") == [
        f"its machine writes to {base}-x1, not cpu-amd-epyc-2c-x1"
    ]


@pytest.mark.parametrize(
    ("i", "field", "value", "problem"),
    [
        (0, "other_load", 1.02, "measured on a busy machine: other processes used 1.02 CPU cores "
         "(busy above 0.1)"),  # step 00, round 1
        (2, "interpreted", True, "ran through Triton's interpreter (TRITON_INTERPRET=1): "
         "numerics only, not a measurement"),  # step 01, round 1
    ],
    ids=["a busy run", "a run through Triton's interpreter"],
)  # fmt: skip
def test_a_record_that_measured_nothing_reliable(tmp_path, records, i, field, value, problem):
    def edit(recs):
        recs[i][field] = value

    rc, problems, _ = run_check(make_tag(tmp_path, records, edit))
    assert rc == 1
    rec = records[i]
    assert problems == [
        f"cpu-amd-epyc-2c-x1: step {rec['step']} round 1 run {rec['sweep']['run_id'][:8]} "
        f"(line {i + 1}): " + problem
    ]


def test_a_busy_run_that_a_later_run_replaced_is_a_note(tmp_path, records):
    def edit(recs):
        busy = copy.deepcopy(recs[2])  # step 01, round 1, measured before the three it has
        busy["sweep"]["run_id"], busy["other_load"] = "f" * 32, 1.5
        recs.insert(0, busy)

    rc, problems, lines = run_check(make_tag(tmp_path, records, edit))
    assert (rc, problems) == (0, []), lines
    said = "note: cpu-amd-epyc-2c-x1: step 01: a run measured busy that the summary does not use"
    assert said in lines


def test_an_absolute_path_and_a_host_name_in_a_record(tmp_path, records, monkeypatch):
    monkeypatch.setattr(record_checks.socket, "gethostname", lambda: "alice-laptop")
    monkeypatch.setattr(record_checks.socket, "getfqdn", lambda: "alice-laptop.example.org")

    def edit(recs):
        recs[4]["sweep"]["command"] = ["python", "/home/alice/ladder/steps/01_x.py"]
        recs[5]["notes"] = ["measured on alice-laptop"]
        recs[6]["sweep"]["host"] = "alice-laptop"

    rc, problems, _ = run_check(make_tag(tmp_path, records, edit))
    assert rc == 1
    assert [p.split(": ", 2)[2] for p in problems] == [
        "an absolute path in sweep.command[1]: '/home/alice/ladder/steps/01_x.py'",
        "this machine's host name in notes[0]",
        "this machine's host name in sweep.host",
        "sweep.host 'alice-laptop' is not a hashed host id",
    ]
    assert [p.split(" (line ")[1][:2] for p in problems] == ["5)", "6)", "7)", "7)"]


def test_paths_are_told_from_other_slashes():
    paths = [
        "/usr/bin/python",
        "--results=/opt/x/r.jsonl",
        "C:\\Users\\me\\x",
        "~/ladder/x",
        "data/tmp/work/x",
        "a /proc/self/x note",
    ]
    for s in paths:
        assert record_checks._PATH.search(s), s
    for s in ["n/a", "tok/s", "fp32 182 GFLOP/s", "steps/05_bf16.py", "data/middlemarch.txt"]:
        assert not record_checks._PATH.search(s), s


def test_an_unparsable_line(tmp_path, records):
    tag = make_tag(tmp_path, records)
    with open(tag / "runs.jsonl", "a") as f:
        f.write('{"step": "02", "status": \n')
    rc, problems, _ = run_check(tag)
    assert rc == 1
    assert len(problems) == 1, problems
    assert problems[0].startswith("cpu-amd-epyc-2c-x1: line 10 is not a record (not JSON: ")


def test_a_gain_claim_from_one_round(tmp_path, records):
    tag = make_tag(tmp_path, records)
    import pandas as pd

    df = pd.read_csv(tag / SUMMARY, dtype={"step": str, "prev_step": str})
    df.loc[df["step"] == "01", ["runs", "verdict", "gain_vs_prev_lo"]] = [1, "faster", 1.02]
    df.to_csv(tag / SUMMARY, index=False)
    rc, problems, _ = run_check(tag)
    assert rc == 1
    assert (
        "cpu-amd-epyc-2c-x1: summary.csv step 01: verdict 'faster' rests on 1 round(s) of it "
        "and of step 00; a claim needs 2 or more"
    ) in problems
    assert any("step 01 disagrees with runs.jsonl" in p for p in problems)  # and check 4 too


def test_a_script_that_is_not_the_one_its_commit_has(tmp_path, records):
    def edit(recs):
        recs[2]["script_sha256"] = recs[2]["sweep"]["script_sha256"] = "ab" * 32
        recs[5]["git_sha"] = "0123456789abcdef" * 2 + "01234567"  # a commit not in this clone
        recs[8]["git_sha"] = recs[5]["git_sha"]
        recs[8]["script_sha256"] = recs[8]["sweep"]["script_sha256"] = "cd" * 32

    rc, problems, lines = run_check(make_tag(tmp_path, records, edit))
    assert rc == 1
    assert len(problems) == 2, problems
    assert problems[0].endswith(
        "(line 3): script_sha256 is not steps/01_dynamic_causal_mask.py "
        f"as of its git_sha {records[2]['git_sha'][:8]}"
    )
    assert problems[1].endswith(
        "(line 9): script_sha256 matches no version of "
        "steps/01_dynamic_causal_mask.py in this clone (a modified "
        "script, or a newer one: git fetch)"
    )
    assert (
        "note: cpu-amd-epyc-2c-x1: commit 01234567 is not in this clone (a local commit?): scripts "
        "checked against this clone's history instead (2 records)"
    ) in lines


def test_the_command_line(tmp_path, records):
    """One subprocess: the exit code and the lines; bad input in-process (exit 2)."""

    def edit(recs):
        recs[1]["other_load"] = 0.5  # the A/A control of round 1: the noise floor rests on it

    tag = make_tag(tmp_path, records, edit)
    res = subprocess.run(
        [sys.executable, "-m", "speed_ladder", "check", str(tag)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stderr
    out = res.stdout.splitlines()
    assert out[-1] == "1 tag(s) checked, 1 problem(s)"
    assert "A/A control" in out[0]
    assert out[0].endswith(
        "measured on a busy machine: other processes used 0.50 CPU cores (busy above 0.1)"
    )
    with pytest.raises(UserError, match="no such folder"):
        check.check([str(tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    from speed_ladder.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["check", str(tmp_path / "empty")])
    assert e.value.code == 2


def test_every_tag_but_the_reference_by_default(tmp_path, records):
    for name in ("a-x1", "reference"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "runs.jsonl").write_text("")
    (tmp_path / "b-x1").mkdir()  # no runs.jsonl: not a tag to check
    assert check.tag_dirs(tmp_path) == [tmp_path / "a-x1"]
