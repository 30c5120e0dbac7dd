"""Step 12's Liger loss checked against plain linear + cross-entropy: the cases shared by the CPU
suite (tests/test_liger.py, through Triton's interpreter: TRITON_INTERPRET=1 in a subprocess
running this file) and the GPU suite (tests/test_gpu.py, the same cases on CUDA, compiled).

Every case calls step 12's own `FusedLinearCrossEntropy` (its import of Liger's kernel, the
kernel's arguments, its chunk loop, `ignore_index=-100`, the fp32 accumulation, the backward),
never Liger directly, so a change to the step's code is what these cases see. `python
tests/liger_cases.py [cpu|cuda] [CASE...]` prints one JSON line per case: its measured errors and
its tolerances; `python tests/liger_cases.py [cpu|cuda] syncs` prints the host syncs (below).

Each case sets the step's `chunk_mem_const` (its chunks by Liger's rule, `liger_chunk_rows`), so
that every case runs several chunks: the step's 8 (2 chunks of 32 rows in the fp32 and bf16
cases), or Liger's default 1 (16 chunks of 4 rows; 32 chunks of 16 in the accumulation cases).

Tolerances, per dtype:
- fp32: the reference is `F.cross_entropy(h @ w.T, t)` in fp32; Liger computes the same sums
  chunk by chunk in another order: ~1e-7 relative per op. Loss 1e-5, gradients 1e-5 of their
  largest entry (measured: the loss 5e-7, gradients 8e-9 and 2e-8 absolute).
  On CUDA (not yet run on a GPU) fp32 gets 5e-3: a matmul may run in TF32 (2^-11 per input).
- bf16: the step casts hidden and weight to bf16 (as autocast would); the reference is fp32 math
  on those same bf16 values. Liger's logits are bf16 matmul outputs (unit roundoff 2^-9 = 2e-3
  relative), so the loss may move by ~2e-3 x |logit| / sqrt(rows): tolerance 1e-2 (measured
  2.7e-4); the hidden gradient is a bf16 matmul of the bf16 logits' gradient, scaled in bf16 by
  1 / (rows not ignored) in backward; the weight gradient is summed in fp32 and stays fp32:
  2^-7 of the largest entry (measured: 0.68 and 0.34 of it).
- accumulation (the fp32 weight-gradient sum): 512 rows in 32 chunks of 16 (Liger's default
  chunk: V / H = 32 chunks), all with target 0 and positive hidden values, so that every row's
  contribution to a weight gradient entry has the same sign; chunk 0's rows are large, the other
  31 chunks' 1/1024 of them, so each later chunk adds 2^-10 relative to the running sum: a bf16
  running sum (half an ulp is 2^-9 relative) rounds every one of them away (~3% of the entry),
  an fp32 one keeps them. The check: the weight gradient within 2^-7 of its largest entry, and
  its error below half of those 31 chunks' share (measured: a quarter with fp32 accumulation,
  1.2x with bf16). A control case runs the same with a bf16 running sum (the step's Function
  given accum_dtype bf16), which the check must reject.

Host syncs (`syncs`): forward and backward of the step's fused loss call none of the torch
entry points that wait for the GPU (SYNCS: `.item()`, `torch.equal`, `.tolist()`, `bool()` of a
tensor, `.cpu()`, ...), counted wherever they are called from but Triton's own package (the
interpreter copies every kernel argument to the host with `.cpu()` and back: on a GPU no such
copy exists). A control runs Liger's own LigerFusedLinearCrossEntropyFunction under the same
counter, which must count its `.item()` and its `torch.equal` (fused_linear_cross_entropy.py
~lines 132 and 420), so that the check can fail.
"""

import importlib.util
import json
import math
import sys
from collections import Counter
from contextlib import contextmanager
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
    """The step's Function with its last argument (accum_dtype) replaced by bf16: the weight
    gradient summed in bf16. Only the control case uses it, to show the accum case can fail."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, *args):
        assert args[-1] is torch.float32, args[-1]
        return self.fn.apply(*args[:-1], torch.bfloat16)


def _fused(mod, dtype, device, chunk_mem_const):
    fused = mod.FusedLinearCrossEntropy(dtype, device)
    assert fused.liger is not None, fused.fallback_reason
    fused.chunk_mem_const = chunk_mem_const
    return fused


def _liger(mod, dtype, h, w, t, chunk_mem_const, bf16_accumulation=False):
    """The step's loss: hidden cast to `dtype` inside, weight an fp32 leaf cast as the step does."""
    fused = _fused(mod, dtype, h.device, chunk_mem_const)
    h = h.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    function = mod.LigerLinearCrossEntropy
    if bf16_accumulation:
        mod.LigerLinearCrossEntropy = _Bf16Accumulation(function)
    try:
        loss = fused(w, h, t)
    finally:
        mod.LigerLinearCrossEntropy = function
    loss.backward()
    assert fused.fallback_reason is None  # the step's loop then notes that Liger's kernel ran
    return loss.detach(), h.grad, w.grad


def _err(a, b):
    return (a.float() - b.float()).abs().max().item()


CASES = {
    # name: (dtype, rows, dim, vocab, ignored, scale_rows, chunk_mem_const, loss tol,
    #        grad tol relative to max)
    "fp32": (torch.float32, 64, 32, 512, 5, None, 8, 1e-5, 1e-5),
    "bf16": (torch.bfloat16, 64, 32, 512, 5, None, 8, 1e-2, 2**-7),
    "bf16-16-chunks": (torch.bfloat16, 64, 32, 512, 5, None, 1, 1e-2, 2**-7),
    "accum": (torch.bfloat16, 512, 8, 256, 0, 16, 1, 1e-2, 2**-7),
    # the control: the accum case with bf16 accumulation, which check() must reject
    "accum-bf16-control": (torch.bfloat16, 512, 8, 256, 0, 16, 1, 1e-2, 2**-7),
}


def run_case(name, device, mod=None):
    """{case, loss_err, hidden_err, weight_err, tolerances, ...} for one case on `device`."""
    mod = mod or step12()
    dtype, rows, dim, vocab, ignored, scale_rows, chunk_mem_const, loss_tol, grad_tol = CASES[name]
    if torch.device(device).type == "cuda" and dtype == torch.float32:
        loss_tol, grad_tol = 5e-3, 5e-3  # TF32 where a matmul allows it: 2^-11 per input
    h, w, t = _inputs(rows, dim, vocab, ignored, 0, device, scale_rows)
    hq, wq = h.to(dtype).float(), w.to(dtype).float()  # what the step computes with
    ref_loss, ref_h, ref_w = _reference(hq, wq, t)
    control = name.endswith("-control")
    loss, gh, gw = _liger(mod, dtype, h, w, t, chunk_mem_const, bf16_accumulation=control)
    out = {
        "case": name,
        "device": str(device),
        "chunks": -(-rows // mod.liger_chunk_rows(rows, dim, vocab, chunk_mem_const)),
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


# torch's entry points that make the host wait for the GPU: (owner, name)
TENSOR_SYNCS = "item tolist __bool__ __int__ __float__ cpu numpy nonzero equal".split()
SYNCS = [(torch.Tensor, n) for n in TENSOR_SYNCS]
SYNCS += [(torch, "equal"), (torch, "nonzero"), (torch.cuda, "synchronize")]


@contextmanager
def counting_syncs():
    """Counts calls of SYNCS, {"Tensor.item": n, ...}, from anywhere but Triton's package (its
    interpreter's host copies of the kernel's arguments); triton is found, not imported."""
    triton_dir = importlib.util.find_spec("triton").submodule_search_locations[0]
    counts, saved = Counter(), []

    def counting(orig, name):
        def call(*args, **kwargs):
            if not sys._getframe(1).f_code.co_filename.startswith(triton_dir):
                counts[name] += 1
            return orig(*args, **kwargs)

        return call

    for owner, attr in SYNCS:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, counting(saved[-1][2], f"{owner.__name__}.{attr}"))
    try:
        yield counts
    finally:
        for owner, attr, orig in reversed(saved):
            setattr(owner, attr, orig)


def syncs(device, mod=None):
    """{"step": counts, "liger": counts}: the host syncs (counting_syncs) of one forward and
    backward of the step's fused loss (bf16, 2 chunks), and of Liger's own Function (the control)
    on the same bf16 inputs, each after a warm-up call (Triton compiles outside the count)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    mod = mod or step12()
    h, w, t = _inputs(64, 32, 512, 5, 0, device)
    fused = _fused(mod, torch.bfloat16, h.device, 8)

    def step_loss():
        fused(w.clone().requires_grad_(True), h.clone().requires_grad_(True), t).backward()

    def liger_loss():  # the call step 12 made before: hidden, weight, targets, ... accum_dtype
        hb = h.to(torch.bfloat16).requires_grad_(True)
        wb = w.to(torch.bfloat16).requires_grad_(True)
        args = (None, None, IGNORE, 0.0, 0.0, "mean", None, False, torch.float32)
        LigerFusedLinearCrossEntropyFunction.apply(hb, wb, t, *args)[0].backward()

    out = {}
    for name, loss in (("step", step_loss), ("liger", liger_loss)):
        loss()
        with counting_syncs() as counts:
            loss()
        out[name] = dict(counts)
    return out


if __name__ == "__main__":
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    mod = step12()
    if sys.argv[2:] == ["syncs"]:
        print(json.dumps(syncs(device, mod)), flush=True)
        sys.exit(0)
    for name in sys.argv[2:] or CASES:
        print(json.dumps(run_case(name, device, mod)), flush=True)
