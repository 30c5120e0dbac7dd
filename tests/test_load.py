"""speed_ladder.measure.cpu_load: other processes' CPU use during a run (other_load), the sweep's
busy check and --wait-quiet. Real CPU burners (`yes`) for a few seconds (they read as at least one
core whatever else runs beside them: another test only adds to the load); the rest with fake
samples and clocks."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, records

from speed_ladder.measure import cpu_load

linux = pytest.mark.skipif(not cpu_load.supported(), reason="needs Linux /proc")
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def burners():
    """Two `yes > /dev/null`: a CPU-bound process per core of a 2-core machine."""
    procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    time.sleep(0.2)
    yield procs
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


def _sample(t, busy, procs):
    return cpu_load.Sample(t, busy, {pid: cpu_load.Proc(*v) for pid, v in procs.items()})


def test_other_cores_leaves_out_the_runs_own_process_tree():
    hz = cpu_load._hz()
    # pid 10 is the run; 11 its child (alive in both), 12 a child that ended and was reaped
    # (its time moved to 10's cutime); 20 another process
    a = _sample(0.0, 0, {10: (1, "run", 0, 0), 11: (10, "worker", 0, 0), 12: (10, "w2", 0, 0),
                         20: (1, "other", 0, 0)})  # fmt: skip
    b = _sample(2.0, 6 * hz, {10: (1, "run", 2 * hz, hz), 11: (10, "worker", hz, 0),
                              20: (1, "other", 2 * hz, 0)})  # fmt: skip
    # 6 core-seconds busy in 2 s; the run's tree used 4 of them: others 1 core on average
    assert cpu_load.other_cores(a, b, 10) == pytest.approx(1.0)
    assert cpu_load.top_others(a, b, 10) == [("other", 1.0)]
    assert cpu_load.other_cores(a, b, 20) == pytest.approx(2.0)  # everyone else is other to 20
    assert cpu_load.other_cores(_sample(0, None, {}), b, 10) is None
    # a window of 5 ms: one 10-ms tick would read as 2 cores; too short to tell
    assert cpu_load.other_cores(a, _sample(0.005, 1, {10: (1, "run", 0, 0)}), 10) is None


def test_threshold_and_notes():
    assert cpu_load.threshold(2) == 0.1 and cpu_load.threshold(16) == 0.32
    t = cpu_load.threshold()
    assert not cpu_load.is_busy(None) and not cpu_load.is_busy(t) and cpu_load.is_busy(t + 0.01)
    assert cpu_load.busy_note(t / 2) is None
    note = cpu_load.busy_note(1.5)
    assert note.startswith("unreliable: other processes used 1.50 CPU cores") and "--wait" in note


@pytest.fixture
def sleeper():
    """A process that uses no CPU: the root of a "run" whose others are everyone else."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@linux
def test_two_burners_read_as_at_least_one_core(burners, sleeper):
    meter = cpu_load.Meter(root=sleeper)
    meter.start()
    time.sleep(1.5)
    got = meter.stop()
    assert got["other_load"] >= 1.0, got  # 2 on an otherwise idle 2-core machine
    assert isinstance(got["loadavg_start"], float)


@linux
def test_a_run_under_burners_records_its_other_load_and_says_unreliable(
    burners, sleeper, tmp_path, monkeypatch
):
    """Run's own wiring: the meter over the timed window, the record's fields and note, the
    machine fingerprint. (The run's tree is the sleeper's here: the burners are this test's
    children, which a real step would not have.)"""
    import torch

    from speed_ladder.measure import matmul_peak
    from speed_ladder.measure.run import Run

    class Args:
        device, preset, max_steps, epochs, warmup_steps, batch_size = "cpu", "tiny", 3, 1, 1, None
        data, results, seed = None, str(tmp_path / "r.jsonl"), 123

    monkeypatch.setattr(cpu_load, "own_root", lambda: sleeper)
    monkeypatch.setattr(matmul_peak, "peak_flops", lambda d: (1e12, "a 1 TFLOP/s peak"))
    run = Run(Args, "00", str(ROOT / "00_orig.py"))
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 100))
    run.set_model(model, {"n_layers": 1, "n_heads": 1, "context_length": 8, "emb_dim": 16}, 2)
    for _ in range(3):
        time.sleep(0.5)
        run.step_done(torch.tensor(1.0), tokens=16)
    rec = run.finish(1.0, 1.0)
    assert records(tmp_path / "r.jsonl") == [rec]
    assert rec["other_load"] >= 1.0, rec["other_load"]
    assert any(n.startswith("unreliable: other processes used") for n in rec["notes"])
    assert isinstance(rec["loadavg_start"], float)
    fp = rec["machine"]
    assert fp["device_count"] == os.cpu_count() and len(fp["host_id"]) == 12
    assert fp["torch_version"] == torch.__version__ and fp["device_name"]


@pytest.fixture
def detached_burners():
    """Two `yes` outside this process's tree (started by a shell that exits at once), so that
    an in-process sweep sees them as other processes."""
    out = subprocess.run(["sh", "-c", "for i in 1 2; do yes >/dev/null 2>&1 </dev/null & "
                          "echo $!; done"], capture_output=True, text=True, timeout=30)  # fmt: skip
    pids = [int(x) for x in out.stdout.split()]
    time.sleep(0.2)
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@linux
def test_the_sweep_says_when_the_machine_is_busy(detached_burners, tmp_path, capsys, monkeypatch):
    from conftest import sweep_here

    monkeypatch.setenv("SPEED_LADDER_CHECK_S", "0.5")
    args = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", tmp_path, "--device", "cpu"]
    code, out, _ = sweep_here(capsys, *args, "--no-plots", "--steps", "00")
    assert code == 0
    line = next(ln for ln in out.splitlines() if "machine busy:" in ln)
    cores = float(line.split("other processes are using ")[1].split()[0])
    assert cores >= 1.0 and " CPU cores (" in line, line  # how many, and who


def test_wait_quiet_in_the_sweep(tmp_path, capsys, monkeypatch):
    from conftest import sweep_here

    monkeypatch.setenv("SPEED_LADDER_CHECK_S", "0.01")
    monkeypatch.setattr(cpu_load, "supported", lambda: True)
    monkeypatch.setattr(cpu_load, "measure_others", lambda s: (1.7, [("yes", 0.9)]))
    args = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", tmp_path, "--device", "cpu"]
    code, out, _ = sweep_here(capsys, *args, "--no-plots", "--steps", "00", "--wait-quiet", "0.05")
    assert code == 0
    assert "waiting for a quiet machine: other processes are using 1.70 CPU cores" in out
    assert "still busy after" in out and "running anyway" in out


def test_wait_quiet_shows_progress_and_is_bounded():
    said, now = [], [0.0]
    loads = iter([1.2, 1.1, 0.9, 0.02])

    def measure():
        now[0] += 3.0
        return next(loads), [("yes", 1.0)]

    clock = lambda: now[0]
    assert cpu_load.wait_quiet(60, say=said.append, measure=measure, clock=clock)
    assert said[0].startswith("waiting for a quiet machine: other processes are using 1.20")
    assert "(yes 1.0)" in said[0] and said[-1].startswith("machine quiet")
    said.clear()
    now[0] = 0.0
    busy = lambda: (now.__setitem__(0, now[0] + 4.0), (1.5, []))[1]
    assert not cpu_load.wait_quiet(10, say=said.append, measure=busy, clock=clock)
    assert said[-1].startswith("still busy after 12 s")
    said.clear()
    assert cpu_load.quiet_check(say=said.append, measure=lambda: (0.01, [])) == 0.01 and not said
    cpu_load.quiet_check(say=said.append, measure=lambda: (1.5, []))
    assert said[0].startswith("machine busy:")
