"""A run's settings resolved once (`resolve_spec`) into a frozen RunSpec (speed_ladder/spec.py):
the preset (--preset, else gpt2-124m on CUDA and cpu elsewhere) with the flags applied, the
batch rule on a GPU too small for the preset's batch (`fit_batch`), step 05's autocast where it
is known without measuring, --to-loss. How they are chosen: docs/measurement.md and
docs/memory.md."""

from dataclasses import fields

from speed_ladder import ladder
from speed_ladder.autocast_env import amp_forced, bf16_forced
from speed_ladder.errors import UserError
from speed_ladder.files import data_id
from speed_ladder.measure import memory_model
from speed_ladder.measure.curve import val_batches
from speed_ladder.presets import GPT2_VOCAB, PRESETS, TO_LOSS
from speed_ladder.spec import (
    BatchRule,
    RunSpec,
    ToLoss,
    default_workers,
    micro_batches,
    preset_name,
)

# The memory model counts fused ops (Korthikanti et al.): step 00's hand-written LayerNorm, GELU
# and attention save more. On the one published fp32 peak, step 00 at batch 8 (26.26 GB reserved
# on an A100, results/reference), it predicts 23.4 GB: x1.12. The batch rule and step 20 add 15%
# to every prediction, then the CUDA context (memory_model's 1 GiB).
FIT_MARGIN = 1.15
TO_LOSS_EPOCHS = 10**6  # --to-loss: epochs without end; the target or the token budget stops it
FLAGGED = ("epochs", "max_steps", "warmup_steps", "accum_steps")  # flags that replace the preset's


def gpu_bytes_needed(predicted: float) -> float:
    """What a GPU must hold for a run the memory model predicts at `predicted` bytes."""
    return predicted * FIT_MARGIN + memory_model.CUDA_OVERHEAD


def batch_fits_gpu(
    shape: dict,
    step: str,
    world: int,
    batch: int,
    half: bool | None,
    capacity: int,
    windows: int,
    fused: bool,
    name: str = "custom",
) -> bool:
    """Step 20's test of one batch on a CUDA GPU: `batch` sequences per process within the text's
    training `windows` (over every process), and the memory model's prediction for them, with
    the loss that runs (`fused`: Liger's; else the full logits), within `capacity` bytes."""
    if batch * world > windows:
        return False
    vocab = shape.get("vocab_size")
    p = memory_model.predict_run(shape, step, world, batch, half, "cuda", None, vocab, name, fused)
    return gpu_bytes_needed(p.total_bytes) <= capacity


def amp_known(device_type: str, gpu_amp: str | None) -> str | None:
    """Step 05's autocast where it needs no measuring: $SPEED_LADDER_AMP, $SPEED_LADDER_BF16
    (bf16 or fp32), else a CUDA GPU's (`gpu_amp`); None on a CPU or MPS (measured there)."""
    if amp_forced() is not None:
        return amp_forced()
    if bf16_forced() is not None:
        return "bf16" if bf16_forced() else "fp32"
    return gpu_amp if device_type == "cuda" else None


def resolve_spec(values: dict, device_type: str, gpu: tuple[int, str] | None = None) -> RunSpec:
    """The RunSpec of a run with these flag values (a step's args as a dict, or the sweep's
    measuring values) on a device of `device_type`; `gpu`: a CUDA device's (memory in bytes,
    autocast), for the batch rule and `amp`, which applies where --batch-size is not given."""
    name, why = preset_name(values.get("preset"), device_type)
    preset = PRESETS[name]
    p = {f.name: preset[f.name] for f in fields(RunSpec) if f.name in preset}
    p |= {k: values[k] for k in FLAGGED if values.get(k) is not None}
    rule, override = None, values.get("batch_size")
    if override is not None:
        p["batch_size"] = p["large_batch_size"] = override
    elif device_type == "cuda" and gpu is not None:
        rule = fit_batch(name, p, *gpu)
        if rule is not None:
            p["batch_size"], p["large_batch_size"] = rule.batch, rule.large_batch
    to_loss = to_loss_settings(name, values.get("to_loss"), values.get("token_budget"))
    if to_loss is not None:  # the target or the budget ends the run, not a step count
        p["max_steps"] = values.get("max_steps")
        p["epochs"] = values.get("epochs") or TO_LOSS_EPOCHS
        # every rung evaluates in batches of batch_size: these cover the same val_tokens
        p["eval_iters"] = val_batches(to_loss.val_tokens, p["batch_size"], p["context_length"])
    if p["max_steps"] is not None and p["max_steps"] <= p["warmup_steps"]:
        raise UserError(
            f"--max-steps {p['max_steps']} leaves no timed step after "
            f"{p['warmup_steps']} warm-up steps; raise --max-steps or lower --warmup-steps"
        )
    workers = values.get("workers")
    return RunSpec(
        preset=name,
        why=why,
        device=device_type,
        **p,
        workers=default_workers(device_type) if workers is None else workers,
        seed=values.get("seed"),
        to_loss=to_loss,
        batch_rule=rule,
        batch_override=override,
        accum_override=values.get("accum_steps"),
        gpu_bytes=gpu[0] if gpu is not None else None,
        amp=amp_known(device_type, gpu[1] if gpu is not None else None),
        data=data_id(values.get("data")),
    )


def to_loss_settings(name: str, target, budget: int | None) -> ToLoss | None:
    """A --to-loss run's settings: the target (`preset`: the preset's measured one), the token
    budget (--token-budget, else the preset's), how often it evaluates and over how many
    validation tokens (presets.TO_LOSS); None without --to-loss."""
    if target is None:
        if budget is not None:
            raise UserError("--token-budget is for a --to-loss run; add --to-loss L")
        return None
    measured = TO_LOSS.get(name)
    if measured is None:
        raise UserError(
            f"preset {name} has no measured time-to-loss settings (how often to evaluate, on "
            f"how many tokens): use one that has, --preset {' or --preset '.join(TO_LOSS)}"
        )
    return ToLoss(
        target=float(measured["target"] if target == "preset" else target),
        budget_tokens=budget or measured["budget_tokens"],
        eval_tokens=measured["eval_tokens"],
        val_tokens=measured["val_tokens"],
    )


# ---------------------------------------------------------------- a batch that fits this GPU
def _heaviest(shape: dict, batch: int, large: int, half: bool) -> tuple[str, int]:
    """(step, predicted bytes) of the ladder's heaviest step on one GPU at these batches."""
    worst = (ladder.BASELINE, 0)
    for r in ladder.rungs():
        m = r.memory
        act = 2 if half and m.bf16_autocast else 4
        b = large if m.large_batch else batch
        vocab = memory_model.VOCAB if m.padded_vocab else GPT2_VOCAB
        p = memory_model.predict(shape, 1, r.num, b, act, flash=m.flash, vocab=vocab)
        worst = max(worst, (r.num, p.total_bytes), key=lambda w: w[1])
    return worst


def fit_batch(name: str, p: dict, gpu_bytes: int, amp: str) -> BatchRule | None:
    """The batch rule: None where the preset's batches fit a GPU of `gpu_bytes` (amp: step 05's
    autocast there); else the batches halved together until the heaviest step fits, so that
    every step makes the same choice and the speedups compare (the preset's where none fits)."""
    gib = lambda x: f"{x / memory_model.GIB:.1f} GiB"

    def need(batch, large):
        step, b = _heaviest(p, batch, large, amp != "fp32")
        return step, gpu_bytes_needed(b)

    batch, large = p["batch_size"], p["large_batch_size"]
    step, first = need(batch, large)
    if first <= gpu_bytes:
        return None
    head = (
        f"this GPU's {gib(gpu_bytes)} cannot hold {name} at batch {batch} (step {step} "
        f"needs {gib(first)}: predicted x{FIT_MARGIN} + the CUDA context)"
    )
    b, lb = batch, large
    while b > 1 or lb > 1:
        b, lb = max(1, b // 2), max(1, lb // 2)
        step, n = need(b, lb)
        if n <= gpu_bytes:
            large_from = ladder.first(lambda r: r.memory.large_batch).num
            why = (
                f"{head}: batch {b} (step {large_from} on: {lb}) for every step, so the "
                f"speedups compare; step {step} needs {gib(n)}; --batch-size N overrides"
            )
            return BatchRule(gpu_bytes, batch, large, b, lb, step, why)
    why = (
        f"{head}, nor at batch 1: the preset's batch is kept (python -m "
        "speed_ladder.measure.memory_model shows what fits; step 14 on several GPUs shards "
        "the state)"
    )
    return BatchRule(gpu_bytes, batch, large, batch, large, step, why)


def refuse_unused(spec: RunSpec, step: str) -> None:
    """A setting the rung does not use is a UserError, not ignored: --accum-steps on a rung that
    does not accumulate, or one that does not split the rung's batch into equal micro-batches
    (the preset's own accum_steps there stays a note: inactive.batch_not_split)."""
    asked = spec.accum_override
    try:
        rung = ladder.rung(step)
    except UserError:  # not a rung of the ladder (a test's script)
        return
    if asked is None:
        return
    if not rung.memory.accumulation:
        doing = [r.num for r in ladder.rungs() if r.memory.accumulation]
        raise UserError(
            f"--accum-steps {asked}: step {step} does not accumulate gradients (step "
            f"{' and '.join(doing)} does); leave it out"
        )
    batch = rung.batch(spec)
    if asked > 1 and micro_batches(batch, asked) == 1:
        fits = [k for k in range(2, batch + 1) if batch % k == 0]
        raise UserError(
            f"--accum-steps {asked} does not split step {step}'s batch of {batch} into equal "
            f"micro-batches: use one of {', '.join(map(str, fits)) or '1'}, or another "
            "--batch-size"
        )
