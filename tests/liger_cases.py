"""Step 12's Liger loss checked against plain linear + cross-entropy: the cases shared by the CPU
suite (tests/test_liger.py, through Triton's interpreter: TRITON_INTERPRET=1 in a subprocess
running this file) and the GPU suite (tests/test_gpu.py, the same cases on CUDA, compiled).

Every case builds the loss as step 12 does (Liger's public LigerFusedLinearCrossEntropyLoss with
`accum_dtype=torch.float32`, where the harness's `liger_unavailable` says it can run) and calls
it as the step does, under its autocast, with the fp32
weight as the leaf: so the import, the module's arguments, `ignore_index=-100`, Liger's chunks
(its default rule: 16 chunks of 4 rows in the fp32 and bf16 cases, 32 of 16 in the accumulation
cases), its AMP path and the fp32 accumulation are what these cases see. `python
tests/liger_cases.py [cpu|cuda] [CASE...]` prints one JSON line per case: its measured errors
and its tolerances.

Tolerances, per dtype:
- fp32: the reference is `F.cross_entropy(h @ w.T, t)` in fp32; Liger computes the same sums
  chunk by chunk in another order: ~1e-7 relative per op. Loss 1e-5, gradients 1e-5 of their
  largest entry. On CUDA fp32 gets 5e-3: a matmul may run in TF32 (2^-11 per input).
- bf16: the step's bf16 autocast around the loss (hidden and weight fp32, as the model's final
  LayerNorm and out_head hand them over); the reference is fp32 math on their bf16 roundings.
  Liger's logits are bf16 matmul outputs (unit roundoff 2^-9 = 2e-3 relative), so the loss may
  move by ~2e-3 x |logit| / sqrt(rows): tolerance 1e-2 (measured 2.7e-4); both gradients are bf16
  matmuls of the bf16 logits' gradient, the weight's summed over the chunks in fp32: 2^-7 of
  the largest entry (measured: 0.83 and 0.79 of it, interpreted).
- accumulation (the fp32 weight-gradient sum): 512 rows in 32 chunks of 16, all with target 0
  and positive hidden values, so that every row's contribution to a weight gradient entry has
  the same sign; chunk 0's rows are large, the other 31 chunks' 1/1024 of them, so each later
  chunk adds 2^-10 relative to the running sum: a bf16 running sum (half an ulp is 2^-9
  relative) rounds every one of them away (~3% of the entry), an fp32 one keeps them. The
  check: the weight gradient within 2^-7 of its largest entry, and its error below half of
  those 31 chunks' share. A control case runs the same through Liger's module with its default
  accumulation (accum_dtype None) on a bf16 weight, a bf16 running sum, which the check must
  reject.
"""

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
IGNORE = -100


def _inputs(rows, dim, vocab, ignored, seed, device, scale_rows=None):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, dim, generator=g)
    w = torch.randn(vocab, dim, generator=g) / math.sqrt(dim)
    t = torch.randint(0, vocab, (rows,), generator=g)
    if scale_rows is not None:  # every row's contribution of one sign, to one target: they add up
        h = h.abs()
        h[scale_rows:] /= 1024  # each later chunk adds 2^-10 of chunk 0's share: bf16 drops it
        t[:] = 0
    t[torch.randperm(rows, generator=g)[:ignored]] = IGNORE
    return h.to(device), w.to(device), t.to(device)


def _reference(h, w, t):
    """fp32 linear + cross-entropy on the values the step computes with."""
    h = h.detach().float().requires_grad_(True)
    w = w.detach().float().requires_grad_(True)
    loss = F.cross_entropy(h @ w.T, t, ignore_index=IGNORE)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def step12_loss(device):
    """The loss step 12 builds here: Liger's, or the test fails (where the harness says Liger
    cannot run, the step would run step 11's loss instead). tests/test_step_fixes.py checks that
    every step from 12 on builds exactly this module."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    from speed_ladder.measure.inactive import liger_unavailable

    why = liger_unavailable(torch.device(device), torch.bfloat16)
    assert why is None, why
    return LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)


def _liger(device, bf16, h, w, t, control=False):
    """The step's call: hidden and the fp32 weight leaf under the step's autocast; the control:
    Liger's module with its own default accumulation, on a bf16 weight leaf."""
    fused = step12_loss(device)
    h = h.detach().clone().requires_grad_(True)
    w = w.detach().clone()
    if control:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        fused, w = LigerFusedLinearCrossEntropyLoss(), w.to(torch.bfloat16)
    w.requires_grad_(True)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
        loss = fused(w, h, t)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _err(a, b):
    return (a.float() - b.float()).abs().max().item()


CASES = {
    # name: (bf16 autocast, rows, dim, vocab, ignored, scale_rows, loss tol, grad tol relative
    #        to max)
    "fp32": (False, 64, 32, 512, 5, None, 1e-5, 1e-5),
    "bf16": (True, 64, 32, 512, 5, None, 1e-2, 2**-7),
    "accum": (True, 512, 8, 256, 0, 16, 1e-2, 2**-7),
    # the control: the accum case with bf16 accumulation, which check() must reject
    "accum-bf16-control": (True, 512, 8, 256, 0, 16, 1e-2, 2**-7),
}


def run_case(name, device):
    """{case, loss_err, hidden_err, weight_err, tolerances, ...} for one case on `device`."""
    from speed_ladder.measure.memory_model import liger_chunk_rows

    bf16, rows, dim, vocab, ignored, scale_rows, loss_tol, grad_tol = CASES[name]
    if torch.device(device).type == "cuda" and not bf16:
        loss_tol, grad_tol = 5e-3, 5e-3  # TF32 where a matmul allows it: 2^-11 per input
    h, w, t = _inputs(rows, dim, vocab, ignored, 0, device, scale_rows)
    dtype = torch.bfloat16 if bf16 else torch.float32
    hq, wq = h.to(dtype).float(), w.to(dtype).float()  # what the step computes with
    ref_loss, ref_h, ref_w = _reference(hq, wq, t)
    loss, gh, gw = _liger(device, bf16, h, w, t, control=name.endswith("-control"))
    out = {
        "case": name,
        "device": str(device),
        "chunks": -(-rows // liger_chunk_rows(rows, dim, vocab)),
        "loss": loss.item(),
        "ref_loss": ref_loss.item(),
        "loss_err": abs(loss.item() - ref_loss.item()),
        "loss_tol": loss_tol,
        "hidden_err": _err(gh, ref_h),
        "hidden_tol": grad_tol * ref_h.abs().max().item(),
        "weight_err": _err(gw, ref_w),
        "weight_tol": grad_tol * ref_w.abs().max().item(),
        "ignored_rows_zero": bool((gh[t == IGNORE] == 0).all()),
        "weight_grad_dtype": str(gw.dtype),
    }
    if scale_rows is not None:  # the small rows' share of the weight gradient
        small = hq[scale_rows:].clone()
        wl = wq.clone().requires_grad_(True)
        (F.cross_entropy(small @ wl.T, t[scale_rows:], reduction="sum") / rows).backward()
        out["small_rows_share"] = wl.grad.abs().max().item()
    return out


def check(res):
    """Assertion messages for one case's result (empty: it passed)."""
    over = [k for k in ("loss", "hidden", "weight") if not res[k + "_err"] <= res[k + "_tol"]]
    bad = [f"{k} {res[k + '_err']:.3g} > {res[k + '_tol']:.3g}" for k in over]
    if not res["ignored_rows_zero"]:
        bad.append("an ignored target's row got a gradient")
    if res["weight_grad_dtype"] != "torch.float32":
        bad.append(f"weight gradient {res['weight_grad_dtype']}, not the fp32 leaf's")
    if "small_rows_share" in res and not res["weight_err"] < res["small_rows_share"] / 2:
        bad.append(
            f"weight error {res['weight_err']:.3g} is not well below the small rows' "
            f"share {res['small_rows_share']:.3g}: their contributions were lost"
        )
    return bad


if __name__ == "__main__":
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    for name in sys.argv[2:] or CASES:
        print(json.dumps(run_case(name, device)), flush=True)
