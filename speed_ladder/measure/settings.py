"""A run's settings (speed_ladder.spec's `RunSpec`), resolved once by `resolve_spec` from the
flags, the preset, the device (its type, a CUDA GPU's memory and autocast dtype), the batch rule
and --to-loss. The sweep resolves it before it plans (preflight.py: the run length, the memory
each run needs) and the step's `Run` resolves it with the same function from the same flags on
the same device, so the run the sweep predicts is the run the step does; the record keeps it
(`spec`).

- **The preset** (spec.preset_name): --preset, else gpt2-124m on CUDA and cpu elsewhere;
  --epochs, --max-steps, --warmup-steps, --accum-steps and --batch-size override its settings.
- **The batch rule** (`fit_batch`): on a CUDA GPU that cannot hold every step of the ladder at
  the preset's batch (gpt2-124m's fp32 steps 00-04 at batch 8 reserve about 26 GB: a 24 GB RTX
  3090/4090, L4 or A10 runs out of memory at step 00), the default halves `batch_size` and
  `large_batch_size` together until the heaviest step fits, by speed_ladder.measure.memory_model's
  prediction for this GPU's memory, with a margin. Every step makes the same choice on the same
  GPU, so the ladder's speedups compare, and step 10 keeps its 4x. `--batch-size` turns it off.
- **Step 05's autocast** (`RunSpec.amp`: bf16, fp16 or fp32) where it is known without
  measuring: forced by $SPEED_LADDER_AMP or $SPEED_LADDER_BF16, or a CUDA GPU's (native bf16,
  else fp16 on tensor cores: measure.gpus.autocast_for); None on a CPU or MPS, where the step
  measures it (measure.precision.choice, cached) and memory_model.act_bytes_of asks the same.
"""

from speed_ladder import ladder
from speed_ladder.autocast_env import amp_forced, bf16_forced
from speed_ladder.errors import UserError
from speed_ladder.files import data_id
from speed_ladder.measure import memory_model
from speed_ladder.measure.curve import val_batches
from speed_ladder.presets import GPT2_VOCAB, PRESETS, TO_LOSS, micro_batches
from speed_ladder.spec import RunSpec, default_workers, preset_name

# speed_ladder.measure.memory_model counts fused ops (Korthikanti et al.): step 00's hand-written
# LayerNorm, GELU and attention save more. On the one published fp32 peak, step 00 at batch 8
# (26.26 GB reserved on an A100, results/reference), it predicts 23.4 GB: x1.12. The rule adds 15%
# to every prediction, then the CUDA context (memory_model's 1 GiB).
FIT_MARGIN = 1.15


def gpu_bytes_needed(predicted: float) -> float:
    """What a GPU must hold for a run the memory model predicts at `predicted` bytes: x FIT_MARGIN
    and the CUDA context (the batch rule's and step 20's test)."""
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
    the loss that runs (`fused`: Liger's; else the full logits), x FIT_MARGIN and the CUDA
    context, within `capacity` bytes."""
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
    measuring values) on a device of `device_type`; gpu: (total memory in bytes, its autocast:
    bf16, fp16 or fp32) of a CUDA device, for the batch rule and `amp`. The batch rule applies
    where --batch-size is not given."""
    name, why = preset_name(values.get("preset"), device_type)
    p = dict(PRESETS[name])
    for key in ("epochs", "max_steps", "warmup_steps", "accum_steps"):
        if values.get(key) is not None:
            p[key] = values[key]
    p["batch_rule"] = None
    override = p["batch_override"] = values.get("batch_size")
    if override is not None:
        p["batch_size"] = p["large_batch_size"] = override
    elif device_type == "cuda" and gpu is not None:
        p["batch_rule"] = fit_batch(name, p, *gpu)
        if p["batch_rule"] is not None:
            p["batch_size"] = p["batch_rule"]["batch"]
            p["large_batch_size"] = p["batch_rule"]["large_batch"]
    workers = values.get("workers")
    p["workers"] = default_workers(device_type) if workers is None else workers
    p["to_loss"] = to_loss_settings(name, values.get("to_loss"), values.get("token_budget"))
    if p["to_loss"] is not None:  # the target or the budget ends the run, not a step count
        p["max_steps"] = values.get("max_steps")
        p["epochs"] = values.get("epochs") or TO_LOSS_EPOCHS
        # every rung evaluates in batches of batch_size: these cover the same val_tokens
        val_tokens = p["to_loss"]["val_tokens"]
        p["eval_iters"] = val_batches(val_tokens, p["batch_size"], p["context_length"])
    if p["max_steps"] is not None and p["max_steps"] <= p["warmup_steps"]:
        raise UserError(
            f"--max-steps {p['max_steps']} leaves no timed step after "
            f"{p['warmup_steps']} warm-up steps; raise --max-steps or lower --warmup-steps"
        )
    return RunSpec(
        preset=name,
        why=why,
        device=device_type,
        settings=p,
        batch_rule=p["batch_rule"],
        gpu_bytes=gpu[0] if gpu is not None else None,
        amp=amp_known(device_type, gpu[1] if gpu is not None else None),
        seed=values.get("seed"),
        data=data_id(values.get("data")),
        batch_size_override=override,
    )


# ---------------------------------------------------------------- time to a target loss
TO_LOSS_EPOCHS = 10**6  # --to-loss: epochs without end; the target or the token budget stops it


def to_loss_settings(name: str, target, budget: int | None) -> dict | None:
    """A --to-loss run's settings (measure/curve.py): the target (`preset`: the preset's
    measured one), the token budget (--token-budget, else the preset's), how often it evaluates
    (`eval_tokens`) and over how many validation tokens (`val_tokens`), from the preset's
    (presets.TO_LOSS); None without --to-loss."""
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
    if target == "preset":
        target = measured["target"]
    out = {k: measured[k] for k in ("eval_tokens", "val_tokens")}
    return {"target": float(target), "budget_tokens": budget or measured["budget_tokens"], **out}


# ---------------------------------------------------------------- a batch that fits this GPU
def _heaviest(shape: dict, batch: int, large: int, half: bool) -> tuple[str, int]:
    """(step, predicted bytes) of the ladder's heaviest step on one GPU at these batches: fp32
    until step 05 (and after, on a GPU with neither bf16 nor fp16 tensor cores), materialized
    attention until step 07, the padded vocabulary from step 09, the large batch from step 10,
    DDP's buckets from 11."""
    worst = (ladder.BASELINE, 0)
    for r in ladder.rungs():
        m = r.memory
        act = 2 if half and m.bf16_autocast else 4
        b = r.batch({"batch_size": batch, "large_batch_size": large})
        vocab = memory_model.VOCAB if m.padded_vocab else GPT2_VOCAB
        p = memory_model.predict(shape, 1, r.num, b, act, flash=m.flash, vocab=vocab)
        worst = max(worst, (r.num, p.total_bytes), key=lambda w: w[1])
    return worst


def large_from() -> str:
    """The first rung that trains with the large batch."""
    return ladder.first(lambda r: r.memory.large_batch).num


def fit_batch(name: str, p: dict, gpu_bytes: int, amp: str) -> dict | None:
    """The batch rule (see the module doc): None where the preset's batches fit a GPU of
    `gpu_bytes` (amp: step 05's autocast there, bf16, fp16 or fp32); else what was chosen and
    why, for the record (`batch_rule`). Where no batch fits (the state alone is too big: the
    GPT-2 family's larger presets on small GPUs, for FSDP2 on several), the preset's is kept."""
    GIB = memory_model.GIB

    def need(batch, large):
        step, b = _heaviest(p, batch, large, amp != "fp32")
        return step, gpu_bytes_needed(b)

    batch, large = p["batch_size"], p["large_batch_size"]
    step, first = need(batch, large)
    if first <= gpu_bytes:
        return None
    rule = {"gpu_bytes": gpu_bytes, "preset_batch": batch, "preset_large_batch": large}
    gib = lambda x: f"{x / GIB:.1f} GiB"
    head = (f"this GPU's {gib(gpu_bytes)} cannot hold {name} at batch {batch} (step {step} "
            f"needs {gib(first)}: predicted x{FIT_MARGIN} + the CUDA context)")  # fmt: skip
    b, lb = batch, large
    while b > 1 or lb > 1:
        b, lb = max(1, b // 2), max(1, lb // 2)
        step, n = need(b, lb)
        if n <= gpu_bytes:
            return rule | {"batch": b, "large_batch": lb, "heaviest_step": step, "reason": (
                f"{head}: batch {b} (step {large_from()} on: {lb}) for every step, so the speedups "
                f"compare; step {step} needs {gib(n)}; --batch-size N overrides")}  # fmt: skip
    return rule | {"batch": batch, "large_batch": large, "heaviest_step": step, "reason": (
        f"{head}, nor at batch 1: the preset's batch is kept (python -m "
        "speed_ladder.measure.memory_model shows what fits; step 14 on several GPUs shards "
        "the state)")}  # fmt: skip


def check_accum_steps(spec: RunSpec, step: str, asked: int | None) -> None:
    """A --accum-steps set by hand that does not split the rung's batch into equal micro-batches
    is a UserError: the run would not do what was asked. The preset's own accum_steps on a batch
    it does not split (a GPU's batch rule can leave an odd one) stays a note: the rung is
    inactive (measure/inactive.py's batch_not_split)."""
    if asked is None or asked <= 1:
        return
    try:
        rung = ladder.rung(step)
    except UserError:  # not a rung of the ladder (a test's script)
        return
    if rung.memory.accumulation == "none":
        return
    batch = rung.batch(spec.settings)
    if micro_batches(batch, asked) == 1:
        fits = [k for k in range(2, batch + 1) if batch % k == 0]
        raise UserError(
            f"--accum-steps {asked} does not split step {step}'s batch of {batch} into equal "
            f"micro-batches: use one of {', '.join(map(str, fits)) or '1'}, or another "
            "--batch-size"
        )
