"""The phase chart of a tag, `phases.png`: each step's time split into data wait, forward,
backward and optimizer; and the line its page says of the data wait.

One stacked horizontal bar per step (the order and labels of the tag's other charts), its
segments the summary's `phase_<name>_ms` columns (the median step's phases, each the median over
the step's runs: measure/phases.py) in ms, and after the bar the total and the data wait's share.
Drawn only where some step has phases (every run records them; a record may have none);
a step without them gets a label saying why, never a bar.
"""

from pathlib import Path

from speed_ladder.measure.phases import PHASE_MS, PHASES
from speed_ladder.report.charts.chart_style import (
    is_ok,
    label_after,
    layout,
    no_value,
    pyplot,
    save,
    step_bars_frame,
)
from speed_ladder.report.rows import describe, number
from speed_ladder.report.summary import read_summary

PHASE_CHART = "phases.png"
COLORS = {"data": "#ff7f0e", "forward": "#1f77b4", "backward": "#2ca02c", "optimizer": "#9467bd"}
LABELS = {"data": "data wait (loader, copy to the device)", "forward": "forward (and the loss)",
          "backward": "backward", "optimizer": "optimizer step"}  # fmt: skip


def phases_of(row: dict) -> dict | None:
    """A summary row's ms per phase; None when the step has none (not ok, or records without
    phases)."""
    if not is_ok(row):
        return None
    ms = {p: number(row.get(c)) for p, c in zip(PHASES, PHASE_MS, strict=True)}
    return None if any(v is None for v in ms.values()) else ms


def data_line(rows: list[dict]) -> str | None:
    """The page's line: the largest data wait of a step, as a share of the step; None when no
    step has phases."""
    shares = [(number(r.get("data_share")), r["step"]) for r in rows if phases_of(r) is not None]
    shares = [(s, step) for s, step in shares if s is not None]
    if not shares:
        return None
    share, step = max(shares)
    return (
        f"*Data wait* (from a step's start to its forward: the loader and the copy to the device): "
        f"{share:.1%} of a step at most (step {step}); each step's phases in {PHASE_CHART}."
    )


def phase_figure(plt, rows: list[dict], heading: str):
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12.5, 0.42 * len(rows) + 2.2))
    ys = list(range(len(rows)))
    texts = []
    for y, r in zip(ys, rows, strict=True):
        ms = phases_of(r)
        if ms is None:
            text, color = no_value(r)
            if is_ok(r):
                text = "no phases in its records (older records, or MPS)"
            texts.append(label_after(ax, 0, y, text, color=color, fontweight="bold", fontsize=9))
            continue
        left = 0.0
        for p in PHASES:
            ax.barh(y, ms[p], left=left, color=COLORS[p], edgecolor="white", linewidth=0.5)
            left += ms[p]
        share = number(r.get("data_share"))
        label = f"{left:,.1f} ms" + ("" if share is None else f", data {share:.1%}")
        texts.append(label_after(ax, left, y, label, fontsize=8))
    ax.set_xlim(left=0)
    handles = [Patch(color=COLORS[p], label=LABELS[p]) for p in PHASES]
    what = (
        "where each step's time goes, by phase: the median timed step's, marked by hooks without "
        "a synchronize (CUDA events on a GPU, the host clock on a CPU)"
    )
    step_bars_frame(ax, rows, ys, "ms per step (the median step's phases)", handles, heading, what)
    layout(fig, [(ax, texts)])
    return fig


def plot_phases(tag_dir: Path) -> list[Path]:
    """phases.png in `tag_dir` when some step has phases; returns what it wrote."""
    tag_dir = Path(tag_dir)
    df = read_summary(tag_dir)
    rows = df.to_dict("records")
    if all(phases_of(r) is None for r in rows):
        return []
    desc = describe(df)
    heading = f"{tag_dir.name} ({desc})" if desc else tag_dir.name
    plt = pyplot()
    return [save(plt, phase_figure(plt, rows, heading), tag_dir / PHASE_CHART)]
