"""The charts of one tag's summary (headless: matplotlib's Agg).

Per tag folder: tokens_per_sec.png (bars labelled with the speedup over step 00, and in a
`-xN` tag the scaling efficiency; error bars: min-max over the rounds), peak_memory.png (peak
reserved GiB, the largest of the rounds; error bars down to the smallest) and mfu.png (MFU %); a
failed step is a "failed (oom)" label at zero, never a bar, and so is an MFU outside (0, 100%]
("MFU invalid: ..."). An inactive step (it does nothing on this device) is a hatched, pale bar
labelled "inactive here: <why>"; a step measured while other processes were busy, "[busy]".
Each step's own effect over the previous one is gain_chart.py's; the styling, labels and
layout every chart shares, chart_style.py's. Each chart is written atomically: an interrupted
or failed save leaves the previous one, never half a PNG. The published single-A100 figures of
the reference ladder (Raschka, LLMs-from-scratch ch05/10,
results/reference/published_a100_ladder.csv) are drawn in their own grey, hatched panel,
labelled as such: they are not this project's measurements (compare/reference.py reads them).
Every tag side by side, results/comparison.png, is comparison_chart.py's.
"""

from pathlib import Path

from speed_ladder.ladder import BASELINE
from speed_ladder.report.charts.chart_style import (
    FAIL_COLOR,
    INACTIVE_COLOR,
    OURS_COLOR,
    REF_STYLE,
    TITLE_WIDTH,
    inactive_label,
    is_ok,
    label_after,
    layout,
    no_value,
    pyplot,
    reference_patch,
    save,
    shorten,
    step_label,
    wrap,
)
from speed_ladder.report.compare.reference import REF_LABEL, resolve_reference
from speed_ladder.report.rows import busy_text, describe, inactive, mfu_flag, number, speedup_text
from speed_ladder.report.summary import read_summary

CHARTS = ("tokens_per_sec.png", "peak_memory.png", "mfu.png")
REF_NOTE = (
    "1x A100 (step 11: 4x A100), PyTorch 2.6; tok/s is the average to step 07 and the per-step "
    "rate from step 08 on"
)
REF_MEM_NOTE = "1x A100 (step 11: 4x A100), PyTorch 2.6; max reserved memory, printed as GB (GiB)"


def _thousands(ax):
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 10 else f"{x:g}"))


def _end(r, v: float, span_of) -> float:
    """Where a bar's label goes: after its bar, or after its error bar."""
    hi = (span_of(r) or (None, None))[1] if span_of else None
    return max(v, hi) if hi is not None else v


def _bars(ax, rows, value_of, label_of, unit: str, no_value=no_value, span_of=None) -> list:
    """Horizontal bars, step 00 on top; failed or missing steps get a label at zero, no bar.
    `span_of(row)`: (min, max) over the runs, drawn as an error bar; an inactive step's bar is
    hatched and labelled "inactive here: <why>" (wrapped under its numbers), a busy one
    "[busy]". Returns the labels placed after the bars (for `layout`)."""
    ys = list(range(len(rows)))
    values = [value_of(r) if is_ok(r) else None for r in rows]
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
    texts = []
    for y, r, v in zip(ys, rows, values, strict=True):
        if v is None:
            text, color = no_value(r)
            texts.append(label_after(ax, 0, y, text, color=color, fontweight="bold", fontsize=9))
            continue
        label = label_of(r, v) + ("  [busy]" if busy_text(r) else "")
        note = inactive_label(r)
        if note is not None:
            label += "\n" + note
        x = _end(r, v, span_of)
        texts.append(label_after(ax, x, y, label, fontsize=8, linespacing=1.1))
    ax.set_yticks(ys, [step_label(r) for r in rows], fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.05)
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)
    _thousands(ax)
    return texts


def _unbroken(text: str) -> str:
    """`text` with no-break spaces: wrapped as one word ("1x A100")."""
    return text.replace(" ", "\u00a0")


def _reference_bars(ax, ref, column: str, unit: str, label_of, note: str = REF_NOTE) -> list:
    rows = ref.to_dict("records")
    ys = list(range(len(rows)))
    vals = [float(r[column]) for r in rows]
    ax.barh(ys, vals, linewidth=0.5, **REF_STYLE)
    top = max(vals) if vals else 1.0
    texts = [
        label_after(ax, v, y, label_of(r, v), fontsize=8, color="#505050")
        for y, r, v in zip(ys, rows, vals, strict=True)
    ]
    labels = [
        step_label(
            {
                "step": r["step"],
                "title": f"{r['optimization']} ({_unbroken(r['hardware'].split(' (')[0])})",
            }
        )  # fmt: skip
        for r in rows
    ]
    ax.set_yticks(ys, labels, color="#505050", fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.05)
    ax.set_xlabel(unit + " (published)")
    ax.set_title(f"REFERENCE: {REF_LABEL}\n{wrap(note, TITLE_WIDTH)}", fontsize=9, color="#505050")
    ax.legend(
        handles=[reference_patch(REF_LABEL)],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1 - 0.5 / max(len(rows), 1)),
        fontsize=8,
        frameon=False,
    )
    _thousands(ax)
    ax.grid(axis="x", alpha=0.3)
    return texts


ROW_IN = 0.42  # inches per step: a two-line step label, two lines under an inactive step's numbers
NOTE_LINE_IN = 0.13  # inches per line of an inactive step's note past its second


def _row_in(rows) -> float:
    """Inches per step: ROW_IN, more where an inactive step's note (never cut) is longer."""
    lines = [len(n.splitlines()) for r in rows if (n := inactive_label(r)) is not None]
    return ROW_IN + NOTE_LINE_IN * max(0, max(lines, default=0) - 2)


def _figure(plt, rows, n_ref: int):
    n_ours, row_in = len(rows), _row_in(rows)
    if n_ref:
        fig, (ax, ax_ref) = plt.subplots(
            2,
            1,
            figsize=(11, row_in * n_ours + ROW_IN * n_ref + 3.6),
            gridspec_kw={"height_ratios": [row_in * max(n_ours, 1), ROW_IN * max(n_ref, 1)]},
        )
        return fig, ax, ax_ref
    fig, ax = plt.subplots(figsize=(11, row_in * n_ours + 1.9))
    return fig, ax, None


def _heading(heading: str, what: str) -> str:
    """A chart's title: whose measurement (the tag), then what it shows, each line wrapped."""
    return (
        wrap(f"MEASURED by this project: {heading}", TITLE_WIDTH) + "\n" + wrap(what, TITLE_WIDTH)
    )


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
        base = ref[ref["step"] == BASELINE]
        ref_base = float(base["tokens_per_sec"].iloc[0]) if len(base) else None

    def ref_tps_label(r, v):
        s = f"{speedup_text(v / ref_base)}  " if ref_base else ""
        return f"{s}{v:,.0f}"

    fig, ax, ax_ref = _figure(plt, rows, n_ref)
    texts = _bars(ax, rows, lambda r: number(r.get("tokens_per_sec_median")), _tps_label,
                  "tokens / s", span_of=_tps_span)  # fmt: skip
    what = ("training throughput per step (labels: speedup over step 00, tok/s [min-max]; "
            "error bars: min-max over rounds)")  # fmt: skip
    ax.set_title(_heading(heading, what), fontsize=10)
    fits = [(ax, texts)]
    if ax_ref is not None:
        fits.append((ax_ref, _reference_bars(ax_ref, ref, "tokens_per_sec", "tokens / s",
                                             ref_tps_label)))  # fmt: skip
    layout(fig, fits)
    return fig


def _memory_figure(plt, rows, heading: str, ref):
    fig, ax, ax_ref = _figure(plt, rows, len(ref) if ref is not None else 0)
    gib = lambda r, v: f"{v:.2f} GiB"
    unit = "peak reserved memory (GiB)"
    texts = _bars(ax, rows, lambda r: number(r.get("peak_reserved_gib")), gib, unit,
                  span_of=_mem_span)  # fmt: skip
    what = (
        "peak reserved memory per step (the largest of the rounds; error bars down to the smallest)"
    )
    ax.set_title(_heading(heading, what), fontsize=10)
    fits = [(ax, texts)]
    if ax_ref is not None:
        fits.append((ax_ref, _reference_bars(ax_ref, ref, "reserved_memory_gb", unit, gib,
                                             REF_MEM_NOTE)))  # fmt: skip
    layout(fig, fits)
    return fig


def _mfu_value(r) -> float | None:
    """MFU in %, only when it is a fraction in (0, 1]: an impossible MFU is never a bar."""
    v = number(r.get("mfu"))
    return None if v is None or mfu_flag(r) else v * 100


def _mfu_missing(r) -> tuple[str, str]:
    flag = mfu_flag(r)
    if flag:
        why = shorten(flag.removeprefix("MFU "), 70)
        return f"MFU invalid: {why}", FAIL_COLOR
    return no_value(r)


def _mfu_figure(plt, rows, heading: str):
    fig, ax, _ = _figure(plt, rows, 0)
    texts = _bars(
        ax,
        rows,
        _mfu_value,
        lambda r, v: f"{v:.1f}%",
        "model FLOPs utilization (% of the device's bf16 peak)",
        no_value=_mfu_missing,
    )
    ax.set_title(_heading(heading, "MFU per step"), fontsize=10)
    layout(fig, [(ax, texts)])
    return fig


def plot_tag(tag_dir: Path, reference="default") -> list[Path]:
    """tokens_per_sec.png, peak_memory.png and mfu.png in `tag_dir`; returns their paths."""
    plt = pyplot()
    tag_dir = Path(tag_dir)
    df = read_summary(tag_dir)
    ref = resolve_reference(reference)
    rows = df.to_dict("records")
    desc = describe(df)
    heading = f"{tag_dir.name} ({desc})" if desc else tag_dir.name
    tps, mem, mfu = CHARTS
    return [
        save(plt, _tps_figure(plt, rows, heading, ref), tag_dir / tps),
        save(plt, _memory_figure(plt, rows, heading, ref), tag_dir / mem),
        save(plt, _mfu_figure(plt, rows, heading), tag_dir / mfu),
    ]
