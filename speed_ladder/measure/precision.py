"""Step 05's mixed precision, decided once per device type before the model is built: bf16
where it is native (a CUDA GPU of compute capability 8.0 on; a CPU or MPS where bf16 matmuls
measure faster), fp16 with loss scaling on a GPU with fp16 tensor cores only (V100, T4), fp32
elsewhere (docs/steps.md, 05). $SPEED_LADDER_AMP or $SPEED_LADDER_BF16 force it. The step builds
its GradScaler itself, enabled in fp16 alone (in bf16 and fp32 it passes everything through)."""

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
