"""One GPU session in the background of a lent machine (speed_ladder/sweep/lease_session.py, the
default of `tools/gpu_session.sh --plan`, run by tools/gpu_lease.sh): the whole ladder and the
fast GPU tests fit the 15-minute lease on the committed H200 durations, with room to run the
longest run again; the plan is replayed on a simulated device clock, which fails when a limit of
the lease is broken; and gpu_lease.sh, with a stand-in for gpu_session.sh, starts the session
once, in a process session of its own, and every call brings back what is done."""

import os
import subprocess
import tarfile

import pytest
from test_lease_plan import H200, LEASE, WHOLE, runs, wall_times

from speed_ladder.sweep import lease_costs as lc
from speed_ladder.sweep import lease_plan as lp
from speed_ladder.sweep import lease_session as ls

ROOT = lp.ROOT


def background(steps=WHOLE, profile=False, tests=lc.TESTS_S):
    picked = runs(steps)
    if not profile:
        for r in picked:
            r.seconds = max(1.0, r.seconds - lc.PROFILE_S)
    return ls.Background(picked, tests, H200, LEASE, 600.0, profile, resume=True)


def simulate(bg, factor=1.0, again=None, gap=lc.GAP_S):
    """The session on a device clock: the machine starts; call 1 sends the tree, starts
    gpu_session.sh and waits; the session's set-up, then each run that the sweep's deadline
    (--budget less KEPT_S) admits on its estimate (the tag's wall time), taking its wall time x
    `factor` (`again`: that step's run twice, a rerun), cut at the deadline; the tests once no run
    is left and 50 s remain, cut 20 s before the deadline; its end. Each call waits at most
    bg.wait, archives OUT and brings it back; between calls the machine idles `gap` s while the
    session goes on, and is gone past IDLE_S. Returns (device seconds, steps done, tests done,
    problems)."""
    walls, modelled = wall_times(), {r.step: r.seconds for r in bg.runs}
    cost = {r.step: (walls.get(r.step, modelled[r.step]) - (0 if bg.profile else lc.PROFILE_S))
            for r in bg.runs}  # fmt: skip
    deadline = bg.budget() - lc.KEPT_S
    t, done, left, problems = lc.SETUP_S + lc.SWEEP_START_S, [], False, []
    for r in bg.runs:
        if t + walls.get(r.step, lc.SWEEP_GUESS_S) > deadline:
            left = True
            continue
        took = cost[r.step] * factor * (2 if r.step == again else 1)
        if t + took > deadline:
            t, left = deadline, True
            continue
        t += took + lc.BETWEEN_RUNS_S
        done.append(r.step)
    tests = False
    if not left and deadline - t >= 50:
        if t + bg.tests * factor <= deadline - 20:
            t, tests = t + bg.tests * factor, True
        else:
            t = deadline
    end = t + lc.END_LEAN_S  # the session's own seconds, from call 1's start
    clock, session, calls = H200.start_s, 0.0, 0
    while True:
        calls += 1
        clock += lc.TRANSFER_S / 2  # the tree out
        waited = min(bg.wait, max(0.0, end - session))
        command = waited + ls.BACK_S
        if command > bg.timeout:
            problems.append(f"call {calls}: killed at its timeout_s")
        clock += command + lc.TRANSFER_S / 2  # the archive back
        session += waited + ls.BACK_S + lc.TRANSFER_S
        if session >= end:
            break
        if gap > lc.IDLE_S:
            problems.append(f"call {calls + 1}: a {gap:.0f} s gap: the machine went back")
            break
        clock += gap
        session += gap  # the machine works through the gap
    return clock + lc.CLOSE_S, done, tests, problems


def test_the_whole_ladder_and_the_tests_fit_one_lease_in_the_background(capsys):
    bg = background()
    assert bg.fits() and bg.steps() == WHOLE and bg.tests == lc.TESTS_S
    assert bg.device_seconds() + bg.in_flight() == pytest.approx(833, abs=1)
    assert bg.worst() <= LEASE and bg.budget() == 824 and bg.timeout == 590 and bg.wait == 570
    clock, done, tests, problems = simulate(bg)
    assert not problems and tests and done == WHOLE.split(",")
    assert clock <= LEASE and abs(clock - bg.device_seconds()) < 20, (clock, bg.device_seconds())
    assert lp.main(["--steps", WHOLE]) == 0
    out = capsys.readouterr().out
    assert "fits: the session and a rerun of its longest run within the 15-minute lease" in out
    call = next(line for line in out.splitlines() if line.startswith("run("))
    assert call.startswith("run(kind=\"nvidia-h200\", carry=['.carry'], timeout_s=590, ")
    assert f"tools/gpu_lease.sh /tmp/s $OUT 570 {lc.FLAGS} --resume results" in call
    assert f"--steps {WHOLE} --no-profile --budget 824" in call and "--no-tests" not in call
    assert "the same call again, at once (within 30 s); 2 planned, 2 at most" in out


def test_the_background_session_has_room_for_a_rerun_and_slower_runs():
    bg = background()
    longest = max(bg.runs, key=lambda r: r.seconds).step
    for kw in ({"again": longest}, {"factor": 1.1}, {"gap": 30}):
        clock, done, tests, problems = simulate(bg, **kw)
        assert not problems and tests and done == WHOLE.split(",") and clock <= LEASE, kw


def test_the_background_session_fails_the_simulation_when_a_limit_is_broken():
    bg = background()
    clock, done, tests, problems = simulate(bg, factor=1.5)  # far slower: the budget cuts it
    assert not tests or len(done) < len(bg.runs)
    assert clock <= LEASE  # ... but never past the lease
    assert "the machine went back" in " ".join(simulate(bg, gap=45)[3])
    with_profile = background(profile=True)  # the profile's 4.5 s a run: 5 s over
    assert not with_profile.fits()
    assert with_profile.device_seconds() + with_profile.in_flight() - LEASE == pytest.approx(
        5, abs=1
    )
    assert background("08,09,10,11,12,13,14", profile=True).fits()  # the top rungs, profiled


def lease(out, back, wait, env, *flags):
    return subprocess.run(
        ["bash", ROOT / "tools" / "gpu_lease.sh", out, back, str(wait), *flags],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip


def test_gpu_lease_starts_the_session_once_and_each_call_brings_back_what_is_done(tmp_path):
    fake = tmp_path / "fake_session.sh"  # a stand-in for gpu_session.sh: its folder, its status
    fake.write_text(
        '#!/usr/bin/env bash\nout=$1; shift; echo "flags: $*" >> "$out/started"\n'
        'echo "sweep: running" > "$out/status.txt"; sleep 3\n'
        'echo "sweep: ok" > "$out/status.txt"; exit 3\n'
    )
    fake.chmod(0o755)
    env, out = {"GPU_SESSION": str(fake)}, tmp_path / "s"
    first = lease(out, tmp_path / "b1", 1, env, "--steps", "00")
    assert first.returncode == 4, first.stdout + first.stderr  # still running: call again
    assert "started: fake_session.sh" in first.stdout
    assert (tmp_path / "b1" / "status.txt").read_text() == "sweep: running\n"
    second = lease(out, tmp_path / "b2", 20, env, "--steps", "00")
    assert second.returncode == 3, second.stdout + second.stderr  # the session's own exit
    assert "already started" in second.stdout and "has ended (exit 3)" in second.stdout
    assert (out / "started").read_text() == "flags: --steps 00\n"  # started once
    with tarfile.open(tmp_path / "b2" / "session.tgz") as tar:
        assert "./status.txt" in tar.getnames()
        assert tar.extractfile("./status.txt").read() == b"sweep: ok\n"
    assert lease(out, tmp_path / "b3", 1, env).returncode == 3  # ended: it says so again
    assert lease(out, tmp_path / "b4", "soon", env).returncode == 2
    gone = tmp_path / "g"  # started here, gone without a status (the machine lost it)
    gone.mkdir()
    (gone / ".lease-pid").write_text("999999\n")
    assert lease(gone, tmp_path / "b5", 1, env).returncode == 5
