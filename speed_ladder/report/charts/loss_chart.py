"""The charts of a time-to-loss tag (report/to_loss.py): `loss_curves.png`, each rung's
validation loss against its training time (warm-up counted at its median step time, the clock
`time_s` is read on), the target a dashed line; and `time_to_target.png`, each rung's time to
the target beside its tok/s, both as speedups over the first rung, so that a rung that is
faster per token but needs more tokens shows both."""

from pathlib import Path

from speed_ladder.ladder import Step
from speed_ladder.report import to_loss
from speed_ladder.report.charts.chart_style import FAIL_COLOR, layout, pyplot, save

LOSS_CURVES, TIME_TO_TARGET = "loss_curves.png", "time_to_target.png"
TIME_COLOR, TPS_COLOR = "#2ca02c", "#1f77b4"


def plot_to_loss(tag_dir: Path, steps: list[Step]) -> list[Path]:
    """Both charts where the tag has a to_loss.csv, else none."""
    rows = to_loss.read(tag_dir)
    if not rows:
        return []
    return [_curves(tag_dir, steps, rows), _times(tag_dir, rows)]


def _curves(tag_dir: Path, steps: list[Step], rows: list[dict]) -> Path:
    plt = pyplot()
    curves = to_loss.curves(tag_dir, steps)
    fig, ax = plt.subplots(figsize=(10, 6))
    cmap = plt.get_cmap("viridis")
    nums = [r["step"] for r in rows if curves.get(r["step"])]
    for i, num in enumerate(nums):
        xs, ys = zip(*curves[num], strict=True)
        ax.plot(xs, ys, color=cmap(i / max(len(nums) - 1, 1)), lw=1.4, label=f"step {num}")
    target = rows[0]["target"]
    ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("training time (s; warm-up at the run's median step time, evaluation left out)")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title(f"{Path(tag_dir).name}: validation loss against training time, per rung")
    ax.legend(ncol=2, fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    layout(fig)
    return save(plt, fig, Path(tag_dir) / LOSS_CURVES)


def _times(tag_dir: Path, rows: list[dict]) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 2), sharey=True)
    ys = list(range(len(rows)))[::-1]
    labels = [f"{r['step']} {r['title']}"[:40] for r in rows]
    first = rows[0]
    for y, r in zip(ys, rows, strict=True):
        if r["time_s"] is None:
            left.text(0, y, f"  not reached ({r['reached']})", va="center", color=FAIL_COLOR)
            continue
        left.barh(y, r["time_s"], color=TIME_COLOR)
        more = ""
        if r["tokens_ratio"] is not None:
            more = f"  tokens x{r['tokens_ratio']:.2f}, tok/s x{r['tps_ratio']:.2f}"
        left.text(r["time_s"], y, f" {r['time_s']:.0f} s{more}", va="center", fontsize=8)
        for k, (value, color) in enumerate([
            (first["time_s"] / r["time_s"] if first["time_s"] else None, TIME_COLOR),
            (r["tokens_per_sec"] / first["tokens_per_sec"] if first["tokens_per_sec"] else None,
             TPS_COLOR),
        ]):  # fmt: skip
            if value is not None:
                right.barh(y + (0.2 if k == 0 else -0.2), value, height=0.4, color=color)
    longest = max((r["time_s"] for r in rows if r["time_s"] is not None), default=1.0)
    left.set_xlim(0, longest * 1.9)  # room for each bar's label
    left.set_yticks(ys, labels, fontsize=8)
    left.set_xlabel(f"time to validation loss {first['target']:g} (s)")
    right.axvline(1.0, color="k", lw=0.8)
    right.set_xlabel(f"over step {first['step']}: time to target (green), tok/s (blue)")
    noise = first["noise"]
    said = f"seeds' spread {noise:.0%}" if noise is not None else "one seed: no spread"
    fig.suptitle(f"{Path(tag_dir).name}: time to target per rung ({said})")
    layout(fig)
    return save(plt, fig, Path(tag_dir) / TIME_TO_TARGET)
