"""tools/gpu_session.sh on a CPU (tiny preset, a few steps): the offline set-up, the sweep and the
GPU tests (skipped without CUDA) into one folder, --budget, the archive (--pack) and a rerun that
goes on from it (--resume), the wheels, a signal, bad flags; the sweep's two passes (the lower
rungs once, the top ones in rounds with the A/A control) and the summary they make together;
the peer (--peer) beside the sweep's results; and the plan of a 15-minute session on the
committed H200 durations."""

import json
import os
import re
import shutil
import statistics
import sys
import tarfile
import time
import zipfile

import pytest
from conftest import BPE, ROOT, VERDICT, records, run_script
from test_peer_tool import STAND_IN

SCRIPT = ["bash", ROOT / "tools" / "gpu_session.sh"]
TINY = ["--device", "cpu", "--preset", "tiny", "--max-steps", 3, "--warmup-steps", 1,
        "--data", VERDICT, "--bpe", BPE, "--no-plots", "--no-profile"]  # fmt: skip


def needs(*what):
    if not shutil.which("bash") or ("bpe" in what and not BPE.is_dir()):
        pytest.skip("needs bash and the offline BPE files")


def status_of(out) -> list[str]:
    return (out / "status.txt").read_text().splitlines()


def test_one_command_sets_up_offline_runs_the_ladder_packs_and_a_rerun_goes_on(tmp_path):
    """Offline (no tiktoken cache, no offline folder but the one the script stages from --data
    and --bpe): the sweep, then the tests, in one folder and one archive. A rerun from that
    archive keeps what is done; one whose --budget cannot fit the next run leaves it (exit 3)
    and packs; the next runs no test again."""
    needs("bpe")
    env = {"PYTHON": sys.executable, "TIKTOKEN_CACHE_DIR": None, "SPEED_LADDER_HOST_ID": "smoke",
           "SPEED_LADDER_SHARED": str(tmp_path / "nothing")}  # fmt: skip
    default_text = ROOT / "data" / "middlemarch.txt"  # read by every later test that wants it
    before = default_text.read_bytes() if default_text.is_file() else None
    one = tmp_path / "one"
    proc = run_script([*SCRIPT, one, *TINY, "--steps", "00", "--budget", 280, "--pack",
                       tmp_path / "one.tgz"], timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (default_text.read_bytes() if default_text.is_file() else None) == before
    for name in ["session.log", "versions.txt", "pip-freeze.txt", "nvidia-smi.txt", "sweep.log",
                 "pytest-gpu.log", "pytest-gpu.xml"]:  # fmt: skip
        assert (one / name).is_file(), name
    assert (one / "offline" / "data" / "gpt2_bpe" / "vocab.bpe").is_file()
    status = [ln for ln in status_of(one) if not ln.startswith("liger: ")]
    assert status[0] == "sweep: ok", status
    assert re.fullmatch(r"tests: ok \(0 passed, (\d+) skipped\)", status[1]), status
    assert int(status[1].split()[-2]) >= 8 and len(status) == 2
    sweep_log = (one / "sweep.log").read_text()
    assert "expected duration: about" in sweep_log and "budget: " in sweep_log
    (runs,) = list((one / "results").glob("*/runs.jsonl"))
    rec = json.loads(runs.read_text().splitlines()[-1])
    assert (rec["status"], rec["step"], rec["preset"]) == ("ok", "00", "tiny")
    assert rec["sweep"]["machine"]["host_id"] == "pool:smoke"
    with tarfile.open(tmp_path / "one.tgz") as tar:
        names = tar.getnames()
    assert f"./results/{runs.parent.name}/runs.jsonl" in names and "./status.txt" in names
    assert not [n for n in names if n.startswith("./offline")]

    # from the archive, a budget too short for step 08's compiled run: 00 is kept, 08 left
    two = tmp_path / "two"
    proc = run_script([*SCRIPT, two, *TINY, "--steps", "00,08", "--budget", 130, "--resume",
                       tmp_path / "one.tgz", "--pack", tmp_path / "two.tgz"],
                      timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "up to date" in proc.stdout
    status = [ln for ln in status_of(two) if not ln.startswith("liger: ")]
    assert status[0].startswith("sweep: partial (not run, --budget") and "step 08" in status[0]
    assert status[1] == "tests: not started (the sweep has runs left)"
    assert not (two / ".resume").exists()
    with tarfile.open(tmp_path / "two.tgz") as tar:
        assert tar.extractfile(f"./results/{runs.parent.name}/runs.jsonl").read() == (
            runs.read_bytes()
        )

    # a resumed run with the sweep done runs the GPU tests again (skipped without CUDA)
    proc = run_script([*SCRIPT, tmp_path / "three", "--no-sweep", "--data", VERDICT, "--bpe", BPE,
                       "--resume", two], timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    status = [ln for ln in status_of(tmp_path / "three") if not ln.startswith("liger: ")]
    assert re.fullmatch(r"tests: ok \(0 passed, (\d+) skipped\)", status[-1]), status
    assert (tmp_path / "three" / "results" / runs.parent.name / "runs.jsonl").is_file()


def _wheel(folder, name: str) -> None:
    """A wheel of one empty module `name`."""
    info = f"{name}-0.0.1.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-0.0.1-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def test_wheels_of_missing_packages_go_to_out_site_and_liger_is_said(tmp_path):
    """--wheels installs, offline, what this Python lacks into OUT/site (on PYTHONPATH for the
    sweep and the tests); a wheel of an installed package is left. status.txt says whether step
    12 has Liger's kernel or falls back."""
    needs()
    _wheel(tmp_path / "wheels", "speed_ladder_smoke")
    _wheel(tmp_path / "wheels", "pytest")  # installed: left alone
    out = tmp_path / "s"
    proc = run_script([*SCRIPT, out, "--no-sweep", "--no-tests", "--wheels", tmp_path / "wheels"],
                      timeout=120, env={"PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    status = status_of(out)
    assert "wheels: ok (speed_ladder_smoke-0.0.1-py3-none-any.whl into OUT/site)" in status
    assert (out / "site" / "speed_ladder_smoke" / "__init__.py").is_file()
    assert not (out / "site" / "pytest").exists()
    (liger,) = [ln for ln in status if ln.startswith("liger: ")]
    try:
        import liger_kernel  # noqa: F401

        assert liger.startswith("liger: ok (liger-kernel ")
    except ImportError:
        assert liger.startswith("liger: missing (ModuleNotFoundError: No module named 'liger")
        assert "step 12 runs step 11's PyTorch loss instead" in liger


@pytest.mark.slow
def test_stopped_by_a_signal_it_still_packs_what_it_finished(tmp_path):
    """SIGTERM to the whole process group (the log's tee included) while the sweep runs, as a
    batch scheduler ends a job: the archive is still written, with the finished runs.
    Slow (~30 s on a 2-core CPU: real steps)."""
    import os
    import signal
    import subprocess
    import time

    needs("bpe")
    out, pack = tmp_path / "s", tmp_path / "back" / "s.tgz"
    proc = subprocess.Popen(
        [*map(str, SCRIPT), str(out), *map(str, TINY), "--steps", "00-03", "--no-tests",
         "--pack", str(pack)],
        env=dict(os.environ, PYTHON=sys.executable), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("results/*/runs.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.5)  # the first step's record is in
        assert proc.poll() is None, "the run ended before it could be stopped"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with tarfile.open(pack) as tar:
        status = tar.extractfile("./status.txt").read().decode()
        (runs,) = [n for n in tar.getnames() if n.endswith("/runs.jsonl")]
        assert b'"step": "00"' in tar.extractfile(runs).read()
    assert "session: stopped by a signal" in status


def test_the_lower_rungs_run_once_then_the_top_ones_in_rounds_into_one_summary(tmp_path):
    """Without --steps: a first pass runs --once's steps once, a second --rounds' in --repeats
    rounds with the A/A control (its first step twice a round), into one results folder; the
    summary the second writes pairs a step of one round with its base's round 1, gives two-round
    steps an interval, and takes its noise floor from the control. The ladder of fixture
    scripts: each run takes a moment."""
    needs()
    out = tmp_path / "s"
    fixture = ROOT / "tests" / "fixtures" / "ladder_ok"
    proc = run_script([*SCRIPT, out, "--device", "cpu", "--ladder-dir", fixture, "--once", "00",
                       "--rounds", "01-03", "--no-tests", "--no-profile", "--no-plots"],
                      timeout=300, env={"PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    log = (out / "session.log").read_text()
    passes = [ln for ln in log.splitlines() if ln.startswith("== python -m speed_ladder run")]
    assert len(passes) == 2, passes
    assert passes[0].endswith("--steps 00 --repeats 1 --no-control ")
    assert passes[1].endswith("--steps 01-03 --repeats 2 ")
    (runs,) = list((out / "results").glob("*-x1/runs.jsonl"))
    rounds = [(r["step"], r["sweep"]["round"], bool(r["sweep"].get("control")))
              for r in records(runs)]  # fmt: skip
    assert rounds == [("00", 1, False)] + [
        (s, k, c) for k in (1, 2) for s, c in [("01", False), ("01", True), ("02", False),
                                               ("03", False)]
    ]  # fmt: skip
    import pandas as pd

    df = pd.read_csv(runs.parent / "summary.csv", dtype={"step": str, "prev_step": str})
    row = {r["step"]: r for r in df.to_dict("records")}
    assert [row[s]["runs"] for s in ("00", "01", "02", "03")] == [1, 2, 2, 2]
    assert row["01"]["prev_step"] == "00" and row["01"]["verdict"] == "one round: no interval"
    assert row["03"]["prev_step"] == "02" and row["03"]["gain_vs_prev_lo"] > 0  # two rounds
    assert row["03"]["noise_source"].startswith("A/A control: step 01 run twice per round")
    assert [ln for ln in status_of(out) if not ln.startswith("liger: ")] == ["sweep: ok"]


def _peer_out(tmp_path, tps: float) -> tuple:
    """An OUT folder to resume from (--resume), whose tag holds ok runs of every rung the peers
    compare with, at `tps` tok/s, as the sweep on this machine would record them on tiny with
    2 warm-up and 10 timed steps; and the stand-in peer's source."""
    sys.path.insert(0, str(ROOT / "tools"))
    import peer_compare
    import torch

    from speed_ladder import machine

    src = tmp_path / "01_opt_single_gpu.py"
    src.write_text(STAND_IN)
    done = tmp_path / "done"
    tag = done / "results" / "cpu-test-x1"
    tag.mkdir(parents=True)
    (done / "status.txt").write_text("sweep: ok\n")
    fp = machine.of_device(torch.device("cpu"))  # SPEED_LADDER_HOST_ID=smoke: pool:smoke
    steps = {s.num for dropout in (False, True) for s in peer_compare.rungs_for(dropout)}
    runs = [{"step": n, "status": "ok", "tokens_per_sec": tps, "preset": "tiny", "batch_size": 8,
             "context_length": 32, "timed_steps": 10, "spec": {"warmup_steps": 2},
             "machine": fp, "sweep": {"round": 1}} for n in sorted(steps)]  # fmt: skip
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    return done, src, sorted(steps)


def test_the_peers_run_beside_the_sweeps_results_and_a_rerun_skips_them(tmp_path, monkeypatch):
    """--peer: both peers made from the stand-in with the sweep's preset and length, run on this
    CPU, each record in the tag folder's peer.jsonl and OUT/peer.txt comparing them with the
    rungs of their model; a rerun into the same folder finds them recorded; a --budget too short
    for a peer leaves both for a rerun (exit 3) and the tests not started."""
    needs("bpe")
    monkeypatch.setenv("SPEED_LADDER_HOST_ID", "smoke")
    done, src, steps = _peer_out(tmp_path, tps=1e6)
    env = {"PYTHON": sys.executable, "TIKTOKEN_CACHE_DIR": None, "SPEED_LADDER_HOST_ID": "smoke"}
    flags = ["--no-sweep", "--device", "cpu", "--preset", "tiny", "--max-steps", 12,
             "--warmup-steps", 2, "--data", VERDICT, "--bpe", BPE, "--peer", src]  # fmt: skip
    out = tmp_path / "s"
    # a time-to-loss sweep's tag in the same folder, its records the newest: no peer lands there
    to_loss = out / "results" / "cpu-test-to-loss-x1" / "runs.jsonl"
    to_loss.parent.mkdir(parents=True)
    to_loss.write_text((done / "results" / "cpu-test-x1" / "runs.jsonl").read_text())
    os.utime(to_loss, (time.time() + 3600,) * 2)
    for rerun in (False, True):
        proc = run_script([*SCRIPT, out, *flags, "--no-tests", "--resume", done], timeout=300,
                          env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        peers = records(out / "results" / "cpu-test-x1" / "peer.jsonl")
        assert not (out / "results" / "cpu-test-to-loss-x1" / "peer.jsonl").exists()
        assert [(p["peer"], p["preset"], p["timed_steps"]) for p in peers] == [
            ("peer", "tiny", 10), ("peer-no-dropout", "tiny", 10)
        ]  # fmt: skip
        text = (out / "peer.txt").read_text()
        ratios = [float(x) for x in re.findall(r": ([\d.]+)x(?: \[.*\])? the peer's", text)]
        assert ratios == [
            pytest.approx(1e6 / peers[0]["tokens_per_sec"], rel=1e-3),
            *[pytest.approx(1e6 / peers[1]["tokens_per_sec"], rel=1e-3)] * (len(steps) - 1),
        ], text
        (line,) = [ln for ln in status_of(out) if ln.startswith("peers: ")]
        assert line.startswith(f"peers: ok (step {steps[0]} ") and line.endswith("see peer.txt)")
        assert ("up to date: " in proc.stdout) is rerun  # recorded: not run again

    short = tmp_path / "short"
    proc = run_script([*SCRIPT, short, *flags, "--resume", done, "--budget", 60], timeout=300,
                      env=env)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    status = [ln for ln in status_of(short) if not ln.startswith("liger: ")]
    assert status == [
        "peers: partial (peer peer-no-dropout left: under 60 s of --budget, or cut at its end)",
        "tests: not started (the peers have runs left)",
    ], status
    assert not (short / "results" / "cpu-test-x1" / "peer.jsonl").exists()


# The H200's measured run durations (results/nvidia-h200-x1, `sweep.duration_s`), the plan of a
# 15-minute session (docs/gpu-machines.md, "A 15-minute budget"): --once none --rounds 12,15,16,17
ROUNDS, REPEATS, BUDGET = ["12", "15", "16", "17"], 2, 840


def test_a_15_minute_session_fits_the_sweep_and_the_peers_and_leaves_the_tests_last():
    """The rounds (each step of --rounds once a round and its first step again, the A/A
    control) at the committed H200 durations, a step without one at the duration of the rung it
    builds on, and the two peers at the time a peer is given (gpu_session.sh's PEER_S): within
    --budget 840 less the 45 s the script keeps; the fast GPU tests come after them and are what
    the budget cuts first (docs/gpu-machines.md)."""
    from speed_ladder.ladder import rung

    script = (ROOT / "tools" / "gpu_session.sh").read_text()
    margin = int(re.search(r"^MARGIN=(\d+)", script, re.M).group(1))
    peer_s = int(re.search(r"^PEER_S=(\d+)", script, re.M).group(1))
    took: dict[str, list[float]] = {}
    for r in records(ROOT / "results" / "nvidia-h200-x1" / "runs.jsonl"):
        if r["status"] == "ok" and not r["sweep"].get("control"):
            took.setdefault(r["step"], []).append(r["sweep"]["duration_s"])

    def seconds(step: str) -> float:
        while step not in took:  # never run on it: the rung it builds on
            step = rung(step).after
        return statistics.median(took[step])

    per_round = sum(seconds(s) for s in ROUNDS) + seconds(ROUNDS[0])  # with the A/A control
    plan = REPEATS * per_round + 2 * peer_s
    assert plan + margin <= BUDGET, (per_round, plan)


@pytest.mark.parametrize(
    "flags, says",
    [(["--budget", "soon"], "--budget soon: a whole number of seconds"),
     (["--budget", "0"], "--budget 0: a whole number of seconds"),
     (["--budget"], "--budget : a whole number of seconds"),
     (["--data", "/nonexistent/text"], "--data /nonexistent/text: no such file"),
     (["--resume", "/nonexistent/results"],
      "--resume /nonexistent/results: no such archive or folder"),
     (["--resume", "text.tgz"], "text.tgz: not a .tar.gz of --pack"),
     (["--resume", "."], ": not an OUT folder or a --pack archive"),
     (["--peer", "/nonexistent/peer.py"], "--peer /nonexistent/peer.py: no such file"),
     (["--peer", "text.tgz"], "text.tgz: not the peer this tool knows"),
     (["--once", "99"], "--once 99: no step 99 in the ladder"),
     (["--rounds", "17-10"], "--rounds 17-10: range 17-10 runs backwards"),
     (["--steps", "00", "--once", "00"], "--steps chooses one sweep's steps"),
     (["--repeats", "0"], "--repeats 0: a whole number of rounds above 0")],
)  # fmt: skip
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, says):
    needs()
    (tmp_path / "text.tgz").write_text("not an archive")
    proc = run_script([*SCRIPT, tmp_path / "s", *flags], timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
