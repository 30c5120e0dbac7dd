"""Each step's own effect: its tokens/s and peak memory against the previous step's, round by
round, with an interval, a verdict, and the noise floor that verdict is judged against.

- **Pairs.** `python -m speed_ladder run --repeats K` runs K rounds (every step once per round), so
  a step and its predecessor are measured minutes apart in each round. A record's round is
  `sweep.round` (a record without it may say `sweep.repeat`: then the i-th run of each step).
  Two runs of the same round pair only if they started within `PAIR_WINDOW_S` (an hour) of each
  other: a later sweep that runs a step again but not its predecessor numbers its rounds from 1
  too, and its runs must not be paired with runs of another session (other load, other
  thermals, hours apart). Such a step has no effect in the summary, not a made-up one; a sweep
  resumed after its --budget ran out runs minutes later and still pairs.
  The previous step is the rung it builds on (its `after` in speed_ladder/data/ladder.json:
  normally the file before it, NN-1, but `"after": "12"` makes step 15's effect its gain over
  step 12), where the tag has it with ok runs; none where the tag lacks that step or it has
  no ok run (in a `-xN` tag the first distributed step has none). A step this checkout's
  registry lacks is taken over the row before it.
- **gain_vs_prev** is the median over rounds of (this step's tok/s / the previous step's tok/s,
  same round); `mem_vs_prev` the same for peak reserved memory.
- **Interval** `[lo, hi]`: the min and max of those per-round ratios (not a bootstrap). With K
  rounds the true median ratio lies inside the min-max of K independent ratios with probability
  1 - 2^(1-K): 75% for 3 rounds, 88% for 4, 94% for 5. One round has no interval, and says so.
- **Verdict**: `faster` / `slower` (memory: `less` / `more`) when the interval excludes 1.0
  and the median effect is larger than the noise floor and than `MIN_EFFECT` (1%: a smaller
  effect is not a rung of a speed ladder, and peak memory, often exact to the byte from run to
  run, would otherwise call 0.1% "more"); otherwise `no change`. A step whose
  records say `step_active: false` (it does nothing on this device) is `inactive`.
- **Noise floor**: what two runs of the same script differ by. With the A/A control (the
  sweep's default from 2 rounds on: the first step run twice in each round, right after itself)
  it is the largest |A/A ratio - 1| over the rounds, of every sweep's control in the tag;
  without one, the median over steps of a step's max/min - 1 across its rounds (which includes
  drift between rounds, so it is larger).
- **Scaling efficiency** (a `-xN` tag): N-process tok/s / (N x the same step's 1-process tok/s
  in the `-x1` tag), round by round, with its interval.
"""

import math
import statistics
from dataclasses import dataclass
from datetime import datetime

from speed_ladder import ladder

NO_CHANGE, ONE_ROUND, INACTIVE = "no change", "one round: no interval", "inactive"
MIN_EFFECT = 0.01  # |ratio - 1| below this is "no change", however tight the interval
# a round's two runs pair only if they started this close: neighbours in a round run minutes
# apart (a cpu-preset round of the whole ladder takes ~30 min), sessions hours apart
PAIR_WINDOW_S = 3600.0
TPS, MEM = "tokens_per_sec", "peak_mem_reserved_bytes"


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) and v > 0 else None


def round_of(rec: dict, position: int) -> int:
    """The round a record ran in: `sweep.round`, else `sweep.repeat`, else its position."""
    sw = rec.get("sweep") or {}
    for key in ("round", "repeat"):
        v = sw.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return position + 1


def runs_by_round(runs: list[dict], key: str) -> dict[int, dict]:
    """{round: run} of the runs that have a positive number under `key` (later runs win); a
    run through Triton's interpreter (`interpreted: true`) is left out: it measured nothing."""
    out = {}
    for i, r in enumerate(runs):
        if r.get("interpreted") is True:  # Triton's interpreter ran Liger: no measurement
            continue
        if _num(r.get(key)) is not None:
            out[round_of(r, i)] = r
    return out


def per_round(runs: list[dict], key: str) -> dict[int, float]:
    """{round: value} of runs_by_round."""
    return {k: _num(r.get(key)) for k, r in runs_by_round(runs, key).items()}


def _started(rec: dict) -> float | None:
    try:
        return datetime.fromisoformat(rec["started_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def same_session(a: dict, b: dict) -> bool:
    """Whether two runs started within PAIR_WINDOW_S of each other (a run without a start time
    pairs by its round alone)."""
    ta, tb = _started(a), _started(b)
    return ta is None or tb is None or abs(ta - tb) <= PAIR_WINDOW_S


def paired(before: list[dict], after: list[dict], key: str) -> tuple[dict, dict]:
    """({round: value}, {round: value}) of the rounds where both sides have a run under `key`
    and the two started in the same session (same_session)."""
    a, b = runs_by_round(before, key), runs_by_round(after, key)
    both = [k for k in a.keys() & b.keys() if same_session(a[k], b[k])]
    return {k: _num(a[k].get(key)) for k in both}, {k: _num(b[k].get(key)) for k in both}


@dataclass
class Effect:
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None
    rounds: int = 0
    verdict: str = ""


def effect(before: dict, after: dict, floor: float | None, up: str, down: str, scale=1.0):
    """after / (scale x before), round by round: the median, its min-max and the verdict."""
    ratios = [after[r] / (scale * before[r]) for r in sorted(set(before) & set(after))]
    if not ratios:
        return Effect()
    med = statistics.median(ratios)
    if len(ratios) == 1:
        return Effect(med, None, None, 1, ONE_ROUND)
    lo, hi = min(ratios), max(ratios)
    quiet = lo <= 1.0 <= hi or abs(med - 1.0) <= max(floor or 0.0, MIN_EFFECT)
    return Effect(med, lo, hi, len(ratios), NO_CHANGE if quiet else up if med > 1 else down)


# ---------------------------------------------------------------- the noise floor
@dataclass
class Floor:
    tps: float | None
    mem: float | None
    source: str


def _control_floor(first: list[dict], control: list[dict], key: str) -> tuple[float | None, int]:
    a, b = paired(first, control, key)
    pairs = [abs(b[r] / a[r] - 1.0) for r in a]
    return (max(pairs) if pairs else None), len(pairs)


def _spread_floor(used: dict[str, list[dict]], key: str) -> tuple[float | None, int]:
    spreads = []
    for runs in used.values():
        vals = list(per_round(runs, key).values())
        if len(vals) >= 2:
            spreads.append(max(vals) / min(vals) - 1.0)
    return (statistics.median(spreads) if spreads else None), len(spreads)


def noise_floor(used: dict[str, list[dict]], control: dict[str, list[dict]]) -> Floor:
    """The floor from the A/A control runs (`control`: by step, each sweep's first step run
    twice per round) when there are any: the largest |ratio - 1| over every step's control
    rounds, so that a tag swept more than once is judged by its noisiest sweep, not by its
    first step's; else from the spread of each step's runs (see the module doc)."""
    found = []
    for step, runs in control.items():
        if step in used:
            tps, n = _control_floor(used[step], runs, TPS)
            if tps is not None:
                found.append((step, tps, n, _control_floor(used[step], runs, MEM)[0]))
    if found:
        mems = [m for *_, m in found if m is not None]
        steps = [f[0] for f in found]
        who = f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(steps)}"
        return Floor(max(f[1] for f in found), max(mems, default=None),
                     f"A/A control: {who} run twice per round, largest |ratio - 1| over "
                     f"{sum(f[2] for f in found)} round(s)")  # fmt: skip
    tps, n = _spread_floor(used, TPS)
    mem, _ = _spread_floor(used, MEM)
    if tps is None:
        return Floor(None, None, "no repeated runs: no noise floor")
    return Floor(tps, mem, f"spread: median over {n} step(s) of max/min - 1 across rounds")


# ---------------------------------------------------------------- the summary's columns
COLUMNS = [
    "prev_step",
    "gain_vs_prev",
    "gain_vs_prev_lo",
    "gain_vs_prev_hi",
    "verdict",
    "mem_vs_prev",
    "mem_vs_prev_lo",
    "mem_vs_prev_hi",
    "mem_verdict",
    "noise_floor",
    "mem_noise_floor",
    "noise_source",
    "scaling_efficiency",
    "scaling_efficiency_lo",
    "scaling_efficiency_hi",
]
NUMBERS = [c for c in COLUMNS if c not in ("prev_step", "verdict", "mem_verdict", "noise_source")]


def measured(row: dict | None, used: dict[str, list[dict]]) -> bool:
    """Whether a summary row has ok runs to be the base of another step's effect or parity."""
    return row is not None and bool(used.get(row["step"])) and row.get("status") == "ok"


def add_effects(rows: list[dict], used: dict[str, list[dict]],
                control: dict[str, list[dict]]) -> Floor:  # fmt: skip
    """Fill each summary row's effect columns from the runs it summarizes (`used`, by step): each
    step over the rung it builds on (ladder.bases: its `after`, normally the row before it),
    where both have ok runs; `control`: the A/A control runs, by step."""
    floor = noise_floor(used, control)
    by_step = {r["step"]: r for r in rows}
    for row, prev in zip(rows, ladder.bases([r["step"] for r in rows]), strict=True):
        runs = used.get(row["step"])
        row.update(noise_floor=floor.tps, mem_noise_floor=floor.mem, noise_source=floor.source)
        if not runs or row.get("status") != "ok":
            continue
        # none where the base has no ok run (a ratio over an earlier step would hold the
        # base's own effect too; parity.py alike)
        if measured(by_step.get(prev), used):
            g = effect(*paired(used[prev], runs, TPS), floor.tps, "faster", "slower")
            m = effect(*paired(used[prev], runs, MEM), floor.mem, "more", "less")
            row.update(prev_step=prev, gain_vs_prev=g.ratio, gain_vs_prev_lo=g.lo,
                       gain_vs_prev_hi=g.hi, verdict=g.verdict, mem_vs_prev=m.ratio,
                       mem_vs_prev_lo=m.lo, mem_vs_prev_hi=m.hi, mem_verdict=m.verdict)  # fmt: skip
        if row.get("step_active") is False:
            row["verdict"] = INACTIVE
    return floor


def add_scaling(rows: list[dict], used: dict, single: dict[str, list[dict]], nproc: int) -> None:
    """Scaling efficiency of each step of a `-xN` tag against its runs in the `-x1` tag."""
    for row in rows:
        runs, base = used.get(row["step"]), single.get(row["step"])
        if not runs or not base or row.get("status") != "ok":
            continue
        one, many = per_round(base, TPS), per_round(runs, TPS)
        e = effect(one, many, None, "", "", scale=nproc)
        if e.ratio is None and one and many:  # no round in common: the medians
            e = Effect(statistics.median(many.values()) / (nproc * statistics.median(one.values())))
        row.update(scaling_efficiency=e.ratio, scaling_efficiency_lo=e.lo,
                   scaling_efficiency_hi=e.hi)  # fmt: skip
