"""The time-breakdown chart of a tag: `time_breakdown.png`, where each step's time goes.

One stacked horizontal bar per step (same order and labels as the tag's other charts), its segments
the categories of `speed_ladder.measure.op_categories` (matmul, attention, normalization and
activations, loss, optimizer, communication, data and host, other) as shares of the profiled steps'
time: the `time_<category>` columns of summary.csv, each the median over the step's runs (scaled to
add up to 100%). Drawn only when some step was profiled (`--profile`); a step without a breakdown
gets a label saying why, never a bar.
"""

from pathlib import Path

from speed_ladder.measure.op_categories import CATEGORIES, LABELS
from speed_ladder.report.charts.chart_style import (
    is_ok,
    layout,
    no_value,
    pyplot,
    save,
    step_bars_frame,
)
from speed_ladder.report.rows import describe, number
from speed_ladder.report.summary import TIME_COLUMNS, read_summary

TIME_CHART = "time_breakdown.png"
COLORS = {
    "matmul": "#1f77b4",
    "attention": "#ff7f0e",
    "norm_act": "#2ca02c",
    "loss": "#d62728",
    "optimizer": "#9467bd",
    "communication": "#8c564b",
    "data_host": "#7f7f7f",
    "other": "#c7c7c7",
}


def shares_of(row: dict) -> dict | None:
    """A summary row's breakdown, scaled to add up to 1; None when the step has none."""
    if not is_ok(row):
        return None
    vals = {c: number(row.get(col)) for c, col in zip(CATEGORIES, TIME_COLUMNS, strict=True)}
    if all(v is None for v in vals.values()):
        return None
    vals = {c: max(v or 0.0, 0.0) for c, v in vals.items()}
    total = sum(vals.values())
    return {c: v / total for c, v in vals.items()} if total > 0 else None


def has_breakdown(df) -> bool:
    """Whether any step of a summary has a time breakdown (the chart is drawn)."""
    return any(shares_of(r) is not None for r in df.to_dict("records"))


def _missing(row) -> tuple[str, str]:
    text, color = no_value(row)
    if is_ok(row):
        text = "not profiled (run with --profile)"
    return text, color


def time_figure(plt, rows, heading: str):
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12.5, 0.42 * len(rows) + 2.2))
    ys = list(range(len(rows)))
    for y, r in zip(ys, rows, strict=True):
        share = shares_of(r)
        if share is None:
            text, color = _missing(r)
            ax.text(0.5, y, text, va="center", ha="left", color=color, fontweight="bold",
                    fontsize=9)  # fmt: skip
            continue
        left = 0.0
        for c in CATEGORIES:
            w = share[c] * 100
            if w <= 0:
                continue
            ax.barh(y, w, left=left, color=COLORS[c], edgecolor="white", linewidth=0.5)
            if w >= 7:
                ax.text(left + w / 2, y, f"{w:.0f}%", va="center", ha="center", fontsize=8)
            left += w
    ax.set_xlim(0, 100)
    handles = [Patch(color=COLORS[c], label=LABELS[c]) for c in CATEGORIES]
    what = (
        "where the time goes per step (torch.profiler, --profile: device time on a GPU, self CPU "
        "time on a CPU)"
    )
    step_bars_frame(ax, rows, ys, "share of the profiled steps' time (%)", handles, heading, what)
    layout(fig)
    return fig


def plot_time_breakdown(tag_dir: Path) -> list[Path]:
    """time_breakdown.png in `tag_dir` when some step has a breakdown; returns what it wrote."""
    tag_dir = Path(tag_dir)
    df = read_summary(tag_dir)
    if not has_breakdown(df):
        return []
    desc = describe(df)
    heading = f"{tag_dir.name} ({desc})" if desc else tag_dir.name
    plt = pyplot()
    return [save(plt, time_figure(plt, df.to_dict("records"), heading), tag_dir / TIME_CHART)]
