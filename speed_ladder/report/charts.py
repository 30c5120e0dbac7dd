"""The charts of a tag's summary, and of every tag side by side (headless: matplotlib's Agg).

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
labelled as such: they are not this project's measurements.

results/comparison.png compares ladders of different hardware: per step, each tag's speedup
over its own step 00 (tok/s of the step / tok/s of that tag's step 00; an N-process tag, which
holds the distributed steps only, over its 1-process tag's step 00 on the same machine) beside
the published reference's speedup over its step 00 (its single-GPU rows), on a log axis with
1x at step 00. An inactive step is a hatched, pale bar labelled "inactive here"; a step that
failed, ran interpreted or did not run is a label at 1x, never a bar.
"""

import re
from pathlib import Path

from speed_ladder.errors import warn
from speed_ladder.files import RESULTS
from speed_ladder.ladder import tag_processes
from speed_ladder.report.chart_style import (
    FAIL_COLOR,
    INACTIVE_COLOR,
    OURS_COLOR,
    REF_COLOR,
    is_ok,
    label_after,
    layout,
    no_value,
    pyplot,
    save,
    shorten,
    step_label,
    wrap,
)
from speed_ladder.report.rows import busy_text, inactive
from speed_ladder.report.summary import describe, mfu_flag, number, read_summary, speedup_text

REFERENCE_CSV = RESULTS / "reference" / "published_a100_ladder.csv"
CHARTS = ("tokens_per_sec.png", "peak_memory.png", "mfu.png")
COMPARISON = "comparison.png"
REF_LABEL = "published A100 figures (Raschka), not our measurement"
REF_NOTE = (
    "1x A100 (step 11: 4x A100), PyTorch 2.6; tok/s is the average to step 07 and the per-step "
    "rate from step 08 on"
)
REF_MEM_NOTE = "1x A100 (step 11: 4x A100), PyTorch 2.6; max reserved memory, printed as GB (GiB)"
TITLE_WIDTH = 95  # characters per line of a chart's title


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
        if inactive(r):
            label += "\n" + wrap(inactive(r), 62, max_lines=2)
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
    from matplotlib.patches import Patch

    rows = ref.to_dict("records")
    ys = list(range(len(rows)))
    vals = [float(r[column]) for r in rows]
    ax.barh(ys, vals, color=REF_COLOR, hatch="//", edgecolor="#606060", linewidth=0.5)
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
        handles=[Patch(facecolor=REF_COLOR, hatch="//", edgecolor="#606060", label=REF_LABEL)],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1 - 0.5 / max(len(rows), 1)),
        fontsize=8,
        frameon=False,
    )
    _thousands(ax)
    ax.grid(axis="x", alpha=0.3)
    return texts


ROW_IN = 0.42  # inches per step: a two-line step label, a label under an inactive step's numbers


def _figure(plt, n_ours: int, n_ref: int):
    if n_ref:
        fig, (ax, ax_ref) = plt.subplots(
            2,
            1,
            figsize=(11, ROW_IN * (n_ours + n_ref) + 3.6),
            gridspec_kw={"height_ratios": [max(n_ours, 1), max(n_ref, 1)]},
        )
        return fig, ax, ax_ref
    fig, ax = plt.subplots(figsize=(11, ROW_IN * n_ours + 1.9))
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
        base = ref[ref["step"] == "00"]
        ref_base = float(base["tokens_per_sec"].iloc[0]) if len(base) else None

    def ref_tps_label(r, v):
        s = f"{speedup_text(v / ref_base)}  " if ref_base else ""
        return f"{s}{v:,.0f}"

    fig, ax, ax_ref = _figure(plt, len(rows), n_ref)
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
    fig, ax, ax_ref = _figure(plt, len(rows), len(ref) if ref is not None else 0)
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
    fig, ax, _ = _figure(plt, len(rows), 0)
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
    ref = _reference(reference)
    rows = df.to_dict("records")
    desc = describe(df)
    heading = f"{tag_dir.name} ({desc})" if desc else tag_dir.name
    tps, mem, mfu = CHARTS
    return [
        save(plt, _tps_figure(plt, rows, heading, ref), tag_dir / tps),
        save(plt, _memory_figure(plt, rows, heading, ref), tag_dir / mem),
        save(plt, _mfu_figure(plt, rows, heading), tag_dir / mfu),
    ]


def _base_tps(df) -> float | None:
    """A summary's step 00 tok/s, when step 00 has a result."""
    rows = [r for r in df.to_dict("records") if r["step"] == "00" and is_ok(r)]
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
    bar labelled "inactive here" for an inactive step; a label at 1x, no bar, for a step without
    a measurement (failed, interpreted, not run). Returns the speedups drawn and the labels."""
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
            v = number(r.get("tokens_per_sec_median")) if is_ok(r) else None
            if v is None:
                text, c = no_value(r)
                texts.append(label_after(ax, 1.0, y, text, fontsize=7, color=c))
                continue
            up = v / base[0]
            off = inactive(r) is not None
            if off:
                style = {"color": to_rgba(color, 0.35), "hatch": "xx", "edgecolor": color}
            else:
                style = {"color": color}
            _speedup_bar(ax, y, up, height, **style)
            values.append(up)
            label = speedup_text(up) + ("  inactive here" if off else "")
            texts.append(label_after(ax, max(up, 1.0), y, label, fontsize=7))
    return values, texts


def _comparison_reference(ax, ref, steps, height, k: int) -> tuple[list, list]:
    """The published single-GPU figures' speedup over their step 00, hatched grey."""
    by_step = {r["step"]: r for r in ref.to_dict("records")}
    values, texts = [], []
    base = by_step.get("00")
    if base is None:
        return values, texts
    for i, s in enumerate(steps):
        r = by_step.get(s)
        if r is not None:
            y = i - 0.4 + height * (k + 0.5)
            up = float(r["tokens_per_sec"]) / float(base["tokens_per_sec"])
            _speedup_bar(ax, y, up, height, color=REF_COLOR, hatch="//", edgecolor="#606060")
            values.append(up)
            texts.append(label_after(ax, max(up, 1.0), y, speedup_text(up), fontsize=7,
                                     color="#505050"))  # fmt: skip
    return values, texts


def _single_gpu(ref):
    """The reference's rows measured on one GPU (step 11's 4x A100 left out)."""
    if ref is None or not len(ref):
        return None
    one = ref[ref["hardware"].astype(str).str.startswith("1x ")]
    return one if len(one) else None


def plot_comparison(tag_dirs, out: Path | None = None, reference="default") -> Path:
    """Every tag's speedup over its own step 00 per step, one color per tag (log scale, 1x at
    step 00), beside the published single-GPU reference's speedup over its step 00."""
    import numpy as np
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    plt = pyplot()
    tag_dirs = [Path(t) for t in tag_dirs]
    out = Path(out) if out is not None else tag_dirs[0].parent / COMPARISON
    ref = _single_gpu(_reference(reference))
    series = list({t.name: read_summary(t) for t in tag_dirs}.items())
    bases = _bases(series)
    steps = sorted({s for _, df in series for s in df["step"]})
    titles = {}
    for _, df in series:
        for r in df.to_dict("records"):
            titles.setdefault(r["step"], r.get("title") or "")
    if ref is not None:
        steps = sorted(set(steps) | set(ref["step"]))
        for r in ref.to_dict("records"):
            titles.setdefault(r["step"], r["optimization"])
    n = len(series) + (1 if ref is not None else 0)
    height = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(11, 0.2 * len(steps) * max(n, 2) + 2.6))
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
    handles.append(Patch(facecolor="white", hatch="xx", edgecolor="#606060",
                         label="inactive here: the step does nothing on this device"))  # fmt: skip
    if ref is not None:
        ref_values, ref_texts = _comparison_reference(ax, ref, steps, height, len(series))
        values += ref_values
        texts += ref_texts
        handles.append(Patch(facecolor=REF_COLOR, hatch="//", edgecolor="#606060",
                             label=f"{REF_LABEL} (1x A100)"))  # fmt: skip
    ax.set_xscale("log")
    lo = min([0.5, *(v / 1.3 for v in values)])
    hi = max([4.0, *(v * 1.3 for v in values)])
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(LogLocator(base=2.0, subs=(1.0,)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.axvline(1.0, color="#333333", lw=0.8)
    labels = [step_label({"step": s, "title": titles.get(s, "")}) for s in steps]
    ax.set_yticks(np.arange(len(steps)), labels, fontsize=9)
    ax.set_ylim(len(steps) - 0.5, -0.5)
    ax.set_xlabel("speedup over the same ladder's step 00 (its tok/s / step 00's tok/s; log scale)")
    title = (
        "Speedup per step over each ladder's own step 00, every hardware tag, beside the "
        "published single-GPU reference; a step that failed or did not run is a label at 1x, "
        "never a bar"
    )
    ax.set_title(wrap(title, TITLE_WIDTH), fontsize=10)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.6 / fig.get_figheight()),
              fontsize=8, ncols=2, frameon=False)  # fmt: skip
    ax.grid(axis="x", alpha=0.3)
    layout(fig, [(ax, texts)])
    return save(plt, fig, out)
