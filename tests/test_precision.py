"""Step 05's fp16 path on a CPU (speed_ladder/measure/precision.py): CPU autocast takes fp16,
and torch.amp.GradScaler("cpu") scales, unscales and skips as on CUDA, so the path a V100 or T4
takes runs here with SPEED_LADDER_AMP=fp16. Which GPU gets which dtype: tests/test_gpu_sim.py.
"""

import sys

import pytest
import torch
from conftest import VERDICT, py, records, run_script

from speed_ladder import ladder, parity
from speed_ladder.autocast_env import AMP_ENV
from speed_ladder.measure import precision
from speed_ladder.measure.rung_checks import CHECKS

CPU = torch.device("cpu")
TINY = ["--preset", "tiny", "--device", "cpu", "--max-steps", 3, "--warmup-steps", 1,
        "--data", VERDICT]  # fmt: skip


@pytest.fixture
def amp(monkeypatch):
    """amp(kind): step 05's MixedPrecision on this CPU with SPEED_LADDER_AMP=kind, and its loss
    scaler as the step builds it."""

    def make(kind):
        monkeypatch.setenv(AMP_ENV, kind)
        a = precision.mixed_precision(CPU)
        return a, torch.amp.GradScaler(CPU.type, enabled=a.dtype == torch.float16)

    return make


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # as the steps


def test_the_scaler_keeps_fp16_gradients_that_would_flush_to_zero(amp):
    """A gradient of 1e-8 is below fp16's smallest number (2^-24, 6e-8): without the scale the
    fp16 activation's gradient is 0 and so is the weight's; scaled by 2^16, then unscaled, it
    is the fp32 value."""
    a, scaler = amp("fp16")
    assert a.dtype == torch.float16 and a.enabled and scaler.is_enabled()
    assert scaler.get_scale() == 2.0**16
    x = torch.ones(4, 8)

    def grad(scaled):
        model, opt = _model()
        with torch.autocast("cpu", dtype=a.dtype, enabled=a.enabled):
            y = model(x)
            assert y.dtype == torch.float16
            loss = (y.float() * 1e-8).sum()
        (scaler.scale(loss) if scaled else loss).backward()
        if scaled:
            scaler.unscale_(opt)
        return model.weight.grad

    assert torch.count_nonzero(grad(scaled=False)) == 0
    assert torch.allclose(grad(scaled=True), torch.full((8, 8), 4e-8), rtol=1e-3, atol=0)


def test_a_step_with_an_inf_gradient_is_skipped_and_the_scale_halved(amp):
    """step 05's three lines on the fused AdamW of the steps: a good step updates and keeps the
    scale; an inf in the gradients leaves the weights and AdamW's state as they were and halves
    the scale; the next good step updates again."""
    a, scaler = amp("fp16")
    model, opt = _model()
    x = torch.randn(4, 8)

    def step(poison=False):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=a.dtype, enabled=a.enabled):
            loss = model(x).float().pow(2).mean() * (float("inf") if poison else 1.0)
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    assert step() and scaler.get_scale() == 2.0**16
    steps = opt.state[model.weight]["step"].item()
    assert not step(poison=True)
    assert scaler.get_scale() == 2.0**15 and opt.state[model.weight]["step"].item() == steps
    assert step() and scaler.get_scale() == 2.0**15


@pytest.mark.parametrize("kind", ["bf16", "fp32"])
def test_without_fp16_the_scaler_does_nothing(kind, amp):
    """bf16 keeps fp32's exponent range (no underflow to guard) and fp32 needs none: the same
    three lines then run the plain backward and optimizer step."""
    a, scaler = amp(kind)
    assert a.dtype == precision.DTYPES[kind] and a.enabled is (kind == "bf16")
    assert not scaler.is_enabled()
    model, opt = _model()
    loss = model(torch.randn(4, 8)).pow(2).mean()
    assert scaler.scale(loss) is loss
    loss.backward()
    w = model.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(w, model.weight)


def test_step_05_runs_fp16_with_a_scaler_on_a_cpu_end_to_end(tmp_path):
    """Step 05 with SPEED_LADDER_AMP=fp16 on tiny: the record says fp16 and the step active;
    its losses stay within step 05's tolerance of step 04's fp32 ones (measured 3.2e-5 over 4
    steps)."""
    recs = {}
    for script in ("steps/04_pinned_memory.py", "steps/05_bf16.py"):
        num = ladder.step_of(script)
        res = tmp_path / f"{num}.jsonl"
        proc = py(script, *TINY, "--results", res, env={AMP_ENV: "fp16"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        (recs[num],) = records(res)
    r04, r05 = recs["04"], recs["05"]
    assert r04["regime"] == "fp32" and r05["regime"] == "fp16" and r05["step_active"]
    assert not any(n.startswith("step 05:") for n in r05["notes"])
    ok, how = parity.check("05", r04, r05)
    assert ok and 0 < max(abs(a - b) for a, b in zip(r04["losses"], r05["losses"], strict=True)), (
        how
    )


@pytest.mark.slow  # a second end-to-end run (about 30 s on 2 shared cores)
def test_later_rungs_keep_fp16_or_say_why_not(tmp_path):
    """Step 15 (eager) in fp16: its bf16 weights need bf16, so it keeps fp32 weights and says
    so; step 12's Liger is not asked on a CPU; the record's regime is fp16 through DDP's
    wrapper (a world of one) and the scaler's step on the masters' path."""
    res = tmp_path / "15.jsonl"
    proc = py("steps/15_bf16_weights.py", *TINY, "--results", res,
              env={AMP_ENV: "fp16", "TORCH_COMPILE_DISABLE": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (rec,) = records(res)
    assert rec["regime"] == "fp16" and not rec["step_active"]
    assert rec["inactive_reason"] == CHECKS[ladder.rung("15").num].why
    assert not any(n.startswith("step 05:") for n in rec["notes"])


FSDP2_SCALER = """
import sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
scaler = torch.amp.GradScaler("cpu")
x = torch.randn(4, 8)
for poison in (False, True, False):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    if poison and rank == 1:  # an inf in rank 1's shard of the first weight only
        model[0].weight.grad.to_local().view(-1)[0] = float("inf")
    before = [p.to_local().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    moved = any(not torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters()))
    with open(f"{sys.argv[1]}/rank{rank}.txt", "a") as out:  # a file each: no interleaving
        out.write(f"poison {poison} moved {moved} scale {scaler.get_scale():g}\\n")
dist.barrier()  # both ranks done before either tears gloo down (see the test's comment)
dist.destroy_process_group()
"""


# Without the barrier before destroy_process_group, rank 1 sometimes aborted at its exit after
# all its work ("terminate called without an active exception", SIGABRT with no Python frame:
# a gloo thread still joinable when the process tore down): 2 of 14 runs on 2 cores kept busy
# by two spinning loops; with it, 0 of 40 under the same load.
@pytest.mark.timeout(120)
def test_fsdp2_shards_skip_the_same_step_with_the_plain_grad_scaler(tmp_path):
    """Step 14 keeps step 05's torch.amp.GradScaler: with FSDP2's sharded gradients (DTensors)
    its inf check is all-reduced across the mesh (torch.distributed.tensor's handler for
    _amp_foreach_non_finite_check_and_unscale_), so an inf in one rank's shard makes every rank
    skip the step and halve the scale: no ShardedGradScaler needed."""
    script = tmp_path / "fsdp2_scaler.py"
    script.write_text(FSDP2_SCALER)
    proc = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node=2", script, tmp_path], timeout=110)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text().splitlines() == [
            "poison False moved True scale 65536",
            "poison True moved False scale 32768",
            "poison False moved True scale 32768",
        ], rank
