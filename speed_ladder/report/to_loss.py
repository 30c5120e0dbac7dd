"""A time-to-loss tag's table (`python -m speed_ladder run --to-loss`): `to_loss.csv`, one row
per rung, built from the tag's runs.jsonl (their `to_loss`, `curve` and tok/s:
measure/curve.py).

Each row gives the tokens and time the rung took to reach the target (`time_s`: its warm-up
counted at its median step time, compiling reported apart as `warmup_s`), its tok/s in that
run, and against the rung it builds on (`after`): `time_speedup` (how many times sooner it got
there), `tokens_ratio` (how many times the tokens it needed) and `tps_ratio` (its tok/s over
the base's); time_speedup = tps_ratio / tokens_ratio, up to the evaluations' spacing. Over
several rounds, each figure is the median of the rounds'.

Noise: the A/A control of such a sweep runs the first rung again with the next seed, so the
seeds' spread of time to target (`noise`: max - min over their median, step 00's seeds) says
how far apart two runs of one rung land. A rung's `verdict` against its base is `sooner` or
`later` only beyond that spread, else `within noise`; with a single seed, `one seed`; a rung
whose idea did nothing here (`inactive`: a run's `step_active` false), `inactive here`, never
a verdict.
"""

import csv
import io
import statistics
from pathlib import Path

from speed_ladder.files import atomic_write_bytes
from speed_ladder.ladder import Step
from speed_ladder.selection import collect, judged_by
from speed_ladder.store import RUNS, load_runs

TO_LOSS = "to_loss.csv"
COLUMNS = ["step", "title", "after", "preset", "target", "reached", "runs", "tokens", "time_s",
           "train_s", "warmup_s", "tokens_per_sec", "tokens_ratio", "tps_ratio", "time_speedup",
           "verdict", "noise", "seeds", "inactive"]  # fmt: skip


def is_to_loss(rec: dict) -> bool:
    return isinstance(rec.get("to_loss"), dict)


def _median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def _spread(values) -> float | None:
    """(max - min) / median of two or more times, else None."""
    values = [v for v in values if isinstance(v, (int, float))]
    if len(values) < 2 or not statistics.median(values):
        return None
    return (max(values) - min(values)) / statistics.median(values)


def _ratio(a, b):
    return round(a / b, 4) if isinstance(a, (int, float)) and b else None


def _row(step: Step, oks: list[dict]) -> dict:
    reached = [r for r in oks if r["to_loss"].get("reached")]
    row = dict.fromkeys(COLUMNS) | {"step": step.num, "title": step.title, "after": step.after}
    row.update(target=oks[-1]["to_loss"]["target"], runs=len(oks), preset=oks[-1].get("preset"),
               inactive=any(r.get("step_active") is False for r in oks),
               reached=f"{len(reached)}/{len(oks)}",
               tokens_per_sec=_median(r.get("tokens_per_sec") for r in oks),
               warmup_s=_median(r.get("warmup_s") for r in oks))  # fmt: skip
    if len(reached) == len(oks):  # a figure only where every round reached the target
        row.update(tokens=_median(r["to_loss"]["tokens"] for r in oks),
                   time_s=_median(r["to_loss"]["time_s"] for r in oks),
                   train_s=_median(r["to_loss"]["train_s"] for r in oks))  # fmt: skip
    return row


def _used(steps: list[Step], records: list[dict]) -> tuple[dict, dict]:
    """(per rung, its --to-loss runs a row takes; the A/A control's runs), as a summary rebuilt
    from the records alone takes them (selection.judged_by)."""
    records = [r for r in records if is_to_loss(r)]
    configs, shas, repeats, machine = judged_by(records, steps)
    _, used, control = collect(steps, records, configs, shas, repeats, machine)
    return used, control


def table(steps: list[Step], records: list[dict]) -> list[dict]:
    """The rows (COLUMNS) of the rungs with ok --to-loss runs, in ladder order."""
    used, control = _used(steps, records)
    rows = {s.num: _row(s, used[s.num]) for s in steps if s.num in used}
    first = next(iter(rows), None)
    seeds = [r["to_loss"]["time_s"] for r in used.get(first, []) + control.get(first, [])]
    noise = _spread(seeds)
    for row in rows.values():
        row["seeds"] = len(seeds) if row["step"] == first else None
        row["noise"] = round(noise, 4) if noise is not None else None
        base = rows.get(row["after"])
        if base is None:
            continue
        row["tokens_ratio"] = _ratio(row["tokens"], base["tokens"])
        row["tps_ratio"] = _ratio(row["tokens_per_sec"], base["tokens_per_sec"])
        row["time_speedup"] = _ratio(base["time_s"], row["time_s"])
        row["verdict"] = "inactive here" if row["inactive"] else verdict(row["time_speedup"], noise)
    return list(rows.values())


def verdict(speedup: float | None, noise: float | None) -> str | None:
    """`sooner`, `later` or `within noise` against the seeds' spread; `one seed` without it."""
    if speedup is None:
        return None
    if noise is None:
        return "one seed"
    if speedup > 1 + noise:
        return "sooner"
    if speedup < 1 / (1 + noise):
        return "later"
    return "within noise"


def write(tag_dir: Path, steps: list[Step]) -> Path | None:
    """to_loss.csv of a tag whose runs.jsonl holds --to-loss runs (atomically), else None."""
    if not (Path(tag_dir) / RUNS).is_file():
        return None
    rows = table(steps, load_runs(tag_dir))
    if not rows:
        return None
    out = io.StringIO()
    w = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path = Path(tag_dir) / TO_LOSS
    atomic_write_bytes(path, out.getvalue().encode("utf-8"))
    return path


def read(tag_dir: Path) -> list[dict]:
    """A tag's to_loss.csv rows (numbers as floats, empty cells None), or [] without one."""
    path = Path(tag_dir) / TO_LOSS
    if not path.is_file():
        return []

    def value(k, v):
        if v == "" or k in ("step", "title", "after", "preset", "reached", "verdict"):
            return v or None
        return v == "True" if k == "inactive" else float(v)

    with open(path, encoding="utf-8", newline="") as f:
        return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


def curves(tag_dir: Path, steps: list[Step]) -> dict[str, list[tuple[float, float]]]:
    """Each rung's loss curve of its last used --to-loss run: [(time, val_loss)], the time on the
    same clock as `time_s` (the warm-up counted at the run's median step time)."""
    used, _ = _used(steps, load_runs(tag_dir))
    out = {}
    for num, oks in used.items():
        r = oks[-1]
        warm = int((r.get("spec") or {}).get("warmup_steps") or 0)
        excess = (r.get("warmup_s") or 0.0) - warm * (r.get("step_time_ms") or 0.0) / 1000
        out[num] = [(max(t - excess, 0.0), loss) for _, t, loss in r.get("curve") or []]
    return out


def format_rows(rows: list[dict]) -> str:
    """The table for the terminal: a line per rung."""

    def num(v, spec):
        return "-" if v is None else format(v, spec)

    head = (f"{'step':4}  {'reached':7}  {'tokens':>8}  {'time s':>7}  {'tok/s':>7}  "
            f"{'x tokens':>8}  {'x tok/s':>7}  {'sooner':>6}  verdict")  # fmt: skip
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['step']:4}  {r['reached']:7}  {num(r['tokens'], ',.0f'):>8}  "
            f"{num(r['time_s'], '.1f'):>7}  {num(r['tokens_per_sec'], ',.0f'):>7}  "
            f"{num(r['tokens_ratio'], '.2f'):>8}  {num(r['tps_ratio'], '.2f'):>7}  "
            f"{num(r['time_speedup'], '.2f'):>6}  {r['verdict'] or ''}"
        )
    noise = next((r["noise"] for r in rows if r["noise"] is not None), None)
    lines.append(
        f"noise: the seeds' spread of step {rows[0]['step']}'s time to target, "
        + (f"{noise:.1%}" if noise is not None else "not measured (one seed)")
    )
    return "\n".join(lines)
