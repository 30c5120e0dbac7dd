"""What every chart of the report shares (bar_charts.py, comparison_chart.py, gain_chart.py,
time_chart.py, phase_chart.py): the colors, the title width, the step labels, the label of a step
without a value, an inactive step's note, the layout that keeps every label inside the figure, and
the atomic save. Headless: matplotlib's Agg backend.

Labels are wrapped or shortened at word boundaries (`textwrap`), never cut mid-word; a label
placed after its bar widens the axis until it ends inside it (`fit_right`), so no text runs past
the figure's edge.
"""

import io
import math
import textwrap
from pathlib import Path

from speed_ladder.files import atomic_write_bytes
from speed_ladder.report.rows import inactive

OURS_COLOR, REF_COLOR, FAIL_COLOR, MISSING_COLOR = "#1f77b4", "#b0b0b0", "#c0392b", "#7f7f7f"
INACTIVE_COLOR = "#c6dbef"
REF_STYLE = {
    "color": REF_COLOR,
    "hatch": "//",
    "edgecolor": "#606060",
}  # the published figures' bars
DPI = 110
LABEL_GAP_PT = 4  # points between a bar and its label
STEP_LABEL_WIDTH = 34  # characters per line of a step's label on the y axis (two lines at most)
TITLE_WIDTH = 95  # characters per line of a chart's title
INACTIVE_WIDTH = 62  # characters per line of an inactive step's note


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def is_ok(row) -> bool:
    """Whether a summary row has a result (status ok)."""
    return row.get("status") == "ok"


def wrap(text: str, width: int, max_lines: int | None = None) -> str:
    """`text` on lines of at most `width` characters, broken between words; with `max_lines`,
    the words past the last line are left out for " …" (a word is never cut)."""
    lines = textwrap.wrap(str(text), width, max_lines=max_lines, placeholder=" …",
                          break_long_words=False, break_on_hyphens=False)  # fmt: skip
    return "\n".join(lines)


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters, whole words only, " …" where words were left out."""
    return textwrap.shorten(str(text), width, placeholder=" …", break_on_hyphens=False)


def step_label(row, width: int = STEP_LABEL_WIDTH) -> str:
    """'NN  title' for a y axis: the title wrapped at word boundaries, two lines at most."""
    title = str(row.get("title") or "")
    return wrap(f"{row['step']}  {title}", width, max_lines=2) if title else str(row["step"])


def no_value(row) -> tuple[str, str]:
    """The label (and its color) a step without a bar gets."""
    status = row.get("status") or "not run"
    if status == "ok":
        return "n/a (not measured on this device)", MISSING_COLOR
    if status == "not run":
        return "not run", MISSING_COLOR
    if status == "interpreted":  # Triton's interpreter ran Liger: numerics, no measurement
        return "interpreted (TRITON_INTERPRET=1): not a measurement", MISSING_COLOR
    return f"failed ({status})", FAIL_COLOR


def inactive_label(row, width: int = INACTIVE_WIDTH) -> str | None:
    """'inactive here: <why>' for a step that does nothing on this device, wrapped at word
    boundaries on as many lines as it takes (never cut: the chart makes room); None for a step
    that acts."""
    note = inactive(row)
    return None if note is None else wrap(note, width)


def reference_patch(label: str):
    """A legend entry for the published figures' bars (grey, hatched: REF_STYLE)."""
    from matplotlib.patches import Patch

    return Patch(facecolor=REF_COLOR, hatch=REF_STYLE["hatch"], edgecolor=REF_STYLE["edgecolor"],
                 label=label)  # fmt: skip


def label_after(ax, x: float, y: float, text: str, **style):
    """`text` left-aligned a few points right of the data point (x, y): after a bar's end, the
    same gap whatever the axis' range."""
    return ax.annotate(text, (x, y), xytext=(LABEL_GAP_PT, 0), textcoords="offset points",
                       va="center", ha="left", **style)  # fmt: skip


def _scaled(ax, x: float) -> float:
    """x on the axis' own scale (its logarithm on a log axis)."""
    return math.log(x) if ax.get_xscale() == "log" else x


def fit_right(ax, texts, pad: float = 0.01) -> None:
    """Widen `ax`'s x range to the right until every text of `texts` (left-aligned, placed in
    data coordinates or `label_after` them) ends inside the axes. The figure must be laid out
    (tight_layout) first. Neither a text's width in pixels nor the axes' changes with the
    range, so one pass settles it."""
    renderer = ax.figure.canvas.get_renderer()
    x0, x1 = ax.get_xlim()
    width = ax.get_window_extent(renderer).width
    lo, hi = _scaled(ax, x0), _scaled(ax, x1)
    need = hi
    for t in texts:
        gap = LABEL_GAP_PT * ax.figure.dpi / 72 if hasattr(t, "xy") else 0.0
        room = width * (1 - pad) - t.get_window_extent(renderer).width - gap
        x = _scaled(ax, t.xy[0] if hasattr(t, "xy") else t.get_position()[0])
        if room > 0 and x > lo:  # x at fraction (x - lo) / (need - lo) of the width
            need = max(need, lo + (x - lo) * width / room)
    if need > hi * (1 + 1e-9) + 1e-12:
        ax.set_xlim(x0, math.exp(need) if ax.get_xscale() == "log" else need)


def step_bars_frame(ax, rows, ys, xlabel: str, handles, heading: str, what: str) -> None:
    """The frame of a chart of one horizontal bar per step (the time breakdown, the phases): the
    steps down the side, the x label and grid, the legend right of the axes, the title."""
    ax.set_yticks(ys, [step_label(r) for r in rows], fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title(wrap(f"MEASURED by this project: {heading}", 110) + "\n" + wrap(what, 110),
                 fontsize=10)  # fmt: skip


def layout(fig, fits=()) -> None:
    """Lay the figure out so that no label leaves it: tight_layout, then each (axes, texts) of
    `fits` widened to hold its texts (`fit_right`), then tight_layout again for the new ticks,
    which can narrow an axes by a few pixels, so each is fitted once more (a wider range moves
    no label's pixels). Only savefig draws pixels: `draw_without_rendering` lays the tick labels
    out without rasterizing a glyph."""
    fig.tight_layout()
    if fits:
        fig.draw_without_rendering()  # the tick labels as they will be drawn
        for ax, texts in fits:
            fit_right(ax, texts)
        fig.tight_layout()
        for ax, texts in fits:
            fit_right(ax, texts)


def save(plt, fig, path: Path) -> Path:
    """The figure as a PNG at `path`, written atomically (an interrupted save leaves the old
    file); the figure is closed. Lay it out (`layout`) first."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=DPI, format="png")
    finally:
        plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)
