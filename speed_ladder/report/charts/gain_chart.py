"""The chart of each step's own effect (`results/<tag>/gain_vs_prev.png`): two panels, tokens/s
and peak memory, each step's change over the previous step in percent (the median of the
per-round ratios, gains.py), its min-max interval as an error bar, and the noise floor as a grey
band around 0. Bars are colored by verdict: faster / less memory green, slower / more memory
red, no change grey; one round is drawn without an error bar and says so; an inactive step is
hatched and labelled "inactive here"; a step without a result says why, at 0."""

from pathlib import Path

from speed_ladder.report.charts.chart_style import (
    FAIL_COLOR,
    MISSING_COLOR,
    label_after,
    layout,
    pyplot,
    save,
    shorten,
    step_label,
    wrap,
)
from speed_ladder.report.rows import busy_text, describe, inactive, number, text
from speed_ladder.report.summary import read_summary

GAIN_CHART = "gain_vs_prev.png"
GOOD, BAD, SAME, ONE = "#2ca02c", "#d62728", "#9e9e9e", "#6baed6"
COLORS = {"faster": GOOD, "less": GOOD, "slower": BAD, "more": BAD, "no change": SAME}


def _missing(row) -> tuple[str, str]:
    status = row.get("status") or "not run"
    if status == "ok":
        return "first step here: nothing to compare with", MISSING_COLOR
    if status == "interpreted":  # Triton's interpreter ran Liger: numerics, no measurement
        return "interpreted (TRITON_INTERPRET=1): not a measurement", MISSING_COLOR
    return ("not run", MISSING_COLOR) if status == "not run" else (f"failed ({status})", FAIL_COLOR)


def _label(row, pct, lo, hi, verdict) -> str:
    cell = f"{pct:+.1f}%"
    if lo is not None and hi is not None:
        cell += f" [{lo:+.1f}, {hi:+.1f}]"
    if verdict == "one round: no interval":
        cell += " (one round: no interval)"
    elif verdict == "inactive":
        cell += "  inactive here"
    elif verdict:
        cell += f" {verdict}"
    if busy_text(row):
        cell += "  [busy]"
    return shorten(cell, 80)


def _panel(ax, rows, prefix: str, verdict_col: str, floor_col: str, title: str) -> list:
    """One panel; returns its labels (for `layout`)."""
    ys = list(range(len(rows)))
    vals = []
    for y, r in zip(ys, rows, strict=True):
        g = number(r.get(prefix)) if r.get("status") == "ok" else None
        if g is None:
            vals.append(None)
            continue
        pct = (g - 1) * 100
        lo, hi = number(r.get(f"{prefix}_lo")), number(r.get(f"{prefix}_hi"))
        lo = None if lo is None else (lo - 1) * 100
        hi = None if hi is None else (hi - 1) * 100
        verdict = text(r.get(verdict_col)) or ""
        off = verdict == "inactive" or inactive(r) is not None
        color = SAME if off else COLORS.get(verdict, ONE)
        ax.barh(y, pct, color=color, hatch="xx" if off else None,
                edgecolor="#606060" if off else None)  # fmt: skip
        if lo is not None and hi is not None:
            ax.errorbar(pct, y, xerr=[[max(0.0, pct - lo)], [max(0.0, hi - pct)]], fmt="none",
                        ecolor="#333333", capsize=3, lw=1)  # fmt: skip
        vals.append((pct, lo, hi, _label(r, pct, lo, hi, "inactive" if off else verdict)))
    reach = max((max(abs(v[0]), abs(v[1] or 0), abs(v[2] or 0)) for v in vals if v), default=5)
    reach = max(reach, 5.0) * 1.1
    texts = []
    for y, r, v in zip(ys, rows, vals, strict=True):
        if v is None:
            label, color = _missing(r)
            texts.append(label_after(ax, 0, y, label, color=color, fontsize=8))
        else:
            x = max(0.0, v[0], v[2] if v[2] is not None else v[0])
            texts.append(label_after(ax, x, y, v[3], fontsize=8))
    floor = next((number(r.get(floor_col)) for r in rows if number(r.get(floor_col))), None)
    if floor:
        ax.axvspan(-floor * 100, floor * 100, color="#dddddd", zorder=0,
                   label=f"noise floor ±{floor * 100:.1f}%")  # fmt: skip
        ax.legend(loc="best", fontsize=8)
    ax.axvline(0, color="#333333", lw=0.8)
    ax.set_yticks(ys, [step_label(r) for r in rows], fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(-reach, reach * 2.4)
    ax.set_xlabel("change over the previous step (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return texts


def plot_gains(tag_dir: Path) -> Path:
    """gain_vs_prev.png in `tag_dir`, from its summary.csv."""
    plt = pyplot()
    tag_dir = Path(tag_dir)
    df = read_summary(tag_dir)
    rows = df.to_dict("records")
    desc = describe(df)
    fig, (ax, ax_mem) = plt.subplots(2, 1, figsize=(11, 0.7 * len(rows) + 3.6))
    source = next((text(r.get("noise_source")) for r in rows if text(r.get("noise_source"))), "")
    head = (
        wrap(f"MEASURED by this project: {tag_dir.name}" + (f" ({desc})" if desc else ""), 95)
        + "\n"
        + wrap("bars: median of the per-round ratios; error bars: their min-max"
               + (f"; noise floor from {source}" if source else ""), 95)
    )  # fmt: skip
    texts = _panel(ax, rows, "gain_vs_prev", "verdict", "noise_floor",
                   f"{head}\ntokens/s: each step over the previous one")  # fmt: skip
    mem_texts = _panel(ax_mem, rows, "mem_vs_prev", "mem_verdict", "mem_noise_floor",
                       "peak reserved memory: each step over the previous one")  # fmt: skip
    layout(fig, [(ax, texts), (ax_mem, mem_texts)])
    return save(plt, fig, tag_dir / GAIN_CHART)
