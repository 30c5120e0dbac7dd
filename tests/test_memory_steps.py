"""Steps 12 and 13 on CPU: the record says which loss ran on every rung built on 12, and
checkpointing's memory."""

import json
import sys

import pytest
import torch
from conftest import ROOT, RSS_FOLLOWS_TENSORS, fake_liger, run_script

from speed_ladder import ladder
from speed_ladder.measure import inactive
from speed_ladder.measure.run import Run

TINY = {"vocab_size": 512, "context_length": 16, "emb_dim": 32, "n_heads": 2, "n_layers": 2,
        "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip


class _Run:
    """speed_ladder.Run's notes and step_active mark alone (its own methods): what set_model
    records of the checks it asks (measure/inactive.py, `asked`)."""

    note, inactive = Run.note, Run.inactive

    def __init__(self, step="12"):
        self.step, self.notes, self.inactive_reason, self.inactive_rungs = step, [], None, {}

    def print(self, *a, **k):
        pass


CPU = torch.device("cpu")


def report(run, device=CPU, cfg=TINY):
    """What Run.set_model records for run.step and the rungs it builds on."""
    for step, reason, acted in inactive.asked(run.step, device, cfg, 0.0):
        run.inactive(step, reason, acted)


@pytest.fixture
def bf16_off(monkeypatch):
    """Step 05's decision without measuring this CPU's matmuls: off, as in the ladder's tests."""
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")


def test_every_rung_built_on_12_records_which_loss_ran(bf16_off, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    on_12 = ["12", *(r.num for r in ladder.descendants("12"))]
    assert on_12 == ["12", "13", "14", "15", "16", "17", "18", "19", "20", "21"]
    for step in on_12:
        run = _Run(step)
        report(run)
        report(run)  # asked again: noted once
        said = [n for n in run.notes if n.startswith("step 12: ")]
        assert said == [
            "step 12: PyTorch linear + cross-entropy ran (step 11's loss), not Liger's (Liger "
            "runs Triton GPU kernels: no CUDA device (cpu))"
        ], run.notes
        if step == "12":  # the record: step_active false, and why
            assert "no CUDA device" in run.inactive_reason
        else:
            assert "Liger" not in (run.inactive_reason or "")
    run = _Run("11")  # a rung before 12 asks nothing of it
    report(run)
    assert not any(n.startswith("step 12") for n in run.notes)


def test_where_liger_can_run_the_record_says_so_and_step_12_is_active(bf16_off, monkeypatch):
    fake_liger(monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Liger may run on this CPU
    run = _Run("17")
    report(run)
    assert run.inactive_reason is None  # 17's own check waits for the kernel that ran
    for step, reason, acted in inactive.asked("17", CPU, TINY, 0.0, attention_kernel="flash"):
        run.inactive(step, reason, acted)
    assert run.inactive_reason.startswith("flash attention ran, not cuDNN's")
    assert "step 12: Liger fused linear cross-entropy kernel ran (fp32 accumulation)" in run.notes
    run = _Run("12")
    report(run)
    assert run.inactive_reason is None


@pytest.mark.slow  # two full-size steps of a 650 MB-activation config: 35 s on 2 cores
def test_checkpointing_lowers_measured_peak_memory():
    """tools/checkpoint_trade.py: an activation-heavy config (no big logits), peak RSS growth of
    one training step of step 12's model (no checkpointing) against step 13's."""
    growth = {}
    for step in ["12_liger_fused_ce", "13_gradient_checkpointing"]:
        proc = run_script([sys.executable, ROOT / "tools" / "checkpoint_trade.py", "--one",
                           ROOT / "steps" / f"{step}.py"], timeout=300,
                          env=RSS_FOLLOWS_TENSORS)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        growth[step] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_growth_bytes"]
    plain, ckpt = growth["12_liger_fused_ce"], growth["13_gradient_checkpointing"]
    # 8 blocks x ~(16*256*256*4 B) x ~20 saved tensors ~ 650 MB of activations without
    # checkpointing; with it, the 8 block inputs plus one block's recompute
    assert plain > 400e6, growth
    assert ckpt < 0.5 * plain, growth


def test_the_memory_model_sizes_liger_chunks_as_liger_does():
    """Step 12 runs Liger's public module, which keeps Liger's default chunk rule: the memory
    model's constant is the installed liger-kernel's, and at gpt2-124m's batch 32 that is 64
    chunks of 512 rows (52 MB of bf16 logits each)."""
    import inspect

    from speed_ladder.measure import memory_model as mm

    ops = pytest.importorskip("liger_kernel.ops.fused_linear_cross_entropy", exc_type=ImportError)
    default = inspect.signature(ops.fused_linear_cross_entropy_forward).parameters.get(
        "chunk_mem_const"
    )
    if default is not None:  # liger-kernel 0.8 on; before it, the rule's constant was 1
        assert default.default == mm.LIGER_CHUNK_MEM_CONST
    assert mm.LIGER_CHUNK_MEM_CONST == 1
    assert mm.liger_chunk_rows(32 * 1024, 768, 50304) == 512
    assert mm.liger_chunk_rows(20, 8, 50) == 4  # 20 rows / ceil(50 / 8): 3, a power of 2 up
    assert mm.liger_chunk_rows(3, 100, 100) == 3  # never more rows than there are
