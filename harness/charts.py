"""The charts of a tag's summary, and of every tag side by side (headless: matplotlib's Agg).

Per tag folder: tokens_per_sec.png (bars labelled with the speedup over step 00, and in a
`-xN` tag the scaling efficiency; error bars: min-max over the rounds), peak_memory.png (peak
reserved GiB, the largest of the rounds; error bars down to the smallest) and mfu.png (MFU %); a
failed step is a "failed (oom)" label at zero, never a bar, and so is an MFU outside (0, 100%]
("MFU invalid: ..."). An inactive step (it does nothing on this device) is a hatched, pale bar
labelled "inactive here: <why>"; a step measured while other processes were busy, "[busy]".
Each step's own effect over the previous one is gain_chart.py's. Each chart is
written atomically: an interrupted or failed save leaves the previous one, never half a PNG.
results/comparison.png groups every tag's tok/s per step. The published
single-A100 figures of the reference ladder (Raschka, LLMs-from-scratch ch05/10,
results/reference/published_a100_ladder.csv) are drawn in their own grey, hatched panel,
labelled as such: they are not this project's measurements.
"""

import io
import textwrap
from pathlib import Path

from .errors import warn
from .files import RESULTS, atomic_write_bytes
from .rows import busy_text, inactive
from .summary import describe, mfu_flag, number, read_summary, speedup_text

REFERENCE_CSV = RESULTS / "reference" / "published_a100_ladder.csv"
CHARTS = ("tokens_per_sec.png", "peak_memory.png", "mfu.png")
COMPARISON = "comparison.png"
REF_LABEL = "published A100 figures (Raschka), not our measurement"
REF_NOTE = (
    "1x A100 (step 11: 4x A100), PyTorch 2.6; tok/s is the average to step 07 and the per-step "
    "rate from step 08 on"
)
REF_MEM_NOTE = "1x A100 (step 11: 4x A100), PyTorch 2.6; max reserved memory, printed as GB (GiB)"
OURS_COLOR, REF_COLOR, FAIL_COLOR, MISSING_COLOR = "#1f77b4", "#b0b0b0", "#c0392b", "#7f7f7f"
INACTIVE_COLOR = "#c6dbef"


def read_reference(path: Path = REFERENCE_CSV):
    """The published reference figures, or None when the file is missing."""
    import pandas as pd

    if not Path(path).is_file():
        return None
    try:
        df = pd.read_csv(path, dtype={"step": str})
        df["step"] = df["step"].str.zfill(2)
        missing = {"tokens_per_sec", "reserved_memory_gb", "optimization", "hardware"} - set(df)
        if missing:
            raise KeyError(f"no column {sorted(missing)[0]!r}")
        df["tokens_per_sec"] = df["tokens_per_sec"].astype(float)
        df["reserved_memory_gb"] = df["reserved_memory_gb"].astype(float)
    except (OSError, ValueError, KeyError, AttributeError, pd.errors.ParserError) as e:
        warn(f"{path} unreadable ({e.__class__.__name__}: {e}); charts drawn without it")
        return None
    return df


def _reference(reference):
    return read_reference() if isinstance(reference, str) and reference == "default" else reference


def _ok(row) -> bool:
    return row.get("status") == "ok"


def _step_label(row, width: int = 34) -> str:
    title = str(row.get("title") or "")
    if len(title) > width:
        title = title[: width - 1] + "…"
    return f"{row['step']}  {title}"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _no_value(row) -> tuple[str, str]:
    """The label (and its color) a step without a bar gets."""
    status = row.get("status") or "not run"
    if status == "ok":
        return "n/a (not measured on this device)", MISSING_COLOR
    if status == "not run":
        return "not run", MISSING_COLOR
    if status == "interpreted":  # Triton's interpreter ran Liger: numerics, no measurement
        return "interpreted (TRITON_INTERPRET=1): not a measurement", MISSING_COLOR
    return f"failed ({status})", FAIL_COLOR


def _thousands(ax):
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 10 else f"{x:g}"))


def _end(r, v: float, span_of) -> float:
    """Where a bar's label goes: after its bar, or after its error bar."""
    hi = (span_of(r) or (None, None))[1] if span_of else None
    return max(v, hi) if hi is not None else v


def _bars(ax, rows, value_of, label_of, unit: str, no_value=_no_value, span_of=None):
    """Horizontal bars, step 00 on top; failed or missing steps get a label at zero, no bar.
    `span_of(row)`: (min, max) over the runs, drawn as an error bar; an inactive step's bar is
    hatched and labelled "inactive here", a busy one "[busy]"."""
    ys = list(range(len(rows)))
    values = [value_of(r) if _ok(r) else None for r in rows]
    for y, r, v in zip(ys, rows, values, strict=True):
        if v is None:
            continue
        off = inactive(r) is not None
        ax.barh(y, v, color=INACTIVE_COLOR if off else OURS_COLOR, hatch="xx" if off else None,
                edgecolor="#606060" if off else None)  # fmt: skip
        lo, hi = span_of(r) if span_of else (None, None)
        if lo is not None and hi is not None and lo < hi:
            ax.errorbar(v, y, xerr=[[max(0.0, v - lo)], [max(0.0, hi - v)]], fmt="none",
                        ecolor="#333333", capsize=3, lw=1)  # fmt: skip
    ends = [_end(r, v, span_of) for r, v in zip(rows, values, strict=True) if v is not None]
    top = max(ends, default=0.0) or 1.0
    for y, r, v in zip(ys, rows, values, strict=True):
        if v is None:
            text, color = no_value(r)
            ax.text(top * 0.01, y, text, va="center", ha="left", color=color, fontweight="bold")
            continue
        label = label_of(r, v) + ("  [busy]" if busy_text(r) else "")
        if inactive(r):
            label += "  " + textwrap.shorten(inactive(r), 44, placeholder="…")
        ax.text(_end(r, v, span_of) + top * 0.01, y, label, va="center", ha="left", fontsize=9)
    ax.set_yticks(ys, [_step_label(r) for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.22)
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)
    _thousands(ax)


def _reference_bars(ax, ref, column: str, unit: str, label_of, note: str = REF_NOTE):
    from matplotlib.patches import Patch

    rows = ref.to_dict("records")
    ys = list(range(len(rows)))
    vals = [float(r[column]) for r in rows]
    ax.barh(ys, vals, color=REF_COLOR, hatch="//", edgecolor="#606060", linewidth=0.5)
    top = max(vals) if vals else 1.0
    for y, r, v in zip(ys, rows, vals, strict=True):
        ax.text(v + top * 0.01, y, label_of(r, v), va="center", fontsize=8, color="#505050")
    labels = [f"{r['step']}  {r['optimization']} ({r['hardware'].split(' (')[0]})" for r in rows]
    ax.set_yticks(ys, labels, color="#505050")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.22)
    ax.set_xlabel(unit + " (published)")
    ax.set_title(f"REFERENCE: {REF_LABEL}\n{textwrap.fill(note, 100)}", fontsize=9, color="#505050")
    ax.legend(
        handles=[Patch(facecolor=REF_COLOR, hatch="//", edgecolor="#606060", label=REF_LABEL)],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1 - 0.5 / max(len(rows), 1)),
        fontsize=8,
        frameon=False,
    )
    _thousands(ax)
    ax.grid(axis="x", alpha=0.3)


def _figure(plt, n_ours: int, n_ref: int):
    if n_ref:
        fig, (ax, ax_ref) = plt.subplots(
            2,
            1,
            figsize=(10, 0.34 * (n_ours + n_ref) + 3.2),
            gridspec_kw={"height_ratios": [max(n_ours, 1), max(n_ref, 1)]},
        )
        return fig, ax, ax_ref
    fig, ax = plt.subplots(figsize=(10, 0.34 * n_ours + 1.8))
    return fig, ax, None


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=110, format="png")
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _tps_label(r, v) -> str:
    s = number(r.get("speedup_vs_00"))
    rng = ""
    lo, hi = number(r.get("tokens_per_sec_min")), number(r.get("tokens_per_sec_max"))
    if r.get("runs", 1) and int(r.get("runs") or 1) > 1 and lo is not None and hi is not None:
        rng = f" [{lo:,.0f}-{hi:,.0f}]"
    eff = number(r.get("scaling_efficiency"))
    scaling = f"  scaling {eff:.0%}" if eff is not None else ""
    return (speedup_text(s) + "  " if s is not None else "") + f"{v:,.0f}{rng}{scaling}"


def _tps_span(r):
    return number(r.get("tokens_per_sec_min")), number(r.get("tokens_per_sec_max"))


def _mem_span(r):
    return number(r.get("peak_reserved_gib_min")), number(r.get("peak_reserved_gib"))


def _tps_figure(plt, rows, heading: str, ref):
    n_ref = len(ref) if ref is not None else 0
    ref_base = None
    if n_ref:
        base = ref[ref["step"] == "00"]
        ref_base = float(base["tokens_per_sec"].iloc[0]) if len(base) else None

    def ref_tps_label(r, v):
        s = f"{speedup_text(v / ref_base)}  " if ref_base else ""
        return f"{s}{v:,.0f}"

    fig, ax, ax_ref = _figure(plt, len(rows), n_ref)
    _bars(ax, rows, lambda r: number(r.get("tokens_per_sec_median")), _tps_label, "tokens / s",
          span_of=_tps_span)  # fmt: skip
    ax.set_title(
        f"MEASURED by this project: {heading}\n"
        "training throughput per step (labels: speedup over step 00, tok/s [min-max]; "
        "error bars: min-max over rounds)",
        fontsize=10,
    )
    if ax_ref is not None:
        _reference_bars(ax_ref, ref, "tokens_per_sec", "tokens / s", ref_tps_label)
    return fig


def _memory_figure(plt, rows, heading: str, ref):
    fig, ax, ax_ref = _figure(plt, len(rows), len(ref) if ref is not None else 0)
    gib = lambda r, v: f"{v:.2f} GiB"
    unit = "peak reserved memory (GiB)"
    _bars(ax, rows, lambda r: number(r.get("peak_reserved_gib")), gib, unit, span_of=_mem_span)
    ax.set_title(
        f"MEASURED by this project: {heading}\npeak reserved memory per step (the largest of "
        "the rounds; error bars down to the smallest)",
        fontsize=10,
    )
    if ax_ref is not None:
        _reference_bars(ax_ref, ref, "reserved_memory_gb", unit, gib, REF_MEM_NOTE)
    return fig


def _mfu_value(r) -> float | None:
    """MFU in %, only when it is a fraction in (0, 1]: an impossible MFU is never a bar."""
    v = number(r.get("mfu"))
    return None if v is None or mfu_flag(r) else v * 100


def _mfu_missing(r) -> tuple[str, str]:
    flag = mfu_flag(r)
    if flag:
        why = textwrap.shorten(flag.removeprefix("MFU "), 70, placeholder="…")
        return f"MFU invalid: {why}", FAIL_COLOR
    return _no_value(r)


def _mfu_figure(plt, rows, heading: str):
    fig, ax, _ = _figure(plt, len(rows), 0)
    _bars(
        ax,
        rows,
        _mfu_value,
        lambda r, v: f"{v:.1f}%",
        "model FLOPs utilization (% of the device's bf16 peak)",
        no_value=_mfu_missing,
    )
    ax.set_title(f"MEASURED by this project: {heading}\nMFU per step", fontsize=10)
    return fig


def plot_tag(tag_dir: Path, reference="default") -> list[Path]:
    """tokens_per_sec.png, peak_memory.png and mfu.png in `tag_dir`; returns their paths."""
    plt = _plt()
    tag_dir = Path(tag_dir)
    df = read_summary(tag_dir)
    ref = _reference(reference)
    rows = df.to_dict("records")
    desc = describe(df)
    heading = f"{tag_dir.name} ({desc})" if desc else tag_dir.name
    tps, mem, mfu = CHARTS
    return [
        _save(plt, _tps_figure(plt, rows, heading, ref), tag_dir / tps),
        _save(plt, _memory_figure(plt, rows, heading, ref), tag_dir / mem),
        _save(plt, _mfu_figure(plt, rows, heading), tag_dir / mfu),
    ]


def _comparison_bars(ax, series, steps, height, colors) -> list[float]:
    """Each tag's tok/s bar per step (or its missing/failed label); returns the values drawn."""
    values = []
    for k, (tag, df) in enumerate(series):
        by_step = {r["step"]: r for r in df.to_dict("records")}
        for i, s in enumerate(steps):
            r = by_step.get(s)
            v = number(r.get("tokens_per_sec_median")) if r is not None and _ok(r) else None
            y = i - 0.4 + height * (k + 0.5)
            if v is not None:
                ax.barh(y, v, height=height, color=colors[k % len(colors)])
                values.append(v)
            elif r is not None:
                text, color = _no_value(r)
                ax.text(1, y, f" {text} [{tag}]", va="center", fontsize=7, color=color)
    return values


def _comparison_reference(ax, ref, steps, height, k: int) -> list[float]:
    by_step = {r["step"]: r for r in ref.to_dict("records")}
    values = []
    for i, s in enumerate(steps):
        r = by_step.get(s)
        if r is not None:
            y = i - 0.4 + height * (k + 0.5)
            v = float(r["tokens_per_sec"])
            ax.barh(y, v, height=height, color=REF_COLOR, hatch="//", edgecolor="#606060")
            values.append(v)
    return values


def plot_comparison(tag_dirs, out: Path | None = None, reference="default") -> Path:
    """Grouped bars of tok/s per step, one color per tag (log scale), plus the reference."""
    import numpy as np
    from matplotlib.patches import Patch

    plt = _plt()
    tag_dirs = [Path(t) for t in tag_dirs]
    out = Path(out) if out is not None else tag_dirs[0].parent / COMPARISON
    ref = _reference(reference)
    has_ref = ref is not None and len(ref) > 0
    series = list({t.name: read_summary(t) for t in tag_dirs}.items())
    steps = sorted({s for _, df in series for s in df["step"]})
    titles = {}
    for _, df in series:
        for r in df.to_dict("records"):
            titles.setdefault(r["step"], r.get("title") or "")
    if has_ref:
        steps = sorted(set(steps) | set(ref["step"]))
    n = len(series) + (1 if has_ref else 0)
    height = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(11, 0.3 * len(steps) * max(n, 2) * 0.6 + 2.5))
    colors = plt.get_cmap("tab10").colors
    values = _comparison_bars(ax, series, steps, height, colors)
    handles = [
        Patch(color=colors[k % len(colors)], label=f"{tag} (this project)")
        for k, (tag, _) in enumerate(series)
    ]
    if has_ref:
        values += _comparison_reference(ax, ref, steps, height, len(series))
        handles.append(Patch(facecolor=REF_COLOR, hatch="//", edgecolor="#606060", label=REF_LABEL))
    ax.set_xscale("log")
    if values:
        ax.set_xlim(1, max(values) * 3)
    ax.set_yticks(np.arange(len(steps)), [f"{s}  {str(titles.get(s, ''))[:34]}" for s in steps])
    ax.set_ylim(len(steps) - 0.5, -0.5)
    ax.set_xlabel("tokens / s (log scale)")
    ax.set_title("Throughput per step, every hardware tag")
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3, which="both")
    return _save(plt, fig, out)
