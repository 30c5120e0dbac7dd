"""The summary table of a tag: one row per ladder step, built from runs.jsonl, written as
`results/<tag>/summary.csv` (atomically), read back, and printed for the terminal.

Numbers appear only for steps whose last run was ok, over the last `--repeats` ok runs (one per
round) on this machine: the median tok/s with its min and max, the speedup over step 00, each
step's own effect over the previous step with its interval and verdict (gains.py), the peak
reserved GiB (per rank for a distributed step) beside the memory model's prediction, MFU (never a
number outside (0, 100%]: `mfu_invalid` says why) and losses. From the records: `step_active` /
`inactive_reason`, `inactive_rungs` (the rungs it builds on that did nothing here),
`attention_kernel` (measure/attention_kernel.py), `phase_<name>_ms` and `data_share`
(measure/phases.py), `other_load_max` and `busy_runs` (measure/cpu_load.py). Runs of Liger under
Triton's interpreter are `interpreted`, with no tok/s, memory or MFU. `parity` says whether the
per-step losses keep the previous step's under its rung's rule (parity.py: `ok`, `off`, `not
comparable`), round with round; `parity_detail` says by how much, against which bound, in which
rounds. A record without one of these fields leaves its cell empty.
"""

import math
import statistics
from pathlib import Path

from speed_ladder import gains, parity
from speed_ladder.errors import UserError
from speed_ladder.files import RESULTS, atomic_write_bytes
from speed_ladder.ladder import BASELINE, Step
from speed_ladder.measure.cpu_load import is_busy
from speed_ladder.measure.op_categories import CATEGORIES as TIME_CATEGORIES
from speed_ladder.measure.phases import PHASE_COLUMNS, phase_columns
from speed_ladder.records import mfu_problem
from speed_ladder.report.checks.validity import marked
from speed_ladder.selection import collect, judged_by, used_runs
from speed_ladder.store import load_runs

SUMMARY = "summary.csv"
GIB = 2**30
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
    *gains.COLUMNS,
    "step_active",
    "inactive_reason",
    "inactive_rungs",  # the earlier rungs of its chain that did nothing in its runs: "02 04 12"
    "attention_kernel",  # the SDPA kernel its runs' training call ran (measure/attention_kernel.py)
    "other_load_max",
    "busy_runs",
    "peak_reserved_gib_min",
    "peak_per_rank_gib",
    "predicted_state_gib",
    "predicted_peak_gib",
    "hosts",  # the real hosts the row's runs came from (machine.py: a pooled tag has several)
    *parity.COLUMNS,  # its losses against the previous step's (parity.py): ok/off/not comparable
]
# the measured numbers: empty for a step that has no ok result
NUMBER_COLUMNS = (
    SUMMARY_COLUMNS[2:10]
    + [c for c in gains.NUMBERS if "noise" not in c]
    + ["other_load_max", "peak_reserved_gib_min", "predicted_state_gib", "predicted_peak_gib"]
)
# where the time goes (--profile, measure/profile.py): each category's median share over the runs
TIME_COLUMNS = [f"time_{c}" for c in TIME_CATEGORIES]
SUMMARY_COLUMNS += TIME_COLUMNS + PHASE_COLUMNS  # and ms per phase (measure/phases.py)
_NUMERIC = NUMBER_COLUMNS + ["noise_floor", "mem_noise_floor"]
TEXT_COLUMNS = ["reason", "title", "status", "device_name", "preset", "torch_version",
                "mfu_invalid", "prev_step", "verdict", "mem_verdict", "noise_source",
                "inactive_reason", "inactive_rungs", "attention_kernel", "peak_per_rank_gib",
                "hosts", *parity.COLUMNS]  # fmt: skip
_DIGITS = {
    "tokens_per_sec_median": 1,
    "tokens_per_sec_min": 1,
    "tokens_per_sec_max": 1,
    "speedup_vs_00": 3,
    "peak_reserved_gib": 4,
    "peak_reserved_gib_min": 4,
    "mfu": 5,
    "train_loss": 4,
    "val_loss": 4,
    "other_load_max": 3,
    "predicted_state_gib": 4,
    "predicted_peak_gib": 4,
    **{c: 4 for c in gains.NUMBERS},
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


def _per_rank(oks: list[dict]) -> str | None:
    """'2.53 / 2.51': each rank's peak reserved GiB (its max over the runs), for > 1 rank."""
    lists = [r.get("peak_mem_reserved_per_rank") for r in oks]
    lists = [x for x in lists if isinstance(x, list) and len(x) > 1]
    if not lists or len({len(x) for x in lists}) != 1:
        return None
    peaks = [max((v or 0) for v in col) for col in zip(*lists, strict=True)]
    return " / ".join(f"{p / GIB:.2f}" for p in peaks)


def _activity(row: dict, runs: list[dict]) -> None:
    """step_active (False if a run says so, True if all do, else unknown) and the reason."""
    flags = [r.get("step_active") for r in runs]
    off = next((r for r in runs if r.get("step_active") is False), None)
    row["step_active"] = False if off else True if flags and all(f is True for f in flags) else None
    row["inactive_reason"] = off.get("inactive_reason") if off else None


def _ran(row: dict, runs: list[dict]) -> None:
    """What the runs ran: `attention_kernel` ("flash"; "cudnn/flash" where runs differ) and
    `inactive_rungs`, the earlier rungs of the step's chain whose idea did nothing in them (the
    records' `inactive_rungs`, the step's own left out: that is `step_active`); empty for
    records without them."""
    kernels = {k for r in runs if isinstance(k := r.get("attention_kernel"), str)}
    rungs = {
        k for r in runs if isinstance(r.get("inactive_rungs"), dict) for k in r["inactive_rungs"]
    }
    row["attention_kernel"] = "/".join(sorted(kernels)) or None
    row["inactive_rungs"] = " ".join(sorted(rungs - {row["step"]})) or None


def hosts_text(runs: list[dict]) -> str | None:
    """'3fa2c1a9b0c2,77e0...': the real hosts (`sweep.host`) of the runs, sorted; None if none
    says (a step run by hand, a record without `sweep.host`)."""
    hosts = {(r.get("sweep") or {}).get("host") for r in runs}
    return ",".join(sorted(h for h in hosts if isinstance(h, str) and h)) or None


def _measured(row: dict, oks: list[dict]) -> None:
    """The row of a step whose last runs were ok: medians (min, max for tok/s) over them."""
    tps = [r["tokens_per_sec"] for r in oks if r.get("tokens_per_sec") is not None]
    reserved = [
        r["peak_mem_reserved_bytes"] for r in oks if r.get("peak_mem_reserved_bytes") is not None
    ]
    loads = [r["other_load"] for r in oks if isinstance(r.get("other_load"), (int, float))]
    row.update(
        status="ok",
        runs=len(oks),
        tokens_per_sec_median=_median(tps),
        tokens_per_sec_min=min(tps) if tps else None,
        tokens_per_sec_max=max(tps) if tps else None,
        peak_reserved_gib=max(reserved) / GIB if reserved else None,
        peak_reserved_gib_min=min(reserved) / GIB if reserved else None,
        peak_per_rank_gib=_per_rank(oks),
        mfu=_median(r.get("mfu") for r in oks),
        mfu_invalid=_mfu_invalid(oks),
        train_loss=_median(r.get("train_loss") for r in oks),
        val_loss=_median(r.get("val_loss") for r in oks),
        other_load_max=max(loads) if loads else None,
        busy_runs=sum(is_busy(v) for v in loads),
        hosts=hosts_text(oks),
        **time_breakdown_columns(oks),
        **phase_columns(oks),
    )
    last = oks[-1]
    for key in ("predicted_state", "predicted_peak"):
        v = last.get(f"{key}_bytes_per_rank")
        row[f"{key}_gib"] = v / GIB if isinstance(v, (int, float)) else None


INTERPRETED = (
    "Liger's kernel ran through Triton's interpreter (TRITON_INTERPRET=1): numerics only, "
    "its speed and memory are not a measurement"
)


def _interpreted(row: dict, oks: list[dict]) -> None:
    """A step measured with Triton's interpreter (`interpreted: true` in a record: step 12's
    Liger on a CPU) is no measurement: status `interpreted`, no tok/s, memory or MFU, so no gain
    is claimed (gains.add_effects skips a row that is not ok); its losses stay."""
    if not any(r.get("interpreted") is True for r in oks):
        return
    for col in ("tokens_per_sec_median", "tokens_per_sec_min", "tokens_per_sec_max", "mfu",
                "peak_reserved_gib", "peak_reserved_gib_min", "peak_per_rank_gib",
                *PHASE_COLUMNS):  # fmt: skip
        row[col] = None
    row.update(status="interpreted", reason=INTERPRETED)


def _row(step: Step, runs: list[dict], config: dict, repeats: int) -> dict:
    row = dict.fromkeys(SUMMARY_COLUMNS)
    row.update(step=step.num, title=step.title, script=step.rel, runs=0, busy_runs=0)
    if not runs:
        row["status"] = "not run"
        return row
    if runs[-1].get("status") != "ok":
        _failed(row, runs)
    else:
        _measured(row, used_runs(runs, repeats))
        _interpreted(row, used_runs(runs, repeats))
    _activity(row, used_runs(runs, repeats) or runs[-1:])
    _ran(row, used_runs(runs, repeats) or runs[-1:])
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


def summarize(steps, records, configs: dict, shas: dict, repeats: int, machine=None,
              single: dict | None = None, nproc: int = 1, tag: str | None = None):  # fmt: skip
    """The tidy table: one row per ladder step, numbers only for steps whose last run was ok.
    `machine`: only this fingerprint's records (None: any); `single`: the `-x1` tag's used runs,
    for the scaling efficiency of a tag of `nproc` > 1 processes."""
    return table_and_runs(steps, records, configs, shas, repeats, machine, single, nproc, tag)[0]


def table_and_runs(steps, records, configs: dict, shas: dict, repeats: int, machine=None,
                   single: dict | None = None, nproc: int = 1, tag: str | None = None):  # fmt: skip
    """(summarize's table, the runs each row used: what a tag of more processes is scaled by), from
    one pass over the records. An ok record that is impossible or foreign to `tag`
    (checks/validity.py, against the ladder `steps`) counts as a failed run, status `invalid`: never
    an ok step; then selection.collect takes each row's runs."""
    import pandas as pd

    records = marked(records, tag, steps)
    runs, used, control = collect(steps, records, configs, shas, repeats, machine)
    rows = [_row(s, runs[s.num], configs[s.num], repeats) for s in steps]
    base = next((r for r in rows if r["step"] == BASELINE), None)
    base_tps = base["tokens_per_sec_median"] if base and base["status"] == "ok" else None
    for r in rows:
        if base_tps and r["status"] == "ok" and r["tokens_per_sec_median"] is not None:
            r["speedup_vs_00"] = r["tokens_per_sec_median"] / base_tps
    gains.add_effects(rows, used, control)
    parity.add_columns(rows, used)
    if single is not None and nproc > 1:
        gains.add_scaling(rows, used, single, nproc)
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    for col in _NUMERIC + TIME_COLUMNS + PHASE_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.round(_DIGITS | dict.fromkeys(TIME_COLUMNS + PHASE_COLUMNS, 4))
    df["runs"] = df["runs"].astype(int)
    df["busy_runs"] = df["busy_runs"].fillna(0).astype(int)
    df["world_size"] = df["world_size"].astype("Int64")
    df["step_active"] = df["step_active"].astype("boolean")
    return df, used


def rebuild(tag_dir: Path, ladder: list[Step], single: dict | None = None, nproc: int = 1):
    """A tag's summary from its runs.jsonl alone (`plot_results.py --rebuild`, after the
    summary's columns changed): per step, the runs of its last record's configuration, script
    and machine, as many rounds as they hold. Returns (the table, the used runs)."""
    records = load_runs(tag_dir)
    configs, shas, repeats, machine = judged_by(records, ladder)
    tag = Path(tag_dir).name
    return table_and_runs(ladder, records, configs, shas, repeats, machine, single, nproc, tag)


def write_summary(tag_dir: Path, df) -> Path:
    """summary.csv, replaced atomically (readers never see half a file)."""
    path = Path(tag_dir) / SUMMARY
    atomic_write_bytes(path, df.to_csv(index=False).encode("utf-8"))
    return path


REBUILD = (
    "rerun the `python -m speed_ladder run` that made it: it rewrites summary.csv from runs.jsonl "
    "without rerunning finished steps"
)


def read_summary(tag_dir: Path):
    """A tag's summary.csv; `step` stays the two-digit string ("00"). One that cannot be read
    as a summary (empty, no `step` column, not CSV, not UTF-8) is a UserError saying how to
    rebuild it; a column it lacks is empty, a number that is not one NaN."""
    import pandas as pd

    path = Path(tag_dir) / SUMMARY
    try:
        df = pd.read_csv(path, dtype={"step": str, "prev_step": str, "inactive_rungs": str})
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
    for col in _NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("runs", "busy_runs"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0).astype(int)
    for col in TEXT_COLUMNS:
        df[col] = df[col].astype("object").where(df[col].notna(), None)
    df["step_active"] = [_flag(v) for v in df["step_active"]]
    return df


def _flag(v) -> bool | None:
    """A step_active cell: True, False or None (unknown), whatever pandas read it as."""
    if isinstance(v, str):
        return {"true": True, "false": False}.get(v.strip().lower())
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return bool(v)


def find_tags(results_dir: Path = RESULTS) -> list[Path]:
    """Every results/<tag>/ folder holding a summary.csv, sorted by name."""
    return sorted(p.parent for p in Path(results_dir).glob(f"*/{SUMMARY}"))


def time_breakdown_columns(oks: list[dict]) -> dict:
    """`time_<category>`: the median share of each category over the runs that have a
    `time_breakdown` (run with --profile); empty when none has."""
    shares = [r["time_breakdown"] for r in oks if isinstance(r.get("time_breakdown"), dict)]
    return {f"time_{c}": _median(s.get(c) for s in shares) for c in TIME_CATEGORIES}
