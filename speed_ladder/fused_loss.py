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
- The fallback, where Liger cannot run (no CUDA GPU, liger-kernel or Triton not installed):
  `F.cross_entropy(F.linear(hidden, weight), targets)`, compiled as step 08 compiles the loss.
  It is what step 11 computes (the output layer, then the cross-entropy of the full logits,
  in the same precision under the same autocast), so where Liger cannot run step 12 changes
  nothing, as every inactive rung, and the memory model predicts step 11's logits for it.
"""

import torch
import torch.nn.functional as F

from speed_ladder.measure.inactive import liger_unavailable


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
    """Liger's fused loss where it can run on `device` and liger-kernel imports, else the
    fallback; its `fallback_reason` says which (None: Liger's)."""
    why = liger_unavailable(device)
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
