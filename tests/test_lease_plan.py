"""harness/lease_plan.py (tools/gpu_session.sh --plan): the bounded ladder fits a lent GPU's
20-minute target, checked on the plan and on a simulated session against a simulated clock."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import lease_plan as lp
from harness.ladder import discover

ROOT = Path(__file__).resolve().parent.parent
TARGET, LEASE, BUDGET = 1200.0, 1800.0, 540.0


def default_runs(slower: float = 1.0) -> list:
    runs = [lp.expected(s, "gpt2-124m", lp.DEFAULT_GPU, []) for s in discover()]
    for r in runs:
        r.seconds *= slower
    return runs


def simulate(runs, budget=BUDGET, factor=1.0, kill_at=None):
    """A session on a simulated clock. Each call is a fresh machine (its start-up counted); only
    what the previous calls packed survives (a set of finished steps); the call is planned anew
    from the steps not packed. A run starts only when its expected seconds fit before the call's
    deadline (budget less the margin: rounds.py's --budget rule) and takes expected x `factor`;
    one still going at the deadline is stopped there, unfinished. `kill_at`: the device-clock
    second the machine is lost (a cold start mid-call): the run in flight is lost, the finished
    ones are packed (the session script's TERM trap packs). Returns (clock, call lengths, steps
    lost in flight)."""
    clock, packed, lengths, lost = 0.0, set(), [], []
    while len(packed) < len(runs):
        assert len(lengths) < 3 * len(runs), "no progress"
        todo = [r for r in runs if r.step not in packed]
        call = lp.plan(todo, budget)[0]
        start = clock
        clock += lp.MACHINE_START_S
        deadline = start + budget - lp.MARGIN_S
        for r in call.runs:
            if clock + r.seconds > deadline:
                break  # left for the next call
            end = clock + r.seconds * factor
            if kill_at is not None and clock < kill_at <= min(end, deadline):
                lost.append(r.step)
                clock, kill_at = kill_at, None
                break
            if end > deadline:
                clock = deadline  # stopped at the budget's end: not packed
                break
            clock = end
            packed.add(r.step)
        lengths.append(clock - start)
    return clock, lengths, lost


def assert_fits(clock, lengths, budget=BUDGET, target=TARGET):
    assert all(t <= budget for t in lengths), lengths
    assert clock <= target, f"{clock:.0f} s > {target:.0f} s"


def test_default_plan_is_within_20_minutes_and_every_call_within_its_budget(capsys):
    calls = lp.plan(default_runs(), BUDGET)
    assert lp.total(calls) <= TARGET
    assert all(c.seconds + lp.MARGIN_S <= c.budget for c in calls)
    assert [r.step for c in calls for r in c.runs] == [s.num for s in discover()]
    assert lp.fits(calls, TARGET, LEASE)
    assert lp.main([]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("total: ") and last.endswith("within the 20-minute target")


def test_simulated_session_completes_the_ladder_within_20_minutes():
    runs = default_runs()
    clock, lengths, lost = simulate(runs)
    assert_fits(clock, lengths)
    assert not lost
    assert len(lengths) == len(lp.plan(runs, BUDGET))  # as planned: no extra call
    clock, lengths, _ = simulate(runs, factor=1.05)  # a little slower than expected: still fits
    assert_fits(clock, lengths)


def test_a_cold_start_mid_call_loses_at_most_the_run_in_flight():
    runs = default_runs()
    first = lp.plan(runs, BUDGET)[0]
    kill = lp.MACHINE_START_S + sum(r.seconds for r in first.runs[:3]) + 10  # in the 4th run
    clock, lengths, lost = simulate(runs, kill_at=kill)
    assert lost == [first.runs[3].step]
    assert all(t <= BUDGET for t in lengths)
    # what it costs: the lost run's 10 s and one more machine start-up at most, within the lease
    plain, _, _ = simulate(runs)
    assert clock <= plain + 10 + lp.MACHINE_START_S + first.runs[3].seconds
    assert clock <= LEASE


@pytest.mark.parametrize(
    "args, sim",
    [(["--slower", "2"], {"factor": 2.0}), (["--budget", "200"], {"budget": 200.0})],
)
def test_the_check_can_fail(args, sim, capsys):
    """Runs twice as slow, or calls of 200 s: the planner says over, and the simulated session's
    fits assertion fails."""
    assert lp.main(args) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("over the 20-minute target")
    runs = default_runs(2.0 if "factor" in sim else 1.0)
    budget = sim.get("budget", BUDGET)
    with pytest.raises(AssertionError):
        assert_fits(*simulate(runs, budget=budget)[:2], budget=budget)


def test_measured_results_replace_the_model(tmp_path, capsys):
    recs = [{"step": "00", "status": "ok", "sweep": {"duration_s": 123.0}}]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    lp.main(["--results", str(tmp_path), "--steps", "00-01"])
    out = capsys.readouterr().out
    assert "00=123s*" in out and "01=42s;" in out and "* measured (--results)" in out


def test_tests_budget_is_a_first_call_of_its_own(capsys):
    calls = lp.plan(default_runs(), BUDGET, tests_budget=120)
    assert calls[0].tests and not calls[0].runs and lp.total(calls) >= 120
    lp.main(["--tests-budget", "120"])
    assert "call 1: the GPU tests, 120 s" in capsys.readouterr().out


def test_gpu_session_plan_prints_the_plan_and_exits():
    proc = subprocess.run(
        ["bash", ROOT / "tools" / "gpu_session.sh", "--plan"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("plan: gpt2-124m on NVIDIA H100 80GB HBM3")
    assert lines[-1].startswith("total: ") and "within the 20-minute target" in lines[-1]
    bad = subprocess.run(
        ["bash", ROOT / "tools" / "gpu_session.sh", "--plan", "--gpu", "no such GPU"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert bad.returncode == 2 and "not in harness/gpus.py" in bad.stderr
