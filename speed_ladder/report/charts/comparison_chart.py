"""results/comparison.png: ladders of different hardware side by side, and
results/gpu_vs_a100.png, the same for the 1-process GPU tags alone, the README's chart
(headless: matplotlib's Agg).

Per step, each tag's speedup over its own step 00 (tok/s of the step / tok/s of that tag's step 00;
an N-process tag, which holds the distributed steps only, over its 1-process tag's step 00 on the
same machine) beside the published reference's speedup over its step 00 (its single-GPU rows,
compare/reference.py's, each beside the rung that does what its step did), on a log axis with 1x at
step 00. An inactive step is a hatched, pale bar labelled "inactive here: <why>" (wrapped, never
cut: the bars make room); a step that failed, ran interpreted or did not run is a label at 1x, never
a bar. The chart is written atomically, as every chart (chart_style.save)."""

import re
from pathlib import Path

from speed_ladder.ladder import BASELINE, tag_processes
from speed_ladder.report.charts import chart_style
from speed_ladder.report.compare.reference import (
    REF_LABEL,
    records,
    resolve_reference,
    rungs_of,
    single_gpu,
)
from speed_ladder.report.rows import inactive, number, speedup_text
from speed_ladder.report.summary import read_summary

COMPARISON = "comparison.png"
GPU_CHART = "gpu_vs_a100.png"  # the README's chart: the GPU ladders beside the published A100's
TITLE = (
    "Speedup per step over each ladder's own step 00, every hardware tag, beside the published "
    "single-GPU reference; a step that failed or did not run is a label at 1x, never a bar"
)
GPU_TITLE = (
    "Speedup per step over each ladder's own step 00: this project's ladder on one GPU beside "
    "the published single-A100 ladder; a step that failed or did not run is a label at 1x"
)
NOTE_WIDTH = 80  # characters per line of an inactive step's note (fontsize 7)
BAR_IN = 0.16  # inches per bar: one line of its label
LINE_IN = 0.11  # inches per line of a label (fontsize 7)


def _bar_in(series) -> float:
    """Inches per bar: BAR_IN, more where an inactive step's note (never cut) takes lines."""
    notes = [
        chart_style.inactive_label(r, NOTE_WIDTH) for _, df in series for r in df.to_dict("records")
    ]
    lines = max([len(n.splitlines()) for n in notes if n is not None], default=1)
    return max(BAR_IN, LINE_IN * lines + 0.04)


def _base_tps(df) -> float | None:
    """A summary's step 00 tok/s, when step 00 has a result."""
    rows = [r for r in df.to_dict("records") if r["step"] == BASELINE and chart_style.is_ok(r)]
    return number(rows[0].get("tokens_per_sec_median")) if rows else None


def _bases(series) -> dict:
    """Each tag's step 00 to divide by, and the tag it comes from: its own; for an N-process tag
    (`-xN`, the distributed steps only) its 1-process tag's (`-x1`, the same machine) when that
    is drawn too; None when there is none."""
    machine = lambda tag: re.sub(r"-x\d+$", "", tag)
    single = {machine(t): t for t, _ in series if tag_processes(t) == 1}
    by_name = dict(series)
    bases = {}
    for tag, df in series:
        own = _base_tps(df)
        if own is not None:
            bases[tag] = (own, tag)
            continue
        one = single.get(machine(tag))
        other = _base_tps(by_name[one]) if one is not None and one != tag else None
        bases[tag] = (other, one) if other is not None else None
    return bases


def _speedup_bar(ax, y, s, height, **style):
    """A bar from 1x (step 00) to `s` on the log axis: right for a speedup, left for a slowdown."""
    ax.barh(y, s - 1.0, left=1.0, height=height, **style)


def _comparison_bars(ax, series, bases, steps, height, colors) -> tuple[list, list]:
    """Each tag's speedup over its step 00 per step: a bar and its "1.23x" label; a hatched, pale
    bar labelled "inactive here: <why>" for an inactive step; a label at 1x, no bar, for a step
    without a measurement (failed, interpreted, not run). Returns the speedups drawn and the
    labels."""
    from matplotlib.colors import to_rgba

    values, texts = [], []
    for k, (tag, df) in enumerate(series):
        by_step = {r["step"]: r for r in df.to_dict("records")}
        base = bases[tag]
        color = colors[k % len(colors)]
        for i, s in enumerate(steps):
            r = by_step.get(s)
            if r is None or base is None:
                continue
            y = i - 0.4 + height * (k + 0.5)
            v = number(r.get("tokens_per_sec_median")) if chart_style.is_ok(r) else None
            if v is None:
                text, c = chart_style.no_value(r)
                texts.append(chart_style.label_after(ax, 1.0, y, text, fontsize=7, color=c))
                continue
            up = v / base[0]
            off = inactive(r) is not None
            if off:
                style = {"color": to_rgba(color, 0.35), "hatch": "xx", "edgecolor": color}
            else:
                style = {"color": color}
            _speedup_bar(ax, y, up, height, **style)
            values.append(up)
            note = chart_style.inactive_label(r, NOTE_WIDTH)
            label = speedup_text(up) + (f"  {note}" if note is not None else "")
            texts.append(
                chart_style.label_after(ax, max(up, 1.0), y, label, fontsize=7, linespacing=1.1)
            )
    return values, texts


def _comparison_reference(ax, ref, steps, height, k: int) -> tuple[list, list]:
    """The published single-GPU figures' speedup over their step 00, hatched grey, each beside
    the rung that does what its step did (compare/reference.py's `rungs`), "(his 05)" where
    that is not the rung of its number, "(his 07 = our 07 + 19)" where it bundles several."""
    by_rung = {rungs_of(r)[0]: r for r in records(ref)}
    values, texts = [], []
    base = by_rung.get(BASELINE)
    if base is None:
        return values, texts
    for i, s in enumerate(steps):
        r = by_rung.get(s)
        if r is not None:
            y = i - 0.4 + height * (k + 0.5)
            up = float(r["tokens_per_sec"]) / float(base["tokens_per_sec"])
            _speedup_bar(ax, y, up, height, **chart_style.REF_STYLE)
            values.append(up)
            ours = rungs_of(r)
            his = f"his {r['step']}" + (f" = our {' + '.join(ours)}" if len(ours) > 1 else "")
            label = speedup_text(up) + (f" ({his})" if ours != [r["step"]] else "")
            texts.append(chart_style.label_after(ax, max(up, 1.0), y, label, fontsize=7,
                                     color="#505050"))  # fmt: skip
    return values, texts


def plot_comparison(tag_dirs, out: Path | None = None, reference="default", title=TITLE) -> Path:
    """Every tag's speedup over its own step 00 per step, one color per tag (log scale, 1x at
    step 00), beside the published single-GPU reference's speedup over its step 00."""
    import numpy as np
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    plt = chart_style.pyplot()
    tag_dirs = [Path(t) for t in tag_dirs]
    out = Path(out) if out is not None else tag_dirs[0].parent / COMPARISON
    ref = single_gpu(resolve_reference(reference))
    series = list({t.name: read_summary(t) for t in tag_dirs}.items())
    bases = _bases(series)
    steps = sorted({s for _, df in series for s in df["step"]})
    titles = {}
    for _, df in series:
        for r in df.to_dict("records"):
            titles.setdefault(r["step"], r.get("title") or "")
    if ref is not None:
        steps = sorted(set(steps) | {rungs_of(r)[0] for r in records(ref)})
        for r in records(ref):
            titles.setdefault(rungs_of(r)[0], r["optimization"])
    n = len(series) + (1 if ref is not None else 0)
    height = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(11, _bar_in(series) / 0.8 * len(steps) * max(n, 2) + 2.6))
    colors = plt.get_cmap("tab10").colors
    values, texts = _comparison_bars(ax, series, bases, steps, height, colors)
    handles = []
    for k, (tag, _) in enumerate(series):
        base = bases[tag]
        if base is None:
            note = "no step 00 to divide by: not drawn"
        elif base[1] == tag:
            note = "this project"
        else:
            note = f"this project; over {base[1]}'s step 00"
        handles.append(Patch(color=colors[k % len(colors)], label=f"{tag} ({note})"))
    if any(inactive(r) for _, df in series for r in df.to_dict("records")):
        label = "inactive here: the step does nothing on this device"
        handles.append(Patch(facecolor="white", hatch="xx", edgecolor="#606060", label=label))
    if ref is not None:
        ref_values, ref_texts = _comparison_reference(ax, ref, steps, height, len(series))
        values += ref_values
        texts += ref_texts
        handles.append(chart_style.reference_patch(f"{REF_LABEL} (1x A100)"))
    ax.set_xscale("log")
    lo = min([0.5, *(v / 1.3 for v in values)])
    hi = max([4.0, *(v * 1.3 for v in values)])
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(LogLocator(base=2.0, subs=(1.0,)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.axvline(1.0, color="#333333", lw=0.8)
    labels = [chart_style.step_label({"step": s, "title": titles.get(s, "")}) for s in steps]
    ax.set_yticks(np.arange(len(steps)), labels, fontsize=9)
    ax.set_ylim(len(steps) - 0.5, -0.5)
    ax.set_xlabel("speedup over the same ladder's step 00 (its tok/s / step 00's tok/s; log scale)")
    ax.set_title(chart_style.wrap(title, chart_style.TITLE_WIDTH), fontsize=10)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.6 / fig.get_figheight()),
              fontsize=8, ncols=2, frameon=False)  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    chart_style.layout(fig, [(ax, texts)])
    return chart_style.save(plt, fig, out)


def plot_gpu_comparison(gpu_tags) -> Path:
    """results/gpu_vs_a100.png: the 1-process GPU tags' speedups beside the published A100's."""
    gpu_tags = [Path(t) for t in gpu_tags]
    return plot_comparison(gpu_tags, gpu_tags[0].parent / GPU_CHART, title=GPU_TITLE)
