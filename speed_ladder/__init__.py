"""Speed Ladder's shared harness: flags, data, timing, memory, MFU and results records.

No step changes it: every step measures the same way. A step script uses it as

    args = speed_ladder.parse_args(__doc__)
    run = speed_ladder.Run(args, STEP, __file__)
    amp = speed_ladder.mixed_precision(device)  # step 05 on: autocast's dtype, the loss scaler
    why = speed_ladder.liger_unavailable(device, amp.dtype)  # step 12 on: a rung's "whether"
    run.set_model(model, GPT_CONFIG, batch)  # before the loop: FLOPs/token, clock start
    run.step_done(loss, tokens)  # after each optimizer step
    with run.paused(): ...  # evaluation / sampling: not timed, not in the peak
    run.finish(train_loss, val_loss)

and ends with `speed_ladder.main(main)`, which turns bad input into one error line.
"""

from speed_ladder.errors import UserError, main
from speed_ladder.flags import parse_args
from speed_ladder.presets import GPT2_VOCAB
from speed_ladder.spec import micro_batches

# The names that need torch, looked up in their module at each use (so a test's patch of it
# shows): `import speed_ladder` (plot_results.py) must not import torch. Three checks a step
# asks before it acts (steps 12, 17, 20), and what every step calls.
_CHECKS = {"liger_unavailable", "cudnn_attention_unavailable", "batch_fit_unavailable"}
_OTHERS = ("Run", "ddp_backend", "mixed_precision", "batch_fits")


def __getattr__(name: str):
    # each import here keeps torch out of `import speed_ladder`
    if name in _CHECKS:
        from speed_ladder.measure import inactive  # torch: imported on first use

        return getattr(inactive, name)
    if name == "Run":
        from speed_ladder.measure.run import Run  # torch: imported on first use

        return Run
    if name == "ddp_backend":
        from speed_ladder.measure.device import ddp_backend  # torch: imported on first use

        return ddp_backend
    if name == "mixed_precision":
        from speed_ladder.measure.precision import mixed_precision  # torch: on first use

        return mixed_precision
    if name == "batch_fits":
        from speed_ladder.measure import rank_memory  # torch: imported on first use

        return rank_memory.batch_fits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GPT2_VOCAB", "UserError", "main", "micro_batches", "parse_args"]
__all__ += sorted({*_CHECKS, *_OTHERS})
