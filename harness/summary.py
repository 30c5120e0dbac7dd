"""The summary table of a tag: one row per ladder step, built from runs.jsonl, written as
`results/<tag>/summary.csv` (atomically), read back, and printed for the terminal.

Numbers appear only for steps whose last run was ok: the median of the last `--repeats` ok runs
(with min and max for tok/s), the speedup over step 00, peak reserved GiB, MFU and losses. An MFU
outside (0, 100%] is never a number: the `mfu` cell stays empty and `mfu_invalid` says why.
"""

import math
import statistics
from pathlib import Path

from .errors import UserError
from .files import RESULTS, atomic_write_bytes
from .ladder import Step
from .profile import CATEGORIES as TIME_CATEGORIES
from .record import mfu_problem
from .runs import matching, ok_since_failure

SUMMARY = "summary.csv"
SUMMARY_COLUMNS = [
    "step",
    "title",
    "tokens_per_sec_median",
    "tokens_per_sec_min",
    "tokens_per_sec_max",
    "speedup_vs_00",
    "peak_reserved_gib",
    "mfu",
    "train_loss",
    "val_loss",
    "status",
    "runs",
    "reason",
    "world_size",
    "preset",
    "device_name",
    "torch_version",
    "script",
    "mfu_invalid",  # why a step's MFU is not shown (outside (0, 100%]); empty when it is
]
# where the time goes (--profile, harness.profile): each category's median share over the runs
TIME_COLUMNS = [f"time_{c}" for c in TIME_CATEGORIES]
SUMMARY_COLUMNS += TIME_COLUMNS
NUMBER_COLUMNS = SUMMARY_COLUMNS[2:10]
_DIGITS = {
    "tokens_per_sec_median": 1,
    "tokens_per_sec_min": 1,
    "tokens_per_sec_max": 1,
    "speedup_vs_00": 3,
    "peak_reserved_gib": 4,
    "mfu": 5,
    "train_loss": 4,
    "val_loss": 4,
}


def _median(values):
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def _failed(row: dict, runs: list[dict]) -> None:
    """The row of a step whose last run failed: its status, reason, and the failures in a row."""
    fails = 0
    for r in reversed(runs):
        if r.get("status") == "ok":
            break
        fails += 1
    row.update(status=runs[-1].get("status") or "error", reason=runs[-1].get("reason"), runs=fails)


def _mfu_invalid(oks: list[dict]) -> str | None:
    """Why the runs' MFU is not shown: a run's MFU outside (0, 1], or left out by the run itself
    (`mfu_invalid` in its record); None when every run's MFU is a fraction or unknown."""
    for r in reversed(oks):
        why = mfu_problem(r.get("mfu"))
        if why is None and isinstance(r.get("mfu_invalid"), dict):
            why = r["mfu_invalid"].get("reason")
        if why:
            return str(why)
    return None


def _measured(row: dict, oks: list[dict]) -> None:
    """The row of a step whose last runs were ok: medians (min, max for tok/s) over them."""
    tps = [r["tokens_per_sec"] for r in oks if r.get("tokens_per_sec") is not None]
    reserved = [
        r["peak_mem_reserved_bytes"] for r in oks if r.get("peak_mem_reserved_bytes") is not None
    ]
    row.update(
        status="ok",
        runs=len(oks),
        tokens_per_sec_median=_median(tps),
        tokens_per_sec_min=min(tps) if tps else None,
        tokens_per_sec_max=max(tps) if tps else None,
        peak_reserved_gib=max(reserved) / 2**30 if reserved else None,
        mfu=_median(r.get("mfu") for r in oks),
        mfu_invalid=_mfu_invalid(oks),
        train_loss=_median(r.get("train_loss") for r in oks),
        val_loss=_median(r.get("val_loss") for r in oks),
        **time_breakdown_columns(oks),
    )


def _row(step: Step, runs: list[dict], config: dict, repeats: int) -> dict:
    row = dict.fromkeys(SUMMARY_COLUMNS)
    row.update(step=step.num, title=step.title, script=step.rel, runs=0)
    if not runs:
        row["status"] = "not run"
        return row
    if runs[-1].get("status") != "ok":
        _failed(row, runs)
    else:
        _measured(row, ok_since_failure(runs)[-repeats:])
    if row.get("mfu_invalid"):
        row["mfu"] = None
    last = runs[-1]
    row.update(
        world_size=last.get("world_size"),
        preset=last.get("preset") or config.get("preset"),
        device_name=last.get("device_name"),
        torch_version=last.get("torch_version"),
    )
    return row


def summarize(steps, records, configs: dict, shas: dict, repeats: int):
    """The tidy table: one row per ladder step, numbers only for steps whose last run was ok."""
    import pandas as pd

    rows = [
        _row(s, matching(records, s, configs[s.num], shas[s.num]), configs[s.num], repeats)
        for s in steps
    ]
    base = next((r for r in rows if r["step"] == "00"), None)
    base_tps = base["tokens_per_sec_median"] if base and base["status"] == "ok" else None
    for r in rows:
        if base_tps and r["status"] == "ok" and r["tokens_per_sec_median"] is not None:
            r["speedup_vs_00"] = r["tokens_per_sec_median"] / base_tps
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    for col in NUMBER_COLUMNS + TIME_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.round(_DIGITS | dict.fromkeys(TIME_COLUMNS, 4))
    df["runs"] = df["runs"].astype(int)
    df["world_size"] = df["world_size"].astype("Int64")
    return df


def write_summary(tag_dir: Path, df) -> Path:
    """summary.csv, replaced atomically (readers never see half a file)."""
    path = Path(tag_dir) / SUMMARY
    atomic_write_bytes(path, df.to_csv(index=False).encode("utf-8"))
    return path


REBUILD = (
    "rerun the `python -m harness run` that made it: it rewrites summary.csv from runs.jsonl "
    "without rerunning finished steps"
)


def read_summary(tag_dir: Path):
    """A tag's summary.csv; `step` stays the two-digit string ("00"). One that cannot be read
    as a summary (empty, no `step` column, not CSV, not UTF-8) is a UserError saying how to
    rebuild it; a column it lacks (an older summary) is empty, a number that is not one NaN."""
    import pandas as pd

    path = Path(tag_dir) / SUMMARY
    try:
        df = pd.read_csv(path, dtype={"step": str})
    except pd.errors.EmptyDataError:
        raise UserError(f"{path}: empty; {REBUILD}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        why = str(e).strip().splitlines()[0][:80] if str(e).strip() else e.__class__.__name__
        raise UserError(f"{path}: not a summary table ({why}); {REBUILD}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e}); {REBUILD}") from None
    if "step" not in df.columns:
        raise UserError(f"{path}: no `step` column; {REBUILD}")
    steps = df["step"].astype("object")
    bad = [str(v) for v in steps if not (isinstance(v, str) and v.strip().isdigit())]
    if bad:
        raise UserError(f"{path}: step {bad[0]!r} is not a step number; {REBUILD}")
    df["step"] = steps.str.strip().str.zfill(2)
    for col in SUMMARY_COLUMNS:
        if col not in df:
            df[col] = None
    for col in NUMBER_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df["runs"] = pd.to_numeric(df["runs"], errors="coerce").fillna(0).astype(int)
    for col in (
        "reason",
        "title",
        "status",
        "device_name",
        "preset",
        "torch_version",
        "mfu_invalid",
    ):
        if col in df:
            df[col] = df[col].astype("object").where(df[col].notna(), None)
    return df


def find_tags(results_dir: Path = RESULTS) -> list[Path]:
    """Every results/<tag>/ folder holding a summary.csv, sorted by name."""
    return sorted(p.parent for p in Path(results_dir).glob(f"*/{SUMMARY}"))


# ---------------------------------------------------------------- reading the rows back
def number(v) -> float | None:
    """A summary cell as a float; None when empty or not a number."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def speedup_text(s: float) -> str:
    return f"{s:.2f}x" if s < 10 else f"{s:.1f}x"


def describe(df) -> str:
    """'<device name>, preset <p>, torch <v>' from the summary rows that have them."""
    rows = df.to_dict("records")

    def first(col):
        return next((r.get(col) for r in rows if isinstance(r.get(col), str) and r.get(col)), None)

    dev, preset, torch_v = first("device_name"), first("preset"), first("torch_version")
    bits = [dev, f"preset {preset}" if preset else None, f"torch {torch_v}" if torch_v else None]
    return ", ".join(b for b in bits if b)


def mfu_flag(row: dict) -> str | None:
    """Why a summary row's MFU is not to be shown as a number, or None: its `mfu_invalid`, or
    an `mfu` outside (0, 1] (a summary written before MFU was checked)."""
    if row.get("status") != "ok":
        return None
    if isinstance(row.get("mfu_invalid"), str) and row["mfu_invalid"]:
        return row["mfu_invalid"]
    return mfu_problem(number(row.get("mfu")))


def format_table(df) -> str:
    """The summary as a fixed-width text table for the terminal; an invalid MFU is `invalid`,
    with the reason below the table."""

    def num(v, fmt):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    head = ["step", "title", "tok/s", "speedup", "peak GiB", "MFU", "val loss", "status", "runs"]
    lines, flags = [], []
    for r in df.to_dict("records"):
        status = r["status"]
        if status not in ("ok", "not run") and isinstance(r.get("reason"), str):
            status = f"{status}: {r['reason'][:60]}"
        flag = mfu_flag(r)
        mfu = number(r.get("mfu"))
        if flag:
            flags.append(f"MFU of step {r['step']} not shown: {flag}")
        lines.append(
            [
                r["step"],
                str(r["title"])[:42],
                num(r["tokens_per_sec_median"], "{:,.0f}"),
                num(r["speedup_vs_00"], "{:.2f}x"),
                num(r["peak_reserved_gib"], "{:.2f}"),
                "invalid" if flag else num(None if mfu is None else mfu * 100, "{:.1f}%"),
                num(r["val_loss"], "{:.3f}"),
                status,
                str(r["runs"]),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=False)]
    right = {2, 3, 4, 5, 6, 8}

    def fmt(cells):
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        ).rstrip()

    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines), *flags])


def time_breakdown_columns(oks: list[dict]) -> dict:
    """`time_<category>`: the median share of each category over the runs that have a
    `time_breakdown` (run with --profile); empty when none has."""
    shares = [r["time_breakdown"] for r in oks if isinstance(r.get("time_breakdown"), dict)]
    return {f"time_{c}": _median(s.get(c) for s in shares) for c in TIME_CATEGORIES}
