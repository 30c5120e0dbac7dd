"""The command line of `python -m speed_ladder run` (its flags, and the wrapper that turns Ctrl-C, a
closed stdout or a full disk into one line); the sweep itself is driver.py."""

import argparse
import signal
import sys

from speed_ladder.errors import UserError, broken_pipe, is_environment_os_error, os_error_line
from speed_ladder.files import LOCAL_RESULTS
from speed_ladder.flags import add_step_flags, positive
from speed_ladder.presets import check_name
from speed_ladder.store import RUNS
from speed_ladder.sweep.driver import sweep

DEFAULT_TIMEOUT = 1800
DEFAULT_WAIT_S = 600.0


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return v


def add_run_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="run the ladder's steps, record and summarize them",
        description="Run every step of the ladder (00_orig.py, steps/NN_*.py) in rounds, each "
        "run in its own process (distributed steps through torchrun), and write "
        "results/local/<tag>/runs.jsonl (one record per run), summary.csv and the charts "
        "there (git ignores results/local/; the committed results/<tag>/ folders are never "
        "written by a run), and close with this machine's tok/s beside the committed tag of "
        "the same hardware, else the closest; `python -m speed_ladder publish` adds them to "
        "results/. On N GPUs (or --nproc N) every step runs on one process in the <tag>-x1 "
        "folder and the distributed steps again on N in <tag>-xN. On the GPU presets each step "
        "runs 10 warm-up and 50 timed steps (presets.SWEEP_LENGTH; --warmup-steps and "
        "--max-steps override), not its full epochs. A rerun skips steps that "
        "already have --repeats ok runs for the same settings, script and machine; failed steps "
        "are retried. Exit status 1 if a step failed, 2 on bad input, 3 when --budget ran out "
        "with runs left.",
    )
    p.add_argument(
        "--steps", metavar="SPEC", help="steps to run: 05-08, 00,07,10 or a mix (default: all)"
    )
    add_step_flags(p, passed_only=True)
    p.add_argument(
        "--repeats",
        type=positive,
        default=1,
        metavar="K",
        help="rounds: every chosen step once per round, K rounds (all of them in order, then "
        "again); the summary gives each step's median, min and max, and its gain over the "
        "previous step with an interval (default: 1)",
    )
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument(
        "--control",
        dest="control",
        action="store_true",
        default=None,
        help="an A/A control: the first chosen step run twice per round, to measure the noise "
        "floor (default: on from 2 rounds)",
    )
    ctl.add_argument("--no-control", dest="control", action="store_false", help="no A/A control")
    p.add_argument(
        "--wait-quiet",
        nargs="?",
        type=_positive_float,
        const=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="before each run, wait until other processes use at most the busy threshold of "
        f"CPU cores, at most SECONDS (default {DEFAULT_WAIT_S:.0f}), then run anyway; without "
        "it the sweep only says when the machine is busy",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"per run; a step past it is killed and recorded as timeout "
        f"(default: {DEFAULT_TIMEOUT})",
    )
    p.add_argument(
        "--budget",
        type=_positive_float,
        metavar="SECONDS",
        help="wall-clock limit for the whole sweep (a GPU rented by the hour, a batch job's "
        "limit): a run starts only when its expected duration fits in what is left, one still "
        "going at the end is stopped and not recorded, and the sweep exits 3 naming the runs "
        "left; the same command resumes with them (default: no limit)",
    )
    p.add_argument(
        "--nproc",
        type=positive,
        metavar="N",
        help="processes for the distributed steps' second pass, in <tag>-xN (default: visible "
        "CUDA GPUs, 1 on CPU: no second pass)",
    )
    p.add_argument(
        "--results-dir",
        default=str(LOCAL_RESULTS),
        metavar="DIR",
        help="where the <tag> folders go (default: results/local/ in the repository, which "
        "git ignores); a folder git tracks is refused",
    )
    p.add_argument(
        "--tag",
        help="results folder name, without the -xN the sweep adds (default: the hardware, e.g. "
        "cpu-amd-epyc-7763-64-core-16c, nvidia-h100-80gb-hbm3)",
    )
    p.add_argument("--force", action="store_true", help="rerun steps that are up to date")
    p.add_argument("--no-plots", action="store_true", help="do not redraw the charts")
    p.add_argument("--ladder-dir", help=argparse.SUPPRESS)  # tests: a ladder of fixture scripts
    p.set_defaults(func=_run_command)
    return p


def _run_command(args) -> int:
    check_name(args.preset)
    if sys.platform == "win32":  # flock, process groups, PR_SET_PDEATHSIG: POSIX only
        raise UserError(
            "python -m speed_ladder run needs Linux or macOS (it supervises each step's process "
            "group); on Windows use WSL2, or run a step by hand: "
            "python steps/05_bf16.py --results results.jsonl"
        )

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        return sweep(args)
    except KeyboardInterrupt:
        print("error: interrupted; finished runs are kept, rerun to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `python -m speed_ladder run | head`
        broken_pipe("output closed (broken pipe); finished runs are kept, rerun to resume")
    except OSError as e:
        if not is_environment_os_error(e):
            raise
        print(
            f"error: {os_error_line(e)}; finished runs are kept (a record not yet in "
            f"{RUNS} stays in its .tmp file and the next sweep recovers it)",
            file=sys.stderr,
        )
        return 1
    finally:
        signal.signal(signal.SIGTERM, old)
