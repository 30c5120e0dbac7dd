"""Loss parity: the numeric regime a run computed in, and whether a step's losses agree with the
previous step's under the tolerance stated for it (each rung's `parity` in
speed_ladder/data/ladder.json; the regimes in speed_ladder/data/loss_parity.json).

Every step of a sweep or of the tests trains with the same seed and data, so neighbours' first
losses compare; a step's neighbour is the rung it builds on (its `after` in
speed_ladder/data/ladder.json, normally the file before it). How close they must be depends on
what the step changes and on the numbers it computes with, its **regime**, which every record
keeps (`regime`):

- `fp32`: IEEE fp32 matmuls (a CPU; a GPU before step 02 or without TF32);
- `tf32`: fp32 matmuls on TF32 tensor cores (CUDA, compute capability >= 8.0, step 02 on);
- `bf16`: step 05's bf16 autocast is on (where bf16 is native, or forced by SPEED_LADDER_BF16);
- `fp16`: step 05's fp16 autocast with loss scaling is on (a CUDA GPU with fp16 tensor cores
  but no native bf16: V100, T4; or forced by SPEED_LADDER_AMP=fp16);
- any of them with `-compiled`: torch.compile generated the training graph (step 08 on).

On a CPU (and MPS) a step's rule is `exact` (the same floats) or `close`; a close step's
tolerance is the looser of the two runs' regimes' (`regimes` in the manifest), or its own
`atol` where the step itself changes the numbers more (bf16 on, a new init, a larger batch).
On CUDA every rule is close, with a tolerance per step and preset (`cuda`): atomics make no
rerun exact. They were measured with TF32 and bf16: a CUDA run in fp16 (a GPU without native
bf16) is `not comparable` until a GPU without native bf16 measures its own.

Rounding differences grow with the run, so a close rule holds for the presets and run lengths
it was measured on (`uncovered`): on a CPU tiny's 4 steps and the cpu preset's 13
(`cpu_holds`); on CUDA each step's `holds` (gpt2-124m's 63 steps from the H200 sweep, tiny's 4
estimated). A sweep is held to them (`judge`: the summary's `parity` column), except where no
rule covers its preset or length, or a step says its runs do not compare there: `dropout`
(with dropout > 0 it draws other dropout masks: torch.compile's inductor has its own random
stream) and `presets` (its own tolerance holds on those presets only: a larger batch sees
other data, and how far its losses part depends on the preset). A step is compared with the
step before it in the ladder, never across a step its tag lacks. Such a pair is `not
comparable`, with the reason, never `ok` or `off`. "The step before it" is the rung it builds
on: step 15 with `"after": "12"` is judged against step 12's runs.

Where the training losses keep the rule, the two runs' final validation losses are compared
under it too (`validation`): apart, the pair is `not comparable` where records of other commits
meet (a row that mixes sweeps: the evaluation may have changed), never silently `ok`; where one
commit evaluated both, the detail gives the gap.
"""

import json
import math
import sys
from functools import cache
from pathlib import Path

from speed_ladder import ladder
from speed_ladder.gains import measured, round_of
from speed_ladder.presets import PRESETS

MANIFEST = Path(__file__).parent / "data" / "loss_parity.json"


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


def _rung_rule(step: str, device: str) -> dict:
    """Rung `step`'s rule against the rung it builds on (`after`): `cpu` or `cuda`
    (ladder.json)."""
    return ladder.rung(step).parity[device]


def regime_atol(*regimes: str | None) -> float:
    """The looser tolerance of these regimes' (CPU): two runs of one step that should compute
    the same losses but in another order (1 vs 2 processes, DDP vs FSDP2)."""
    table = manifest()["regimes"]
    return max((table[g]["atol"] for g in regimes if g in table), default=table["fp32"]["atol"])


def rule(step: str, prev_regime: str | None, cur_regime: str | None, device: str = "cpu",
         preset: str | None = None):  # fmt: skip
    """{"rule": "exact"|"close", "atol": float|None, "why": str} for step `step` against the
    previous step, each run in its regime (None: a record that does not say); on CUDA the
    tolerance of `preset` (tiny's where none is named). None where no CUDA tolerance covers the
    preset (`holds`)."""
    m = manifest()
    if device == "cuda":
        r = _rung_rule(step, "cuda")
        h = r["holds"].get(preset or "tiny")
        if h is None:
            return None
        return {"rule": "close", "atol": h["atol"], "why": r["why"], "steps": h["steps"]}
    r = _rung_rule(step, "cpu")
    if r["rule"] == "exact":
        return {"rule": "exact", "atol": None, "why": r["why"]}
    regimes = m["regimes"]
    known = [g for g in (prev_regime, cur_regime) if g in regimes]
    loosest = max(known, key=lambda g: regimes[g]["atol"], default="fp32")
    atol, why = regimes[loosest]["atol"], f"{r['why']} ({loosest} regime)"
    own = r.get("atol", 0)  # the step's own bound: one number, or one per regime
    own = own.get(loosest, 0) if isinstance(own, dict) else own
    if own > atol:
        atol, why = own, r["why"]
    return {"rule": "close", "atol": atol, "why": why}


def uncovered(step: str, device: str, preset, n: int) -> str | None:
    """Why no rule covers `n` losses of `preset` on `device` (each rung's CUDA
    `holds`, the CPU's `cpu_holds`), or None. Rounding differences grow with the run:
    a tolerance measured over 4 steps of tiny says nothing of 63 steps of gpt2-124m."""
    m = manifest()
    if device == "cuda":
        holds = _rung_rule(step, "cuda")["holds"]
        where = "CUDA tolerance"
    else:
        holds, where = m["cpu_holds"], "CPU rule"
    known = ", ".join(f"{p} up to {h['steps']} steps" for p, h in holds.items())
    h = holds.get(preset) if isinstance(preset, str) else None
    if h is None:
        return f"on preset {preset}: no {where} there (measured: {known})"
    if n > h["steps"]:
        return f"over {n} steps of {preset}: the {where} holds for up to {h['steps']} ({known})"
    return None


def compare(prev: list[float], cur: list[float], r: dict) -> tuple[bool, float]:
    """(within the rule, the largest |difference|) over the steps both runs have."""
    n = min(len(prev), len(cur))
    if n == 0:
        return False, float("nan")
    worst = max(abs(a - b) for a, b in zip(prev[:n], cur[:n], strict=True))
    if r["rule"] == "exact":
        return list(prev[:n]) == list(cur[:n]), worst
    return worst <= r["atol"], worst


def drop_rate(preset) -> float | None:
    """The preset's dropout (speed_ladder/presets.py); None for a preset this checkout lacks."""
    return (PRESETS.get(preset) or {}).get("drop_rate") if isinstance(preset, str) else None


def not_comparable(step: str, prev_rec: dict, cur_rec: dict) -> str | None:
    """Why step `step`'s rule does not apply to these two runs (see the module docstring), or
    None when it does."""
    regimes = [str(r.get("regime") or "") for r in (prev_rec, cur_rec)]
    if cur_rec.get("device") == "cuda" and any(g.startswith("fp16") for g in regimes):
        return f"not comparable in fp16 on CUDA: {manifest()['cuda']['fp16']}"
    r = _rung_rule(step, "cpu") if any(s.num == step for s in ladder.rungs()) else {}
    presets = {p for p in (prev_rec.get("preset"), cur_rec.get("preset")) if isinstance(p, str)}
    only = r.get("presets")
    if only and presets - set(only):
        where = ", ".join(sorted(presets - set(only)))
        return f"not comparable on preset {where}: {r.get('elsewhere') or 'see the manifest'}"
    rates = [d for d in map(drop_rate, presets) if d]
    if r.get("dropout") and rates and not _both_without_dropout(step):
        return f"not comparable with dropout {max(rates):g}: {r['dropout']}"
    return None


def _both_without_dropout(step: str) -> bool:
    """Rung `step` and the rung it builds on both train without dropout (step 16 on): no masks
    to draw otherwise, whatever the preset's drop_rate."""
    cur = ladder.rung(step)
    return (
        cur.after is not None
        and cur.memory.dropout == ladder.rung(cur.after).memory.dropout == "off"
    )


OK, OFF, NOT_COMPARABLE = "ok", "off", "not comparable"


def judge(step: str, prev_rec: dict, cur_rec: dict) -> tuple[str, float, str]:
    """(`ok`, `off` or `not comparable`, the largest |loss difference|, a line saying how) for
    step `step`'s run `cur_rec` against the previous step's `prev_rec`; `off` also when a run
    has no losses (the difference is then NaN)."""
    device = cur_rec.get("device", "cpu")
    preset = cur_rec.get("preset")
    prev, cur = prev_rec.get("losses") or [], cur_rec.get("losses") or []
    r = rule(step, prev_rec.get("regime"), cur_rec.get("regime"), device, preset)
    why = not_comparable(step, prev_rec, cur_rec)
    if r is None or why:
        r = r or {"rule": "close", "atol": math.inf, "why": ""}
        _, worst = compare(prev, cur, r)
        why = why or "not comparable " + uncovered(step, device, preset, min(len(prev), len(cur)))
        return NOT_COMPARABLE, worst, f"max |loss difference| {worst:.2e}, {why}"
    ok, worst = compare(prev, cur, r)
    # an exact rule holds at any length: the same floats stay the same
    n = min(len(prev), len(cur))
    far = uncovered(step, device, preset, n) if n and r["rule"] != "exact" else None
    if far:
        return NOT_COMPARABLE, worst, f"max |loss difference| {worst:.2e}, not comparable {far}"
    if r["rule"] == "exact":
        bound = "exact" if ok else "not exact"
    else:
        bound = f"{'<=' if ok else '>'} {r['atol']:g}"
    line = f"max |loss difference| {worst:.2e} {bound} ({r['why']})"
    state, val = (OK if ok else OFF), validation(prev_rec, cur_rec, r) if ok else None
    return (val[0] or state, worst, f"{line}; {val[1]}") if val else (state, worst, line)


def validation(prev_rec: dict, cur_rec: dict, r: dict) -> tuple[str | None, str] | None:
    """The two runs' final validation losses under the same rule: None where one has none or
    they agree. Apart, (None, how) where one commit's code evaluated both (the same `git_sha`:
    the training losses judge the rung, whose own change may move the validation loss more:
    09's new init), else `not comparable`: other code may have evaluated them (another commit,
    or an unknown one), a row that mixes sweeps."""
    a, b = prev_rec.get("val_loss"), cur_rec.get("val_loss")
    if not all(isinstance(v, (int, float)) for v in (a, b)):
        return None
    if a == b or (r["rule"] != "exact" and abs(a - b) <= r["atol"]):
        return None
    line = f"validation loss {a:.4f} against {b:.4f}"
    shas = {x.get("git_sha") for x in (prev_rec, cur_rec)}
    if len(shas) == 1 and None not in shas:
        return None, line + ", one commit evaluated both"
    commits = ", ".join(str(x.get("git_sha"))[:8] for x in (prev_rec, cur_rec))
    why = "their evaluation may differ; a sweep of both rungs at one commit compares them"
    return NOT_COMPARABLE, f"{line}, not comparable across commits ({commits}): {why}"


# ---------------------------------------------------------------- the summary's columns
COLUMNS = ["parity", "parity_detail"]
_SEVERITY = {OFF: 2, NOT_COMPARABLE: 1, OK: 0}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def pair_runs(step: str, prev_runs: list[dict], runs: list[dict]) -> tuple[str, str] | None:
    """(`ok`/`off`/`not comparable`, the detail) of a step's runs against the previous step's:
    round with round (gains.round_of), else the last run with the last; the worst round counts
    (`off` over `not comparable` over `ok`, then the larger difference). None when no pair has
    losses on both sides."""
    a = {round_of(r, i): r for i, r in enumerate(prev_runs)}
    b = {round_of(r, i): r for i, r in enumerate(runs)}
    common = sorted(set(a) & set(b))
    pairs = [(k, a[k], b[k]) for k in common] or [(None, prev_runs[-1], runs[-1])]
    judged = [(k, *judge(step, p, c)) for k, p, c in pairs if p.get("losses") and c.get("losses")]
    if not judged:
        return None
    _, state, _, line = max(judged, key=lambda j: (_SEVERITY[j[1]], _finite(j[2])))
    n = len(judged)
    if n > 1:
        bad = [str(j[0]) for j in judged if j[1] == state]
        where = f"all {n} rounds" if len(bad) == n else f"round {', '.join(bad)} of {n}"
        line += f"; {state} in {where}"
    return state, line


def add_columns(rows: list[dict], used: dict[str, list[dict]]) -> None:
    """Each summary row's `parity` and `parity_detail` against the row of the rung it builds on
    (ladder.bases: its `after`, normally the row before it; the summary has a row for every
    step the tag holds, run or not); a row whose base the tag does not hold (the first) stays
    empty. A rule compares a step with the step it changes: where that step has no ok runs
    here, the pair is `not comparable`, never judged against an earlier step (step 12 against
    10 where 11 was not run differs by all that 11 changes)."""
    by_step = {r["step"]: r for r in rows}
    bases = ladder.bases([r["step"] for r in rows])
    for i, (row, base) in enumerate(zip(rows, bases, strict=True)):
        runs, before = used.get(row["step"]), by_step.get(base)
        if not runs or row.get("status") != "ok" or before is None:
            continue
        if not measured(before, used):
            state = before.get("status") or "not run"
            why = "was not run" if state == "not run" else f"has no ok run ({state})"
            rung = "before it" if i and rows[i - 1] is before else "it builds on (its `after`)"
            row["parity"] = NOT_COMPARABLE
            row["parity_detail"] = (
                f"not comparable without step {base}: it {why} in this tag, and a step is "
                f"judged against the step {rung}"
            )
            continue
        got = pair_runs(row["step"], used[before["step"]], runs)
        if got:
            row["parity"], row["parity_detail"] = got


def check(step: str, prev_rec: dict, cur_rec: dict) -> tuple[bool, str]:
    """Whether `cur_rec` (step `step`) keeps `prev_rec`'s losses (judge says `ok`), and how."""
    state, _, line = judge(step, prev_rec, cur_rec)
    return state == OK, line
