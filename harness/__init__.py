"""Speed Ladder's shared harness: flags, data, timing, memory, MFU and results records.

No step changes it: every step measures the same way. A step script uses it as

    args = harness.parse_args(__doc__)
    run = harness.Run(args, STEP, __file__)
    ...
    run.inactive("02", harness.tf32_unavailable(device))  # why step 02 does nothing here, or None
    run.set_model(model, GPT_CONFIG, batch)     # before the loop: FLOPs/token, clock start
    ...  run.step_done(loss, tokens)            # after each optimizer step
    with run.paused(): ...                      # evaluation / sampling: not timed, not in the peak
    run.finish(train_loss, val_loss)

and ends with `harness.main(main)`, which turns bad input into one error line.
"""

from .cli import main, parse_args
from .device import bf16_is_fast, ddp_backend
from .errors import UserError
from .inactive import (
    compile_disabled,
    liger_unavailable,
    pinned_memory_useless,
    sdpa_math_only,
    tf32_unavailable,
    world_of_one,
)
from .presets import GPT2_VOCAB
from .run import Run

__all__ = [
    "GPT2_VOCAB",
    "Run",
    "UserError",
    "bf16_is_fast",
    "compile_disabled",
    "ddp_backend",
    "liger_unavailable",
    "main",
    "parse_args",
    "pinned_memory_useless",
    "sdpa_math_only",
    "tf32_unavailable",
    "world_of_one",
]
