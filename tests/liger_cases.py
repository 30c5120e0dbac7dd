"""Step 12's Liger call checked against plain linear + cross-entropy: the cases shared by the CPU
suite (tests/test_liger.py, through Triton's interpreter: TRITON_INTERPRET=1 in a subprocess
running this file) and the GPU suite (tests/test_gpu.py, the same cases on CUDA, compiled).

Every case calls step 12's own `FusedLinearCrossEntropy` (its import, its argument order to
`LigerFusedLinearCrossEntropyFunction.apply`, `ignore_index=-100`, `accum_dtype`), never Liger
directly, so a change to the step's call is what these cases see. `python tests/liger_cases.py
[cpu|cuda]` prints one JSON line per case: its measured errors and its tolerances.

Tolerances, per dtype:
- fp32: the reference is `F.cross_entropy(h @ w.T, t)` in fp32; Liger computes the same sums
  chunk by chunk in another order: ~1e-7 relative per op. Loss 1e-5, gradients 1e-5 of their
  largest entry (measured: the loss equal, gradients 7e-10 and 2e-8 absolute).
  On CUDA (not yet run on a GPU) fp32 gets 5e-3: a matmul may run in TF32 (2^-11 per input).
- bf16: the step casts hidden and weight to bf16 (as autocast would); the reference is fp32 math
  on those same bf16 values. Liger's logits are bf16 matmul outputs (unit roundoff 2^-9 = 2e-3
  relative), so the loss may move by ~2e-3 x |logit| / sqrt(rows): tolerance 1e-2 (measured
  1.4e-4); the hidden gradient is returned in bf16, the weight gradient is summed in fp32 and
  rounded to bf16 once: 2^-7 of the largest entry (2 bf16 roundings plus the logits').
- accumulation (`accum_dtype`): 512 rows in 32 chunks of 16 (Liger's chunk: V / H = 32 chunks),
  all with target 0 and positive hidden values, so that every row's contribution to a weight
  gradient entry has the same sign; chunk 0's rows are large, the other 31 chunks' 1/1024 of
  them, so each later chunk adds 2^-10 relative to the running sum: a bf16 running sum (half an
  ulp is 2^-9 relative) rounds every one of them away (~3% of the entry), an fp32 one keeps
  them. The check: the weight gradient within 2^-7 of its largest entry, and its error below half
  of those 31 chunks' share (measured: a quarter with fp32 accumulation, 1.2x with bf16). A
  control case runs the same with `accum_dtype=None` (a bf16
  running sum), which the check must reject.
"""

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
IGNORE = -100


def step12():
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import load_step

    return load_step("12_liger_fused_ce")


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


class _Bf16Accumulation:
    """Liger's Function with the step's last argument (accum_dtype) replaced by None: the weight
    gradient summed in bf16. Only the control case uses it, to show the accum case can fail."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, *args):
        assert args[-1] is torch.float32, args[-1]
        return self.fn.apply(*args[:-1], None)


def _liger(mod, dtype, h, w, t, bf16_accumulation=False):
    """The step's loss: hidden cast to `dtype` inside, weight an fp32 leaf cast as the step does."""
    fused = mod.FusedLinearCrossEntropy(dtype, h.device)
    assert fused.liger is not None, fused.fallback_reason
    if bf16_accumulation:
        fused.liger = _Bf16Accumulation(fused.liger)
    h = h.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    loss = fused(w, h, t)
    loss.backward()
    assert fused.fallback_reason is None  # the step's loop then notes that Liger's kernel ran
    return loss.detach(), h.grad, w.grad


def _err(a, b):
    return (a.float() - b.float()).abs().max().item()


CASES = {
    # name: (dtype, rows, dim, vocab, ignored, scale_rows, loss tol, grad tol relative to max)
    "fp32": (torch.float32, 64, 32, 512, 5, None, 1e-5, 1e-5),
    "bf16": (torch.bfloat16, 64, 32, 512, 5, None, 1e-2, 2**-7),
    "accum": (torch.bfloat16, 512, 8, 256, 0, 16, 1e-2, 2**-7),
    # the control: the accum case with bf16 accumulation, which check() must reject
    "accum-bf16-control": (torch.bfloat16, 512, 8, 256, 0, 16, 1e-2, 2**-7),
}


def run_case(name, device, mod=None):
    """{case, loss_err, hidden_err, weight_err, tolerances, ...} for one case on `device`."""
    mod = mod or step12()
    dtype, rows, dim, vocab, ignored, scale_rows, loss_tol, grad_tol = CASES[name]
    if torch.device(device).type == "cuda" and dtype == torch.float32:
        loss_tol, grad_tol = 5e-3, 5e-3  # TF32 where a matmul allows it: 2^-11 per input
    h, w, t = _inputs(rows, dim, vocab, ignored, 0, device, scale_rows)
    hq, wq = h.to(dtype).float(), w.to(dtype).float()  # what the step computes with
    ref_loss, ref_h, ref_w = _reference(hq, wq, t)
    loss, gh, gw = _liger(mod, dtype, h, w, t, bf16_accumulation=name.endswith("-control"))
    out = {
        "case": name,
        "device": str(device),
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
    mod = step12()
    for name in sys.argv[2:] or CASES:
        print(json.dumps(run_case(name, device, mod)), flush=True)
