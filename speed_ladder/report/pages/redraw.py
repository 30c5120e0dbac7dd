"""Charts, the tags' pages and the README's results from the sweep's summaries
(`python plot_results.py`).

    python plot_results.py                     # every results/<tag>/ with a summary.csv
    python plot_results.py results/cpu-8c      # just these
    python plot_results.py --no-readme         # charts only
    python plot_results.py --rebuild           # summaries again from runs.jsonl first

Per tag folder: tokens_per_sec.png (bars labelled with the speedup over step 00, min-max error
bars), peak_memory.png (peak reserved GiB), mfu.png (MFU %), gain_vs_prev.png (each step's
own effect over the previous step, with its interval and verdict) and, when some step was
profiled (--profile), time_breakdown.png (where each step's time goes) and, where its records
have phases, phases.png (each step's data wait, forward, backward, optimizer); a time-to-loss tag
(--to-loss) also loss_curves.png and time_to_target.png (charts/loss_chart.py); a failed step is a
"failed (oom)" label at zero, never a bar, and an inactive step a hatched bar, "inactive here".
With several tags, results/comparison.png gives every tag's speedup over its own step 00 per
step beside the reference's (charts/comparison_chart.py), so that ladders of different hardware
compare, and results/gpu_vs_a100.png the same for the 1-process GPU tags alone, the README's
chart. The published single-A100 figures of the reference ladder (Raschka, LLMs-from-scratch
ch05/10, results/reference/published_a100_ladder.csv) are drawn in their own grey, hatched
panel, labelled as such: they are not this project's measurements. From the same summaries:
each tag's page, results/<tag>/README.md (its full table, notes and charts), the README's
results between `<!-- results:begin -->` and `<!-- results:end -->` (the GPU ladders beside the
published A100's, and a line linking each tag's page), and LADDER.md beside it (ladder_page.py:
each step's change, why, cost and measured effect), and the memory ladder (memory_page.py:
docs/memory-ladder.md and docs/memory.md's fit table).
A tag folder in results/local/ (this machine's own, from `python -m speed_ladder run`) gets
its charts only: it never enters the README, LADDER.md, a page or the comparisons until
`python -m speed_ladder publish` adds it to results/.
Headless: matplotlib's Agg backend, no display needed.
"""

import argparse
import re
import sys
from pathlib import Path

from speed_ladder import ladder, writable
from speed_ladder.errors import (
    UserError,
    broken_pipe,
    flush_stdout,
    is_environment_os_error,
    os_error_line,
    warn,
)
from speed_ladder.files import LOCAL_RESULTS, ROOT, is_within, shown
from speed_ladder.report import to_loss
from speed_ladder.report.charts.bar_charts import CHARTS, plot_tag
from speed_ladder.report.charts.comparison_chart import plot_comparison, plot_gpu_comparison
from speed_ladder.report.charts.gain_chart import GAIN_CHART, plot_gains
from speed_ladder.report.charts.loss_chart import plot_to_loss
from speed_ladder.report.charts.phase_chart import plot_phases
from speed_ladder.report.charts.time_chart import plot_time_breakdown
from speed_ladder.report.compare.reference import gpu_ladders
from speed_ladder.report.pages import memory_page
from speed_ladder.report.pages.ladder_page import PAGE, write_page
from speed_ladder.report.pages.readme import update_readme
from speed_ladder.report.pages.tag_page import PAGE as TAG_PAGE
from speed_ladder.report.pages.tag_page import write_pages
from speed_ladder.report.summary import SUMMARY, find_tags, read_summary, rebuild, write_summary
from speed_ladder.store import RUNS

TAG_CHARTS = (*CHARTS, GAIN_CHART)


def draw_charts(tag_dirs, all_tags=None) -> list[Path]:
    """Each tag's four charts (its time breakdown when profiled, its phases where timed), and
    results/comparison.png of `all_tags` (default: these) when there are several, and
    results/gpu_vs_a100.png of their 1-process GPU tags; returns the files written."""
    tag_dirs = [Path(t) for t in tag_dirs]
    all_tags = tag_dirs if all_tags is None else list(all_tags)
    steps = ladder.rungs()
    written = [
        path
        for t in tag_dirs
        for path in [
            *plot_tag(t),
            plot_gains(t),
            *plot_time_breakdown(t),
            *plot_phases(t),
            *plot_to_loss(t, steps),
        ]  # fmt: skip
    ]
    readable = []
    for t in all_tags:  # another tag's broken summary costs the comparison that tag only
        try:
            read_summary(t)
            readable.append(t)
        except UserError as e:
            warn(f"{e}; left out of the comparison chart")
    if len(readable) > 1:
        written.append(plot_comparison(readable))
    gpus = gpu_ladders(readable)
    if gpus:
        written.append(plot_gpu_comparison(gpus))
    return written


def write_docs(readme: Path, tags, say=print, pages=None) -> bool:
    """The README's results and LADDER.md beside it, from `tags`' summaries, and the pages of
    `pages` (default: every tag); False (and a warning) when the README has no results
    markers."""
    if not update_readme(Path(readme), tags):
        return False
    say(f"updated the results in {shown(readme)}")
    say(f"wrote {shown(write_page(Path(readme).parent / PAGE, tags))}")
    for page in memory_page.write(
        tags, Path(readme).parent
    ):  # docs/memory-ladder.md, docs/memory.md's fit table
        say(f"wrote {shown(page)}")
    for page in write_pages(tags if pages is None else pages):
        say(f"wrote {shown(page)}")
    return True


def rebuild_summaries(tags) -> None:
    """Each tag's summary.csv again from its runs.jsonl (1-process tags first: the N-process
    tags' scaling efficiency is over their runs), and a time-to-loss tag's to_loss.csv."""
    steps = ladder.discover(ROOT)
    single = {}
    for t in sorted(tags, key=lambda t: ladder.tag_processes(Path(t).name)):
        t = Path(t)
        if not (t / RUNS).is_file():
            continue
        n = ladder.tag_processes(t.name)
        base = re.sub(r"-x\d+$", "", t.name)
        df, used = rebuild(t, ladder.expected_steps(steps, t.name), single.get(base), n)
        if n == 1:
            single[base] = used
        write_summary(t, df)
        print(f"rebuilt {t / SUMMARY} from {t / RUNS}")
        if to_loss.write(t, ladder.expected_steps(steps, t.name)) is not None:
            print(f"rebuilt {t / to_loss.TO_LOSS} from {t / RUNS}")


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
    p.add_argument(
        "--no-readme",
        action="store_true",
        help=f"do not touch the README (nor {PAGE} beside it, nor the tags' pages)",
    )
    p.add_argument(
        "--readme", default=str(ROOT / "README.md"), metavar="PATH", help="(default: README.md)"
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="first rewrite each tag's summary.csv from its runs.jsonl (e.g. after the "
        "summary's columns changed); a tag without runs.jsonl keeps its summary",
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
            print("no results/*/summary.csv yet: run `python -m speed_ladder run` first")
            return 0
    if args.rebuild:
        rebuild_summaries(tags)
    for t in tags:  # every summary readable, every output writable, before anything is drawn
        read_summary(t)
        writable.check_dir(t, "results folder")
    local = [t for t in tags if is_within(t, LOCAL_RESULTS)]  # this machine's own: charts only
    tags = [t for t in tags if t not in local]
    readme = not args.no_readme and bool(tags)
    if readme and Path(args.readme).exists():  # a missing README is only a warning
        writable.check_file(args.readme, "--readme")
        writable.check_file(Path(args.readme).parent / PAGE, "the ladder page")
        for t in tags:
            writable.check_file(t / TAG_PAGE, "a tag's page")
    for path in draw_charts(local, []) + (draw_charts(tags) if tags else []):
        print(f"wrote {path}")
    if local:
        print(f"{', '.join(str(t) for t in local)}: this machine's own results (not committed): "
              "charts only, never the README, LADDER.md or results/comparison.png; `python -m "
              "speed_ladder publish` adds them to results/")  # fmt: skip
    if readme:
        write_docs(Path(args.readme), tags)
    return 0
