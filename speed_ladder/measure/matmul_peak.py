"""The measured matmul peak of a CPU or an Apple GPU (no datasheet table for them): the best
FLOP/s of a 1024^3 matmul in fp32 and bf16, measured once per device name, thread count and
torch version and cached (`matmul_peak.json` in the cache folder); never cached when it is
implausible or was measured while other processes kept the CPU busy. device.py's peak_flops (the
MFU denominator) and bf16_is_fast (step 05's rule) read it. Under torchrun, rank 0 measures for
the job's ranks (measured_matmul_rates). $SPEED_LADDER_PEAK_FLOPS sets both rates instead, and
nothing is measured (fixed_rates: the tests)."""

import json
import math
import os
import time
from pathlib import Path

import torch

from speed_ladder.errors import UserError, warn
from speed_ladder.files import atomic_write_bytes, cache_dir
from speed_ladder.measure import cpu_load
from speed_ladder.measure.across_ranks import process_group
from speed_ladder.measure.torch_device import name, synchronize


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 1024) -> float:
    """Best of 5 timed bursts of n^3 matmuls: a busy moment lowers one burst, not the best.
    Where one n^3 matmul takes over 0.25 s (an emulated dtype: bf16 on a CPU without native
    bf16 runs at about 1 GFLOP/s, 2 s a call at n = 1024), n halves, down to 256, so that
    measuring a slow dtype takes a few seconds instead of half a minute; such a dtype's rate
    barely depends on n. (Not predicted from a small probe: under load a 256^3 matmul can run
    30x below a 1024^3 one, its threads waiting for each other.) The operands come from a
    generator of their own, so measuring leaves the process's random state as it was.
    """
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
    """{"fp32": FLOP/s, "bf16": FLOP/s} of a 1024^3 matmul, measured once and cached per
    device name, thread count and torch version (CPU/MPS have no datasheet table here).

    A cached entry outside the device's plausible range (see PLAUSIBLE_PEAK), or of the wrong
    type, is measured again; a measurement outside it, or one taken while other processes kept
    a CPU busy (cpu_load.py's threshold), is returned but not cached.

    In a process group of several ranks (torchrun: step 11 on), rank 0 measures (or reads its
    cache) while the others wait, and every rank takes its rates. Each rank measuring for
    itself, all at once, slowed one another, so on a busy machine the peak was never cached and
    every run measured it again, several seconds a rank; and ranks could disagree on step 05's
    bf16 rule or the MFU peak. The first call is a collective: every rank makes it (bf16_is_fast
    or Run.set_model, which every rank calls at the same point of a step).

    $SPEED_LADDER_PEAK_FLOPS set: those rates, in every rank, nothing measured or cached.
    """
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
    """This process's measurement, or its cache's (measured_matmul_rates)."""
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
