"""Loss parity: the numeric regime a run computed in, and whether a step's losses agree with the
previous step's under the tolerance stated for it (tests/loss_parity.json).

Every step of a sweep or of the tests trains with the same seed and data, so neighbours' first
losses compare. How close they must be depends on what the step changes and on the numbers it
computes with, its **regime**, which every record keeps (`regime`):

- `fp32`: IEEE fp32 matmuls (a CPU; a GPU before step 02 or without TF32);
- `tf32`: fp32 matmuls on TF32 tensor cores (CUDA, compute capability >= 8.0, step 02 on);
- `bf16`: step 05's bf16 autocast is on (where bf16 is native, or forced by SPEED_LADDER_BF16);
- any of them with `-compiled`: torch.compile generated the training graph (step 08 on).

On a CPU (and MPS) a step's rule is `exact` (the same floats) or `close`; a close step's
tolerance is the looser of the two runs' regimes' (`regimes` in the manifest), or its own
`atol` where the step itself changes the numbers more (bf16 on, a new init, a larger batch).
On CUDA every rule is close, with a tolerance per step (`cuda`): atomics make no rerun exact.
"""

import json
import sys
from functools import cache

from .files import ROOT

MANIFEST = ROOT / "tests" / "loss_parity.json"


def regime(device) -> str:
    """The regime this process computed in (see the module docstring): `fp32`, `tf32`, `bf16`,
    with `-compiled` when torch.compile compiled a graph here."""
    import torch

    from .device import BF16_USED

    if BF16_USED.get(device.type):
        base = "bf16"
    elif device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        major = torch.cuda.get_device_properties(device).major
        base = "tf32" if major >= 8 else "fp32"
    else:
        base = "fp32"
    compiled = ((compiles() or {}).get("graphs") or 0) > 0
    return base + ("-compiled" if compiled else "")


def compiles() -> dict | None:
    """What torch.compile compiled in this process, from dynamo's own bookkeeping: `graphs` (FX
    graphs: a recompile adds one), `frames` (Python frames traced and compiled, a recompile
    counting again; dynamo's `frames` counter also counts frames it was handed and skipped) and
    `seconds` (compile wall time, forward and backward graphs; an on-disk inductor cache hit
    makes it short); a field this torch does not keep is None. None when no frame reached
    dynamo (dynamo not even imported: an eager run)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None or not dynamo.counters["frames"]["total"]:
        return None
    try:  # private helpers (torch 2.13): absent or renamed in another torch
        seconds = round(dynamo.calculate_time_spent()["total_wall_time"], 1)
    except Exception:
        seconds = None
    frames = getattr(dynamo, "compilation_time_metrics", {}).get("_compile.compile_inner")
    return {
        "graphs": dynamo.counters["stats"]["unique_graphs"],
        "frames": len(frames) if frames is not None else None,
        "seconds": seconds,
    }


@cache
def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def regime_atol(*regimes: str | None) -> float:
    """The looser tolerance of these regimes' (CPU): two runs of one step that should compute
    the same losses but in another order (1 vs 2 processes, DDP vs FSDP2)."""
    table = manifest()["regimes"]
    return max((table[g]["atol"] for g in regimes if g in table), default=table["fp32"]["atol"])


def rule(step: str, prev_regime: str | None, cur_regime: str | None, device: str = "cpu"):
    """{"rule": "exact"|"close", "atol": float|None, "why": str} for step `step` against the
    previous step, each run in its regime (None: a record from before records said)."""
    m = manifest()
    if device == "cuda":
        r = m["cuda"]["steps"][step]
        return {"rule": "close", "atol": r["atol"], "why": r["why"]}
    r = m["steps"][step]
    if r["rule"] == "exact":
        return {"rule": "exact", "atol": None, "why": r["why"]}
    regimes = m["regimes"]
    known = [g for g in (prev_regime, cur_regime) if g in regimes]
    loosest = max(known, key=lambda g: regimes[g]["atol"], default="fp32")
    atol, why = regimes[loosest]["atol"], f"{r['why']} ({loosest} regime)"
    if r.get("atol", 0) > atol:
        atol, why = r["atol"], r["why"]
    return {"rule": "close", "atol": atol, "why": why}


def compare(prev: list[float], cur: list[float], r: dict) -> tuple[bool, float]:
    """(within the rule, the largest |difference|) over the steps both runs have."""
    n = min(len(prev), len(cur))
    if n == 0:
        return False, float("nan")
    worst = max(abs(a - b) for a, b in zip(prev[:n], cur[:n], strict=True))
    if r["rule"] == "exact":
        return list(prev[:n]) == list(cur[:n]), worst
    return worst <= r["atol"], worst


def check(step: str, prev_rec: dict, cur_rec: dict) -> tuple[bool, str]:
    """Whether `cur_rec` (step `step`) keeps `prev_rec`'s losses, and a line saying how."""
    r = rule(step, prev_rec.get("regime"), cur_rec.get("regime"), cur_rec.get("device", "cpu"))
    ok, worst = compare(prev_rec.get("losses") or [], cur_rec.get("losses") or [], r)
    bound = "exact" if r["rule"] == "exact" else f"<= {r['atol']:g}"
    return ok, f"max |loss difference| {worst:.2e} ({bound}: {r['why']})"
