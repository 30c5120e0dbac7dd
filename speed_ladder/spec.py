"""One run's settings, typed and frozen: the preset with the user's flags applied, resolved once
(measure/settings.py's `resolve_spec`) by the sweep before it plans and by the step's `Run`, from
the same flags on the same device, so that the run the sweep predicts is the run the step does.
A step reads them as attributes (`P = run.spec`, `P.lr`); the record keeps them (`spec`); a
sweep's runs are matched by `sweep_config`."""

from dataclasses import asdict, dataclass

from speed_ladder import ladder
from speed_ladder.presets import PRESETS


@dataclass(frozen=True)
class ToLoss:
    """A --to-loss run's target and how it gets there (measure/curve.py, presets.TO_LOSS)."""

    target: float
    budget_tokens: int
    eval_tokens: int  # an evaluation every this many tokens trained on
    val_tokens: int  # over the validation split's first this many tokens


@dataclass(frozen=True)
class BatchRule:
    """How the preset's batch was lowered to fit this GPU (measure/settings.py's fit_batch)."""

    gpu_bytes: int
    preset_batch: int
    preset_large_batch: int
    batch: int
    large_batch: int
    heaviest_step: str
    reason: str


@dataclass(frozen=True)
class RunSpec:
    """One run's settings (see the module doc)."""

    preset: str
    why: str  # "--preset" or "default for <device>"
    device: str  # cuda, cpu, mps
    context_length: int
    emb_dim: int
    n_heads: int
    n_layers: int
    drop_rate: float
    qkv_bias: bool
    batch_size: int  # sequences per step and process, steps 00-09
    large_batch_size: int  # from step 10
    accum_steps: int  # step 18's micro-batches per batch
    lr: float
    weight_decay: float
    epochs: int
    max_steps: int | None  # None: the epochs (a tutorial run) or the target (--to-loss)
    warmup_steps: int
    eval_freq: int  # steps between evaluations in a tutorial run; 0: at the end only
    eval_iters: int  # batches an evaluation reads
    sample_tokens: int
    workers: int  # the training DataLoader's worker processes
    seed: int | None = None
    to_loss: ToLoss | None = None
    batch_rule: BatchRule | None = None
    batch_override: int | None = None  # --batch-size
    accum_override: int | None = None  # --accum-steps
    gpu_bytes: int | None = None  # one CUDA GPU's memory (the batch rule's input)
    amp: str | None = None  # step 05's autocast where known without measuring (None: measured)
    data: str | None = None  # the text by name and sha256 (files.data_id); None: the default

    @property
    def half(self) -> bool | None:
        """Step 05's autocast computes in 16 bits (bf16 or fp16); None: measured by the step."""
        return None if self.amp is None else self.amp != "fp32"

    def batch(self, step: str) -> int:
        """Sequences per step and process of a ladder step: its rung's batch."""
        return ladder.rung(step).batch(self)

    def micro_batches(self, batch: int) -> int:
        """Step 18's micro-batches per batch of `batch` sequences (micro_batches)."""
        return micro_batches(batch, self.accum_steps)

    def record(self) -> dict:
        """The record's `spec` (the batch rule is a field of its own)."""
        keys = "preset device max_steps epochs warmup_steps batch_size large_batch_size"
        return {
            **{k: getattr(self, k) for k in keys.split()},
            "accum_steps": self.accum_steps,
            "workers": self.workers,
            "to_loss": asdict(self.to_loss) if self.to_loss else None,
            "seed": self.seed,
            "batch_size_override": self.batch_override,
            "data": self.data,
            "amp": self.amp,
            "gpu_bytes": self.gpu_bytes,
        }


def micro_batches(batch: int, accum_steps: int) -> int:
    """Step 18's micro-batches per batch of `batch` sequences: `accum_steps` where they split it
    into equal parts, else 1 (the batch stays whole: batch 1, or an odd batch at 2)."""
    return accum_steps if accum_steps > 1 and batch % accum_steps == 0 else 1


def default_workers(device_type: str) -> int:
    """DataLoader workers without --workers: Raschka's 4 on CUDA; elsewhere none, as workers would
    take cores from the training process itself (the step files' create_dataloader)."""
    return 4 if device_type == "cuda" else 0


# What identifies a sweep's run, with its processes: the one definition (sweep_config)
KEY_FIELDS = ("device", "preset", "max_steps", "warmup_steps", "data", "seed")


def sweep_config(spec: RunSpec, nproc: int) -> dict:
    """What a sweep's run is matched by (`sweep.config` in its record): KEY_FIELDS and the
    processes, a --to-loss run's target and budget, and --workers where not the default; not
    --profile or --trace, nor the batch (the same GPU resolves the same)."""
    config = {k: getattr(spec, k) for k in KEY_FIELDS} | {"nproc": nproc}
    if spec.to_loss is not None:
        config["to_loss"] = asdict(spec.to_loss)
    if spec.workers != default_workers(spec.device):
        config["workers"] = spec.workers
    return config


def resolved_config(config, machine) -> dict:
    """A record's `sweep.config` as `sweep_config` makes it. A record made without a RunSpec
    holds the flags the sweep passed (`preset: null`, `device: auto`, `max_steps: null`):
    resolved here as the step resolved them, the device from the record's fingerprint; one that
    does not say is returned as it is. Resolving twice changes nothing."""
    if not isinstance(config, dict):
        return config
    device = config.get("device")
    if device == "auto" and isinstance(machine, dict):
        device = "cuda" if "gpus" in machine else "cpu" if "cpu" in machine else None
    if device not in ("cpu", "cuda", "mps"):
        return config
    name = preset_name(config.get("preset"), device)[0]
    if name not in PRESETS:
        return config
    out = dict(config, device=device, preset=name)
    for key in ("max_steps", "warmup_steps"):
        if out.get(key) is None and not (key == "max_steps" and out.get("to_loss")):
            out[key] = PRESETS[name][key]
    return out


def config_of(rec: dict) -> dict | None:
    """The configuration a sweep's record is matched by: its `sweep.config`, resolved."""
    sw = rec.get("sweep") or {}
    return resolved_config(sw.get("config"), sw.get("machine"))


def preset_name(flag: str | None, device_type: str) -> tuple[str, str]:
    """(name, why) of a run's preset: --preset, else gpt2-124m on CUDA and cpu elsewhere."""
    if flag is not None:
        return flag, "--preset"
    return ("gpt2-124m" if device_type == "cuda" else "cpu"), f"default for {device_type}"
