"""The step clock and the GPU idle share: the clock never drains the GPU inside the timed
window. speed_ladder.measure.clock and gpu_idle, on this CPU:

- a real tiny run of step 10 (in-process, torch.compile off): between the timed window's start
  and end no synchronize and no `.item()`, and the losses read in batches, at most once per
  progress line; its losses are each step's `.item()`;
- the CUDA clock with a fake `torch.cuda.Event` on a made-up GPU timeline (no GPU here): step
  times are the gaps between step-end events, warm-up, a pause and the profiled steps left out,
  and the progress line reads only what the GPU has passed;
- the idle share from a fake NVML sample buffer, and every way it is None.
"""

import sys
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, VERDICT, count_host_syncs, load_script

from speed_ladder import flags as cli
from speed_ladder.measure import clock as clock_mod
from speed_ladder.measure import device as dev
from speed_ladder.measure import gpu_idle, matmul_peak
from speed_ladder.measure import run as run_mod
from speed_ladder.measure.run import Run
from speed_ladder.presets import PRESETS


# ---------------------------------------------------------------- a real step, calls counted
@pytest.mark.parametrize(
    "script,bf16",
    [
        ("steps/10_larger_batch.py", "0"),
        # emulated bf16 on a CPU without it: 88 s on 2 cores; the fast suite counts step 15's
        # update alone (tests/test_bf16_weights.py)
        pytest.param("steps/15_bf16_weights.py", "1", marks=pytest.mark.slow),
    ],
)
def test_a_real_step_neither_synchronizes_nor_reads_a_loss_per_step(
    script, bf16, eager, monkeypatch, tmp_path, capsys
):
    """Step 10 on tiny, 12 steps (2 warm-up, 10 timed), its records' losses against the losses
    the step computed (`.item()` of each, taken outside the count); step 15 the same with bf16
    forced on, so that its master weights' update runs in the window; compiling off (`eager`)."""
    monkeypatch.setenv(matmul_peak.BF16_ENV, bf16)
    # the record's regime reads dynamo's process-wide counters (parity.compiles): fresh ones, so
    # that a graph an earlier test of this worker compiled is not taken for this run's
    import collections

    import torch._dynamo.utils

    fresh = collections.defaultdict(collections.Counter)
    monkeypatch.setattr(torch._dynamo.utils, "counters", fresh)
    rates = {"fp32": 5e10, "bf16": 1e9}  # the matmul peak, not measured here
    monkeypatch.setattr(matmul_peak, "measured_matmul_rates", lambda device: rates)
    calls = {"sync": 0, "item": 0, "tolist": 0}
    phase = {"window": False}
    seen_losses = []

    def counting(name, real):
        def wrapper(*a, **k):
            if phase["window"]:
                calls[name] += 1
            return real(*a, **k)

        return wrapper

    real_item = torch.Tensor.item
    count_host_syncs(monkeypatch, counting)
    prints = []
    real_start, real_end, real_done = Run._open_window, Run._close_window, Run.step_done

    def start(self):
        real_start(self)
        phase["window"] = True

    def end(self):
        phase["window"] = False
        real_end(self)

    def step_done(self, loss, tokens):
        was = phase["window"]
        phase["window"] = False
        seen_losses.append(real_item(loss))  # each step's .item(), outside the window's count
        phase["window"] = was
        real_done(self, loss, tokens)
        if phase["window"] and capsys.readouterr().out.count("  step "):
            prints.append(self.steps_done)

    monkeypatch.setattr(Run, "_open_window", start)
    monkeypatch.setattr(Run, "_close_window", end)
    monkeypatch.setattr(Run, "step_done", step_done)
    monkeypatch.setattr(run_mod, "time", SimpleNamespace(time=time.time, perf_counter=_fast()))
    out = tmp_path / "r.jsonl"
    argv = [script, "--device", "cpu", "--preset", "tiny", "--max-steps", "12"]
    argv += ["--warmup-steps", "2", "--data", str(VERDICT), "--results", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    load_script(script).main()
    rec = _record(out)
    assert rec["status"] == "ok" and rec["timed_steps"] == 10
    assert rec["regime"] == ("bf16" if bf16 == "1" else "fp32")
    assert calls["sync"] == 0 and calls["item"] == 0, calls
    # a batched read per progress line in the window (about one every 2 s), never one a step
    assert 1 <= calls["tolist"] <= len(prints) < 10, (calls, prints)
    assert rec["losses"] == seen_losses  # the same floats, in order
    assert rec["gpu_idle_share"] is None and rec["gpu_idle_source"] == "no GPU"


def _fast():
    """The Run's perf_counter, 1.5 s a call: the progress line (every 2 s) prints every other
    step, and the batched reads are counted against it (the step clock keeps the real one)."""
    t = [0.0]

    def now():
        t[0] += 1.5
        return t[0]

    return now


def _record(path):
    from conftest import records

    (rec,) = records(path)
    return rec


# ---------------------------------------------------------------- the CUDA clock, faked
class Timeline:
    """A made-up GPU: `now` is where its work ends (ms), `passed` how far it has run."""

    def __init__(self):
        self.now = self.passed = 0.0
        self.waits = 0

    def event(self, enable_timing=True):
        line = self

        class Event:
            def record(self):
                self.t = line.now

            def query(self):
                return self.t <= line.passed

            def synchronize(self):
                line.waits += 1
                line.passed = max(line.passed, self.t)

            def elapsed_time(self, end):
                assert self.query() and end.query(), "elapsed_time of an event not passed"
                return end.t - self.t

        return Event()


def test_cuda_clock_times_gaps_between_step_ends_and_reads_only_what_the_gpu_passed():
    line = Timeline()
    c = clock_mod.StepClock(torch.device("cuda"), event=line.event)
    c.restart()
    for i, (ms, timed) in enumerate([(10, False), (15, True), (20, True), (30, True)]):
        line.now += ms
        c.step_end(torch.tensor(float(i)), timed)
    assert c.times == [] and c.losses == [] and line.waits == 0  # nothing read, nothing waited
    line.passed = 25  # the GPU is two steps behind the host
    assert c.progress(4, 4, 1000) == "  step     4/4  loss 1.000 (step 2)  66,667 tok/s"
    assert c.times == [0.015] and c.losses == [0.0, 1.0] and line.waits == 0
    c.read(wait=True)
    assert c.times == pytest.approx([0.015, 0.020, 0.030]) and c.losses == [0.0, 1.0, 2.0, 3.0]


def test_cuda_clock_through_a_run_leaves_out_warm_up_a_pause_and_profiled_steps(monkeypatch):
    """A Run (on this CPU) whose clock is the CUDA one on a fake timeline: 2 warm-up steps, 3
    timed with an evaluation after the first, then 2 profiled; each step takes its own ms."""
    monkeypatch.setattr(matmul_peak, "measured_matmul_rates", lambda d: {"fp32": 5e10, "bf16": 1})
    argv = ["--device", "cpu", "--preset", "tiny", "--max-steps", "5", "--warmup-steps", "2"]
    run = Run(cli.parse_args(None, [*argv, "--profile", "2"]), "10", str(ROOT / "00_orig.py"))
    cfg = {**PRESETS["tiny"], "vocab_size": 50257}
    line = Timeline()
    run.clock = clock_mod.StepClock(torch.device("cuda"), event=line.event)
    run.step_times, run.losses = run.clock.times, run.clock.losses
    monkeypatch.setattr(dev, "synchronize", lambda d: setattr(line, "passed", line.now))
    model = torch.nn.Linear(8, 8)
    run.set_model(model, cfg, 2)
    step_ms = [100, 50, 11, 12, 13, 500, 600]  # warm-up, warm-up, timed x3, profiled x2
    for n, ms in enumerate(step_ms, 1):
        loss = model(torch.ones(2, 8)).sum() * 0 + n
        line.now += ms
        run.step_done(loss, tokens=8)
        if n == 3:
            with run.paused():
                line.now += 1000  # an evaluation: never in a step's time
        if run.finished:
            break
    rec = run.finish(None, None)
    assert run.steps_done == 7 and rec["timed_steps"] == 3
    assert run.step_times == pytest.approx([0.011, 0.012, 0.013])
    assert rec["losses"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert rec["step_time_ms"] == pytest.approx(12)


# ---------------------------------------------------------------- the GPU idle share
class FakeSamples:
    """The driver's sample buffer: what it holds grows as the test says time passes."""

    def __init__(self, held):
        self.held = list(held)

    def since(self, last):
        return [(t, v) for t, v in self.held if t > last]


def test_idle_share_from_the_samples_inside_the_window_pauses_left_out():
    buf = FakeSamples([(1, 100), (2, 100)])  # before the window: not counted
    meter = gpu_idle.IdleMeter(torch.device("cuda"), source=buf)
    meter.start()
    buf.held += [(3, 50), (4, 80), (5, 90)]  # (3) began before the window: dropped
    meter.pause()
    buf.held += [(6, 100), (7, 100)]  # an evaluation
    meter.resume()
    buf.held += [(8, 0), (9, 70)]  # (8) straddles the pause's end: dropped
    meter.stop()
    assert meter.values == [80, 90, 70]
    fields = meter.fields(0.100)  # a 100 ms mean step
    assert fields["gpu_idle_share"] == pytest.approx(0.2)
    assert fields["gpu_idle_ms_per_step"] == pytest.approx(20.0)
    assert fields["gpu_idle_source"].startswith("NVML GPU utilization: 1 - mean of 3 ")


def test_idle_share_is_none_with_its_reason_never_a_made_up_number(monkeypatch):
    cpu = gpu_idle.IdleMeter(torch.device("cpu"))
    cpu.start()
    cpu.stop()
    assert cpu.fields(0.1) == {
        "gpu_idle_share": None,
        "gpu_idle_ms_per_step": None,
        "gpu_idle_source": "no GPU",
    }
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    share, why = gpu_idle.IdleMeter(torch.device("cuda")).share()
    assert share is None and why == "pynvml is not installed (pip install nvidia-ml-py)"
    short = gpu_idle.IdleMeter(torch.device("cuda"), source=FakeSamples([]))
    short.start()
    short.source.held.append((5, 40))  # one sample, the one that straddles the start
    short.stop()
    assert (
        short.share()[0] is None and "shorter than the driver's sample period" in short.share()[1]
    )

    class Broken:
        def since(self, last):
            raise RuntimeError("GPU is lost")

    lost = gpu_idle.IdleMeter(torch.device("cuda"), source=Broken())
    lost.start()
    lost.stop()
    assert lost.share() == (None, "NVML read failed: RuntimeError: GPU is lost")
    odd = gpu_idle.IdleMeter(torch.device("cuda"), source=FakeSamples([(1, 0)]))
    odd.start()
    odd.source.held += [(2, 500), (3, 700)]
    odd.stop()
    assert odd.share() == (None, "NVML utilization samples up to 700: not percents")


def test_nvml_installed_without_a_gpu_is_a_reason_not_a_failure():
    """nvidia-ml-py is installed on every Linux machine (pyproject.toml), GPU or not: where NVML
    cannot start (no NVIDIA driver), the idle share is None with that reason."""
    pytest.importorskip("pynvml")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: NVML may read it")
    share, why = gpu_idle.IdleMeter(torch.device("cuda")).share()
    assert share is None and why.startswith("NVML utilization samples unavailable: "), why


def test_nvml_samples_are_read_from_pynvml_s_structures():
    """nvmlDeviceGetSamples's answer as nvidia-ml-py gives it (ctypes samples with timeStamp and
    sampleValue.uiVal); NVML_ERROR_NOT_FOUND (nothing newer) is no sample, not a failure."""

    class NotFound(Exception):
        pass

    def get(handle, kind, last):
        assert (handle, kind) == ("h0", 1)
        if last >= 200:
            raise NotFound()
        held = [(100, 30), (200, 44)]
        return 1, [
            SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v))
            for t, v in held
            if t > last
        ]

    nv = SimpleNamespace(
        NVML_GPU_UTILIZATION_SAMPLES=1, NVMLError_NotFound=NotFound, nvmlDeviceGetSamples=get
    )
    src = gpu_idle.NvmlSamples(nv, "h0")
    assert src.since(0) == [(100, 30), (200, 44)] and src.since(100) == [(200, 44)]
    assert src.since(200) == []
