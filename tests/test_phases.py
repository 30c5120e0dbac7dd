"""Where a step's time goes, by phase (speed_ladder.measure.phases), on this CPU:

- the CUDA path on the fake GPU timeline of test_clock.py, through a Run: each timed step's data
  wait, forward, backward and optimizer are the timeline's own, read from events at the window's
  end; warm-up, a pause (an evaluation's forward included) and the profiled steps count nowhere;
- the record's phases are the median step's, so they add up to its step time, and a summary's
  columns take their median over the runs;
- the hooks fire outside torch.compile's graph: a compiled module, hooked, compiles once;
- a device without phase times (MPS) and a step that misses a boundary say so, never a number;
- the chart and the page's line where a tag's summary has phases, nothing where it has none.
The real steps (00-17, step 08 compiled) record their four phases: tests/test_ladder.py.
"""

import shutil
import statistics
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from test_clock import Timeline

from speed_ladder import flags as cli
from speed_ladder.measure import clock as clock_mod
from speed_ladder.measure import device as dev
from speed_ladder.measure import matmul_peak
from speed_ladder.measure.phases import PHASES, Phases, median_step, phase_columns
from speed_ladder.measure.run import Run
from speed_ladder.presets import PRESETS

FIXTURE_TAG = Path(__file__).resolve().parent / "fixtures" / "summary" / "cpu-fixture"


class Timed(torch.nn.Module):
    """A model whose forward and backward take `f` and `b` ms on the fake GPU timeline."""

    def __init__(self, line):
        super().__init__()
        self.lin, self.line, self.f, self.b = torch.nn.Linear(8, 8), line, 0.0, 0.0

    def _backward(self, grad):
        self.line.now += self.b

    def forward(self, x):
        self.line.now += self.f
        h = self.lin(x)
        if h.requires_grad:  # reached after the output's gradient: inside backward
            h.register_hook(self._backward)
        return h * 1.0


def test_cuda_phases_are_the_timelines_and_leave_out_warm_up_pauses_and_profiled_steps(
    monkeypatch,
):
    """2 warm-up steps, 3 timed (an evaluation after the first), 2 profiled; each phase of each
    step takes its own ms on the fake GPU; the record has the median step's."""
    monkeypatch.setattr(matmul_peak, "measured_matmul_rates", lambda d: {"fp32": 5e10, "bf16": 1})
    argv = ["--device", "cpu", "--preset", "tiny", "--max-steps", "5", "--warmup-steps", "2"]
    run = Run(cli.parse_args(None, [*argv, "--profile", "2"]), "10", str(ROOT / "00_orig.py"))
    line = Timeline()
    run.clock = clock_mod.StepClock(torch.device("cuda"), event=line.event)
    run.step_times, run.losses = run.clock.times, run.clock.losses
    monkeypatch.setattr(dev, "synchronize", lambda d: setattr(line, "passed", line.now))
    model = Timed(line)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    run.set_model(model, {**PRESETS["tiny"], "vocab_size": 50257}, 2)
    big = (500, 500, 500, 500)  # warm-up and profiled steps: never in a phase
    plan = [big, big, (1, 20, 40, 3), (9, 10, 20, 1), (2, 30, 60, 5), big, big]
    for data, fwd, bwd, step in plan:
        line.now += data
        model.f, model.b = fwd, bwd
        loss = model(torch.ones(2, 8)).sum()
        loss.backward()
        opt.step()
        line.now += step
        run.step_done(loss, tokens=8)
        if run.steps_done == 3:
            with run.paused(), torch.no_grad():
                line.now += 1000  # an evaluation, its forward hooked too: in no step
                model(torch.ones(2, 8))
        if run.finished:
            break
    rec = run.finish(None, None)
    assert run.steps_done == 7 and rec["timed_steps"] == 3
    assert run.step_times == pytest.approx([0.064, 0.040, 0.097])
    assert run.clock.phases.ms == {
        "data": pytest.approx([1, 9, 2]),
        "forward": pytest.approx([20, 10, 30]),
        "backward": pytest.approx([40, 20, 60]),
        "optimizer": pytest.approx([3, 1, 5]),
    }
    # the median step (64 ms): its phases, which add up to the record's step time
    assert rec["phase_ms"] == {"data": 1, "forward": 20, "backward": 40, "optimizer": 3}
    assert sum(rec["phase_ms"].values()) == pytest.approx(rec["step_time_ms"])
    assert rec["data_share"] == pytest.approx(1 / 64, abs=1e-4)
    assert not any("phase" in n for n in rec["notes"])


def test_the_record_has_the_median_steps_phases_and_they_add_up():
    """Odd and even counts: the middle step, or the middle two averaged, as the median step time
    averages theirs; the per-phase medians would fall short (a disturbance in each phase)."""
    ms = {
        "data": [1, 1, 30],
        "forward": [10, 40, 10],
        "backward": [50, 30, 20],
        "optimizer": [9] * 3,
    }  # steps of 70, 80 and 69 ms
    totals = [sum(s) for s in zip(*ms.values(), strict=True)]
    assert median_step(ms) == {"data": 1, "forward": 10, "backward": 50, "optimizer": 9}
    assert sum(median_step(ms).values()) == statistics.median(totals) == 70
    assert sum(statistics.median(v) for v in ms.values()) == 50  # each phase's own median
    even = {p: v + [v[0]] for p, v in ms.items()}
    totals = [sum(s) for s in zip(*even.values(), strict=True)]
    assert sum(median_step(even).values()) == pytest.approx(statistics.median(totals))


def test_a_summary_takes_the_median_over_the_runs_and_leaves_older_records_empty():
    runs = [{"phase_ms": dict.fromkeys(PHASES, v), "data_share": v / 100} for v in (1.0, 3.0, 2.0)]
    cols = phase_columns([*runs, {"tokens_per_sec": 5.0}])  # an older record: no phases
    assert cols == {**{f"phase_{p}_ms": 2.0 for p in PHASES}, "data_share": 0.02}
    assert set(phase_columns([{}]).values()) == {None}


def test_a_hooked_compiled_model_compiles_once_and_marks_every_phase():
    """The hooks sit on torch.compile's wrapper (OptimizedModule), outside its graph: three
    training steps compile one graph, and each marks its forward, backward and end."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    # the counters are process-wide: count from here, not what an earlier test compiled
    before = counters["stats"]["unique_graphs"]
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = clock_mod.StepClock(torch.device("cpu"))
    c.phases.attach(model)
    c.restart()
    for _ in range(3):
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        opt.step()
        c.step_end(loss, timed=True)
    assert counters["stats"]["unique_graphs"] - before == 1, dict(counters["stats"])
    assert len(c.phases.ms["forward"]) == 3 and c.phases.incomplete == 0
    for per_step in zip(*c.phases.ms.values(), strict=True):  # each step's four: its time
        assert sum(per_step) == pytest.approx(c.times.pop(0) * 1000)


def test_backward_ends_after_what_ddp_and_fsdp2_queue_during_backward():
    """DDP and FSDP2 queue their wait for the last gradient reduction on the autograd engine
    during backward (`queue_callback`): the backward's end is marked after it, not before."""
    log = []
    ticks = iter(range(10))

    def now():
        log.append(next(ticks))
        return log[-1]

    phases, model = Phases(now, "cpu"), torch.nn.Linear(2, 2)
    queue = torch.autograd.Variable._execution_engine.queue_callback
    model.weight.register_hook(lambda grad: queue(lambda: log.append("reduced")))
    phases.attach(model)
    model(torch.ones(1, 2)).sum().backward()
    assert log == [0, 1, "reduced", 2]  # forward, backward, the reduction, backward's end
    phases.step_end(-1, 3, timed=True)
    assert {p: v[0] for p, v in phases.ms.items()} == {
        "data": 1000,
        "forward": 1000,
        "backward": 1000,
        "optimizer": 1000,
    }


def test_no_phases_where_they_cannot_be_timed_and_a_note_says_why():
    notes = []
    mps = Phases(lambda: 0.0, "mps")
    mps.attach(torch.nn.Linear(2, 2))  # nothing hooked
    assert mps.fields(notes.append) == {"phase_ms": None, "data_share": None}
    assert "no phase times on mps" in notes[-1]
    c = clock_mod.StepClock(torch.device("cpu"))
    model = torch.nn.Linear(2, 2)
    c.phases.attach(model)
    c.restart()
    model(torch.ones(1, 2))  # a forward, but no backward
    c.step_end(torch.tensor(0.0), timed=True)
    assert c.phases.fields(notes.append) == {"phase_ms": None, "data_share": None}
    assert "1 timed step(s) missed a boundary" in notes[-1]
    assert not model._forward_hooks and not model._forward_pre_hooks  # taken off at the end


def test_the_chart_and_the_page_line_only_where_the_summary_has_phases(tmp_path):
    from speed_ladder.report.charts.phase_chart import PHASE_CHART, plot_phases
    from speed_ladder.report.pages.tag_page import page_markdown
    from speed_ladder.report.summary import read_summary, write_summary

    tag = tmp_path / "cpu-fixture"
    shutil.copytree(FIXTURE_TAG, tag)
    assert plot_phases(tag) == [] and not (tag / PHASE_CHART).exists()  # an older summary
    assert PHASE_CHART not in page_markdown(tag, tmp_path)
    df = read_summary(tag)
    ok = df.index[df["status"] == "ok"]
    for i, share in zip(ok[:2], (0.05, 0.2), strict=True):
        df.loc[i, [f"phase_{p}_ms" for p in PHASES]] = [share * 100, 30, 50, 20 - share * 100]
        df.loc[i, "data_share"] = share
    write_summary(tag, df)
    assert plot_phases(tag) == [tag / PHASE_CHART]
    assert (tag / PHASE_CHART).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = page_markdown(tag, tmp_path)
    step = df.loc[ok[1], "step"]
    assert f"20.0% of a step at most (step {step})" in page
    assert f"![each step's phases]({PHASE_CHART})" in page
