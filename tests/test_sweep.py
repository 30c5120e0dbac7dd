"""`python -m speed_ladder run`: records, summary, charts, skip/force, kill -9 and resume, failures.

Real steps (00-02 on `tiny`) check the whole path once; the runner's handling of crashes,
timeouts, OOM records, torchrun and kills uses fixture scripts (tests/fixtures/ladder_*), which
train nothing and take milliseconds.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BPE, ROOT, VERDICT, alive, sweep_here

from speed_ladder import flags as cli
from speed_ladder import machine
from speed_ladder.errors import UserError
from speed_ladder.ladder import descendants, discover, parse_steps, processes_suffix
from speed_ladder.measure.data import stage_bpe
from speed_ladder.records import append_jsonl
from speed_ladder.report.summary import NUMBER_COLUMNS
from speed_ladder.spec import KEY_FIELDS
from speed_ladder.store import load_runs, recover
from speed_ladder.sweep import command as sweep_command
from speed_ladder.sweep import driver as sweep
from speed_ladder.sweep import launch
from speed_ladder.sweep.child import failure_reason

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TAG = sweep.tag_base("cpu") + processes_suffix(1)  # this machine's 1-process tag


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Offline tokenizer (the mirror's BPE files, staged) and a private token cache."""
    if not BPE.is_dir() or not VERDICT.is_file():
        pytest.skip(f"needs {BPE} and {VERDICT}")
    tk = stage_bpe(BPE, tmp_path_factory.mktemp("tiktoken"))
    cache = tmp_path_factory.mktemp("ladder-cache")
    return {**os.environ, "TIKTOKEN_CACHE_DIR": str(tk), "SPEED_LADDER_CACHE": str(cache)}


def speed_ladder_run(*args, env, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "speed_ladder", "run", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def runs_of(results: Path, tag: str = TAG) -> list[dict]:
    path = results / tag / "runs.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def summary_of(results: Path, tag: str = TAG) -> dict[str, dict]:
    import pandas as pd

    df = pd.read_csv(results / tag / "summary.csv", dtype={"step": str, "prev_step": str})
    return {r["step"]: r for r in df.to_dict("records")}


def is_nan(v) -> bool:
    return isinstance(v, float) and v != v


def copy_ladder(name: str, dest: Path) -> Path:
    """A fixture ladder copied next to fixture_step.py, so a test may edit its scripts."""
    shutil.copy(FIXTURES / "fixture_step.py", dest / "fixture_step.py")
    shutil.copytree(FIXTURES / name, dest / name)
    return dest / name


# ---------------------------------------------------------------- real steps
@pytest.fixture(scope="module")
def real_sweep(env, tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    args = ["--steps", "00-02", "--preset", "tiny", "--device", "cpu", "--max-steps", 3]
    args += ["--warmup-steps", 1, "--data", VERDICT, "--results-dir", results]
    t0 = time.monotonic()
    proc = speed_ladder_run(*args, env=env)
    return results, args, proc, time.monotonic() - t0


def test_sweep_of_real_steps_writes_records_summary_and_charts(real_sweep):
    results, _, proc, _ = real_sweep
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = runs_of(results)
    assert [r["step"] for r in recs] == ["00", "01", "02"]
    for r in recs:
        assert r["status"] == "ok" and r["preset"] == "tiny" and r["tokens_per_sec"] > 0
        s = r["sweep"]
        assert len(s["run_id"]) == 32 and s["tag"] == TAG and s["exit_code"] == 0
        assert s["config"]["max_steps"] == 3 and s["config"]["nproc"] == 1
        assert s["script_sha256"] == r["script_sha256"]
        # the step's fingerprint is the one the sweep computed for this machine
        assert r["machine"] == s["machine"] == sweep.this_machine("cpu")
        assert r["other_load"] is None or r["other_load"] >= 0
        assert "loadavg_start" in r and s["round"] == 1
    assert len({r["sweep"]["run_id"] for r in recs}) == 3
    # progress: an overall line per step, the step's own output indented beneath it
    assert "[1/3] step 00 the baseline ... elapsed" in proc.stdout
    assert "[3/3] step 02 " in proc.stdout and "ETA" in proc.stdout
    assert "\n      [01] done:" in proc.stdout

    summary = summary_of(results)
    ladder = discover(ROOT)
    assert list(summary) == [s.num for s in ladder]  # a row per ladder step
    assert summary["00"]["speedup_vs_00"] == 1.0
    for n in ("00", "01", "02"):
        row = summary[n]
        assert row["status"] == "ok" and row["runs"] == 1
        assert row["tokens_per_sec_median"] > 0 and row["peak_reserved_gib"] > 0
        assert 0 < row["mfu"] < 1 and row["val_loss"] > 0
    assert summary["01"]["title"] == "a dynamic causal mask"
    assert summary["03"]["status"] == "not run" and is_nan(summary["03"]["tokens_per_sec_median"])
    assert not list((results / TAG).glob(".tmp-*"))
    for png in ("tokens_per_sec.png", "peak_memory.png", "mfu.png"):
        data = (results / TAG / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_rerun_is_skipped_as_up_to_date(real_sweep, env):
    results, args, first, first_s = real_sweep
    assert first.returncode == 0
    before = (results / TAG / "runs.jsonl").read_bytes()
    t0 = time.monotonic()
    proc = speed_ladder_run(*args, "--no-plots", env=env)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("up to date") == 3, proc.stdout
    assert "run(s) to do" in proc.stdout and "0 run(s) to do" in proc.stdout
    assert (results / TAG / "runs.jsonl").read_bytes() == before
    assert took < first_s / 2, (took, first_s)


def test_a_folder_named_by_tag_is_the_users_and_a_rerun_skips_its_steps(
    env, tmp_path, capsys, monkeypatch
):
    """`--tag mine --results-dir DIR`: the runs go to DIR/mine-x1, its summary's rows are ok and
    the sweep exits 0 (a tag named for the hardware is check's and publish's rule for results/,
    not a sweep's); the same command again runs nothing."""
    for k in ("TIKTOKEN_CACHE_DIR", "SPEED_LADDER_CACHE"):  # the steps inherit this process's
        monkeypatch.setenv(k, env[k])
    results = tmp_path / "res"
    args = ["--steps", "00,01", "--preset", "tiny", "--device", "cpu", "--max-steps", 3,
            "--warmup-steps", 1, "--data", VERDICT, "--tag", "mine", "--results-dir", results,
            "--no-plots"]  # fmt: skip
    code, out, err = sweep_here(capsys, *args)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "failed" not in err and "invalid" not in out
    assert [p.name for p in results.iterdir()] == ["mine-x1"]
    recs = runs_of(results, "mine-x1")
    assert [(r["step"], r["status"], r["sweep"]["tag"]) for r in recs] == [
        ("00", "ok", "mine-x1"),
        ("01", "ok", "mine-x1"),
    ]
    rows = summary_of(results, "mine-x1")
    assert [rows[n]["status"] for n in ("00", "01", "02")] == ["ok", "ok", "not run"]
    assert rows["01"]["tokens_per_sec_median"] > 0
    # the closing table compares this machine's hardware, not the folder's name, with results/
    assert "this machine against results/cpu-" in out
    before = (results / "mine-x1" / "runs.jsonl").read_bytes()
    code, out, err = sweep_here(capsys, *args)
    assert code == 0, out[-3000:] + err[-3000:]
    assert out.count("up to date") == 2 and "0 run(s) to do" in out
    assert (results / "mine-x1" / "runs.jsonl").read_bytes() == before


# ---------------------------------------------------------------- fixture ladders
def test_force_reruns_and_changes_invalidate(tmp_path, capsys):
    ladder = copy_ladder("ladder_ok", tmp_path)
    results = tmp_path / "results"
    base = ["--ladder-dir", ladder, "--results-dir", results, "--device", "cpu", "--no-plots"]
    base += ["--steps", "00,01,03"]
    assert sweep_here(capsys, *base)[0] == 0
    assert len(runs_of(results)) == 3

    code, out, _ = sweep_here(capsys, *base)  # up to date
    assert code == 0 and out.count("up to date") == 3
    assert len(runs_of(results)) == 3

    code, out, _ = sweep_here(capsys, *base, "--force")
    assert code == 0 and "up to date" not in out
    recs = runs_of(results)
    assert [r["step"] for r in recs] == ["00", "01", "03"] * 2
    assert len({r["sweep"]["run_id"] for r in recs}) == 6

    # a docstring or comment edit changes no code: still up to date (code_sha256)
    script = ladder / "steps" / "01_fixture_ok.py"
    text = script.read_text().replace("that succeeds.", "that succeeds, edited.")
    script.write_text(text + "\n# edited\n")
    code, out, _ = sweep_here(capsys, *base)
    assert code == 0 and out.count("up to date") == 3
    # an edited line of code reruns; the others stay up to date
    script.write_text(text.replace('main(__file__, "ok")', 'main(__file__, "o" + "k")'))
    code, out, _ = sweep_here(capsys, *base)
    assert code == 0 and out.count("up to date") == 2
    assert [r["step"] for r in runs_of(results)][-1] == "01"
    # another configuration (seed) is not the same measurement: everything reruns
    code, out, _ = sweep_here(capsys, *base, "--seed", 7)
    assert code == 0 and "up to date" not in out
    assert len(runs_of(results)) == 10
    summary = summary_of(results)
    assert summary["01"]["runs"] == 1 and summary["02"]["status"] == "not run"


def test_rounds_interleave_the_steps_and_resume_in_their_round(tmp_path, capsys):
    results = tmp_path / "results"
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    base += ["--no-plots", "--no-control", "--steps", "00,01", "--repeats", 3]
    code, out, err = sweep_here(capsys, *base)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "round 3/3 [2/2] step 01" in out
    assert "expected duration: about " in out and "      memory: predicted per rank (" in out
    recs = runs_of(results)
    assert [r["step"] for r in recs] == ["00", "01"] * 3  # 00 01, 00 01, 00 01: not 00 00 00
    assert [r["sweep"]["round"] for r in recs] == [1, 1, 2, 2, 3, 3]
    assert all(r["sweep"]["machine"] == sweep.this_machine("cpu") for r in recs)

    # killed in round 3 after step 00: the rerun does step 01's round 3 only
    rows = [json.loads(x) for x in (results / TAG / "runs.jsonl").read_text().splitlines()]
    rows[1]["tokens_per_sec"], rows[3]["tokens_per_sec"] = 1000.0, 5000.0
    (results / TAG / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    code, out, _ = sweep_here(capsys, *base)
    assert code == 0 and out.count("up to date") == 1 and "round 3/3 [1/1] step 01" in out
    assert "round 1/3" not in out and "round 2/3" not in out
    assert runs_of(results)[-1]["sweep"]["round"] == 3
    row = summary_of(results)["01"]
    assert row["runs"] == 3 and row["tokens_per_sec_median"] == 2000.0
    assert row["tokens_per_sec_min"] == 1000.0 and row["tokens_per_sec_max"] == 5000.0
    # its own effect: per-round ratios to step 00 of 1, 5 and 2 -> median 2, interval [1, 5]
    assert (row["gain_vs_prev"], row["gain_vs_prev_lo"], row["gain_vs_prev_hi"]) == (2, 1, 5)
    assert row["verdict"] == "no change" and row["prev_step"] == "00"  # the interval holds 1.0
    assert summary_of(results)["00"]["verdict"] != summary_of(results)["00"]["verdict"]  # NaN


def test_distributed_steps_run_on_one_and_on_n_processes_in_their_own_tags(tmp_path, capsys):
    results = tmp_path / "results"
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    code, out, err = sweep_here(capsys, *base, "--nproc", 2, "--no-plots", "--steps", "01,02")
    assert code == 0, out[-3000:] + err[-3000:]
    one, two = runs_of(results), runs_of(results, TAG[: -len("-x1")] + "-x2")
    assert [r["step"] for r in one] == ["01", "02"] and [r["step"] for r in two] == ["02"]
    for rec, n in ((one[1], 1), (two[0], 2)):  # the distributed step: torchrun, 1 then 2 ranks
        assert rec["world_size"] == n and rec["sweep"]["config"]["nproc"] == n
        assert rec["sweep"]["command"][1:3] == ["-m", "torch.distributed.run"]
        assert f"--nproc_per_node={n}" in rec["sweep"]["command"]
    assert one[0]["sweep"]["command"][1:3] != ["-m", "torch.distributed.run"]
    assert one[0]["sweep"]["config"]["nproc"] == 1
    x2 = summary_of(results, TAG[: -len("-x1")] + "-x2")
    assert list(x2) == ["02"]  # an N-process tag holds the distributed steps only
    # 6000 tok/s on 2 processes against 3000 on one: 6000 / (2 x 3000)
    assert x2["02"]["scaling_efficiency"] == 1.0 and x2["02"]["world_size"] == 2


def test_killed_sweep_keeps_finished_records_and_resumes(tmp_path, capsys, monkeypatch):
    results, pids = tmp_path / "results", tmp_path / "pids"
    sweep_args = ["--ladder-dir", FIXTURES / "ladder_ok", "--steps", "00,01,03"]
    sweep_args += ["--results-dir", results, "--device", "cpu", "--no-plots"]
    args = [sys.executable, "-m", "speed_ladder", "run", *sweep_args]
    env = dict(os.environ, SWEEP_FIXTURE_SLEEP="1.5", SWEEP_FIXTURE_PIDS=str(pids))
    proc = subprocess.Popen(
        [str(a) for a in args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    runs = results / TAG / "runs.jsonl"
    deadline = time.monotonic() + 60
    while not (runs.exists() and runs.read_text().count("\n") >= 1):
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline, "no record within 60 s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = runs_of(results)
    assert len(kept) >= 1 and all(r["status"] == "ok" for r in kept)

    # no step outlives the sweep (the step process gets SIGTERM when its parent dies)
    if sys.platform.startswith("linux"):
        deadline = time.monotonic() + 10
        started = [int(p.name.split("-")[1]) for p in pids.iterdir()]
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in started)

    monkeypatch.delenv("SWEEP_FIXTURE_SLEEP", raising=False)
    code, out, err = sweep_here(capsys, *sweep_args)
    assert code == 0, out[-3000:] + err[-3000:]
    recs = runs_of(results)
    assert sorted(r["step"] for r in recs) == ["00", "01", "03"]  # none lost, none twice
    assert recs[: len(kept)] == kept
    assert len({r["sweep"]["run_id"] for r in recs}) == 3
    assert out.count("up to date") == len(kept)
    assert not list((results / TAG).glob(".tmp-*")) and not (results / TAG / ".lock").exists()
    assert [r["status"] for r in summary_of(results).values()] == ["ok", "ok", "not run", "ok"]


def test_recover_closes_the_append_delete_window(tmp_path):
    """What a kill -9 can leave: a torn last line, a temp file already copied (killed between
    append and delete), one not yet copied (killed after the step wrote it), one empty."""
    tag_dir = tmp_path / TAG
    tag_dir.mkdir()
    runs = tag_dir / "runs.jsonl"

    def meta(rid):
        return {"run_id": rid, "tag": TAG, "repeat": 1, "config": {}, "script_sha256": "x"}

    step_rec = {"step": "00", "status": "ok", "tokens_per_sec": 1.0}
    append_jsonl(runs, step_rec | {"sweep": meta("a" * 32) | {"exit_code": 0}})
    with open(runs, "a") as f:
        f.write('{"step": "01", "status": "o')  # torn
    for rid, with_record in (("a" * 32, True), ("b" * 32, True), ("c" * 32, False)):
        tmp = tag_dir / f".tmp-00-{rid[:12]}.jsonl"
        append_jsonl(tmp, {"sweep_meta": meta(rid)})
        if with_record:
            append_jsonl(tmp, step_rec)

    assert recover(tag_dir) == 1
    recs = load_runs(tag_dir)
    assert [r["sweep"]["run_id"] for r in recs] == ["a" * 32, "b" * 32]
    assert recs[1]["sweep"]["recovered"] is True
    assert runs.read_text().endswith("\n") and len(runs.read_text().splitlines()) == 2
    assert not list(tag_dir.glob(".tmp-*"))
    assert recover(tag_dir) == 0  # idempotent
    # a duplicated line (however it came) is counted once
    append_jsonl(runs, recs[1])
    assert len(load_runs(tag_dir)) == 2


def test_failures_are_recorded_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    results, pids = tmp_path / "results", tmp_path / "pids"
    args = ["--ladder-dir", FIXTURES / "ladder_fail", "--results-dir", results]
    args += ["--device", "cpu", "--timeout", 3, "--no-plots"]
    monkeypatch.setenv("SWEEP_FIXTURE_PIDS", str(pids))
    t0 = time.monotonic()
    code, out, err = sweep_here(capsys, *args)
    assert time.monotonic() - t0 < 60
    assert code == 1, out[-3000:] + err[-3000:]
    recs = {r["step"]: r for r in runs_of(results)}
    assert [recs[n]["status"] for n in sorted(recs)] == ["ok", "error", "timeout", "oom", "ok"]
    assert recs["01"]["reason"] == "RuntimeError: fixture crash"  # last stderr line
    assert recs["01"]["sweep"]["exit_code"] == 1
    assert recs["02"]["reason"] == "timed out after 3 s"
    assert recs["02"]["sweep"]["exit_code"] is None
    assert "out of memory" in recs["03"]["reason"]  # the step's own oom record
    assert recs["03"]["notes"] == ["fixture script, not a measurement"]  # the step's own
    assert recs["03"]["sweep"]["exit_code"] == 3
    for n in ("01", "02"):  # synthesized records
        r = recs[n]
        assert r["script_sha256"] and r["started_at"] and r["duration_s"] >= 0 and r["script"]
    assert recs["02"]["duration_s"] >= 3
    assert "FAILED (timeout)" in out and "failed: step 01 (error)" in err
    assert "      RuntimeError: fixture crash" in err  # the step's stderr, passed through
    # a failure keeps its stderr, the whole traceback, in a log the record names (relative)
    assert recs["01"]["log"] == f"logs/01-{recs['01']['sweep']['run_id'][:12]}.log"
    log = (results / TAG / recs["01"]["log"]).read_text()
    assert log.startswith("Traceback (most recent call last):") and "fixture crash" in log
    assert (results / TAG / recs["03"]["log"]).is_file() and "log" not in recs["00"]
    # the hung step and the child it started were killed with its process group
    hung = [int(p.name.split("-")[1]) for p in pids.iterdir() if p.name.startswith("02")]
    assert len(hung) == 2 and not any(alive(p) for p in hung)

    summary = summary_of(results)
    for n in ("01", "02", "03"):
        row = summary[n]
        assert row["status"] == recs[n]["status"] and row["reason"] == recs[n]["reason"]
        for col in NUMBER_COLUMNS:  # a failed step never shows a number
            assert is_nan(row[col]), (n, col, row[col])
    assert summary["04"]["status"] == "ok" and summary["04"]["speedup_vs_00"] == 5.0

    # a rerun retries the failed step and skips the ok one
    code, out, _ = sweep_here(capsys, *args, "--steps", "00,01")
    assert code == 1 and out.count("up to date") == 1
    assert [r["step"] for r in runs_of(results)].count("01") == 2


def test_unknown_step_is_one_error_line(tmp_path):
    proc = speed_ladder_run(
        "--steps", "00,42", "--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", tmp_path,
        env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --steps 00,42: no step 42 in the ladder (steps 00-03)"
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- in-process pieces
def test_parse_steps():
    ladder = discover(FIXTURES / "ladder_fail")
    nums = lambda spec: [s.num for s in parse_steps(spec, ladder)]
    assert nums(None) == nums("all") == ["00", "01", "02", "03", "04"]
    assert nums("01-03") == ["01", "02", "03"]
    assert nums("04,00,2") == ["00", "02", "04"]
    assert nums("0-1, 03 ,1") == ["00", "01", "03"]
    for bad, msg in (
        ("05", "no step 05"),
        ("03-01", "backwards"),
        ("x", "not a step"),
        (",", "no steps named"),
    ):
        with pytest.raises(UserError, match=msg):
            parse_steps(bad, ladder)


def test_discover_titles_and_ddp():
    ladder = discover(ROOT)
    by = {s.num: s for s in ladder}
    assert ladder[0].num == "00" and by["00"].title == "the baseline"
    assert by["08"].title == "torch.compile"
    assert [s.num for s in ladder] == sorted(by)
    # distributed: the steps that set up a process group, 11 (DDP) on (15 builds on 12)
    assert [s.num for s in ladder if s.distributed] == ["11", *(s.num for s in descendants("11"))]
    fixture = discover(FIXTURES / "ladder_ok")
    assert [s.distributed for s in fixture] == [False, False, True, False]


def test_hardware_tag(monkeypatch):
    """A tag is the machine's base and the processes' suffix (the sweep joins them per pass)."""
    cpu = f"cpu-{machine.cpu_tag_part(machine.cpu_model(), machine.cpu_id())}-{os.cpu_count()}c"
    assert sweep.tag_base("cpu") + processes_suffix(1) == TAG == f"{cpu}-x1"
    assert sweep.tag_base("cpu") + processes_suffix(2) == f"{cpu}-x2"
    monkeypatch.setattr(sweep, "_CUDA_INFO", (8, "NVIDIA H200", 150 * 2**30))
    assert sweep.tag_base("cuda") == "nvidia-h200" and sweep.default_nproc("cuda") == 8
    assert processes_suffix(8) == "-x8" and processes_suffix(1) == "-x1"
    assert sweep.capacity("cuda") == 150 * 2**30
    assert sweep.this_machine("cuda")["device_count"] == 8
    assert machine.slug("NVIDIA H200") == "nvidia-h200"
    assert machine.slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"
    assert machine.cpu_slug("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz") == (
        "intel-xeon-platinum-8375c-2-90ghz"
    )
    assert machine.cpu_slug("AMD EPYC 7763 64-Core Processor") == "amd-epyc-7763-64-core"


def test_one_flag_table_gives_the_steps_and_the_sweep_their_flags():
    """flags.STEP_FLAGS: a step parses every flag; the sweep passes on the identifying ones. A
    default sweep's config and step argv are those the committed results/*/runs.jsonl hold, so
    those records stay up to date."""
    assert sorted(vars(cli.parse_args(None, []))) == sorted(f.dest for f in cli.STEP_FLAGS)
    p = cli.Parser()
    sweep_command.add_run_parser(p.add_subparsers(dest="command"))
    values = vars(p.parse_args(["run"]))
    # the passed flags but the profiler's identify a run: spec.KEY_FIELDS, as resolved, and a
    # --to-loss run's resolved `to_loss` (target and budget) and a --workers that is not the
    # device's default, in its config alone
    passed = {f.dest for f in cli.STEP_FLAGS if f.passed} - {"profile", "trace"}
    assert passed - {"to_loss", "token_budget", "workers"} == set(KEY_FIELDS)
    assert {k: values[k] for k in KEY_FIELDS} == {"preset": None, "device": "auto",
            "max_steps": None, "warmup_steps": None, "seed": 123, "data": None}  # fmt: skip
    assert cli.child_argv(values) == ["--device", "auto", "--seed", "123"]
    values = vars(p.parse_args(["run", "--preset", "tiny", "--max-steps", "3", "--data", "t"]))
    assert cli.child_argv(values) == ["--device", "auto", "--preset", "tiny", "--max-steps", "3",
                                      "--data", "t", "--seed", "123"]  # fmt: skip
    assert not {"epochs", "batch_size", "results"} & set(values)  # not the sweep's to set


def test_failure_reason():
    assert failure_reason(["x", "error: out of memory: boom", "y"], 3) == "out of memory: boom"
    torchrun_tail = [
        "RuntimeError: boom",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "  exitcode  : 1 (pid: 42)",
    ]
    assert failure_reason(torchrun_tail, 1) == "RuntimeError: boom"
    assert failure_reason([], -9) == "killed by signal SIGKILL"
    assert failure_reason([], 1) == "exit code 1"


def test_help(capsys):
    from speed_ladder.__main__ import main

    for argv in (["--help"], ["run", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--steps", "--repeats", "--timeout", "--nproc", "--results-dir", "--force"):
        assert flag in out
    assert "--ladder-dir" not in out


def test_one_sweep_per_tag_folder_and_bad_data(tmp_path, capsys):
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", tmp_path, "--device", "cpu"]
    (tmp_path / TAG).mkdir()
    with launch.Lock(tmp_path / TAG):
        code, _, err = sweep_here(capsys, *base, "--no-plots")
    assert code == 2 and err.startswith("error: another sweep is writing")
    assert not (tmp_path / TAG / ".lock").exists() and not runs_of(tmp_path)
    code, _, err = sweep_here(capsys, *base, "--data", tmp_path / "nope.txt")
    assert code == 2 and "no such file" in err


# ---------------------------------------------------------------- machines, control, oom
def _tree_bytes(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_another_machines_folder_is_not_skipped_and_its_files_are_unchanged(tmp_path, capsys):
    results = tmp_path / "results"
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    base += ["--steps", "00,01"]
    assert sweep_here(capsys, *base)[0] == 0  # charts too: files of every kind in the folder
    # the same runs, as if made on another machine (and one without a fingerprint)
    rows = runs_of(results)
    rows[0]["sweep"]["machine"] = dict(rows[0]["sweep"]["machine"], host_id="0123456789ab")
    del rows[1]["sweep"]["machine"]
    (results / TAG / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = _tree_bytes(results / TAG)

    code, out, err = sweep_here(capsys, *base, "--no-plots")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "up to date" not in out and "holds another machine's records" in out
    assert _tree_bytes(results / TAG) == before  # not one byte changed
    mine = TAG[: -len("-x1")] + f"-{machine.short_id(sweep.this_machine('cpu'))}-x1"
    assert [r["step"] for r in runs_of(results, mine)] == ["00", "01"]
    assert summary_of(results, mine)["01"]["runs"] == 1
    # a rerun finds this machine's folder up to date, and still leaves the other alone
    code, out, _ = sweep_here(capsys, *base, "--no-plots")
    assert code == 0 and out.count("up to date") == 2
    assert _tree_bytes(results / TAG) == before
    # naming the other machine's folder with --tag is refused, in one line
    code, out, err = sweep_here(capsys, *base, "--tag", TAG)
    assert code == 2 and "holds another machine's records" in err and "--tag" in err
    assert _tree_bytes(results / TAG) == before


def test_a_step_off_its_loss_parity_is_named_and_the_exit_code_stays(tmp_path, capsys,
                                                                    monkeypatch):  # fmt: skip
    """Every step trains on the same seed and data: a step whose losses leave the previous
    step's beyond its rule (speed_ladder/data/ladder.json) is `off` in the summary, named in the
    closing status line and shown in the README table and LADDER.md; the others are `ok`; the
    exit code stays 0 (information, not a failure)."""
    from speed_ladder.report.pages import ladder_page, tag_page

    results = tmp_path / "results"
    monkeypatch.setenv("SWEEP_FIXTURE_LOSS_OFF", "03:0.01")  # 03 (close, fp32: 1e-4) is off
    args = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    code, out, err = sweep_here(capsys, *args, "--no-plots", "--no-control", "--repeats", 2)
    assert code == 0, out[-3000:] + err[-3000:]
    rows = summary_of(results)
    assert is_nan(rows["00"]["parity"]) and is_nan(rows["00"]["parity_detail"])  # no previous
    assert rows["01"]["parity"] == "ok" and rows["02"]["parity"] == "ok"
    assert rows["01"]["parity_detail"].startswith("max |loss difference| 0.00e+00 exact")
    assert rows["01"]["parity_detail"].endswith("; ok in all 2 rounds")
    assert rows["03"]["parity"] == "off"
    detail = rows["03"]["parity_detail"]
    assert detail.startswith("max |loss difference| 1.00e-02 > 0.0001 (fused AdamW")
    assert detail.endswith("; off in all 2 rounds")
    status = [ln for ln in err.splitlines() if ln.startswith("parity off: ")]
    assert status == [f"parity off: step 03 ({detail})"] and "failed:" not in err

    md = tag_page.tag_markdown(results / TAG, tmp_path)
    assert "| val loss | loss parity | status |" in md
    table = {ln.split(" | ")[0]: ln for ln in md.splitlines() if ln.startswith("| 0")}
    assert table["| 00"].endswith("| – | ok |") and table["| 01"].endswith("| ok | ok |")
    assert table["| 03"].endswith("| **off** | ok |")
    assert "**Loss parity off**: step 03 (max \\|loss difference\\| 1.00e-02 > 0.0001" in md
    page = ladder_page.page_markdown([results / TAG], tmp_path, root=FIXTURES / "ladder_ok")
    sec03 = page.split("## 03 ")[1]
    assert "| loss parity | status |" in sec03
    assert f"| [**off**](results/{TAG}/README.md) |" in sec03  # the detail: the tag's page
    sec01 = page.split("## 01 ")[1].split("\n## ")[0]
    assert "| ok | ok |" in sec01

    # without the perturbation every step keeps parity, and nothing is said
    monkeypatch.delenv("SWEEP_FIXTURE_LOSS_OFF")
    code, out, err = sweep_here(capsys, *args, "--no-plots", "--no-control", "--force")
    assert code == 0 and "parity off" not in err
    assert {summary_of(results)[n]["parity"] for n in ("01", "02", "03")} == {"ok"}


def test_the_sweeps_own_summary_marks_an_impossible_record_invalid(tmp_path, capsys,
                                                                   monkeypatch):  # fmt: skip
    """The summary the sweep writes after its runs judges its records by its tag folder, as a
    rebuilt one does (report/checks/validity.py): a step whose record has NaN losses is `invalid`
    with the reason, never `ok` until a rebuild; the fixture's own records are valid."""
    from speed_ladder.report.summary import rebuild

    results = tmp_path / "results"
    monkeypatch.setenv("SWEEP_FIXTURE_LOSS_OFF", "01:nan")  # step 01 records NaN losses
    args = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    code, out, err = sweep_here(capsys, *args, "--no-plots", "--no-control", "--steps", "00,01")
    assert runs_of(results)[1]["status"] == "ok"  # the step itself said ok
    assert "01    a fixture that succeeds" in out and "invalid: invalid record: 10 of its" in out
    rows = summary_of(results)
    assert rows["00"]["status"] == "ok", rows["00"]["reason"]
    assert rows["01"]["status"] == "invalid"
    assert rows["01"]["reason"].startswith("invalid record: 10 of its 10 losses are not finite")
    assert is_nan(rows["01"]["tokens_per_sec_median"])
    rebuilt, _ = rebuild(results / TAG, discover(FIXTURES / "ladder_ok")[:2])
    assert list(rebuilt["status"]) == ["ok", "invalid"]


def test_the_aa_control_measures_the_noise_floor(tmp_path, capsys):
    results = tmp_path / "results"
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    code, out, err = sweep_here(capsys, *base, "--steps", "00,01", "--repeats", 2, "--no-plots")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "step 00 the fixture baseline (A/A control)" in out
    recs = runs_of(results)
    assert [(r["step"], bool(r["sweep"].get("control"))) for r in recs] == [
        ("00", False), ("00", True), ("01", False)] * 2  # fmt: skip
    rows = summary_of(results)
    assert rows["00"]["runs"] == 2  # the control runs are not step 00's own
    assert rows["01"]["noise_floor"] == 0.0 and rows["01"]["noise_source"].startswith("A/A")
    assert rows["01"]["verdict"] == "faster" and rows["01"]["gain_vs_prev"] == 2.0
    assert rows["01"]["mem_verdict"] == "more"
    # the control is up to date with the rest
    code, out, _ = sweep_here(capsys, *base, "--steps", "00,01", "--repeats", 2, "--no-plots")
    assert code == 0 and out.count("up to date") == 3


def test_an_out_of_memory_on_another_rank_is_oom(tmp_path, capsys):
    ladder = copy_ladder("ladder_ok", tmp_path)
    (ladder / "steps" / "02_fixture_ddp.py").write_text(
        "import os, sys\n"
        "def init_process_group(): pass\n"
        "init_process_group()\n"
        "if os.environ.get('RANK') == '1':\n"
        "    print('error: out of memory: CUDA out of memory (rank 1)', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "import time; time.sleep(1.5)  # rank 0 fails after its peer, as in a real job\n"
        "print('RuntimeError: Connection closed by peer', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    results = tmp_path / "results"
    args = ["--ladder-dir", ladder, "--results-dir", results, "--device", "cpu", "--nproc", 2]
    code, out, err = sweep_here(capsys, *args, "--steps", "02", "--no-plots")
    assert code == 1
    (rec,) = runs_of(results, TAG[: -len("-x1")] + "-x2")
    assert rec["status"] == "oom", rec
    assert rec["reason"] == "out of memory: CUDA out of memory (rank 1)"
    assert runs_of(results)[0]["status"] == "error"  # on one process: rank 0's own failure


def test_preflight_run_length_duration_and_memory(monkeypatch):
    from speed_ladder.measure import memory_model
    from speed_ladder.measure.settings import resolve_spec
    from speed_ladder.sweep import preflight

    ladder = {s.num: s for s in discover(ROOT)}
    # GPU presets: a bounded measuring run; the cpu preset and explicit flags are left alone
    bounded = preflight.measuring_values({"preset": None}, "cuda")
    assert (bounded["warmup_steps"], bounded["max_steps"]) == (10, 60)
    assert preflight.measuring_values({"preset": None}, "cpu") == {"preset": None}
    mine = {"preset": "gpt2-xl", "max_steps": 7, "warmup_steps": 2}
    assert preflight.measuring_values(mine, "cuda") == mine
    # duration: earlier runs of this step here, else the rough model (+ torch.compile)
    earlier = [{"status": "ok", "sweep": {"duration_s": d}} for d in (30.0, 34.0, 90.0)]
    assert preflight.run_seconds(ladder["05"], earlier, "cpu") == (34.0, True)
    assert preflight.run_seconds(ladder["05"], [], "cpu") == (40.0, False)
    assert preflight.run_seconds(ladder["08"], [], "cpu") == (130.0, False)
    assert preflight.run_seconds(ladder["08"], [], "cpu", compile_s=12.0) == (52.0, False)
    assert preflight.run_seconds(ladder["07"], [], "cpu", compile_s=12.0) == (40.0, False)
    line = preflight.estimate_line([(34.0, preflight.HERE), (130.0, None)], "cpu")
    assert line.startswith("expected duration: about 2m44s (2 runs; 1 from earlier runs here; 1 "
                           "rough: 40 s a run on cpu")  # fmt: skip
    # torch.compile's measured seconds: this step's earlier runs here, else step 08's
    cfg = {"preset": "tiny", "nproc": 1}

    def rec(step, seconds, machine="m", nproc=1):
        sweep = {"machine": machine, "config": dict(cfg, nproc=nproc)}
        return {"step": step, "status": "ok", "compiles": {"seconds": seconds}, "sweep": sweep}

    recs = [rec("08", 20.0), rec("08", 30.0), rec("08", 99.0, machine="other"), rec("07", None)]
    assert preflight.compile_seconds(ladder["10"], recs, cfg, "m") == 25.0  # step 08's
    recs += [rec("11", 40.0, nproc=2)]  # another process count: the same compile
    assert preflight.compile_seconds(ladder["11"], recs, cfg, "m") == 40.0  # its own
    assert preflight.compile_seconds(ladder["10"], recs, cfg, "other") == 99.0
    assert preflight.compile_seconds(ladder["10"], recs, dict(cfg, preset="cpu"), "m") is None
    assert preflight.compile_seconds(ladder["10"], [rec("08", None)], cfg, "m") is None
    # memory: the prediction's line, and a warning when it cannot fit
    gpu = lambda gib: (gib * 2**30, "bf16")  # noqa: E731
    xl = resolve_spec({"preset": "gpt2-xl"}, "cuda", gpu(24))
    pred = preflight.predict(ladder["10"], xl, 1)
    text, warning = preflight.memory_line(pred, "cuda", 24 * 2**30, 1)
    assert text.startswith("predicted per rank (gpt2-xl, single, 1 process")
    assert warning.startswith("predicted not to fit: ") and "24.0 GiB" in warning
    assert not memory_model.fits(pred, 24 * 2**30)
    small = preflight.predict(ladder["10"], resolve_spec({"preset": None}, "cuda", gpu(80)), 1)
    assert preflight.memory_line(small, "cuda", 80 * 2**30, 1)[1] is None
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")  # a CPU's bf16 is measured: not here
    cpu = preflight.predict(ladder["11"], resolve_spec({"preset": None}, "cpu"), 2)
    assert cpu.mode == "ddp" and cpu.world == 2
    assert "RAM per process" in preflight.memory_line(cpu, "cpu", 2 * 2**30, 2)[1]


def _committed_tag(results: Path, name: str, recs: list[dict]) -> Path:
    """A committed tag folder: its records and a summary.csv of one row (what choose reads)."""
    folder = results / name
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    preset, device = recs[0]["preset"], recs[0]["device_name"]
    row = f"00,ok,{preset},{device}"
    (folder / "summary.csv").write_text(f"step,status,preset,device_name\n{row}\n")
    return folder


def test_a_first_guess_of_each_runs_duration_from_the_committed_tag(tmp_path):
    """A step this tag has not measured is guessed from the committed tag the closing table
    compares with (committed.choose: the same hardware, else the closest): its ok runs in the
    same configuration, the A/A control's aside; the line says where each guess comes from."""
    from speed_ladder.sweep import preflight

    ladder = {s.num: s for s in discover(ROOT)}
    cfg = {"device": "cpu", "preset": "cpu", "max_steps": 10, "warmup_steps": 2, "data": None,
           "seed": 123, "nproc": 1}  # fmt: skip

    def rec(step, seconds, config=cfg, control=False, name="AMD EPYC"):
        sweep = {"duration_s": seconds, "config": config, "control": control, "machine": {}}
        return {"step": step, "status": "ok", "preset": "cpu", "device_name": name, "sweep": sweep}

    results = tmp_path / "results"
    zen4 = "cpu-amd-epyc-f25-m17-bf16-2c-x1"
    recs = [rec("00", 30.0), rec("00", 34.0), rec("00", 99.0, control=True)]
    recs += [rec("01", 20.0, dict(cfg, preset="tiny")), rec("02", 25.0)]
    _committed_tag(results, zen4, recs)
    _committed_tag(results, "cpu-intel-xeon-f6-m143-amx-2c-x1", [rec("00", 9.0, name="Xeon")])
    where, theirs = preflight.committed_runs(zen4, "cpu", "AMD EPYC", None, results)
    assert where == f"{zen4} (the same hardware)" and len(theirs) == 5
    assert preflight.committed_seconds(ladder["00"], cfg, theirs) == 32.0  # control aside
    assert preflight.committed_seconds(ladder["01"], cfg, theirs) is None  # another preset
    assert preflight.committed_seconds(ladder["03"], cfg, theirs) is None  # never measured
    # this hardware's own folder with a machine's suffix: still the same hardware's tag; the
    # sweep's own folder is never its own guess
    suffixed = "cpu-amd-epyc-f25-m17-bf16-2c-1a2b3c-x1"
    assert preflight.committed_runs(suffixed, "cpu", "AMD EPYC", None, results)[0].startswith(zen4)
    assert preflight.committed_runs(zen4, "cpu", "AMD EPYC", results / zen4, results)[0] == (
        "cpu-intel-xeon-f6-m143-amx-2c-x1 (the closest committed tag)"
    )
    # other hardware: the closest of its kind (here the same CPU name), none of another kind
    where, _ = preflight.committed_runs("cpu-amd-epyc-f25-m17-bf16-16c-x1", "cpu", "AMD EPYC",
                                        None, results)  # fmt: skip
    assert where == f"{zen4} (the closest committed tag)"
    assert preflight.committed_runs("nvidia-h100-x1", "gpt2-124m", "H100", None, results) == (
        None, [],
    )  # fmt: skip
    line = preflight.estimate_line(
        [(34.0, preflight.HERE), (32.0, where), (25.0, where), (130.0, None)], "cpu"
    )
    assert line.startswith(f"expected duration: about 3m41s (4 runs; 1 from earlier runs here; 2 "
                           f"as measured in {where}; 1 rough: 40 s a run on cpu")  # fmt: skip


def test_a_sweep_guesses_from_its_hardwares_committed_tag_whatever_its_tag(tmp_path, capsys):
    """The estimate the sweep prints before its first run: steps it has not measured take the
    committed tag of this machine's hardware (not of --tag's name); a --ladder-dir ladder (a
    test's fixtures) has no committed runs."""
    from speed_ladder.files import RESULTS
    from speed_ladder.sweep import rounds

    def plan(*extra):
        parser = cli.Parser()
        sweep_command.add_run_parser(parser.add_subparsers(dest="command"))
        args = ["run", "--steps", "00,01,02", "--device", "cpu", "--preset", "tiny",
                "--results-dir", tmp_path / "local", *extra]  # fmt: skip
        return sweep.plan(parser.parse_args([str(a) for a in args]))

    p = plan("--tag", "mine")
    assert p.committed == RESULTS and p.passes[0].hardware == TAG
    assert plan("--ladder-dir", FIXTURES / "ladder_ok").committed is None
    cfg = p.passes[0].configs["00"]
    run = {"duration_s": 21.0, "config": cfg, "machine": {}}
    recs = [{"step": n, "status": "ok", "preset": "tiny", "device_name": "x", "sweep": run}
            for n in ("00", "01")]  # fmt: skip
    p.committed = tmp_path / "results"
    _committed_tag(p.committed, TAG, recs)
    capsys.readouterr()
    rounds._start(p, False)
    out = capsys.readouterr().out
    said = f"expected duration: about 1m22s (3 runs; 2 as measured in {TAG} (the same hardware)"
    assert f"{said}; 1 rough: 40 s a run on cpu" in out


def test_a_record_of_the_sweeps_flags_is_matched_as_its_step_resolved_them():
    """sweep.config is the RunSpec's (spec.sweep_config); a record made without one holds the
    flags the sweep passed (`preset: null`, `device: auto`), read as the step resolved them, so
    a sweep's earlier runs stay up to date (results/cpu-amd-epyc-f25-m17-bf16-2c-x1)."""
    from speed_ladder.measure.settings import resolve_spec
    from speed_ladder.spec import config_of, sweep_config

    flags = {"device": "auto", "preset": None, "max_steps": None, "warmup_steps": None,
             "data": None, "seed": 123}  # fmt: skip
    cpu, gpu = {"cpu": {"vendor": "x"}}, {"gpus": []}
    spec = resolve_spec({"seed": 123}, "cpu")
    old = {"sweep": {"config": dict(flags, nproc=2), "machine": cpu}}
    assert config_of(old) == sweep_config(spec, 2)
    want = {"device": "cpu", "preset": "cpu", "max_steps": 10, "warmup_steps": 2, "data": None,
            "seed": 123, "nproc": 2}  # fmt: skip
    assert sweep_config(spec, 2) == want
    new = {"sweep": {"config": sweep_config(spec, 2), "machine": cpu}}
    assert config_of(new) == sweep_config(spec, 2)  # resolving twice changes nothing
    measuring = dict(flags, max_steps=60, warmup_steps=10)  # preflight.measuring_values'
    on_gpu = resolve_spec(dict(measuring, device="cuda"), "cuda")
    assert config_of({"sweep": {"config": dict(measuring, nproc=1), "machine": gpu}}) == (
        sweep_config(on_gpu, 1)
    )
    legacy = {"sweep": {"config": dict(flags, nproc=1), "machine": {"name": "AMD EPYC"}}}
    assert config_of(legacy) == dict(flags, nproc=1)  # no device to resolve by: as it is
    assert config_of({"sweep": {"config": {}}}) == {}
