"""speed_ladder/sweep/lease_plan.py (tools/gpu_session.sh --plan): the bounded ladder fits a lent
GPU's 20-minute target, checked on the plan and on a simulated session against a simulated clock."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speed_ladder.ladder import discover
from speed_ladder.sweep import lease_plan as lp

ROOT = Path(__file__).resolve().parent.parent
TARGET, LEASE, BUDGET = 1200.0, 1800.0, 540.0


def default_runs(slower: float = 1.0) -> list:
    runs = [lp.expected(s, "gpt2-124m", lp.DEFAULT_GPU, []) for s in discover()]
    for r in runs:
        r.seconds *= slower
    return runs


def simulate(runs, budget=BUDGET, factor=1.0, kill_at=None, tests=()):
    """A session on a simulated clock, as tools/gpu_session.sh runs it. Each call is a fresh
    machine (its start-up counted); only what the previous calls packed survives (a set of
    finished steps and finished tests); the call is planned anew from the steps not packed. A run
    starts only when its expected seconds fit before the call's deadline (budget less the margin:
    rounds.py's --budget rule) and takes expected x `factor`; one still going at the deadline is
    stopped there, unfinished. Then, once no run is left and 50 s remain, the GPU tests (`tests`:
    each test's seconds) run in order until the deadline: the one it cuts runs again in the next
    call (tests/budget.py's state). `kill_at`: the device-clock second the machine is lost (a
    cold start mid-call): the run or test in flight is lost, what finished is packed (the session
    script's TERM trap packs). Returns (clock, call lengths, steps and tests lost in flight)."""
    clock, packed, passed, lengths, lost = 0.0, set(), set(), [], []
    while len(packed) < len(runs) or len(passed) < len(tests):
        assert len(lengths) < 3 * (len(runs) + len(tests)), "no progress"
        todo = [r for r in runs if r.step not in packed]
        call = lp.plan(todo, budget)[0] if todo else lp.Call(0, [], budget)
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
        if len(packed) == len(runs) and deadline - clock >= 50:
            for i, t in enumerate(tests):
                if i in passed:
                    continue
                end = clock + t * factor
                if kill_at is not None and clock < kill_at <= min(end, deadline):
                    lost.append(f"test {i}")
                    clock, kill_at = kill_at, None
                    break
                if end > deadline:
                    clock = deadline  # cut: recorded cut, run again next call
                    break
                clock = end
                passed.add(i)
        lengths.append(clock - start)
    return clock, lengths, lost


# the fast GPU tests as tools/gpu_session.sh runs them (tests/test_gpu.py, `gpu and not slow`):
# lease_plan.TESTS_S spread over its 11 tests
TESTS = [lp.TESTS_S / 11] * 11


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


def test_simulated_session_with_the_gpu_tests_fits_the_lease():
    """The ladder, then the GPU tests in what is left: every call within its budget, the whole
    session within the 30-minute lease, as many calls as the plan says (the tests included)."""
    runs = default_runs()
    calls = lp.plan(runs, BUDGET, lp.TESTS_S)
    clock, lengths, lost = simulate(runs, tests=TESTS)
    assert all(t <= BUDGET for t in lengths) and not lost
    assert clock <= LEASE and len(lengths) == len(calls), (clock, lengths)
    assert abs(clock - lp.session(calls)) < 1, (clock, lp.session(calls))
    # tests that take twice as long: the one a call's end cuts runs again in a next call
    clock, lengths, _ = simulate(runs, tests=[2 * t for t in TESTS])
    assert all(t <= BUDGET for t in lengths) and clock <= LEASE


def test_a_cold_start_mid_call_loses_at_most_the_run_in_flight():
    runs = default_runs()
    first = lp.plan(runs, BUDGET)[0]
    kill = lp.MACHINE_START_S + sum(r.seconds for r in first.runs[:3]) + 10  # in the 4th run
    clock, lengths, lost = simulate(runs, kill_at=kill, tests=TESTS)
    assert lost == [first.runs[3].step]
    assert all(t <= BUDGET for t in lengths)
    # what it costs: the lost run's 10 s and one more machine start-up at most, within the lease
    plain, _, _ = simulate(runs, tests=TESTS)
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


def test_the_tests_go_after_the_ladder_in_the_last_calls_time_or_a_call_of_their_own(capsys):
    calls = lp.plan(default_runs(), BUDGET, tests=150)
    assert calls[-1].runs and calls[-1].tests == 150  # call 3 has room (tools/gpu_session.sh)
    assert lp.session(calls) == lp.total(calls) + 150
    big = lp.plan(default_runs(), BUDGET, tests=400)
    assert not big[-1].runs and big[-1].tests == 400 and len(big) == len(calls) + 1
    assert lp.total(big) == lp.total(calls)  # the ladder's total leaves the tests out
    lp.main(["--tests", "400"])
    out = capsys.readouterr().out
    assert f"call {len(big)}: then the GPU tests 400s (--tests)" in out
    assert "session: " in out


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
    assert bad.returncode == 2 and "not in speed_ladder/measure/gpus.py" in bad.stderr
