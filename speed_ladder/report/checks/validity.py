"""Whether a record can be right, and whether it belongs to its tag: the reasons an `ok` record is
impossible (its numbers contradict each other or the hardware) or foreign (another machine's,
preset's or process count's than its tag says). `python -m speed_ladder check` names each
reason in a line; every summary built for a tag folder shows such a record's step as `invalid`
with the first reason, never as `ok` (summary.table_and_runs): the one the sweep writes after
its runs (sweep/plan.py's `summarize`, against the ladder it ran) and the one rebuilt from
runs.jsonl (`plot_results.py --rebuild`, `publish`, and `check`, which compares it with
summary.csv).

A committed tag names the hardware that made its records (`misnamed`): that rule is `check`'s,
and so `publish`'s, which checks a folder before it goes into results/. A sweep's folder is
named by --tag as its user likes, and its summary is not judged by its name."""

import math
import re
from pathlib import Path

from speed_ladder import ladder, machine
from speed_ladder.files import ROOT, portable_path
from speed_ladder.measure.gpu_specs import lookup
from speed_ladder.spec import config_of

REQUIRED = ("tokens_per_sec", "step_time_ms", "world_size", "batch_size", "context_length",
            "device", "device_name", "preset", "losses", "script")  # fmt: skip
POSITIVE = ("tokens_per_sec", "step_time_ms", "tokens_per_step", "flops_per_token", "duration_s",
            "peak_mem_reserved_bytes", "peak_mem_allocated_bytes", "mfu")  # fmt: skip
COUNTS = ("world_size", "batch_size", "context_length", "timed_steps")
CPU_CORE_FLOPS = 4e12  # above any CPU core's matrix units (AMX bf16: ~2 TFLOP/s per core)
GIB = 2**30
_SUFFIX = re.compile(r"(-[0-9a-f]{6})?-x\d+$")
_STEPS: dict = {}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _fp(rec: dict) -> dict:
    sw = rec.get("sweep") or {}
    fp = sw.get("machine") if isinstance(sw.get("machine"), dict) else rec.get("machine")
    return fp if isinstance(fp, dict) else {}


def step_files(steps=None) -> dict[str, str]:
    """{step number: its file as its records name it (files.portable_path; one outside the
    checkout that ran it, by its name alone)} of the ladder `steps` (a list of ladder.Step;
    None: this checkout's ladder)."""
    if steps is not None:
        return {s.num: portable_path(s.path) for s in steps}
    if not _STEPS:
        _STEPS.update({s.num: s.rel for s in ladder.discover(ROOT)})
    return _STEPS


def _numbers(rec: dict) -> list[str]:
    out = [f"{k} is missing" for k in REQUIRED if rec.get(k) is None]
    for k in POSITIVE:
        v = _num(rec.get(k))
        if rec.get(k) is not None and (v is None or not math.isfinite(v) or v <= 0):
            out.append(f"{k} {rec.get(k)!r} is not a finite number above 0")
    for k in COUNTS:
        v = rec.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            out.append(f"{k} {v!r} is not a count of 1 or more")
    for k in ("train_loss", "val_loss"):
        v = _num(rec.get(k))
        if rec.get(k) is not None and (v is None or not math.isfinite(v) or v < 0):
            out.append(f"{k} {rec.get(k)!r} is not a finite cross-entropy (0 or more)")
    losses = rec.get("losses")
    if isinstance(losses, list):
        bad = [x for x in losses if _num(x) is None or not math.isfinite(x) or x < 0]
        if bad:
            out.append(f"{len(bad)} of its {len(losses)} losses are not finite numbers of 0 or "
                       f"more (first: {bad[0]!r})")  # fmt: skip
        steps = (rec.get("spec") or {}).get("max_steps") or (config_of(rec) or {}).get("max_steps")
        want = steps + (rec.get("profiled_steps") or 0) if isinstance(steps, int) else None
        if want is not None and len(losses) != want:
            out.append(f"{len(losses)} losses for {steps} steps (+ "
                       f"{rec.get('profiled_steps') or 0} profiled): one per step")  # fmt: skip
    elif losses is not None:
        out.append("losses is not a list")
    return out


def _arithmetic(rec: dict) -> list[str]:
    out = []
    tps, ms, tok = (_num(rec.get(k)) for k in ("tokens_per_sec", "step_time_ms", "tokens_per_step"))
    b, t, w = (rec.get(k) for k in ("batch_size", "context_length", "world_size"))
    if tok and all(isinstance(x, int) and x > 0 for x in (b, t, w)) and tok != b * t * w:
        out.append(f"tokens_per_step {tok:g} is not batch x context x processes = {b} x {t} x {w}")
    if (
        tps
        and ms
        and tok
        and ms > 0
        and abs(tps - tok / (ms / 1000)) > max(1e-3 * tok / (ms / 1000), 0.051)
    ):
        out.append(f"tokens_per_sec {tps:g} is not tokens_per_step / step time = {tok:g} / "
                   f"{ms / 1000:g} s = {tok / (ms / 1000):.1f}")  # fmt: skip
    return out


def _hardware(rec: dict) -> list[str]:
    """MFU against a datasheet peak, memory against the device's."""
    out, fp = [], _fp(rec)
    tps, fpt, world = _num(rec.get("tokens_per_sec")), _num(rec.get("flops_per_token")), None
    world = rec.get("world_size") if isinstance(rec.get("world_size"), int) else 1
    gpus = fp.get("gpus") if isinstance(fp.get("gpus"), list) else []
    if rec.get("device") == "cuda":
        sms = next((g.get("sms") for g in gpus if isinstance(g, dict)), None)
        peak = lookup(str(rec.get("device_name")), sms if isinstance(sms, int) else None)
        said = [_num(rec.get("mfu")), _num((rec.get("mfu_invalid") or {}).get("value"))]
        if peak is not None and peak.flops and tps and fpt and world >= 1:
            said.append(tps * fpt / (peak.flops * world))
        worst = max((x for x in said if x is not None and math.isfinite(x)), default=None)
        if worst is not None and worst > 1:
            out.append(f"MFU {worst:.0%} of the {rec.get('device_name')}'s datasheet peak: "
                       "above 100% is impossible (tok/s, step time or flops is wrong)")  # fmt: skip
        mem = [_num(g.get("memory_gib")) for g in gpus if isinstance(g, dict)]
        mem = max((m for m in mem if m), default=None)
    else:
        cores = fp.get("device_count") if isinstance(fp.get("device_count"), int) else None
        flops = tps * fpt if tps and fpt else 0
        if rec.get("device") == "cpu" and cores and flops > CPU_CORE_FLOPS * cores:
            out.append(f"{tps * fpt / cores / 1e12:.1f} TFLOP/s per CPU core: above any CPU's "
                       "matrix units (tok/s, step time or flops_per_token is wrong)")  # fmt: skip
        mem = _num(fp.get("memory_gib"))  # RAM, whole GiB: a process's RSS stays under it
        mem = mem + 1 if mem else None
    per_rank = rec.get("peak_mem_reserved_per_rank")
    peaks = [_num(x) for x in per_rank] if isinstance(per_rank, list) else []
    peak_mem = max([x for x in [*peaks, _num(rec.get("peak_mem_reserved_bytes"))] if x],
                   default=None)  # fmt: skip
    if mem and peak_mem and peak_mem > mem * GIB:
        out.append(f"peak memory {peak_mem / GIB:.1f} GiB above the device's {mem:g} GiB")
    res, alloc = _num(rec.get("peak_mem_reserved_bytes")), _num(rec.get("peak_mem_allocated_bytes"))
    if rec.get("device") == "cuda" and res and alloc and alloc > res:
        out.append("peak_mem_allocated_bytes above peak_mem_reserved_bytes")
    return out


def impossible(rec: dict, steps=None) -> list[str]:
    """Why an `ok` record cannot be right (empty: it can); other statuses are not measurements.
    `steps`: the ladder it ran from (None: this checkout's)."""
    if rec.get("status") != "ok":
        return []
    out = _numbers(rec) + _arithmetic(rec) + _hardware(rec)
    step, script = rec.get("step"), rec.get("script")
    files = step_files(steps)
    if step not in files:
        out.append(f"step {step!r} is not a step of this ladder")
    elif script is not None and script not in (files[step], Path(files[step]).name):
        out.append(f"script {str(script)[:60]!r} is not step {step}'s file ({files[step]})")
    return out


def tag_base(fp: dict, device: str | None = None) -> str | None:
    """The hardware part of the tag this fingerprint's machine writes to (machine.tag_base);
    `device`: the record's (an Apple GPU's records carry the CPU's fingerprint)."""
    name = fp.get("device_name")
    if not isinstance(name, str):
        return None
    if isinstance(fp.get("gpus"), list):
        return machine.slug(name)
    cpu = fp.get("cpu") if isinstance(fp.get("cpu"), dict) else {}
    if device == "mps":
        return f"mps-{machine.cpu_tag_part(name, cpu)}"
    return f"cpu-{machine.cpu_tag_part(name, cpu)}-{fp.get('device_count')}c"


def foreign(rec: dict, tag: str | None, steps=None) -> list[str]:
    """Why a record does not belong to the tag folder `tag` (None: only the record's own
    consistency): its device name, fingerprint, preset, device or process count. `steps`: the
    ladder it ran from (None: this checkout's)."""
    out, fp, sw = [], _fp(rec), rec.get("sweep") or {}
    own = rec.get("machine")
    mps = rec.get("device") == "mps"  # an Apple GPU's fingerprint names its CPU
    if fp and not mps and rec.get("device_name") != fp.get("device_name"):
        out.append(f"device_name {rec.get('device_name')!r} is not its machine's "
                   f"{fp.get('device_name')!r}")  # fmt: skip
    if isinstance(own, dict) and isinstance(sw.get("machine"), dict) and own != sw["machine"]:
        out.append("its machine is not the sweep's (machine and sweep.machine differ)")
    if fp and rec.get("torch_version") not in (None, fp.get("torch_version")):
        out.append(f"torch {rec.get('torch_version')} is not its machine's "
                   f"{fp.get('torch_version')}")  # fmt: skip
    config = config_of(rec) or {}
    for key in ("preset", "device"):
        if config.get(key) not in (None, "auto") and rec.get(key) != config.get(key):
            out.append(f"{key} {rec.get(key)!r} is not its sweep's {config.get(key)!r}")
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    if spec.get("preset") is not None and rec.get("preset") != spec.get("preset"):
        out.append(f"preset {rec.get('preset')!r} is not its spec's {spec.get('preset')!r}")
    if tag is None:
        return out
    n, files = ladder.tag_processes(tag), step_files(steps)
    ran = ladder.discover(ROOT) if steps is None else steps
    distributed = rec.get("step") in {s.num for s in ran if s.distributed}
    want = n if n > 1 or not distributed else 1
    if rec.get("step") in files and rec.get("world_size") not in (None, want):
        out.append(f"world_size {rec.get('world_size')} in a tag of {want} process(es) ({tag})")
    return out


def misnamed(rec: dict, tag: str) -> list[str]:
    """Why a record's machine is not the hardware its tag folder names (`check`'s rule for
    committed results, module docstring): `tag` less its `-<6 hex>` and `-xN` is the tag base
    the record's machine writes to, with `-to-loss` for a --to-loss run's record."""
    base = tag_base(_fp(rec), rec.get("device"))
    if base is None:
        return []
    base += ladder.TO_LOSS_TAG if isinstance(rec.get("to_loss"), dict) else ""
    if _SUFFIX.sub("", tag) == base:
        return []
    return [f"its machine writes to {base}-x{ladder.tag_processes(tag)}, not {tag}"]


def invalid(rec: dict, tag: str | None = None, steps=None) -> str | None:
    """The first reason an `ok` record is impossible or foreign, or None."""
    if rec.get("status") != "ok":
        return None
    why = impossible(rec, steps) + foreign(rec, tag, steps)
    return why[0] if why else None


def marked(records: list[dict], tag: str | None = None, steps=None) -> list[dict]:
    """The records as a tag's summary takes them (`tag`: its folder's name; `steps`: the ladder
    they ran from, None: this checkout's): an `ok` one that is impossible or foreign becomes
    status `invalid` with its reason (a copy; the file is untouched). The sweep's summary and a
    rebuilt one (`plot_results.py --rebuild`, `check`) both pass their tag; without one (a
    caller with no tag folder) the records are taken as they are."""
    if tag is None:
        return records
    out = []
    for r in records:
        why = invalid(r, tag, steps)
        out.append(r if why is None else dict(r, status="invalid", reason=f"invalid record: {why}"))
    return out
