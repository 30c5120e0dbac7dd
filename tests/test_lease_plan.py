"""speed_ladder/sweep/lease_plan.py (tools/gpu_session.sh --plan) against the 15-minute lease: the
durations come from the committed H200 tag, and the plan is replayed as a simulated session under
the lease's limits (start-up, the per-command cap, idle release between calls, the device-time
budget, transfers), which fails when one is broken."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from speed_ladder.ladder import Step, discover
from speed_ladder.records import file_sha256, read_jsonl
from speed_ladder.sweep import lease_costs as lc
from speed_ladder.sweep import lease_plan as lp

ROOT = Path(__file__).resolve().parent.parent
TAG = ROOT / "results" / "nvidia-h200-x1"
H200 = lc.KINDS["nvidia-h200"]
LEASE, CAP, MARGIN = 900.0, 600.0, lc.KEPT_S  # MARGIN: what gpu_session.sh keeps after a phase
SWEEP_ROUGH_S = 86.0  # the sweep's own guess for a step it never ran (60 s + step 08's compile)
BLIND_S = {False: 60.0, True: 120.0}  # its guess with no record at all (preflight: rough+compile)


def wall_times() -> dict[str, float]:
    """Each step's sweep wall time in the committed tag, read here independently of the plan."""
    took: dict[str, list] = {}
    for r in read_jsonl(TAG / "runs.jsonl"):
        if r.get("status") == "ok":
            took.setdefault(r["step"], []).append(r["sweep"]["duration_s"])
    return {k: statistics.median(v) for k, v in took.items()}


def runs(steps=None, recs=None):
    """The lease costs of `steps` (default WHOLE, the ladder through 14: these tests were made for
    it; the rungs after it are planned in test_the_ladder_with_15_needs_two_leases)."""
    recs = read_jsonl(TAG / "runs.jsonl") if recs is None else recs
    steps = WHOLE if steps is None else steps
    pick = discover() if steps == "all" else [s for s in discover() if s.num in steps.split(",")]
    return [lc.run_seconds(s, recs, H200) for s in pick]


def simulate(session, extra=None, factor=1.0, gaps=None, lose=None, cut=None):
    """The session on a device clock, as the lease and tools/gpu_session.sh run it. A machine
    starts (its start-up counted); each call sends the tree and brings its archive back
    (TRANSFER_S), runs gpu_session.sh: set-up, then each run starts only when the sweep's expected
    seconds fit before the deadline (--budget less 45 s), takes its measured wall time x `factor`,
    and one still going at the deadline is cut; the tests run once no run is left and 50 s remain,
    cut at the deadline; then the summary and pack. A command past its timeout_s is killed. Between
    calls the machine idles `gaps[i]` s; past IDLE_S it is gone (a fresh start, /tmp lost). Every
    run takes the tag's wall time, its step-50 evaluation included (the plan counts on its removal).
    `lose`: the number of a call whose machine is lost at its end: its pack does not come back, and
    the call runs again whole on a fresh machine. `cut`: (call number, step): that call is stopped
    half-way through that step's run, it comes back, and the same call runs again at once on the
    warm machine, the finished steps skipped. Returns (device seconds, command seconds, steps done,
    tests done, problems)."""
    walls = wall_times()
    modelled = {r.step: r.seconds for c in session.calls for r in c.runs}
    clock, commands, done, tests_done, problems = H200.start_s, [], [], False, []
    calls = [*session.calls, *([extra] if extra else [])]
    queue = [(c, i) for i, c in enumerate(calls)]
    fresh, kept, rerun = True, [], False  # fresh: the whole set-up; kept: --resume's runs
    informed = set()  # the folders the tag's records were resumed into
    while queue:
        call, i = queue.pop(0)
        if commands and not fresh:
            gap = (gaps or {}).get(i, lc.GAP_S)
            clock += min(gap, lc.IDLE_S)
            if gap > lc.IDLE_S:
                problems.append(f"call {call.number}: a {gap:.0f} s gap: the machine went back")
                clock += H200.start_s
        clock += lc.TRANSFER_S / 2  # the tree out; the archive back below
        informed |= {call.out} if call.resume else set()
        t = lc.SETUP_AGAIN_S if (call.again or rerun) and not fresh else lc.SETUP_S
        rerun = False
        deadline, left, stopped, fresh = call.budget - MARGIN, False, False, False
        if call.runs:
            t += lc.SWEEP_START_S
            for r in call.runs:
                if r.step in kept:  # --resume: a finished run is kept and skipped
                    kept.remove(r.step)
                    continue
                if cut == (call.number, r.step):  # stopped half-way: the pack comes back
                    t += walls.get(r.step, modelled.get(r.step)) * factor / 2
                    stopped = True
                    break
                # the sweep's estimate: the tag's records of the step, any script version,
                # where the folder holds them (--resume results, or its own earlier run)
                if call.resume or call.out in informed or r.step in done:
                    expected = walls.get(r.step, SWEEP_ROUGH_S)
                else:
                    expected = BLIND_S[r.compiled]
                if t + expected > deadline:
                    left = True
                    continue
                took = walls.get(r.step, modelled.get(r.step)) * factor
                if t + took > deadline:
                    t, left = deadline, True
                    continue
                t += took + lc.BETWEEN_RUNS_S
                done.append(r.step)
        if call.tests and not left and not stopped and deadline - t >= 50:
            if t + call.tests * factor <= deadline - 20:
                t += call.tests * factor
                tests_done = True
            else:
                t = deadline
        t += lc.END_LEAN_S
        if t > call.timeout:
            problems.append(f"call {call.number}: killed at its timeout_s {call.timeout}")
            t = call.timeout
        if call.timeout > CAP:
            problems.append(f"call {call.number}: timeout_s {call.timeout} over the cap")
        commands.append(t)
        clock += t + lc.TRANSFER_S / 2
        if lose == call.number:  # lost: nothing came back; the same call on a fresh machine
            lose, fresh = None, True
            done = [s for s in done if s not in call.steps().split(",")]
            tests_done = tests_done and not call.tests
            clock += lc.IDLE_S + H200.start_s
            queue.insert(0, (call, i))
        if stopped:  # the same call again on the warm machine: only what did not finish
            cut, rerun = None, True
            kept = [r.step for r in call.runs if r.step in done]
            queue.insert(0, (call, i))
    clock += lc.CLOSE_S
    return clock, commands, done, tests_done, problems


def assert_within(session, extra=None, **kw):
    clock, commands, done, tests_done, problems = simulate(session, extra, **kw)
    assert not problems, problems
    assert clock <= LEASE, f"{clock:.0f} s of device time > {LEASE:.0f} s"
    assert all(t <= CAP for t in commands), commands
    planned = [r.step for c in [*session.calls, *([extra] if extra else [])] for r in c.runs]
    assert sorted(done) == sorted(planned), (done, planned)
    assert tests_done or not any(c.tests for c in session.calls), "the GPU tests did not finish"
    return clock


WHOLE = "00,01,02,03,04,05,06,07,08,09,10,11,12,13,14"
# what fits as calls with the profile and the GPU tests where 00-03 are current: dropped
FITS = "04,05,06,07,08,09,10,11,12,13,14"


def fitting_session(steps=FITS):
    session = lp.plan(runs(steps), lc.TESTS_S, H200, LEASE, CAP, resume=True)
    return session, lp.extra_call(session, runs("08,09"), 2, CAP)


def test_the_durations_are_the_committed_h200_tags_wall_times_less_the_mid_run_evaluation():
    recs = read_jsonl(TAG / "runs.jsonl")
    by_step = {r.step: r for r in runs()}
    walls = wall_times()
    assert set(walls) == set(by_step) - {"11", "14"}  # 13 steps measured, 11 and 14 not
    evals = {}
    for num, wall in walls.items():  # the sweep's wall time, not the step's own duration_s
        evals[num] = wall - by_step[num].seconds
        assert by_step[num].source == "measured" and 0.1 < evals[num] < 0.8, (num, evals[num])
    assert evals["00"] == pytest.approx(10 * 220.138 / 3 / 1000)  # 10 eager fp32 forwards
    assert evals["08"] == pytest.approx(10 * 26.759 / 3 * 1.75 / 1000)  # compiled: eval eager
    assert sum(walls.values()) == pytest.approx(490.8, abs=0.1)
    assert sum(evals.values()) == pytest.approx(5.2, abs=0.1)
    assert sum(r["duration_s"] for r in recs) == pytest.approx(375.6, abs=0.1)  # the 376
    assert by_step["11"].seconds == pytest.approx(walls["10"] * 1.1 - evals["10"])  # ladder.json
    assert by_step["14"].seconds == pytest.approx(1.1 * walls["13"] - evals["13"])
    assert by_step["11"].mark == by_step["14"].mark == "~"


def test_a_step_measured_nowhere_is_assumed_and_flagged(tmp_path, capsys):
    future = tmp_path / "15_new_rung.py"
    future.write_text('"""Step 15: a new rung."""\n')
    run = lc.run_seconds(Step("15", future, "a new rung", False), [], H200)
    assert (run.seconds, run.source, run.mark) == (lc.ASSUMED_RUN_S, "assumed", "?")
    # an empty tag: every step assumed, said in the plan, never a KeyError
    (tmp_path / "runs.jsonl").write_text('{"step": "00", "status": "ok", "sweep": {"dur')  # torn
    assert lp.main(["--results", str(tmp_path), "--extra", "", "--profile", "--steps", WHOLE]) == 1
    out = capsys.readouterr().out
    assert "0 ok runs" in out and "? assumed: measured nowhere, 90 s" in out
    assert "00=90s?" in out


def test_as_calls_that_each_run_a_part_the_whole_ladder_does_not_fit(capsys):
    """Calls that each run a part of the work (the fallback), with the profile: two calls on one
    warm machine, each under the cap, the leanest set-up and pack: 857 s planned, and a reserve
    of 145 s to finish a cut call on the warm machine; the background session is 5 s over too."""
    assert lp.main(["--profile", "--steps", WHOLE]) == 1
    out = capsys.readouterr().out
    assert out.startswith("plan: gpt2-124m on nvidia-h200 (NVIDIA H200); lease 900 s")
    assert "does not fit in the background (5 s over with a rerun of its longest run" in out
    whole = lp.plan(runs(), lc.TESTS_S, H200, LEASE, CAP)
    assert [c.steps() for c in whole.calls] == [WHOLE[:35], "12,13,14"]
    assert [c.again for c in whole.calls] == [False, True]
    assert whole.device_seconds() == pytest.approx(857, abs=1)
    assert "does not fit: 102 s over the 900 s lease with the reserve (43 s left without" in out
    assert "to fit, drop" not in out  # no record is of the scripts as they are now
    with pytest.raises(AssertionError, match="device time"):
        assert_within(whole, cut=(1, "11"))  # the simulated session agrees: a cut is over


def test_the_reserve_is_a_resumed_call_not_the_whole_call_again():
    session, _ = fitting_session()
    longest = max(r.seconds for c in session.calls for r in c.runs)
    assert session.in_flight() == longest  # step 14's run, longer than any one test
    assert session.reserve() == pytest.approx(lc.GAP_S + lc.TRANSFER_S + lc.SETUP_AGAIN_S
                                              + lc.SWEEP_START_S + longest + lc.BETWEEN_RUNS_S
                                              + lc.END_LEAN_S)  # fmt: skip
    assert session.reserve() < session.longest().seconds  # the old reserve: the call again
    # call 1 stopped half-way through step 12's run: it came back, and the same call again on
    # the warm machine runs 12, 13 and 14 only; everything done, within the lease
    clock, _, done, tests_done, problems = simulate(session, cut=(1, "12"))
    assert not problems and tests_done and sorted(done) == FITS.split(",")
    assert done.count("09") == 1 and clock <= LEASE
    assert clock - simulate(session)[0] < session.reserve()


def current_tag(tmp_path, but=()):
    """The committed tag with each record's script sha256 made the file's as it is now (as a
    sweep of these scripts would have written it), but for the steps in `but`."""
    files = {s.num: file_sha256(s.path) for s in discover()}
    lines = []
    for r in read_jsonl(TAG / "runs.jsonl"):
        if r["step"] not in but:
            r["sweep"]["script_sha256"] = r["script_sha256"] = files[r["step"]]
        lines.append(json.dumps(r))
    (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_a_record_of_another_version_of_the_script_is_not_current(tmp_path):
    """Commit 870e67d changed every step file: the H200 records give durations, not results."""
    recs = read_jsonl(TAG / "runs.jsonl")
    assert not any(r.current for r in runs(recs=recs))  # durations measured, no step current
    assert sum(r.source == "measured" for r in runs(recs=recs)) == 13
    step = next(s for s in discover() if s.num == "05")
    copy = tmp_path / step.path.name
    copy.write_bytes(step.path.read_bytes())
    mine = Step("05", copy, step.title, step.distributed)  # a ladder of this copy
    rec = json.loads(json.dumps(next(r for r in recs if r["step"] == "05")))
    rec["sweep"]["script_sha256"] = file_sha256(copy)  # a record of this very file
    assert lc.is_current(mine, [rec], H200) and lc.run_seconds(mine, [rec], H200).current
    assert not lc.is_current(mine, [rec], lc.KINDS["nvidia-h100-x1"])  # another GPU's
    other = json.loads(json.dumps(rec))
    other["sweep"]["config"]["preset"] = "gpt2-medium"
    assert not lc.is_current(mine, [other], H200)  # another configuration
    copy.write_text(copy.read_text() + "# changed\n")  # the file changes: the record is old
    assert not lc.is_current(mine, [rec], H200)
    assert lc.run_seconds(mine, [rec], H200).source == "measured"  # its duration still counts


def test_a_current_record_counts_as_measured_and_can_be_dropped(tmp_path, capsys):
    """As calls with the profile (the background session runs every step it is asked for)."""
    assert lp.main(["--results", str(current_tag(tmp_path)), "--profile", "--steps", WHOLE]) == 1
    out = capsys.readouterr().out
    assert "to fit, drop steps 00,01,02,03 " in out and "leases" not in out
    assert f"the session that fits, --steps {FITS}:" in out
    assert f"--resume results --steps {FITS[:-3]} --no-tests --budget 560" in out
    # step 05 of another version: it is run again, never dropped
    assert (
        lp.main(
            ["--results", str(current_tag(tmp_path, but=("05",))), "--profile", "--steps", WHOLE]
        )
        == 1
    )
    out = capsys.readouterr().out
    drop = out.split("to fit, drop steps ")[1].split(" ")[0].split(",")
    assert "05" not in drop and "05=" in out.split("the session that fits")[1]


def two_leases():
    leases = lp.split(runs(), lc.TESTS_S, H200, LEASE, CAP, resume=True)
    return leases, lp.extra_call(leases[-1], runs("08,09"), 2, CAP)


def test_as_calls_the_whole_ladder_and_the_tests_split_into_two_leases_that_each_fit(capsys):
    """The fallback with the profile: lease A 00-12 and the tests, lease B 13 and 14 and the
    extra round of 08 and 09."""
    (a, b), extra = two_leases()
    assert [c.steps() for c in a.calls] == [WHOLE[:35], "12"] and a.calls[1].tests
    assert [c.steps() for c in b.calls] == ["13,14"] and not any(c.tests for c in b.calls)
    assert [c.number for c in [*a.calls, *b.calls, extra]] == [1, 2, 3, 4]
    assert a.calls[0].resume and b.calls[0].resume  # A: the tag's durations, B: A's records too
    assert a.fits() and b.fits() and extra is not None and extra.steps() == "08,09"
    assert a.device_seconds() + a.reserve() == pytest.approx(807, abs=1)
    assert a.device_seconds(worst=True) == pytest.approx(840, abs=1)  # each call to its budget
    assert_within(a)
    assert_within(a, cut=(1, "11"))  # cut mid-way through A's longest run: again, still fits
    assert_within(a, factor=1.1)
    assert_within(b, extra)
    assert_within(b, cut=(3, "14"))
    with pytest.raises(AssertionError, match="device time"):  # one session of both: over
        assert_within(lp.Session([*a.calls, *b.calls], H200, LEASE))
    assert lp.main(["--profile", "--steps", WHOLE]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        "current in results/nvidia-h200-x1 (an ok NVIDIA H200 record of the file's sha256 now, "
        "gpt2-124m): no step; nothing can be left out"
    ) in out
    assert "2 leases (sessions of their own, 15 minutes each):" in out
    assert f"lease A: --steps {WHOLE[:38]}, then the GPU tests:" in out
    assert "lease B: --steps 13,14 (once lease A's records are committed to " in "\n".join(out)
    calls = [line.strip() for line in out if line.strip().startswith("run(")]
    assert len(calls) == 4 and sum(line.strip() == "give_back()" for line in out) == 2
    # --budget 540: room for the sweep's own estimate of 11 (86 s, no record) after 00-10
    assert f"--resume results --steps {WHOLE[:35]} --no-tests --budget 540" in calls[0]
    assert "--resume" not in calls[1] and "/tmp/s --" in calls[1]  # the same folder, warm
    assert "--steps 12 --budget 210" in calls[1]
    assert "--resume results --steps 13,14 --no-tests --budget 260" in calls[2]
    assert "/tmp/e " in calls[3] and "--steps 08,09 --repeats 2 --no-control" in calls[3]
    for line in calls:
        assert len(line.split('command="', 1)[1].rstrip('")')) <= 2000
        assert int(line.split("timeout_s=")[1].split(",")[0]) <= CAP


def test_the_simulated_session_fits_the_lease_with_its_reserve():
    session, extra = fitting_session()
    assert session.fits() and extra is None  # no time left for the extra round
    assert ",".join(c.steps() for c in session.calls) == FITS and session.calls[-1].tests
    plain = assert_within(session)
    assert abs(plain - session.device_seconds()) < 15, (plain, session.device_seconds())
    assert_within(session, cut=(2, "14"))  # the longest run cut: again on the warm machine
    assert_within(session, cut=(1, "09"))
    assert_within(session, factor=1.1)  # 10% slower than measured: the budgets hold it
    short, extra = fitting_session("11,14")  # a shorter session: the extra 08/09 round too
    assert extra is not None and extra.out == "/tmp/e"
    assert_within(short, extra)
    assert_within(short, cut=(1, "14"))


def test_the_simulated_session_fails_when_a_limit_is_broken():
    session, _ = fitting_session()
    with pytest.raises(AssertionError):  # everything twice as slow: runs or tests left
        assert_within(session, factor=2.0)
    with pytest.raises(AssertionError, match="the machine went back"):
        assert_within(session, gaps={1: 45})  # 45 s between the calls
    with pytest.raises(AssertionError, match="device time"):
        assert_within(session, lose=1)  # a machine lost mid-call: not covered, said
    short, extra = fitting_session("11,14")
    with pytest.raises(AssertionError, match="device time"):
        assert_within(short, extra, lose=1)  # a lost call 1, then the extra round: over
    big = SimpleNamespace(calls=[lp.Call(1, runs("08,09,10,11,12,13,14"), lc.TESTS_S)])
    with pytest.raises(AssertionError, match="over the cap"):  # one call of everything
        assert_within(big)


def test_the_h100_plan_says_its_numbers_are_assumed_and_does_not_fit(capsys):
    assert lp.main(["--kind", "nvidia-h100-x1"]) == 1
    out = capsys.readouterr().out
    assert "assumed: runs 1.2x the H200's, a cold start; start-up 90 s" in out
    assert "no nvidia-h100-x1 run is measured" in out and "run(" not in out


@pytest.mark.parametrize("args", [["--lease", "0"], ["--steps", "99"], ["--tests", "-1"]])
def test_bad_input_is_one_error_line(args, capsys):
    assert lp.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_gpu_session_plan_defaults_to_the_15_minute_lease():
    def plan(*args):
        return subprocess.run(
            ["bash", ROOT / "tools" / "gpu_session.sh", "--plan", *args], capture_output=True,
            text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable},
        )  # fmt: skip

    proc = plan("--steps", WHOLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lease 900 s of device time, commands of at most 600 s" in proc.stdout
    assert "one session in the background (tools/gpu_lease.sh), without --profile" in proc.stdout
    proc = plan("--profile", "--steps", WHOLE)
    assert proc.returncode == 1 and "does not fit in the background" in proc.stdout
    proc = plan("--steps", FITS, "--profile")
    assert proc.returncode == 0 and "fits: " in proc.stdout, proc.stdout + proc.stderr
    bad = plan("--kind", "no-such-kind")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_the_ladder_with_15_to_17_needs_two_leases(capsys):
    """Rungs 15, 16 and 17 (~58 s each, modelled as 12's run) take the whole ladder past one
    lease in the background: the plan says so, and splits it into two leases that each fit, the
    second starting where the first's records end."""
    rc = lp.main(["--steps", "all"])
    out = capsys.readouterr().out
    assert "does not fit in the background (" in out and "17=58s~" in out
    assert "2 leases (sessions of their own, 15 minutes each):" in out
    assert f"lease A: --steps {WHOLE[:41]}, then the GPU tests:" in out
    assert "lease B: --steps 14,15,16,17 (once lease A's records are committed" in out
    assert rc == 1  # not one lease: the exit says so
    leases = lp.split(runs("all"), lc.TESTS_S, H200, LEASE, CAP, resume=True)
    assert len(leases) == 2 and all(lease.fits() for lease in leases)  # with the profile
    assert leases[1].calls[-1].steps().endswith("14,15,16,17")
