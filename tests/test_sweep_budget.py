"""A sweep with a time limit (a GPU rented by the hour, a batch job's wall-clock limit, where
each job may start on a fresh machine): `--budget` ends it in time without losing or inventing a
result, and SPEED_LADDER_HOST_ID pools interchangeable machines into one tag, in sight (each
record's real host, the summary's `hosts`, a README line).

Fixture ladders (tests/fixtures/ladder_ok) train nothing and take milliseconds.
"""

import shutil
import sys
import time

import pytest
from conftest import alive, sweep_here
from test_sweep import FIXTURES, TAG, runs_of, summary_of

from speed_ladder import machine
from speed_ladder.errors import UserError
from speed_ladder.records import read_jsonl
from speed_ladder.report.pages.tag_page import tag_markdown
from speed_ladder.report.rows import pooled_text
from speed_ladder.store import TMP_GLOB
from speed_ladder.sweep import child, preflight
from speed_ladder.sweep import driver as sweep

BASE = ["--ladder-dir", FIXTURES / "ladder_ok", "--device", "cpu", "--no-plots"]


def _estimates(monkeypatch, seconds: dict[str, float], measured: bool = True) -> None:
    """Each step's expected duration, as the sweep's preflight would have it (`measured`: from
    earlier ok runs, else the rough model)."""

    def run_seconds(step, earlier, dev, compile_s=None):
        return seconds[step.num], measured

    monkeypatch.setattr(preflight, "run_seconds", run_seconds)


# ---------------------------------------------------------------- --budget
def test_a_run_that_does_not_fit_is_left_for_the_next_sweep_and_the_rerun_resumes(
    tmp_path, capsys, monkeypatch
):
    results = tmp_path / "results"
    args = [*BASE, "--results-dir", results, "--steps", "00,01,03"]
    _estimates(monkeypatch, {"00": 0.5, "01": 500.0, "03": 0.5})
    code, out, err = sweep_here(capsys, *args, "--budget", 60)
    assert code == sweep.BUDGET_EXIT == 3, out[-2000:] + err[-2000:]
    # 01 does not fit in 60 s and is passed over; 03 after it still fits and runs
    assert [r["step"] for r in runs_of(results)] == ["00", "03"]
    assert "budget: 1m00s left" in out or "budget: 59s left" in out
    assert "step 01 a fixture that succeeds is expected to take 8m20s: left for the next" in out
    assert "not run, --budget 60 s ran out: step 01 a fixture that succeeds; the same " in err
    assert "failed" not in err
    assert summary_of(results)["01"]["status"] == "not run"  # never a failure

    code, out, err = sweep_here(capsys, *args)  # the same command, no budget: resumes
    assert code == 0, out[-2000:] + err[-2000:]
    assert out.count("up to date") == 2
    assert [r["step"] for r in runs_of(results)] == ["00", "03", "01"]


def test_a_run_still_going_when_the_budget_ends_is_stopped_and_not_recorded(
    tmp_path, capsys, monkeypatch
):
    results = tmp_path / "results"
    monkeypatch.setenv("SWEEP_FIXTURE_SLEEP", "60")
    _estimates(monkeypatch, {"00": 0.1}, measured=False)  # no ok run yet: the rough model
    args = [*BASE, "--results-dir", results, "--steps", "00"]
    t0 = time.monotonic()
    code, out, err = sweep_here(capsys, *args, "--budget", 13)  # 10 s of it: the kill's grace
    took = time.monotonic() - t0
    assert code == 3, out[-2000:] + err[-2000:]
    assert took < 13, took
    assert "-> stopped unfinished after" in out and "(not recorded; noted in cuts.jsonl)" in out
    assert runs_of(results) == []  # no made-up "timeout" for a step that was only cut short
    assert not list((results / TAG).glob(TMP_GLOB))  # nothing left to "recover" either
    assert summary_of(results)["00"]["status"] == "not run"
    (cut,) = read_jsonl(results / TAG / "cuts.jsonl")
    assert cut["step"] == "00" and 0 < cut["cut_after_s"] <= 3

    # the next sweep knows the run needs more than that (half as much again): given about the
    # same time, it is not started again (and cut again), it is passed over
    code, out, err = sweep_here(capsys, *args, "--budget", 10 + cut["cut_after_s"] * 1.2)
    assert code == 3 and "is expected to take" in out and "stopped unfinished" not in out
    assert runs_of(results) == []
    # given more, it runs
    monkeypatch.setenv("SWEEP_FIXTURE_SLEEP", "0")
    code, out, err = sweep_here(capsys, *args, "--budget", 10 + cut["cut_after_s"] * 1.5 + 5)
    assert code == 0, out[-2000:] + err[-2000:]
    assert [r["status"] for r in runs_of(results)] == ["ok"]


def test_a_run_cut_twice_is_recorded_failed_and_the_sweep_goes_on(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    monkeypatch.setenv("SWEEP_FIXTURE_SLEEP", "60")  # never fits in these budgets
    _estimates(monkeypatch, {"00": 0.1, "01": 0.1}, measured=False)
    args = [*BASE, "--results-dir", results, "--steps", "00"]
    code, out, err = sweep_here(capsys, *args, "--budget", 13)  # the first cut: not recorded
    assert code == 3 and "(not recorded; noted in cuts.jsonl)" in out, out[-2000:] + err[-2000:]
    (first,) = read_jsonl(results / TAG / "cuts.jsonl")
    assert runs_of(results) == []

    # the next sweep expects half as much again, it fits, it is cut again: now a result
    code, out, err = sweep_here(capsys, *args, "--budget", 10 + first["cut_after_s"] * 1.5 + 3)
    assert code == 1, out[-2000:] + err[-2000:]
    cuts = read_jsonl(results / TAG / "cuts.jsonl")
    assert len(cuts) == 2 and cuts[1]["cut_after_s"] > first["cut_after_s"]
    (rec,) = runs_of(results)
    longest = max(c["cut_after_s"] for c in cuts)
    assert rec["status"] == "failed" and rec["step"] == "00"
    assert rec["reason"].startswith(f"cut twice at {longest:.0f} s")
    assert rec["sweep"]["exit_code"] is None and rec["sweep"]["config"] and rec["script_sha256"]
    assert "-> FAILED (failed): cut twice at" in out and "failed: step 00 (failed)" in err
    assert not list((results / TAG).glob(TMP_GLOB))
    row = summary_of(results)["00"]
    assert row["status"] == "failed" and row["reason"] == rec["reason"]

    # a later sweep goes on with the other runs; the summary still shows the failure and why
    monkeypatch.setenv("SWEEP_FIXTURE_SLEEP", "0")
    code, out, err = sweep_here(capsys, *BASE, "--results-dir", results, "--steps", "00,01",
                                "--budget", 10 + longest)  # fmt: skip
    assert code == 1, out[-2000:] + err[-2000:]
    assert [(r["step"], r["status"]) for r in runs_of(results)] == [("00", "failed"), ("01", "ok")]
    rows = summary_of(results)
    assert rows["00"]["status"] == "failed" and rows["00"]["reason"] == rec["reason"]
    assert rows["01"]["status"] == "ok" and "failed: step 00 (failed)" in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# the budget's cut in the fast suite (a 2-s kill grace for the test; 10 s in use); a --timeout goes
# through the same kill (slow: 10 s grace)
@pytest.mark.parametrize("cut", ["budget", pytest.param("timeout", marks=pytest.mark.slow)])
def test_a_cut_ends_every_process_of_the_run(tmp_path, capsys, monkeypatch, cut):
    """A step (torchrun and its workers on a GPU) that ignores SIGTERM, with a child in its
    process group and one in a session of its own, both deaf too: after the cut none is left
    to keep the GPU busy during the next runs."""
    shutil.copy(FIXTURES / "fixture_step.py", tmp_path / "fixture_step.py")
    ladder = tmp_path / "ladder"
    (ladder / "steps").mkdir(parents=True)
    shutil.copy(FIXTURES / "ladder_ok" / "00_orig.py", ladder / "00_orig.py")
    deaf = (FIXTURES / "ladder_ok" / "steps" / "01_fixture_ok.py").read_text()
    deaf = deaf.replace('main(__file__, "ok")', 'main(__file__, "deaf")')
    (ladder / "steps" / "01_fixture_deaf.py").write_text(deaf.replace("succeeds", "is deaf"))
    pids = tmp_path / "pids"
    monkeypatch.setenv("SWEEP_FIXTURE_PIDS", str(pids))
    _estimates(monkeypatch, {"00": 0.1, "01": 0.1}, measured=False)
    args = ["--ladder-dir", ladder, "--device", "cpu", "--no-plots", "--steps", "01"]
    if cut == "budget":
        monkeypatch.setattr(child, "KILL_GRACE_S", 2.0)
    limit = ["--budget", 7] if cut == "budget" else ["--timeout", 3]
    code, out, err = sweep_here(capsys, *args, "--results-dir", tmp_path / "results", *limit)
    assert code == (3 if cut == "budget" else 1), out[-2000:] + err[-2000:]
    started = {p.name: int(p.name.split("-")[1]) for p in pids.iterdir()}
    assert {n.split("-")[0] for n in started} == {"01", "01child1", "01child2"}, started
    deadline = time.monotonic() + 5  # an orphan may wait a moment to be reaped
    while any(alive(p) for p in started.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [n for n, p in started.items() if alive(p)]


def test_a_step_over_its_own_timeout_inside_the_budget_is_still_a_timeout(
    tmp_path, capsys, monkeypatch
):
    results = tmp_path / "results"
    monkeypatch.setenv("SWEEP_FIXTURE_SLEEP", "60")
    _estimates(monkeypatch, {"00": 0.1})
    code, out, err = sweep_here(capsys, *BASE, "--results-dir", results, "--steps", "00",
                                "--budget", 600, "--timeout", 1)  # fmt: skip
    assert code == 1, out[-2000:] + err[-2000:]
    assert [r["status"] for r in runs_of(results)] == ["timeout"]


@pytest.mark.parametrize("bad", ["0", "-5", "soon"])
def test_a_bad_budget_is_one_line_and_exit_2(tmp_path, capsys, bad):
    code, out, err = sweep_here(capsys, *BASE, "--results-dir", tmp_path, "--budget", bad)
    assert code == 2 and "--budget" in err and "Traceback" not in err
    assert not (tmp_path / TAG).exists()


# ---------------------------------------------------------------- pooled hosts
def test_without_a_pool_the_host_id_is_the_machines_own(monkeypatch):
    monkeypatch.delenv(machine.HOST_ENV, raising=False)
    assert machine.host_id() == machine.real_host_id()
    assert len(machine.real_host_id()) == 12


def test_a_pool_name_replaces_the_host_in_the_fingerprint_only(monkeypatch):
    monkeypatch.setenv(machine.HOST_ENV, "h200-pool")
    monkeypatch.setattr(machine, "real_host_id", lambda: "aaaaaaaaaaaa")
    one = machine.fingerprint("cuda", "NVIDIA H200", 1)
    monkeypatch.setattr(machine, "real_host_id", lambda: "bbbbbbbbbbbb")
    assert machine.fingerprint("cuda", "NVIDIA H200", 1) == one
    assert one["host_id"] == "pool:h200-pool"
    # the pool never makes another GPU, count or torch "the same machine"
    assert machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1) != one
    assert machine.fingerprint("cuda", "NVIDIA H200", 8) != one


@pytest.mark.parametrize("bad", ["a b", "../x", "-lead", "x" * 65])
def test_a_bad_pool_name_is_a_user_error(monkeypatch, bad):
    monkeypatch.setenv(machine.HOST_ENV, bad)
    with pytest.raises(UserError, match="SPEED_LADDER_HOST_ID"):
        machine.host_id()


def test_a_bad_pool_name_stops_the_sweep_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(machine.HOST_ENV, "two words")
    code, out, err = sweep_here(capsys, *BASE, "--results-dir", tmp_path)
    assert code == 2 and "SPEED_LADDER_HOST_ID='two words'" in err and "Traceback" not in err


def test_a_pooled_sweep_resumes_on_a_fresh_machine_and_says_it_pooled(
    tmp_path, capsys, monkeypatch
):
    results = tmp_path / "results"
    args = [*BASE, "--results-dir", results]
    monkeypatch.setenv(machine.HOST_ENV, "batch")
    monkeypatch.setattr(machine, "real_host_id", lambda: "aaaaaaaaaaaa")
    assert sweep_here(capsys, *args, "--steps", "00")[0] == 0
    # the next job starts on another machine of the same kind: 00 is kept, 01 and 03 run
    monkeypatch.setattr(machine, "real_host_id", lambda: "bbbbbbbbbbbb")
    code, out, err = sweep_here(capsys, *args, "--steps", "00,01,03")
    assert code == 0, out[-2000:] + err[-2000:]
    assert out.count("up to date") == 1
    recs = runs_of(results)  # one tag folder, each record with its real host
    assert [(r["step"], r["sweep"]["host"]) for r in recs] == [
        ("00", "aaaaaaaaaaaa"), ("01", "bbbbbbbbbbbb"), ("03", "bbbbbbbbbbbb")]  # fmt: skip
    assert {r["sweep"]["machine"]["host_id"] for r in recs} == {"pool:batch"}
    rows = summary_of(results)
    assert rows["00"]["hosts"] == "aaaaaaaaaaaa" and rows["03"]["hosts"] == "bbbbbbbbbbbb"
    assert "Pooled: these runs come from 2 machines of this kind" in out
    assert "Pooled: these runs come from 2 machines" in tag_markdown(results / TAG, tmp_path)

    # without the pool, the same records are another machine's: never mixed in
    monkeypatch.delenv(machine.HOST_ENV)
    code, out, _ = sweep_here(capsys, *args, "--steps", "00")
    assert code == 0 and "holds another machine's records" in out
    assert len(runs_of(results)) == 3


def test_one_host_is_not_called_pooled():
    rows = [{"status": "ok", "hosts": "aaaaaaaaaaaa"}, {"status": "ok", "hosts": "aaaaaaaaaaaa"},
            {"status": "not run", "hosts": None}]  # fmt: skip
    assert pooled_text(rows) is None
    rows.append({"status": "ok", "hosts": "aaaaaaaaaaaa,bbbbbbbbbbbb"})
    assert pooled_text(rows).startswith("Pooled: these runs come from 2 machines")
