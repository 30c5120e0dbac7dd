"""Charts and the README results table from the sweep's summaries (`python -m harness run`).

    python plot_results.py                     # every results/<tag>/ with a summary.csv
    python plot_results.py results/cpu-8c      # just these
    python plot_results.py --no-readme         # charts only

Per tag folder: tokens_per_sec.png (bars labelled with the speedup over step 00),
peak_memory.png (peak reserved GiB) and mfu.png (MFU %); a failed step is a "failed (oom)" label
at zero, never a bar. With several tags, results/comparison.png groups every tag's tok/s per
step. The published single-A100 figures of the reference ladder (Raschka, LLMs-from-scratch
ch05/10, results/reference/published_a100_ladder.csv) are drawn in their own grey, hatched
panel, labelled as such: they are not this project's measurements. The README's table between
`<!-- results:begin -->` and `<!-- results:end -->` is regenerated from the same summaries.
Headless: matplotlib's Agg backend, no display needed.
"""

import argparse
import math
import os
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
REFERENCE_CSV = RESULTS / "reference" / "published_a100_ladder.csv"
CHARTS = ("tokens_per_sec.png", "peak_memory.png", "mfu.png")
COMPARISON = "comparison.png"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
REF_LABEL = "published A100 figures (Raschka), not our measurement"
REF_NOTE = (
    "1x A100 (step 11: 4x A100), PyTorch 2.6; tok/s is the average to step 07 and the per-step "
    "rate from step 08 on"
)
REF_MEM_NOTE = "1x A100 (step 11: 4x A100), PyTorch 2.6; max reserved memory, printed as GB (GiB)"
OURS_COLOR, REF_COLOR, FAIL_COLOR, MISSING_COLOR = "#1f77b4", "#b0b0b0", "#c0392b", "#7f7f7f"


# ---------------------------------------------------------------- reading
def read_summary(tag_dir: Path):
    """A tag's summary.csv; `step` stays the two-digit string ("00")."""
    import pandas as pd

    df = pd.read_csv(Path(tag_dir) / "summary.csv", dtype={"step": str})
    df["step"] = df["step"].str.zfill(2)
    for col in ("reason", "title", "status", "device_name", "preset", "torch_version"):
        if col in df:
            df[col] = df[col].astype("object").where(df[col].notna(), None)
    return df


def read_reference(path: Path = REFERENCE_CSV):
    """The published reference figures, or None when the file is missing."""
    import pandas as pd

    if not Path(path).is_file():
        return None
    df = pd.read_csv(path, dtype={"step": str})
    df["step"] = df["step"].str.zfill(2)
    return df


def find_tags(results_dir: Path = RESULTS) -> list[Path]:
    """Every results/<tag>/ folder holding a summary.csv, sorted by name."""
    return sorted(p.parent for p in Path(results_dir).glob("*/summary.csv"))


def ladder_steps(root: Path = ROOT) -> list[str]:
    """The ladder's step numbers: 00 (00_orig.py) and every steps/NN_*.py."""
    nums = ["00"] if (root / "00_orig.py").is_file() else []
    return nums + sorted({p.name[:2] for p in (root / "steps").glob("[0-9][0-9]_*.py")})


def _ok(row) -> bool:
    return row.get("status") == "ok"


def _num(v):
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _speedup_text(s) -> str:
    return f"{s:.2f}x" if s < 10 else f"{s:.1f}x"


def _step_label(row, width: int = 34) -> str:
    title = str(row.get("title") or "")
    if len(title) > width:
        title = title[: width - 1] + "…"
    return f"{row['step']}  {title}"


def _describe(df) -> str:
    """'<device name>, preset <p>, torch <v>' from the summary rows that have them."""
    rows = df.to_dict("records")

    def first(col):
        return next((r.get(col) for r in rows if isinstance(r.get(col), str) and r.get(col)), None)

    dev, preset, torch_v = first("device_name"), first("preset"), first("torch_version")
    bits = [dev, f"preset {preset}" if preset else None, f"torch {torch_v}" if torch_v else None]
    return ", ".join(b for b in bits if b)


def _heading(tag: str, df) -> str:
    desc = _describe(df)
    return f"{tag} ({desc})" if desc else tag


# ---------------------------------------------------------------- charts
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
    return f"failed ({status})", FAIL_COLOR


def _bars(ax, rows, value_of, label_of, unit: str):
    """Horizontal bars, step 00 on top; failed or missing steps get a label at zero, no bar."""
    ys = list(range(len(rows)))
    values = [value_of(r) if _ok(r) else None for r in rows]
    bars = [(y, v) for y, v in zip(ys, values, strict=True) if v is not None]
    ax.barh([y for y, _ in bars], [v for _, v in bars], color=OURS_COLOR)
    top = max((v for v in values if v is not None), default=0.0) or 1.0
    for y, r, v in zip(ys, rows, values, strict=True):
        if v is None:
            text, color = _no_value(r)
            ax.text(top * 0.01, y, text, va="center", ha="left", color=color, fontweight="bold")
        else:
            ax.text(v + top * 0.01, y, label_of(r, v), va="center", ha="left", fontsize=9)
    ax.set_yticks(ys, [_step_label(r) for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.22)
    ax.set_xlabel(unit)
    ax.grid(axis="x", alpha=0.3)
    _thousands(ax)


def _thousands(ax):
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 10 else f"{x:g}"))


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


def plot_tag(tag_dir: Path, reference="default") -> list[Path]:
    """tokens_per_sec.png, peak_memory.png and mfu.png in `tag_dir`; returns their paths."""
    plt = _plt()
    tag_dir = Path(tag_dir)
    df = read_summary(tag_dir)
    ref = read_reference() if isinstance(reference, str) and reference == "default" else reference
    rows = df.to_dict("records")
    heading = _heading(tag_dir.name, df)
    out = []

    def tps_label(r, v):
        s = _num(r.get("speedup_vs_00"))
        rng = ""
        lo, hi = _num(r.get("tokens_per_sec_min")), _num(r.get("tokens_per_sec_max"))
        if r.get("runs", 1) and int(r.get("runs") or 1) > 1 and lo is not None and hi is not None:
            rng = f" [{lo:,.0f}-{hi:,.0f}]"
        return (_speedup_text(s) + "  " if s is not None else "") + f"{v:,.0f}{rng}"

    ref_base = None
    if ref is not None and len(ref):
        base = ref[ref["step"] == "00"]
        ref_base = float(base["tokens_per_sec"].iloc[0]) if len(base) else None

    def ref_tps_label(r, v):
        s = f"{_speedup_text(v / ref_base)}  " if ref_base else ""
        return f"{s}{v:,.0f}"

    # tokens per second
    n_ref = len(ref) if ref is not None else 0
    fig, ax, ax_ref = _figure(plt, len(rows), n_ref)
    _bars(ax, rows, lambda r: _num(r.get("tokens_per_sec_median")), tps_label, "tokens / s")
    ax.set_title(
        f"MEASURED by this project: {heading}\n"
        "training throughput per step (labels: speedup over step 00, tok/s)",
        fontsize=10,
    )
    if ax_ref is not None:
        _reference_bars(ax_ref, ref, "tokens_per_sec", "tokens / s", ref_tps_label)
    fig.tight_layout()
    out.append(tag_dir / CHARTS[0])
    fig.savefig(out[-1], dpi=110)
    plt.close(fig)

    # peak reserved memory
    fig, ax, ax_ref = _figure(plt, len(rows), n_ref)
    _bars(
        ax,
        rows,
        lambda r: _num(r.get("peak_reserved_gib")),
        lambda r, v: f"{v:.2f} GiB",
        "peak reserved memory (GiB)",
    )
    ax.set_title(f"MEASURED by this project: {heading}\npeak reserved memory per step", fontsize=10)
    if ax_ref is not None:
        _reference_bars(
            ax_ref,
            ref,
            "reserved_memory_gb",
            "peak reserved memory (GiB)",
            lambda r, v: f"{v:.2f} GiB",
            REF_MEM_NOTE,
        )
    fig.tight_layout()
    out.append(tag_dir / CHARTS[1])
    fig.savefig(out[-1], dpi=110)
    plt.close(fig)

    # MFU
    fig, ax, _ = _figure(plt, len(rows), 0)
    _bars(
        ax,
        rows,
        lambda r: None if _num(r.get("mfu")) is None else _num(r.get("mfu")) * 100,
        lambda r, v: f"{v:.1f}%",
        "model FLOPs utilization (% of the device's bf16 peak)",
    )
    ax.set_title(f"MEASURED by this project: {heading}\nMFU per step", fontsize=10)
    fig.tight_layout()
    out.append(tag_dir / CHARTS[2])
    fig.savefig(out[-1], dpi=110)
    plt.close(fig)
    return out


def plot_comparison(tag_dirs, out: Path | None = None, reference="default") -> Path:
    """Grouped bars of tok/s per step, one color per tag (log scale), plus the reference."""
    import numpy as np
    from matplotlib.patches import Patch

    plt = _plt()
    tag_dirs = [Path(t) for t in tag_dirs]
    out = Path(out) if out is not None else tag_dirs[0].parent / COMPARISON
    ref = read_reference() if isinstance(reference, str) and reference == "default" else reference
    tables = {t.name: read_summary(t) for t in tag_dirs}
    steps = sorted({s for df in tables.values() for s in df["step"]})
    titles = {}
    for df in tables.values():
        for r in df.to_dict("records"):
            titles.setdefault(r["step"], r.get("title") or "")
    series = list(tables.items())
    if ref is not None and len(ref):
        steps = sorted(set(steps) | set(ref["step"]))
    n = len(series) + (1 if ref is not None and len(ref) else 0)
    height = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(11, 0.3 * len(steps) * max(n, 2) * 0.6 + 2.5))
    ys = np.arange(len(steps))
    colors = plt.get_cmap("tab10").colors
    values, handles = [], []
    for k, (tag, df) in enumerate(series):
        by_step = {r["step"]: r for r in df.to_dict("records")}
        for i, s in enumerate(steps):
            r = by_step.get(s)
            v = _num(r.get("tokens_per_sec_median")) if r is not None and _ok(r) else None
            y = ys[i] - 0.4 + height * (k + 0.5)
            if v is not None:
                ax.barh(y, v, height=height, color=colors[k % len(colors)])
                values.append(v)
            elif r is not None:
                text, color = _no_value(r)
                ax.text(1, y, f" {text} [{tag}]", va="center", fontsize=7, color=color)
        handles.append(Patch(color=colors[k % len(colors)], label=f"{tag} (this project)"))
    if ref is not None and len(ref):
        by_step = {r["step"]: r for r in ref.to_dict("records")}
        k = len(series)
        for i, s in enumerate(steps):
            r = by_step.get(s)
            if r is not None:
                y = ys[i] - 0.4 + height * (k + 0.5)
                v = float(r["tokens_per_sec"])
                ax.barh(y, v, height=height, color=REF_COLOR, hatch="//", edgecolor="#606060")
                values.append(v)
        handles.append(Patch(facecolor=REF_COLOR, hatch="//", edgecolor="#606060", label=REF_LABEL))
    ax.set_xscale("log")
    if values:
        ax.set_xlim(1, max(values) * 3)
    ax.set_yticks(ys, [f"{s}  {str(titles.get(s, ''))[:34]}" for s in steps])
    ax.set_ylim(len(steps) - 0.5, -0.5)
    ax.set_xlabel("tokens / s (log scale)")
    ax.set_title("Throughput per step, every hardware tag")
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---------------------------------------------------------------- README
def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _fmt(v, spec: str) -> str:
    f = _num(v)
    return "–" if f is None else format(f, spec)


def results_markdown(tag_dirs, base: Path) -> str:
    """A markdown table per tag, with links (relative to `base`) to its charts."""
    parts = [
        "<!-- generated by plot_results.py from results/<tag>/summary.csv; edits here are "
        "overwritten -->",
        "",
    ]
    if not tag_dirs:
        parts.append(
            "_No results yet: run `python -m harness run`, then `python plot_results.py`._"
        )
    for tag_dir in tag_dirs:
        tag_dir = Path(tag_dir)
        df = read_summary(tag_dir)
        desc = _describe(df)
        parts += [
            f"#### `{tag_dir.name}`" + (f": {desc}" if desc else ""),
            "",
            "| step | title | tok/s | speedup | peak reserved GiB | MFU | val loss | status |",
            "|---|---|--:|--:|--:|--:|--:|---|",
        ]
        rows = df.to_dict("records")
        skipped = [r["step"] for r in rows if (r.get("status") or "not run") == "not run"]
        for r in rows:
            if r["step"] in skipped:
                continue
            ok = _ok(r)
            status = r.get("status") or "not run"
            if not ok and r.get("reason"):
                reason = str(r["reason"])
                status += ": " + (reason if len(reason) <= 80 else reason[:79] + "…")
            mfu = _num(r.get("mfu")) if ok else None
            speed = _num(r.get("speedup_vs_00")) if ok else None
            parts.append(
                "| "
                + " | ".join(
                    _cell(x)
                    for x in (
                        r["step"],
                        r.get("title") or "",
                        _fmt(r.get("tokens_per_sec_median") if ok else None, ",.0f"),
                        "–" if speed is None else _speedup_text(speed),
                        _fmt(r.get("peak_reserved_gib") if ok else None, ".2f"),
                        "–" if mfu is None else f"{mfu * 100:.1f}%",
                        _fmt(r.get("val_loss") if ok else None, ".3f"),
                        status,
                    )
                )
                + " |"
            )
        links = [
            f"[{name}]({Path(os.path.relpath(tag_dir / png, base)).as_posix()})"
            for name, png in zip(("tok/s", "peak memory", "MFU"), CHARTS, strict=True)
        ]
        parts += [""]
        if skipped:
            parts += [f"Not run in this tag: steps {', '.join(skipped)}.", ""]
        parts += ["Charts: " + " · ".join(links), ""]
    if len(tag_dirs) > 1:
        comp = Path(os.path.relpath(Path(tag_dirs[0]).parent / COMPARISON, base)).as_posix()
        parts += [f"All tags side by side: [comparison]({comp})", ""]
    ref = Path(os.path.relpath(REFERENCE_CSV, base)).as_posix()
    if ref.startswith(".."):  # a README outside the repository: name the repository's file
        ref = REFERENCE_CSV.relative_to(ROOT).as_posix()
    parts.append(
        f"Reference, not our measurement: the published single-A100 figures of the original "
        f"ladder (Raschka, LLMs-from-scratch ch05/10) are in [{REFERENCE_CSV.name}]({ref}) and "
        "in the charts' grey hatched panels."
    )
    return "\n".join(parts)


def update_readme(readme_path: Path, tags) -> bool:
    """Rewrite the README between the results markers; warn and skip when they are missing."""
    readme_path = Path(readme_path)
    try:
        text = readme_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        print(f"warning: {readme_path} not found; README table not updated", file=sys.stderr)
        return False
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < 0 or j < i:
        print(
            f"warning: {readme_path} lacks the markers {BEGIN} ... {END}; README table not updated",
            file=sys.stderr,
        )
        return False
    body = results_markdown([Path(t) for t in tags], readme_path.resolve().parent)
    new = text[: i + len(BEGIN)] + "\n" + body + "\n" + text[j:]
    if new != text:
        tmp = readme_path.with_name(f".{readme_path.name}.tmp{os.getpid()}")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, readme_path)
    return True


# ---------------------------------------------------------------- completeness
def expected_steps(tag_dir: Path, root: Path = ROOT) -> list[str]:
    """Every ladder step; for a tag of N > 1 processes (`...-xN`) only the DDP steps, since the
    sweep runs every other step as one process, the same as the single-process tag."""
    m = re.search(r"-x(\d+)$", Path(tag_dir).name)
    if m and int(m.group(1)) > 1:
        return sorted(p.name[:2] for p in (root / "steps").glob("[0-9][0-9]_*ddp*.py"))
    return ladder_steps(root)


def check_complete(tag_dir: Path, steps: list[str] | None = None) -> list[str]:
    """What a tag lacks: a summary row (with a result, ok or failed) per ladder step, and the
    three charts. An empty list means complete."""
    tag_dir = Path(tag_dir)
    steps = expected_steps(tag_dir) if steps is None else steps
    problems = []
    if not (tag_dir / "summary.csv").is_file():
        return [f"{tag_dir}: no summary.csv"]
    df = read_summary(tag_dir)
    status = dict(zip(df["step"], df["status"], strict=True))
    for s in steps:
        if s not in status:
            problems.append(f"{tag_dir.name}: step {s} has no row in summary.csv")
        elif status[s] in (None, "not run"):
            problems.append(f"{tag_dir.name}: step {s} was not run")
    for png in CHARTS:
        if not (tag_dir / png).is_file():
            problems.append(f"{tag_dir.name}: {png} is missing")
    return problems


# ---------------------------------------------------------------- command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "tags",
        nargs="*",
        metavar="results/<tag>",
        help="tag folders to draw (default: every results/*/ with a summary.csv); the README "
        "table lists these",
    )
    p.add_argument("--no-readme", action="store_true", help="do not touch the README")
    p.add_argument(
        "--readme", default=str(ROOT / "README.md"), metavar="PATH", help="(default: README.md)"
    )
    args = p.parse_args(argv)
    if args.tags:
        tags = [Path(t) for t in args.tags]
        bad = [t for t in tags if not (t / "summary.csv").is_file()]
        if bad:
            print(f"error: {bad[0]}: no summary.csv there", file=sys.stderr)
            return 2
    else:
        tags = find_tags()
        if not tags:
            print("no results/*/summary.csv yet: run `python -m harness run` first")
            return 0
    for t in tags:
        for path in plot_tag(t):
            print(f"wrote {path}")
    if len(tags) > 1:
        print(f"wrote {plot_comparison(tags)}")
    if not args.no_readme and update_readme(Path(args.readme), tags):
        print(f"updated the results table in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
