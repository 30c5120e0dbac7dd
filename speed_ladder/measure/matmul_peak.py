"""The matmul peak: the MFU denominator (a GPU's datasheet figure from gpu_specs.py; a CPU's or an
Apple GPU's best measured rate of a 1024^3 matmul in fp32 and bf16, measured once and cached), and
step 05's rule on it: whether bf16 matmuls beat fp32 here. $SPEED_LADDER_PEAK_FLOPS sets a CPU's
or MPS's rates instead, and nothing is measured (the tests)."""

import json
import math
import os
import time
from pathlib import Path

import torch

from speed_ladder.autocast_env import AMP_ENV, BF16_ENV, amp_forced, bf16_forced
from speed_ladder.errors import UserError, warn
from speed_ladder.files import atomic_write_bytes, cache_dir
from speed_ladder.measure import cpu_load, gpu_specs
from speed_ladder.measure.across_ranks import process_group
from speed_ladder.measure.device import is_rocm, name, synchronize


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 1024) -> float:
    """Best of 5 timed bursts of n^3 matmuls: a busy moment lowers one burst, not the best.
    Where one matmul takes over 0.25 s (an emulated dtype, e.g. bf16 on a CPU without native
    bf16), n halves, down to 256: such a dtype's rate barely depends on n. Not predicted from a
    small probe: under load a small matmul runs far below a large one."""
    # its own generator: drawn from the global one, these would move the run's random stream
    # (the first run of a sweep measures, then trains: other dropout masks than every later run)
    gen = torch.Generator().manual_seed(0)
    while True:
        a = torch.randn(n, n, generator=gen).to(device, dtype)
        b = torch.randn(n, n, generator=gen).to(device, dtype)
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        if n <= 256 or time.perf_counter() - t0 <= 0.25:
            break
        n //= 2
    best = 0.0
    for _ in range(5):
        synchronize(device)
        reps, t0 = 0, time.perf_counter()
        while reps < 2 or time.perf_counter() - t0 < 0.2:
            a @ b
            reps += 1
        synchronize(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def rates_key(device: torch.device) -> str:
    return (
        f"{device.type}|{name(device)}|threads={torch.get_num_threads()}|torch={torch.__version__}"
    )


# What a 1024^3 matmul can plausibly reach, FLOP/s: a cached or measured rate outside this is
# wrong (a busy machine, a hand-edited or corrupt cache) and is measured again, never divided by.
# The faster of fp32 and bf16 (the MFU peak) must reach the floor; each must stay below the top.
# CPU: at least 1e8 (0.1 GFLOP/s: below a single 2012 phone core; a 1024^3 matmul would take 20 s)
# and at most 1e13 per thread (an AMX core's bf16 peak is 2048 FLOP/cycle, 8e12 at 4 GHz).
# MPS: 1e9 to 1e14 (Apple's largest GPU, M3 Ultra, is about 28 TFLOP/s fp32).
PLAUSIBLE_PEAK = {"cpu": (1e8, 1e13), "mps": (1e9, 1e14)}


def plausible_range(device: torch.device) -> tuple[float, float]:
    low, high = PLAUSIBLE_PEAK.get(device.type, (1e8, 1e16))
    if device.type == "cpu":
        high *= max(1, torch.get_num_threads())
    return low, high


def rates_problem(device: torch.device, rates) -> str | None:
    """Why cached or measured matmul rates cannot be this device's, or None when they can."""
    if not isinstance(rates, dict):
        return f"{type(rates).__name__}, not {{'fp32': FLOP/s, 'bf16': FLOP/s}}"
    low, high = plausible_range(device)
    for k in ("fp32", "bf16"):
        v = rates.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{k} rate {v!r} is not a number"
        if not math.isfinite(v) or not 0 < v <= high:
            return f"{k} rate {v:.3g} FLOP/s is outside 0..{high:.0e}, the plausible range here"
    best = max(rates["fp32"], rates["bf16"])  # the MFU peak; bf16 alone may be slow (emulated)
    if best < low:
        return f"peak {best:.3g} FLOP/s is below {low:.0e}, the least plausible for a {device.type}"
    return None


def _read_table(path: Path) -> dict:
    """The cache's table of rates by key; anything else (not JSON, not an object) is empty."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warn(f"{path} is unreadable ({e.__class__.__name__}); measuring the matmul peak again")
        return {}
    if not isinstance(table, dict):
        warn(f"{path} is not a JSON object; measuring the matmul peak again")
        return {}
    return table


PEAK_ENV = "SPEED_LADDER_PEAK_FLOPS"  # FLOP/s: the rates of a CPU or MPS, not measured


def fixed_rates() -> dict | None:
    """$SPEED_LADDER_PEAK_FLOPS as both rates (fp32 and bf16 alike, so step 05's measured rule
    keeps fp32, as on a CPU without native bf16), or None when unset."""
    raw = os.environ.get(PEAK_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{PEAK_ENV}={raw!r}: a number of FLOP/s (1e11), or unset to measure")
    return {"fp32": value, "bf16": value}


# What rank 0 gave this process's job (several ranks under torchrun), once: see below
_JOB_RATES: dict | None = None


def measured_matmul_rates(device: torch.device) -> dict:
    """{"fp32": FLOP/s, "bf16": FLOP/s} of a 1024^3 matmul, cached per device name, threads and
    torch version; an implausible or busy machine's measurement is used but not cached. Under
    torchrun rank 0 measures and every rank takes its rates (ranks measuring at once slowed one
    another, and could disagree): the first call is a collective every rank makes."""
    global _JOB_RATES
    if (fixed := fixed_rates()) is not None:
        return fixed
    group = process_group()
    if group is None or group.get_world_size() == 1:
        return _measured_here(device)
    if _JOB_RATES is None:
        box = [_measured_here(device) if group.get_rank() == 0 else None]
        group.broadcast_object_list(box, src=0)
        _JOB_RATES = box[0]
    return _JOB_RATES


def _measured_here(device: torch.device) -> dict:
    """This process's measurement, or its cache's."""
    key = rates_key(device)
    path = cache_dir() / "matmul_peak.json"
    table = _read_table(path)
    if key in table:
        why = rates_problem(device, table[key])
        if why is None:
            return table[key]
        warn(f"{path}: the cached matmul peak is implausible ({why}); measuring it again")
    meter = cpu_load.Meter()  # other processes' CPU use while measuring (Linux; else unknown)
    meter.start()
    rates = {
        "fp32": _matmul_rate(device, torch.float32),
        "bf16": _matmul_rate(device, torch.bfloat16),
    }
    others = meter.stop()["other_load"] if device.type == "cpu" else None
    if cpu_load.is_busy(others):  # a shared core lowers the rate: use it this run, never cache it
        warn(
            f"the {device.type} matmul peak was measured while other processes used "
            f"{others:.2f} CPU cores: not cached, measured again next run"
        )
    elif rates_problem(device, rates) is None:
        table[key] = rates
        try:
            atomic_write_bytes(path, json.dumps(table, indent=1).encode())
        except OSError as e:
            warn(f"matmul peak not cached in {path} ({e.strerror}); measuring again next run")
    return rates


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The MFU denominator for one device and where it comes from: a GPU's dense bf16 peak (fp16
    on V100/T4) from gpu_specs.py, None for an unknown GPU, with a note saying how to add it; a
    CPU's or MPS's best measured matmul rate, or $SPEED_LADDER_PEAK_FLOPS where set."""
    if device.type == "cuda":
        return gpu_specs.peak_for(torch.cuda.get_device_properties(device))
    rates = measured_matmul_rates(device)
    what = f"measured {device.type} matmul peak"
    if fixed_rates() is not None:
        what = f"{device.type} matmul peak set by {PEAK_ENV}"
    why = rates_problem(device, rates)
    if why is not None:
        return None, f"{what} implausible ({why}): MFU left empty"
    best = max(rates, key=rates.get)
    return rates[best], (
        f"{what} {rates[best] / 1e9:.0f} GFLOP/s ({best}; "
        f"fp32 {rates['fp32'] / 1e9:.0f}, bf16 {rates['bf16'] / 1e9:.0f})"
    )


# bf16_is_fast's memo: device type -> (what it depends on, the answer)
_BF16: dict[str, tuple[tuple, tuple[bool, str]]] = {}


def bf16_is_fast(device: torch.device) -> tuple[bool, str]:
    """Whether bf16 matmuls beat fp32 here, and why (step 05's rule), unless $SPEED_LADDER_AMP or
    $SPEED_LADDER_BF16 forces it. Decided once per device type and what it depends on, so the
    step, the memory model and the record see one answer."""
    forced = bf16_forced()
    fixed = os.environ.get(PEAK_ENV)
    depends = (forced, amp_forced()) if forced is not None else (name(device), fixed)
    memo = _BF16.get(device.type)
    if memo is None or memo[0] != depends:
        memo = _BF16[device.type] = depends, _bf16_rule(device, forced)
    return memo[1]


def _bf16_rule(device: torch.device, forced: bool | None) -> tuple[bool, str]:
    if forced is not None:
        by = f"{AMP_ENV}={amp_forced()}" if amp_forced() is not None else BF16_ENV
        return forced, f"forced {'on' if forced else 'off'} by {by}"
    if device.type == "cuda":
        ok, why = gpu_specs.bf16_for(torch.cuda.get_device_properties(device), is_rocm())
        return ok, f"{name(device)}: {why}"
    r = measured_matmul_rates(device)
    how = f"matmul set by {PEAK_ENV}" if fixed_rates() is not None else "measured matmul"
    problem = rates_problem(device, r)
    if problem is not None:
        return False, f"{how} rates implausible ({problem})"
    return r["bf16"] > r["fp32"], (
        f"{how}: bf16 {r['bf16'] / 1e9:.0f} vs fp32 {r['fp32'] / 1e9:.0f} GFLOP/s"
    )
