"""Step 12's loss, built by `run.fused_linear_cross_entropy()`: Liger's fused linear
cross-entropy where Liger can run, else the plain output layer and cross-entropy.

Both are called as `loss(weight (V, C), hidden (N, C), targets (N,))` and return the mean
cross-entropy of `hidden @ weight.T` over the targets that are not -100, under the step's
autocast (step 05), and both say which one computes the loss: `fallback_reason` is None for
Liger's, else why Liger could not run. The run's record says it (rung 12's inactive check in
speed_ladder/data/ladder.json: `step 12: ...` in its notes, and `step_active: false` on step 12
itself when the fallback ran).

- Liger's: `liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss`, its public module
  (liger-kernel >= 0.6.2, pyproject.toml), with `accum_dtype=torch.float32`: the output
  layer's weight gradient is summed over all rows in fp32 (a bf16 running sum of 32K rows'
  contributions would round the small ones away). Under autocast it takes Liger's AMP path:
  the fp32 weight stays the leaf, the chunks' logits are bf16 matmul outputs. It runs on a CUDA
  GPU, or on a CPU through Triton's interpreter (TRITON_INTERPRET=1 set before the run: its
  numerics only, the record then says `interpreted: true`; measure.inactive.liger_unavailable).
  Only its import is tried: a CUDA out-of-memory or a Triton error inside it is the run's result
  (status `oom` or `error`), never a fallback.
- Not under fp16 (step 05's choice on a GPU without native bf16: V100, T4). Liger computes the
  gradient of the loss in its forward pass, in the autocast dtype, before backward brings
  GradScaler's scale: the gradient of a mean over B*T targets is (p - y) / (B*T) per logit,
  about 6e-10 for a non-target logit of gpt2-124m at batch 32 (p ~ 1/V), far below fp16's
  smallest number (6e-8), so it flushes to zero, and the scale applied afterwards brings
  nothing back. Measured on a CPU through Triton's interpreter (8192 rows, V = 8192, fp16
  autocast, loss scale 2^16): the hidden state's gradient was 1.6e-2 off fp32's (relative
  norm), 0.9% of it zero, against 3.2e-4 and none for linear + cross-entropy under the same
  autocast and scale. Step 12 then runs the fallback and says so.
- The fallback, where Liger cannot run (no CUDA GPU, liger-kernel or Triton not installed, fp16):
  `F.cross_entropy(F.linear(hidden, weight), targets)`, compiled as step 08 compiles the loss.
  It is what step 11 computes (the output layer, then the cross-entropy of the full logits,
  in the same precision under the same autocast), so where Liger cannot run step 12 changes
  nothing, as every inactive rung, and the memory model predicts step 11's logits for it.
"""

import torch
import torch.nn.functional as F

from speed_ladder.measure.inactive import liger_unavailable
from speed_ladder.measure.precision import decided

LIGER_FP16 = (
    "step 05 computes in fp16 here: Liger computes the loss's gradient in its forward pass, in "
    "fp16, before GradScaler's scale reaches it, and most of it would flush to zero"
)


@torch.compile  # as step 08 compiles the steps' loss, a graph of its own
def _linear_cross_entropy(weight, hidden, targets):
    return F.cross_entropy(F.linear(hidden, weight), targets)


class LinearCrossEntropy(torch.nn.Module):
    """The fallback: the output layer, then the cross-entropy of its full logits (step 11's)."""

    def __init__(self, why: str):
        super().__init__()
        ran = "PyTorch linear + cross-entropy ran (step 11's), not Liger's"
        self.fallback_reason = f"{ran} ({why})"

    def forward(self, weight, hidden, targets):
        return _linear_cross_entropy(weight, hidden, targets)


def fused_linear_cross_entropy(device: torch.device) -> torch.nn.Module:
    """Liger's fused loss where it can run on `device` and liger-kernel imports, and the step's
    autocast (step 05's, decided before: precision.decided) is not fp16; else the fallback. Its
    `fallback_reason` says which (None: Liger's)."""
    why = liger_unavailable(device)
    if why is None and decided(device.type) == "fp16":
        why = LIGER_FP16
    if why is None:
        try:  # liger_kernel.transformers imports the transformers package only where installed
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError as e:  # not installed (macOS, Windows), or no Triton
            why = f"liger-kernel unavailable: {type(e).__name__}: {e}"
        else:
            loss = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)
            loss.fallback_reason = None
            return loss
    return LinearCrossEntropy(why)
