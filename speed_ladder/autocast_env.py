"""Step 05's autocast as the environment forces it, read without torch: $SPEED_LADDER_AMP (bf16,
fp16 or fp32) and $SPEED_LADDER_BF16 (1 or 0)."""

import os

from speed_ladder.errors import UserError

BF16_ENV = "SPEED_LADDER_BF16"  # 1/on or 0/off: step 05's rule forced, e.g. by the tests
AMP_ENV = "SPEED_LADDER_AMP"  # bf16, fp16 or fp32: step 05's autocast forced
AMP_KINDS = ("bf16", "fp16", "fp32")


def amp_forced() -> str | None:
    """$SPEED_LADDER_AMP (bf16, fp16 or fp32), or None when unset (or `auto`)."""
    raw = os.environ.get(AMP_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in AMP_KINDS:
        return raw
    raise UserError(f"{AMP_ENV}={raw!r}: use {', '.join(AMP_KINDS)} or auto")


def bf16_forced() -> bool | None:
    """bf16 forced on or off: by $SPEED_LADDER_AMP where set (on for bf16 only), else by
    $SPEED_LADDER_BF16 as True/False; None when neither forces it (unset, or `auto`)."""
    amp = amp_forced()
    if amp is not None:
        return amp == "bf16"
    raw = os.environ.get(BF16_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise UserError(f"{BF16_ENV}={raw!r}: use 1 (bf16 on), 0 (off) or auto")
