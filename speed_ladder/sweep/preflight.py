"""What the sweep works out before it runs a step: how long a run lasts, how long the sweep
should take, and what memory each run should need (and whether it fits).

- **Run length** (`measuring_values`): a preset with a `presets.SWEEP_LENGTH` entry (the GPU
  presets) is run for its warm-up + timed steps instead of its full epochs (a --to-loss run: its
  warm-up, then until its target or budget); --max-steps and --warmup-steps override it. A step
  run by hand keeps the tutorial's full run.
- **Duration**: per run, the median duration of this tag's earlier ok runs of that step with the
  same configuration on this machine; without any, those of the committed tag the sweep's closing
  table compares with (report/compare/committed.py: the same hardware, else the closest) with the
  same configuration; without those either, a rough model: `ROUGH_RUN_S` seconds a run on the device
  (what a `cpu`-preset run and a 60-step `gpt2-124m` run take, start-up included), plus, for a step
  that calls torch.compile, the compile time an earlier run here measured (`compile_seconds`: its
  record's `compiles.seconds`, that step's or else step 08's), or `COMPILE_S` where none did. The
  sweep prints the total before it starts and says where each part comes from (`estimate_line`).
- **Memory** (`predict`, `memory_line`): `memory_model.predict_run` for the step and its processes,
  from the sweep's RunSpec (speed_ladder.spec: the batch the step will use after the batch rule,
  bf16 as step 05 decides on this device), printed before each run (the step then does not print it
  again, and keeps its own in its record beside the measured peak); a run predicted not to fit (GPU:
  with the CUDA context and 10% headroom, `memory_model.fits`; CPU: the machine's RAM over its
  processes, with 0.5 GiB of PyTorch per process) is warned about.
"""

import statistics
from collections import Counter

from speed_ladder import ladder
from speed_ladder.errors import UserError
from speed_ladder.files import RESULTS, portable_path
from speed_ladder.ladder import Step
from speed_ladder.measure import memory_model
from speed_ladder.measure.data import train_windows
from speed_ladder.measure.settings import batch_fits_gpu
from speed_ladder.presets import PRESETS, SWEEP_LENGTH
from speed_ladder.report.compare import committed
from speed_ladder.spec import RunSpec, config_of, preset_name
from speed_ladder.store import load_runs

ROUGH_RUN_S = {"cpu": 40.0, "cuda": 60.0, "mps": 60.0}
COMPILE_S = {"cpu": 90.0, "cuda": 60.0, "mps": 60.0}
CPU_PROCESS_BYTES = memory_model.GIB // 2  # PyTorch itself, per process, on a CPU
HERE = "here"  # an estimate's source: this tag's runs (else a committed tag's; None: rough)


def measuring_values(values: dict, device_type: str) -> dict:
    """The sweep's step flags with the bounded run length of the preset filled in: its warm-up,
    and its timed steps but in a --to-loss run, which its target or token budget ends."""
    length = SWEEP_LENGTH.get(preset_name(values.get("preset"), device_type)[0])
    if length is None or values.get("max_steps") is not None:
        return values
    warm = values.get("warmup_steps")
    warm = length["warmup_steps"] if warm is None else warm
    if values.get("to_loss") is not None:
        return dict(values, warmup_steps=warm)
    return dict(values, warmup_steps=warm, max_steps=warm + length["timed_steps"])


def compile_seconds(step: Step, recs: list[dict], cfg: dict, machine: str) -> float | None:
    """torch.compile's seconds in one run of `step`, as earlier runs in `recs` (this tag) with
    this configuration on this machine measured them (their records' `compiles.seconds`): the
    median of this step's latest, else of the first compiled rung's (step 08: the same model,
    compiled the same way);
    None where none was measured."""
    flags = lambda c: {k: v for k, v in (c or {}).items() if k != "nproc"}
    alike = [r for r in recs if (r.get("sweep") or {}).get("machine") == machine
             and flags(config_of(r)) == flags(cfg)]  # fmt: skip
    first = ladder.first(lambda r: r.compiled)
    for num in (step.num, *([first.num] if first else [])):
        took = [(r.get("compiles") or {}).get("seconds") for r in alike if r.get("step") == num]
        took = [t for t in took if isinstance(t, (int, float)) and t > 0][-5:]
        if took:
            return float(statistics.median(took))
    return None


def _measured(runs: list[dict]) -> float | None:
    """The median duration of the last 5 ok runs (the A/A control's aside), or None."""
    took = [
        (r.get("sweep") or {}).get("duration_s")
        for r in runs
        if r.get("status") == "ok" and not (r.get("sweep") or {}).get("control")
    ]
    took = [t for t in took if isinstance(t, (int, float)) and t > 0][-5:]
    return float(statistics.median(took)) if took else None


def run_seconds(
    step: Step, earlier: list[dict], device_type: str, compile_s: float | None = None
) -> tuple[float, bool]:
    """(seconds, measured?) for one run of `step`: the median of `earlier` ok runs' durations
    (its own in this tag, same config, this machine), else the rough model, with `compile_s`
    (compile_seconds) for torch.compile where one was measured, else `COMPILE_S`."""
    took = _measured(earlier)
    if took is not None:
        return took, True
    rough = ROUGH_RUN_S.get(device_type, 60.0)
    if not step.compiled:
        return rough, False
    return rough + (compile_s or COMPILE_S.get(device_type, 60.0)), False


def committed_runs(
    hardware: str, preset: str | None, device_name: str | None, mine=None, results=RESULTS
) -> tuple[str | None, list[dict]]:
    """(where, records) of the committed tag whose runs are the first guess of a duration this
    tag has not measured: the one its closing table compares with (committed.choose;
    `hardware`: this machine's hardware tag with its -xN; `mine`: this sweep's folder, never
    its own guess). `where` says which: 'results/<tag> (the same hardware)'. (None, []) where
    there is none."""
    try:
        tags = committed.committed_tags(results, mine)
        chosen = committed.choose(hardware, preset, device_name, tags)
        if chosen is None:
            return None, []
        folder, why = chosen
        return f"{portable_path(folder)} ({why})", load_runs(folder)
    except (UserError, ValueError, KeyError, OSError):  # a guess: never a reason to stop
        return None, []


def committed_seconds(step: Step, cfg: dict, theirs: list[dict]) -> float | None:
    """The median duration of a committed tag's ok runs (`theirs`: committed_runs's) of `step`
    in this configuration, whichever machine of that hardware made them; None without any."""
    return _measured([r for r in theirs if r.get("step") == step.num and config_of(r) == cfg])


def fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def estimate_line(estimates: list[tuple[float, str | None]], device_type: str) -> str:
    """'expected duration: about 9m20s (14 runs; 10 from earlier runs here; 3 as measured in
    results/<tag> (the same hardware); 1 rough: ...)'. An estimate: (seconds, its source: HERE,
    a committed tag's `where` (committed_runs), or None, the rough model)."""
    total = sum(s for s, _ in estimates)
    sources = Counter(src for _, src in estimates)
    how = [f"{sources.pop(HERE)} from earlier runs here"] if HERE in sources else []
    rough = sources.pop(None, 0)
    how += [f"{n} as measured in {where}" for where, n in sources.items()]
    if rough:
        how.append(
            f"{rough} rough: {ROUGH_RUN_S.get(device_type, 60):.0f} s a run on {device_type}, "
            f"+{COMPILE_S.get(device_type, 60):.0f} s with torch.compile (or the compile time "
            "an earlier run here measured)"
        )
    runs = f"{len(estimates)} runs; {'; '.join(how)}"
    return f"expected duration: about {fmt_duration(total)} ({runs})"


# ---------------------------------------------------------------- memory
def predict(step: Step, spec: RunSpec, world: int, data: str | None = None):
    """The memory model's prediction for one run of `step` on `world` processes, as its RunSpec
    resolves it: with Liger's loss where it can run, and a rung that fits its batch to a GPU
    (step 20) at the batch it will pick there (on the text `data`, --data); None for a preset it
    does not know."""
    shape = PRESETS.get(spec.preset)
    if shape is None:
        return None
    batch, half = spec.batch(step.num), spec.half
    fused = memory_model.liger_runs_on(spec.device) and spec.amp != "fp16"
    grows = spec.device == "cuda" and spec.gpu_bytes and spec.batch_override is None
    if step.memory.batch == "fits" and grows:  # step 20's loop, as it will run
        windows = train_windows(data, shape["context_length"])
        cap, name = spec.gpu_bytes, spec.preset
        while batch_fits_gpu(shape, step.num, world, 2 * batch, half, cap, windows, fused, name):
            batch *= 2
    return memory_model.predict_run(
        shape, step.num, world, batch, half, spec.device, name=spec.preset, fused=fused
    )


def memory_line(pred, device_type: str, capacity: int | None, world: int) -> tuple[str, str | None]:
    """(the prediction's line, a warning when it cannot fit) for one run."""
    line = pred.line()
    if not capacity:
        return line, None
    gib = memory_model.GIB
    if device_type == "cuda":
        if memory_model.fits(pred, capacity):
            return line, None
        need = pred.total_bytes * (1 + memory_model.HEADROOM) + memory_model.CUDA_OVERHEAD
        where = f"this GPU's {capacity / gib:.1f} GiB"
    else:
        per = capacity / max(1, world)
        need = pred.total_bytes + CPU_PROCESS_BYTES
        if need <= per:
            return line, None
        where = f"{per / gib:.1f} GiB of RAM per process ({capacity / gib:.1f} GiB / {world})"
    return line, (
        f"predicted not to fit: {need / gib:.1f} GiB per rank (with overheads) > {where}: "
        "expect out of memory (python -m speed_ladder.measure.memory_model)"
    )
