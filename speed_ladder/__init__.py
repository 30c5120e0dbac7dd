"""Speed Ladder's shared harness: flags, data, timing, memory, MFU and results records.

No step changes it: every step measures the same way. A step script uses it as

    args = speed_ladder.parse_args(__doc__)
    run = speed_ladder.Run(args, STEP, __file__)
    amp = speed_ladder.mixed_precision(device)  # step 05 on: autocast's dtype, the loss scaler
    ...
    why = speed_ladder.liger_unavailable(device, amp.dtype)  # step 12 on: a rung's "whether"
    run.set_model(model, GPT_CONFIG, batch)     # before the loop: FLOPs/token, clock start, and
                                                # why each rung's idea does nothing here, if so
    ...  run.step_done(loss, tokens)            # after each optimizer step
    with run.paused(): ...                      # evaluation / sampling: not timed, not in the peak
    run.finish(train_loss, val_loss)

and ends with `speed_ladder.main(main)`, which turns bad input into one error line.
"""

from importlib import import_module

from speed_ladder.errors import UserError, main
from speed_ladder.flags import parse_args
from speed_ladder.presets import GPT2_VOCAB
from speed_ladder.spec import micro_batches

# The names that need torch, imported when first used: `import speed_ladder.report.redraw` (the
# charts, plot_results.py) runs this file and must not need torch. A step asks some itself
# before it acts, and then performs the technique with the library's own API: step 05
# mixed_precision, step 12 liger_unavailable, step 17 cudnn_attention_unavailable, step 20
# batch_fit_unavailable (and the memory model's batch_fits).
_NEEDS_TORCH = {"Run": "measure.run", "ddp_backend": "measure.device",
                "mixed_precision": "measure.precision", "liger_unavailable": "measure.inactive",
                "cudnn_attention_unavailable": "measure.inactive",
                "batch_fit_unavailable": "measure.inactive",
                "batch_fits": "measure.rank_memory"}  # fmt: skip


def __getattr__(name: str):
    if name not in _NEEDS_TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_NEEDS_TORCH[name]}", __name__), name)


__all__ = ["GPT2_VOCAB", "UserError", "main", "micro_batches", "parse_args"]
__all__ += sorted(_NEEDS_TORCH)
