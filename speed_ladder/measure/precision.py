"""Step 05's mixed precision: which dtype autocast computes in (and so whether the step's loss
scaler is on: fp16 alone needs it), decided once per device type before the model is built.

- **bf16** where bf16 is native (`device.bf16_is_fast`: CUDA compute capability >= 8.0, AMD by
  arch; a CPU or MPS where its measured bf16 matmul beats fp32). bf16 keeps fp32's exponent
  range: no gradient underflows, no scaler.
- **fp16 with loss scaling** on an NVIDIA GPU without bf16 tensor cores but with fp16 ones:
  compute capability 7.x (V100, T4). fp16 keeps 11 significant bits but only 5 exponent bits:
  a value below 2^-24 (6e-8) flushes to zero, where many of a mean loss's gradients lie. The
  scaler (`torch.amp.GradScaler`) multiplies the loss by a large factor (2^16 to start) before
  backward, so the gradients stay representable, divides them by it before the optimizer step,
  skips a step whose gradients hold an inf or NaN (and halves the factor), and doubles the
  factor after 2000 steps without one (Micikevicius et al. 2018, "Mixed Precision Training",
  section 3.2; PyTorch's AMP recipe).
- **fp32** elsewhere: a CPU or MPS where bf16 is no faster, a GPU with neither (compute
  capability < 7.0; AMD GPUs without bf16 matrix cores: no fp16 rule measured there).

$SPEED_LADDER_AMP (bf16, fp16 or fp32) forces the choice, as $SPEED_LADDER_BF16 (1 or 0:
bf16 or fp32) does; the tests run the fp16 path on a CPU that way (CPU autocast takes fp16).

The step builds the scaler itself, `torch.amp.GradScaler(device.type, enabled=amp.dtype ==
torch.float16)`. The scaler of a bf16 or fp32 run is disabled, and its `scale(loss)` is the
loss, `step(optimizer)` is `optimizer.step()` and `update()` does nothing: every later step
runs the same lines in every regime. It works under DDP (gradients are all-reduced before it
reads them) and FSDP2 without FSDP1's ShardedGradScaler (a sharded gradient's inf check is
all-reduced across the mesh by DTensor, so every rank skips the same step:
tests/test_precision.py). Measured in fp16 on `tiny` (4 steps, 2 gloo processes, eager): steps
11, 13 and 14 computed the same losses; step 08 compiled stayed within 2.4e-5 of step 07.
"""

import os
from dataclasses import dataclass

import torch

from speed_ladder.autocast_env import AMP_ENV, BF16_ENV, amp_forced, bf16_forced
from speed_ladder.measure import device as dev
from speed_ladder.measure import gpu_specs, matmul_peak
from speed_ladder.parity import compiles

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# what choice() answered per device type, and the variables it read: the record's regime
_DECIDED: dict[str, tuple[tuple, str]] = {}


@dataclass(frozen=True)
class MixedPrecision:
    """What a step computes with: `torch.autocast(device.type, dtype=amp.dtype,
    enabled=amp.enabled)`, and its loss scaler, `torch.amp.GradScaler(device.type,
    enabled=amp.dtype == torch.float16)` (then `scaler.scale(loss).backward()`,
    `scaler.step(optimizer)`, `scaler.update()`)."""

    kind: str  # "bf16", "fp16" or "fp32"
    why: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.kind]

    @property
    def enabled(self) -> bool:
        """Autocast is on (bf16 or fp16)."""
        return self.kind != "fp32"


def _env() -> tuple:
    return tuple(os.environ.get(k) for k in (AMP_ENV, BF16_ENV))


def choice(device: torch.device) -> tuple[str, str]:
    """(bf16, fp16 or fp32, why) for this device: the rule of the module doc. $SPEED_LADDER_BF16
    forced off keeps fp32 (no fp16 either): the tests' fp32 regime on any device."""
    forced = amp_forced()
    if forced is not None:
        kind, why = forced, f"forced by {AMP_ENV}={forced}"
    else:
        bf16, why = matmul_peak.bf16_is_fast(device)
        kind = "bf16" if bf16 else "fp32"
        if not bf16 and device.type == "cuda" and bf16_forced() is None:
            p = torch.cuda.get_device_properties(device)
            fp16, more = gpu_specs.fp16_tensor_cores(p.major, p.minor, dev.is_rocm())
            kind, why = ("fp16" if fp16 else "fp32"), f"{why}; {more}"
    _DECIDED[device.type] = _env(), kind
    return kind, why


def decided(device_type: str) -> str | None:
    """What choice() last answered for this device type in this process (a step's autocast:
    the record's regime, `regime`); None when nothing asked, or when $SPEED_LADDER_AMP or
    $SPEED_LADDER_BF16 changed since."""
    memo = _DECIDED.get(device_type)
    return memo[1] if memo is not None and memo[0] == _env() else None


def mixed_precision(device: torch.device) -> MixedPrecision:
    """Step 05's call, once, before the model is built: the autocast dtype (fp16: the step's
    loss scaler on)."""
    return MixedPrecision(*choice(device))


def regime(device: torch.device) -> str:
    """The numeric regime this process computed in (speed_ladder/parity.py's module doc):
    `fp32`, `tf32`, `bf16`, `fp16`, with `-compiled` when torch.compile compiled a graph here."""
    if decided(device.type) in ("bf16", "fp16"):  # step 05's autocast
        base = decided(device.type)
    elif device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        major = torch.cuda.get_device_properties(device).major
        base = "tf32" if major >= 8 else "fp32"
    else:
        base = "fp32"
    compiled = ((compiles() or {}).get("graphs") or 0) > 0
    return base + ("-compiled" if compiled else "")
