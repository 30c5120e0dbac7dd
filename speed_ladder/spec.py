"""`RunSpec`: one run's settings, as measure/settings.py's `resolve_spec` resolves them once from
the flags, the preset, the device and the batch rule (the sweep before it plans, the step's `Run`
from the same flags on the same device, so the run the sweep predicts is the run the step does;
the record keeps it, `spec`), and what identifies a sweep's run: its configuration
(`sweep_config`, `config_of`, as store and selection match records by it).

- **The preset** (`preset_name`): --preset, else gpt2-124m on CUDA and cpu elsewhere; --epochs,
  --max-steps, --warmup-steps, --accum-steps and --batch-size override its settings.
"""

from dataclasses import dataclass

from speed_ladder import ladder
from speed_ladder.presets import PRESETS


@dataclass(frozen=True)
class RunSpec:
    """One run's settings (see the module doc). `settings` is the preset's dict with the flags
    and the batch rule applied (what `Run.settings` is, `batch_rule` included)."""

    preset: str  # the preset's name
    why: str  # "--preset" or "default for <device>"
    device: str  # the device type: cuda, cpu, mps
    settings: dict
    batch_rule: dict | None  # how the batch was lowered to fit this GPU, or None
    gpu_bytes: int | None  # CUDA: one GPU's memory (the batch rule's input)
    amp: str | None  # step 05's autocast where known without measuring (None: measured)
    seed: int | None
    data: str | None  # the text by name and sha256 (files.data_id); None: the default
    batch_size_override: int | None  # --batch-size

    @property
    def half(self) -> bool | None:
        """Step 05's autocast computes in 16 bits (bf16 or fp16); None: measured by the step."""
        return None if self.amp is None else self.amp != "fp32"

    def batch(self, step: str) -> int:
        """Sequences per step and process of a ladder step: its rung's batch (ladder.json)."""
        return ladder.rung(step).batch(self.settings)

    def record(self) -> dict:
        """The record's `spec` (its one configuration; the batch rule is its own field)."""
        keys = ("max_steps", "epochs", "warmup_steps", "batch_size", "large_batch_size",
                "accum_steps", "workers", "to_loss")  # fmt: skip
        return {"preset": self.preset, "device": self.device,
                **{k: self.settings[k] for k in keys}, "seed": self.seed,
                "batch_size_override": self.batch_size_override, "data": self.data,
                "amp": self.amp, "gpu_bytes": self.gpu_bytes}  # fmt: skip


# What identifies a sweep's run, with its processes: the one definition (sweep_config)
KEY_FIELDS = ("device", "preset", "max_steps", "warmup_steps", "data", "seed")


def default_workers(device_type: str) -> int:
    """DataLoader workers without --workers: Raschka's 4 on CUDA; elsewhere none, as workers would
    take cores from the training process itself (the step files' create_dataloader)."""
    return 4 if device_type == "cuda" else 0


def sweep_config(spec: RunSpec, nproc: int) -> dict:
    """What a sweep's run is matched by (`sweep.config` in its record: the up-to-date check, the
    summary's rounds): the RunSpec's KEY_FIELDS and the processes, and a --to-loss run's
    resolved `to_loss` (its target and token budget) and --workers where not the default.
    --profile and --trace are not among them (speed_ladder.measure.profile), nor the batch: the
    same GPU resolves the same."""
    fields = dict(spec.settings, device=spec.device, preset=spec.preset, data=spec.data,
                  seed=spec.seed)  # fmt: skip
    config = dict({k: fields[k] for k in KEY_FIELDS}, nproc=nproc)
    if spec.settings["to_loss"] is not None:  # a time-to-loss run: its target, budget, evals
        config["to_loss"] = spec.settings["to_loss"]
    if spec.settings["workers"] != default_workers(spec.device):  # --workers, where not default
        config["workers"] = spec.settings["workers"]
    return config


def resolved_config(config, machine) -> dict:
    """A record's `sweep.config` as `sweep_config` makes it. A record made without a RunSpec
    holds the flags the sweep passed (`preset: null` for the default, `device: auto`, `max_steps:
    null` for the preset's): resolved here as the step resolved them, the device from the
    record's fingerprint (`machine`: a GPU's has `gpus`, a CPU's `cpu`); one that does not say
    (or a configuration of another shape) is returned as it is. Resolving twice changes
    nothing."""
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
