"""Charts and the README results table from the sweep's summaries (`python plot_results.py`),
and whether a results tag is complete.

    python plot_results.py                     # every results/<tag>/ with a summary.csv
    python plot_results.py results/cpu-8c      # just these
    python plot_results.py --no-readme         # charts only

Per tag folder: tokens_per_sec.png (bars labelled with the speedup over step 00),
peak_memory.png (peak reserved GiB) and mfu.png (MFU %); a failed step is a "failed (oom)" label
at zero, never a bar; time_breakdown.png (where each step's time goes) when some step was
profiled (--profile). With several tags, results/comparison.png groups every tag's tok/s per
step. The published single-A100 figures of the reference ladder (Raschka, LLMs-from-scratch
ch05/10, results/reference/published_a100_ladder.csv) are drawn in their own grey, hatched
panel, labelled as such: they are not this project's measurements. The README's table between
`<!-- results:begin -->` and `<!-- results:end -->` is regenerated from the same summaries.
Headless: matplotlib's Agg backend, no display needed.
"""

import argparse
import sys
from pathlib import Path

from . import ladder, outputs
from .charts import CHARTS, plot_comparison, plot_tag
from .errors import (
    UserError,
    broken_pipe,
    flush_stdout,
    is_environment_os_error,
    os_error_line,
    warn,
)
from .files import ROOT
from .readme import update_readme
from .summary import SUMMARY, find_tags, read_summary
from .time_chart import plot_time_breakdown


def draw_charts(tag_dirs, all_tags=None) -> list[Path]:
    """Each tag's three charts (and its time breakdown when profiled), and
    results/comparison.png of `all_tags` (default: these) when there are several; returns the
    files written."""
    tag_dirs = [Path(t) for t in tag_dirs]
    all_tags = tag_dirs if all_tags is None else list(all_tags)
    written = [path for t in tag_dirs for path in plot_tag(t) + plot_time_breakdown(t)]
    readable = []
    for t in all_tags:  # another tag's broken summary costs the comparison that tag only
        try:
            read_summary(t)
            readable.append(t)
        except UserError as e:
            warn(f"{e}; left out of the comparison chart")
    if len(readable) > 1:
        written.append(plot_comparison(readable))
    return written


def expected_steps(tag_dir: Path, root: Path = ROOT) -> list[str]:
    """The step numbers a tag should hold (see `ladder.expected_steps`)."""
    steps = ladder.expected_steps(ladder.discover(root), Path(tag_dir).name)
    return [s.num for s in steps]


def check_complete(tag_dir: Path, steps: list[str] | None = None) -> list[str]:
    """What a tag lacks: a summary row (with a result, ok or failed) per ladder step, and the
    three charts. An empty list means complete."""
    tag_dir = Path(tag_dir)
    steps = expected_steps(tag_dir) if steps is None else steps
    problems = []
    if not (tag_dir / SUMMARY).is_file():
        return [f"{tag_dir}: no {SUMMARY}"]
    df = read_summary(tag_dir)
    status = dict(zip(df["step"], df["status"], strict=True))
    for s in steps:
        if s not in status:
            problems.append(f"{tag_dir.name}: step {s} has no row in {SUMMARY}")
        elif status[s] in (None, "not run"):
            problems.append(f"{tag_dir.name}: step {s} was not run")
    for png in CHARTS:
        if not (tag_dir / png).is_file():
            problems.append(f"{tag_dir.name}: {png} is missing")
    return problems


def main(argv=None) -> int:
    """plot_results.py: a bad summary, a full or read-only disk, Ctrl-C or a closed stdout is
    one `error:` line and a non-zero exit; the charts already written stay whole."""
    try:
        try:
            return _main(argv)
        finally:
            flush_stdout()  # a closed pipe is caught here, not at exit
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; the charts written so far are complete", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `python plot_results.py | head -1`
        broken_pipe()
    except OSError as e:
        if not is_environment_os_error(e):
            raise
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 1


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="plot_results.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        bad = [t for t in tags if not (t / SUMMARY).is_file()]
        if bad:
            print(f"error: {bad[0]}: no {SUMMARY} there", file=sys.stderr)
            return 2
    else:
        tags = find_tags()
        if not tags:
            print("no results/*/summary.csv yet: run `python -m harness run` first")
            return 0
    for t in tags:  # every summary readable, every output writable, before anything is drawn
        read_summary(t)
        outputs.check_dir(t, "results folder")
    if not args.no_readme and Path(args.readme).exists():  # a missing README is only a warning
        outputs.check_file(args.readme, "--readme")
    for path in draw_charts(tags):
        print(f"wrote {path}")
    if not args.no_readme and update_readme(Path(args.readme), tags):
        print(f"updated the results table in {args.readme}")
    return 0
