"""Which SDPA kernel ran (speed_ladder/measure/attention_kernel.py): read from the ops of the last
warm-up step, the record's `attention_kernel`, and steps 07 and 17 judged on it; step 17's own
`sdpa_kernel` order puts cuDNN first in its training forward and nowhere else; the summary's
`attention_kernel` and `inactive_rungs` columns and the tag page's lines about them."""

import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, VERDICT, load_script, records, run_script
from torch.nn.attention import SDPBackend

from speed_ladder.measure import attention_kernel as ak
from speed_ladder.measure import inactive, sdpa_dispatch
from speed_ladder.measure.run import Run
from speed_ladder.measure.run_record import Recorder
from speed_ladder.measure.settings import resolve_spec
from speed_ladder.report import summary
from speed_ladder.report.pages import tag_page

CPU = torch.device("cpu")
TINY = {"vocab_size": 512, "context_length": 16, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
FLASH_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
FLASH = "aten::_scaled_dot_product_flash_attention"
CUDNN = "aten::_scaled_dot_product_cudnn_attention"
MATH = "aten::_scaled_dot_product_attention_math"


class _Run:
    """A Run's recorder and attention watch, wired as Run wires them (its own methods), for the
    watch to report to."""

    note, _facts, _kernel_found = Run.note, Run._facts, Run._kernel_found

    def __init__(self, step, drop=0.0, warmup=2):
        self.step, self.device, self.cfg, self.batch_size = step, CPU, TINY | {"drop_rate": drop}, 8
        self.spec = resolve_spec({"preset": "tiny"}, "cpu")
        self.recorder = Recorder(step, None, is_rank0=False)
        self.attention = ak.Watch(step, CPU, warmup, self._kernel_found)
        self.attention.cfg = self.cfg

    notes = property(lambda self: self.recorder.notes)
    inactive_reason = property(lambda self: self.recorder.inactive_reason)
    inactive_rungs = property(lambda self: self.recorder.inactive_rungs)


@pytest.fixture(autouse=True)
def bf16_off(monkeypatch):
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")


@pytest.mark.parametrize(
    "names,kernel",
    [
        (["aten::scaled_dot_product_attention", FLASH_CPU, FLASH_CPU + "_backward"], "flash"),
        (["aten::mm", FLASH], "flash"),
        (["aten::_scaled_dot_product_efficient_attention"], "efficient"),
        ([CUDNN, "aten::_scaled_dot_product_cudnn_attention_backward"], "cudnn"),
        (["aten::scaled_dot_product_attention", MATH, "aten::bmm", "aten::_softmax"], "math"),
        (["aten::mm", "aten::_softmax", "aten::bmm"], "math"),  # compiled: no SDPA op at all
        ([], None),
    ],
)  # fmt: skip
def test_the_op_names_say_which_kernel_ran(names, kernel):
    assert ak.kernel_of(names)[0] == kernel
    if names and not any(n in ak.OPS for n in names):
        assert ak.kernel_of(names)[1] == ak.DECOMPOSED


def _train(model, x, run, eval_too=True):
    """One training step between two boundaries, and an evaluation inside run.paused()'s block."""
    model.train()
    model(x).sum().backward()
    if eval_too:
        with run.attention.excluded(), torch.no_grad():
            model.eval()
            model(x)


class Attend(torch.nn.Module):
    def __init__(self, drop):
        super().__init__()
        self.drop = drop

    def forward(self, q):
        p = self.drop if self.training else 0.0
        return torch.nn.functional.scaled_dot_product_attention(
            q, q, q, dropout_p=p, is_causal=True
        )


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("drop,kernel", [(0.0, "flash"), (0.1, "math")])
def test_the_last_warmup_step_is_profiled_and_step_07_judged_on_what_ran(drop, kernel, compiled):
    """A CPU's flash kernel refuses dropout: the training call runs math, and step 07 says so,
    though the evaluation between the steps (no dropout) runs flash: it is left out. Compiled,
    the flash kernel stays an op of its own in the graph, and the math path becomes matmuls and
    a softmax (no SDPA op at all)."""
    run = _Run("07", drop)
    model, x = Attend(drop), torch.randn(2, 2, 16, 16, requires_grad=True)
    if compiled:
        model = torch.compile(model)
    assert run.attention.kernel is None and not run.attention.at(0)  # step 1: not watched
    _train(model, x, run)
    assert run.attention.at(1)  # the last warm-up step, watched
    _train(model, x, run)
    assert run.attention.at(2)  # its end: judged, before the window opens
    assert run.attention.kernel == kernel
    assert f"attention kernel: {kernel} (" in run.notes[0] and "warm-up step 2" in run.notes[0]
    assert (ak.DECOMPOSED in run.notes[0]) is (compiled and kernel == "math"), run.notes[0]
    if kernel == "flash":
        assert run.inactive_reason is None
    else:
        assert run.inactive_reason.startswith("math path ran (dropout 0.1 > 0 has no fused kernel")
        assert run.inactive_rungs == {"07": run.inactive_reason}
    assert not run.attention.at(3)  # nothing more


def test_a_run_that_fails_in_the_watched_step_exits_with_its_own_code():
    """A process that exits while torch.profiler still runs dies of a segmentation fault: the
    watch stops it at exit, so a failed step's exit code stays its own."""
    code = (
        "import torch;"
        "from speed_ladder.measure.attention_kernel import Watch;"
        "w = Watch('07', torch.device('cpu'), 1, print);"
        "assert w.at(0) and w.prof is not None; torch.ones(2).sum(); raise SystemExit(3)"
    )
    proc = run_script([sys.executable, "-c", code], timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3, proc.stderr[-2000:]


def test_hand_written_attention_is_not_watched_and_no_warmup_asks_the_dispatcher():
    run = _Run("06")
    assert run.attention.kernel == "materialized" and not run.attention.at(1)
    run = _Run("07", drop=0.1, warmup=0)
    assert run.attention.at(0) and run.attention.kernel == "math"
    assert "no warm-up step to profile: torch's dispatcher's choice" in run.notes[0]
    assert run.inactive_reason.startswith("math path ran")


class _Profiled:
    """What torch.profiler returns for a step in which `names` ran, in that order."""

    def __init__(self, names):
        self.names = names

    def stop(self):
        pass

    def events(self):
        return [SimpleNamespace(name=n, cpu_parent=None, time_range=SimpleNamespace(start=i))
                for i, n in enumerate(self.names)]  # fmt: skip


def _watched(step, names, before, why=None, monkeypatch=None):
    """A run of `step` whose last warm-up step ran `names`; `before`: the kernel torch's own
    order chooses for the training call; `why`: why cuDNN cannot take it (None: it can)."""
    monkeypatch.setattr(sdpa_dispatch, "dispatcher_choice", lambda *a: before)
    monkeypatch.setattr(inactive, "cudnn_attention_unavailable", lambda *a: why)
    run = _Run(step)
    run.attention.prof, run.attention.watched = _Profiled(names), 2
    assert run.attention.at(2)
    return run


@pytest.mark.parametrize(
    "default,step,ran,active",
    [
        ("flash", "17", CUDNN, True),  # torch 2.13's order: flash first; 17 puts cuDNN first
        ("cudnn", "17", CUDNN, False),  # cuDNN already first (Hopper, new cuDNN): 16 ran it too
        ("flash", "17", MATH, False),  # math before cuDNN: never "cuDNN active"
        ("flash", "07", FLASH, True),
        ("cudnn", "07", CUDNN, True),  # step 07's "FlashAttention" is cuDNN's here: recorded
    ],
)  # fmt: skip
def test_both_priority_orders_are_recorded_as_what_ran(default, step, ran, active, monkeypatch):
    run = _watched(step, ["aten::scaled_dot_product_attention", ran], default, None, monkeypatch)
    assert run.attention.kernel == ak.OPS[ran]
    assert (run.inactive_reason is None) is active, run.inactive_reason
    said = [n for n in run.notes if n.startswith(f"step {step}: ")]
    if step == "17" and active:
        assert said == ["step 17: cuDNN attention ran (SDPA tries it first, then flash, "
                        "efficient and math)"]  # fmt: skip
    elif step == "17" and ran == CUDNN:
        assert "already torch's choice" in run.inactive_reason and "step 16 ran it" in said[0]
    elif step == "17":
        assert run.inactive_reason.startswith("math attention ran, not cuDNN's")
        assert "07" in run.inactive_rungs  # and step 07's idea did nothing either
        assert not any("cuDNN attention ran" in n for n in run.notes)


def test_where_cudnn_cannot_run_step_17_says_why_and_which_kernel_ran():
    why = inactive.cudnn_attention_unavailable(CPU, TINY, torch.float32)
    assert why == "cuDNN attention is CUDA's: on cpu step 07's attention kernel stays"
    run = _Run("17")
    run.attention.prof, run.attention.watched = _Profiled([FLASH_CPU]), 2
    assert run.attention.at(2)
    assert run.inactive_reason == f"flash attention ran, not cuDNN's ({why})"


@pytest.mark.parametrize("cudnn", [True, False])
def test_step_17_puts_cudnn_first_in_its_training_forward_alone(cudnn, tmp_path, monkeypatch):
    """Step 17 on tiny, eager: every training call of scaled_dot_product_attention runs under the
    step's own sdpa_kernel(..., set_priority=True) order, cuDNN first, then flash, efficient and
    math; where the harness says cuDNN cannot take the call, the same order without cuDNN (it is
    off). Evaluation, outside the training forward, runs under torch's own order."""
    cudnn_on = int(SDPBackend.CUDNN_ATTENTION)
    if cudnn:  # as on a GPU whose cuDNN takes the call (the CPU then runs its own kernel)
        monkeypatch.setattr(inactive, "cudnn_attention_unavailable", lambda *a: None)
    own = torch._C._get_sdp_priority_order()
    real, seen = torch.nn.functional.scaled_dot_product_attention, []

    def sdpa(*a, **k):
        seen.append((torch.is_grad_enabled(), torch._C._get_sdp_priority_order(),
                     torch.backends.cuda.cudnn_sdp_enabled()))  # fmt: skip
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    out = tmp_path / "r.jsonl"
    argv = ["17", "--device", "cpu", "--preset", "tiny", "--max-steps", "2",
            "--warmup-steps", "1", "--data", str(VERDICT), "--results", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with torch._dynamo.config.patch(disable=True):
        load_script("steps/17_cudnn_attention.py").main()
    training = {(order[0], on) for grad, order, on in seen if grad}
    if cudnn:
        assert training == {(cudnn_on, True)}
    else:
        assert len(training) == 1 and next(iter(training))[1] is False  # cuDNN off
    evaluation = [order for grad, order, _ in seen if not grad]
    assert evaluation and all(order == own for order in evaluation)
    assert torch._C._get_sdp_priority_order() == own  # left as it was
    (rec,) = records(out)
    assert rec["attention_kernel"] == "flash" and rec["step_active"] is False


def _record(step, kernel, rungs, **kw):
    return {"step": step, "status": "ok", "tokens_per_sec": 100.0, "attention_kernel": kernel,
            "inactive_rungs": rungs, **kw}  # fmt: skip


def test_the_summary_says_which_kernel_ran_and_what_each_step_rests_on(tmp_path):
    import pandas as pd

    rows = []
    for step, kernel, rungs in [("06", "materialized", {"02": "x"}),
                                ("12", "math", {"02": "x", "07": "m", "12": "L"}),
                                ("13", "math", {"02": "x", "07": "m", "12": "L"}),
                                ("17", "flash", {"12": "L", "17": "c"})]:  # fmt: skip
        row = dict.fromkeys(summary.SUMMARY_COLUMNS, None) | {"step": step}
        summary._ran(row, [_record(step, kernel, rungs)])
        rows.append(row)
    assert [r["inactive_rungs"] for r in rows] == ["02", "02 07", "02 07 12", "12"]
    old = dict.fromkeys(summary.SUMMARY_COLUMNS, None) | {"step": "00"}
    summary._ran(old, [{"step": "00", "status": "ok"}])  # a record without these fields
    assert old["attention_kernel"] is None and old["inactive_rungs"] is None
    df = pd.DataFrame(rows, columns=summary.SUMMARY_COLUMNS)
    summary.write_summary(tmp_path, df)
    back = summary.read_summary(tmp_path).to_dict("records")
    assert [r["inactive_rungs"] for r in back] == ["02", "02 07", "02 07 12", "12"]  # "02", not 2
    assert [r["attention_kernel"] for r in back] == ["materialized", "math", "math", "flash"]
    lines = tag_page.chain_notes(back)
    assert lines[0] == (
        "Built on rungs that did nothing here, so measured without their idea too (summary.csv's "
        "`inactive_rungs`): step 02 under steps 06–13; step 07 under steps 12–13; step 12 under "
        "steps 13–17."
    )
    assert lines[2] == (
        "Attention kernel not the step's own (summary.csv's `attention_kernel`): math in steps "
        "12–13 (flash expected); flash in step 17 (cudnn expected)."
    )


def test_spans_are_neighbours_in_the_table():
    order = ["00", "05", "07", "08", "09", "12"]
    assert tag_page.spans(["07", "09", "08", "00"], order) == "steps 00, 07–09"
    assert tag_page.spans(["12"], order) == "step 12"
