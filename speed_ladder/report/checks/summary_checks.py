"""The checks of `python -m speed_ladder check` that compare summary.csv with its records
(check.py's docstring numbers them): 4 every cell that comes from the records agrees with the
summary rebuilt from them, and 7 every verdict that claims a change rests on enough rounds and
an interval that excludes no change.
"""

import contextlib
import io
import math
import re
from pathlib import Path

from speed_ladder import gains, ladder
from speed_ladder.errors import UserError
from speed_ladder.report.checks.record_checks import Report
from speed_ladder.report.rows import number, text
from speed_ladder.report.summary import _DIGITS, SUMMARY, read_summary, rebuild
from speed_ladder.selection import matching, ok_since_failure, version
from speed_ladder.spec import config_of
from speed_ladder.store import RUNS

# the verdicts that claim a change (gains.add_effects): column -> (words, the "up" word, ratio,
# noise floor)
CLAIMS = {
    "verdict": ({"faster", "slower"}, "faster", "gain_vs_prev", "noise_floor"),
    "mem_verdict": ({"more", "less"}, "more", "mem_vs_prev", "mem_noise_floor"),
}
MEASURED = ["runs", "tokens_per_sec_median", "tokens_per_sec_min", "tokens_per_sec_max",
            "speedup_vs_00", "peak_reserved_gib", "peak_reserved_gib_min", "mfu", "train_loss",
            "val_loss", "other_load_max"]  # fmt: skip
# `parity` (ok/off/not comparable) is checked; `parity_detail` is not: its words are
# speed_ladder/data/ladder.json's, which may be reworded without changing a verdict
TEXTS = ("status", "prev_step", "verdict", "mem_verdict", "noise_source", "parity",
         "inactive_rungs", "attention_kernel")  # fmt: skip
SCALING = [c for c in gains.COLUMNS if c.startswith("scaling")]


def _differs(col: str, a, b) -> bool:
    if col in TEXTS:
        return text(a) != text(b)
    x, y = number(a), number(b)
    if x is None or y is None:
        return (x is None) != (y is None)
    return not math.isclose(x, y, rel_tol=1e-9, abs_tol=1.01 * 10.0 ** -_DIGITS.get(col, 4))


def _cell(v) -> str:
    return f"{number(v):g}" if number(v) is not None else repr(text(v)) if text(v) else "empty"


def rebuilt(tag_dir: Path, steps, records, rep: Report):
    """(the summary `plot_results.py --rebuild` would write, the run ids it rests on: its rows'
    runs and the A/A control's, the columns to compare). The summary and the ids are None when
    no summary can be rebuilt (a problem says why)."""
    n = ladder.tag_processes(tag_dir.name)
    one = tag_dir.parent / re.sub(r"-x\d+$", "-x1", tag_dir.name)
    columns = [*TEXTS, *MEASURED, *(c for c in gains.NUMBERS if n > 1 or c not in SCALING)]
    if n > 1 and not (one / RUNS).is_file():
        rep.note(f"no {one.name}/{RUNS} beside it: scaling efficiency not checked")
        columns = [c for c in columns if c not in SCALING]
    with contextlib.redirect_stderr(io.StringIO()):  # its warnings are problems above
        try:
            single = None
            if n > 1 and (one / RUNS).is_file():
                single = rebuild(one, ladder.expected_steps(steps, one.name))[1]
            expected = ladder.expected_steps(steps, tag_dir.name)
            df, used = rebuild(tag_dir, expected, single, n)
        except (TypeError, ValueError, KeyError, ZeroDivisionError) as e:
            rep.problem(f"no summary can be rebuilt from {RUNS}: {type(e).__name__}: {e}")
            return None, None, columns
    runs = [r for rs in used.values() for r in rs]
    if used:  # the control runs of the first step, as selection.collect takes them
        first = next(s for s in expected if s.num in used)
        sw = used[first.num][-1].get("sweep") or {}
        ctl = matching([r for _, r in records], first, config_of(used[first.num][-1]),
                       version(used[first.num][-1]), sw.get("machine"), control=True)  # fmt: skip
        runs += ok_since_failure(ctl)[-max(len(rs) for rs in used.values()) :]
    return df, {(r.get("sweep") or {}).get("run_id") for r in runs}, columns


def check_summary(rep: Report, tag_dir: Path, records, df, columns) -> list[dict]:
    """summary.csv against its records (`df`: the summary rebuilt from them); returns its rows,
    for the claims."""
    if not (tag_dir / SUMMARY).is_file():
        rep.problem(f"no {SUMMARY}")
        return []
    try:
        theirs = {r["step"]: r for r in read_summary(tag_dir).to_dict("records")}
    except UserError as e:
        rep.problem(str(e))
        return []
    have = {rec.get("step") for _, rec in records}
    for step, row in theirs.items():
        if step not in have and text(row.get("status")) not in (None, "not run"):
            rep.problem(f"{SUMMARY} step {step}: a row ({row['status']}) with no records")
    for step in sorted(have - set(theirs), key=str):
        rep.problem(f"{SUMMARY}: no row for step {step}, which has records")
    mine = {} if df is None else {r["step"]: r for r in df.to_dict("records")}
    for step in sorted(set(theirs) & set(mine)):
        a, b = theirs[step], mine[step]
        bad = [c for c in columns if _differs(c, a.get(c), b.get(c))]
        said = ", ".join(f"{c} {_cell(a.get(c))} (records: {_cell(b.get(c))})" for c in bad[:3])
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            rep.problem(f"{SUMMARY} step {step} disagrees with {RUNS}: {said}{more}")
    for step in sorted(have & set(theirs) - set(mine), key=str) if df is not None else []:
        rep.note(f"step {step} is not in this checkout's ladder: its row is not checked")
    return list(theirs.values())


def check_claims(rep: Report, rows: list[dict]) -> None:
    by_step = {r["step"]: r for r in rows}
    for row in (r for r in rows if text(r.get("status")) == "ok"):
        for col, (words, up, ratio, floor_col) in CLAIMS.items():
            said, prev = text(row.get(col)), text(row.get("prev_step"))
            if said not in words:
                continue
            where = f"{SUMMARY} step {row['step']}: {col} {said!r}"
            runs = [int(number(r.get("runs")) or 0) for r in (row, by_step.get(prev, {}))]
            r, lo, hi = (number(row.get(c)) for c in (ratio, f"{ratio}_lo", f"{ratio}_hi"))
            floor = number(row.get(floor_col))
            if min(runs) < 2:
                rep.problem(f"{where} rests on {min(runs)} round(s) of it and of step {prev}; a "
                            "claim needs 2 or more")  # fmt: skip
            elif floor is None:
                rep.problem(f"{where} without a noise floor ({floor_col} is empty)")
            elif r is None or lo is None or hi is None or lo <= 1.0 <= hi:
                rep.problem(f"{where}: its interval [{lo}-{hi}] does not exclude 1.0")
            elif abs(r - 1) <= max(floor, gains.MIN_EFFECT) or (r > 1) != (said == up):
                rep.problem(f"{where}: {r:g}x, within the noise floor {floor:g} or 1%, or the "
                            "other way")  # fmt: skip
