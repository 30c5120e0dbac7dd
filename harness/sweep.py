"""`python -m harness run`: every step of the ladder in order, each in its own process, recorded
in `results/<tag>/` (the tag names the hardware), one sweep per tag folder at a time.

A step counts as done (and is skipped on a rerun) when runs.jsonl holds `--repeats` `ok` records
for the same sweep configuration (preset, device, max_steps, warmup_steps, seed, data, nproc)
and the same script sha256, none of them followed by a failure. Failed steps are retried.
`--profile` and `--trace` (harness.profile) do not change the configuration, but a profiled
sweep counts only the latest runs that have a time breakdown, and reruns the others.
`results/<tag>/summary.csv` is rewritten atomically after every step. How the records survive a
kill is in runs.py; how a step's process is supervised, in child.py.
"""

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import outputs, report
from .child import failure_reason, run_child
from .cli import add_step_flags, child_argv, positive, run_config
from .errors import UserError, broken_pipe, is_environment_os_error, os_error_line
from .files import RESULTS, ROOT
from .ladder import Step, discover, parse_steps, processes_suffix
from .presets import check_name
from .profile import profiled_runs
from .record import append_jsonl, file_sha256
from .runs import RUNS, done_runs, load_runs, matching, recover, step_records, tmp_path
from .summary import SUMMARY, find_tags, format_table, summarize, write_summary

DEFAULT_TIMEOUT = 1800


# ---------------------------------------------------------------- hardware tag
def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def resolve_device(name: str) -> str:
    """--device auto|cpu|cuda|mps -> the device type the steps will use (as the harness does)."""
    from .device import resolve

    return resolve(name).type


_CUDA_INFO = None


def cuda_info() -> tuple[int, str]:
    """(visible GPUs, name of GPU 0), asked in a short child process: the sweep itself never
    initializes CUDA, so it holds no GPU memory while the steps run."""
    global _CUDA_INFO
    if _CUDA_INFO is None:
        code = (
            "import json, torch; "
            "print(json.dumps([torch.cuda.device_count(), torch.cuda.get_device_name(0)]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"cannot query the CUDA GPUs: {last}")
        count, name = json.loads(out.stdout.strip().splitlines()[-1])
        _CUDA_INFO = (int(count), str(name))
    return _CUDA_INFO


def default_nproc(device_type: str) -> int:
    return max(1, cuda_info()[0]) if device_type == "cuda" else 1


def hardware_tag(device_type: str, nproc: int) -> str:
    """`cpu-2c`, `nvidia-h200-x1`, ... : where the numbers were measured."""
    if device_type == "cuda":
        return slug(cuda_info()[1]) + processes_suffix(nproc)
    if device_type == "mps":
        import platform

        base = f"apple-mps-{slug(platform.machine())}"
    else:
        base = f"cpu-{os.cpu_count()}c"
    return base if nproc == 1 else base + processes_suffix(nproc)


# ---------------------------------------------------------------- one run
class Lock:
    """One sweep per tag folder at a time (flock; released by the OS if the sweep is killed)."""

    def __init__(self, tag_dir: Path):
        self.path = tag_dir / ".lock"
        self.f = None

    def __enter__(self):
        import fcntl

        while True:
            self.f = open(self.path, "a+")  # noqa: SIM115
            try:
                fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.f.close()
                raise UserError(
                    f"another sweep is writing {self.path.parent} (locked); wait for it, or "
                    "use --tag / --results-dir for a separate folder"
                ) from None
            try:  # the holder before us may have removed the file: lock the one on disk
                if os.stat(self.path).st_ino == os.fstat(self.f.fileno()).st_ino:
                    return self
            except FileNotFoundError:
                pass
            self.f.close()

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)
        self.f.close()


def step_command(step: Step, flags: list[str], nproc: int, results: Path) -> list[str]:
    cmd = [sys.executable]
    if step.ddp:  # stock torchrun, with this interpreter
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return cmd + [str(step.path), *flags, "--results", str(results)]


def _outcome(step: Step, rec: dict | None, res, meta: dict, started_at: str, timeout: float):
    """The run's record: the step's own, its status corrected by how the process ended, or one
    synthesized for a run that wrote none."""
    if res.timed_out or rec is None:
        if res.timed_out:
            status, reason = "timeout", f"timed out after {timeout:g} s"
        elif res.exit_code == 0:
            status = "error"
            reason = "exited 0 without writing a record"
        else:
            status = "oom" if res.exit_code == 3 else "error"
            reason = failure_reason(res.stderr_tail, res.exit_code)
        return {
            "step": step.num,
            "script": step.rel,
            "status": status,
            "reason": reason,
            "script_sha256": meta["script_sha256"],
            "started_at": started_at,
            "duration_s": res.duration_s,
        }
    if res.exit_code != 0 and rec.get("status") == "ok":  # e.g. another DDP rank failed
        rec["status"] = "error"
        rec["reason"] = (
            f"exit code {res.exit_code} after an ok record: "
            f"{failure_reason(res.stderr_tail, res.exit_code)}"
        )
    elif rec.get("status") != "ok" and not rec.get("reason"):
        rec["reason"] = failure_reason(res.stderr_tail, res.exit_code)
    return rec


def run_once(step: Step, flags: list[str], meta: dict, tag_dir: Path, timeout: float) -> dict:
    """One run of one step: temp results file -> record (the step's, or a synthesized one) ->
    appended to runs.jsonl -> temp file deleted."""
    tmp = tmp_path(tag_dir, step, meta["run_id"])
    cmd = step_command(step, flags, meta["config"]["nproc"], tmp)
    meta = dict(meta, command=cmd)
    append_jsonl(tmp, {"sweep_meta": meta})
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        res = run_child(cmd, timeout)
    except BaseException:  # interrupted: keep the temp file only if it holds a record to recover
        if not step_records(tmp):
            tmp.unlink(missing_ok=True)
        raise
    recs = step_records(tmp)
    rec = _outcome(step, dict(recs[0]) if recs else None, res, meta, started_at, timeout)
    rec["sweep"] = dict(meta, exit_code=res.exit_code, duration_s=res.duration_s)
    append_jsonl(tag_dir / RUNS, rec)
    tmp.unlink(missing_ok=True)
    return rec


# ---------------------------------------------------------------- the sweep
def _fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


@dataclass
class Plan:
    """What a sweep does and where: the ladder, the steps chosen, the tag folder, the steps'
    flags, and per step the configuration and script sha256 that identify its runs."""

    ladder: list[Step]
    selected: list[Step]
    tag: str
    tag_dir: Path
    flags: list[str]
    configs: dict[str, dict]
    shas: dict[str, str]
    repeats: int

    def summarize(self, records: list[dict]):
        """The summary of `records`, written to summary.csv."""
        df = summarize(self.ladder, records, self.configs, self.shas, self.repeats)
        write_summary(self.tag_dir, df)
        return df


def check_outputs(tag_dir: Path) -> None:
    """Before any step runs: the tag folder (and --results-dir) can be made and written, and
    runs.jsonl and summary.csv in it, where they exist, are files that can be written."""
    try:
        outputs.check_dir(tag_dir, "results folder")
    except UserError as e:  # e.g. results/ in a read-only checkout
        raise UserError(f"{e}; --results-dir DIR chooses another place") from None
    for name in (RUNS, SUMMARY):
        outputs.check_file(tag_dir / name, "results file")


def plan(args) -> Plan:
    steps = discover(Path(args.ladder_dir) if args.ladder_dir else ROOT)
    selected = parse_steps(args.steps, steps)
    if args.data is not None:
        from .data import check_text_file

        check_text_file(args.data)
    data = str(Path(args.data).resolve()) if args.data is not None else None
    values = dict(vars(args), data=data)
    if args.trace is not None:  # every step writes its trace there (harness.profile)
        outputs.check_dir(args.trace, "--trace")
        values["trace"] = str(Path(args.trace).resolve())
    device_type = resolve_device(args.device)
    nproc = args.nproc or default_nproc(device_type)
    tag = args.tag or hardware_tag(device_type, nproc)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", tag):
        raise UserError(f"--tag {tag!r}: use letters, digits, '.', '_' and '-'")
    tag_dir = Path(args.results_dir) / tag
    check_outputs(tag_dir)
    tag_dir.mkdir(parents=True, exist_ok=True)
    configs = {s.num: dict(run_config(values), nproc=nproc if s.ddp else 1) for s in steps}
    shas = {s.num: file_sha256(s.path) for s in steps}
    return Plan(steps, selected, tag, tag_dir, child_argv(values), configs, shas, args.repeats)


def _run_steps(p: Plan, records: list[dict], force: bool, timeout: float) -> list[dict]:
    """Run each chosen step until it has --repeats ok runs (a failure ends its repeats); returns
    runs.jsonl's records after the last run."""
    todo = {}
    for s in p.selected:
        have = 0 if force else done_runs(records, s, p.configs[s.num], p.shas[s.num])
        if {"--profile", "--trace"} & set(p.flags):  # profiled: latest runs with a breakdown
            have = min(have, profiled_runs(matching(records, s, p.configs[s.num], p.shas[s.num])))
        todo[s.num] = max(0, p.repeats - have)
    runs_left = sum(todo.values())
    print(
        f"sweep {p.tag}: {len(p.selected)} step(s), {runs_left} run(s) to do, "
        f"{p.repeats} per step; results in {p.tag_dir}",
        flush=True,
    )
    t_start, durations = time.monotonic(), []
    for i, s in enumerate(p.selected, 1):
        head = f"[{i}/{len(p.selected)}] step {s.num} {s.title}"
        if todo[s.num] == 0:
            print(f"{head}: up to date ({p.repeats} ok run(s)), skipped", flush=True)
            continue
        for rep in range(p.repeats - todo[s.num] + 1, p.repeats + 1):
            elapsed = _fmt_duration(time.monotonic() - t_start)
            eta = _fmt_duration(statistics.mean(durations) * runs_left) if durations else "?"
            rep_txt = f" (run {rep}/{p.repeats})" if p.repeats > 1 else ""
            print(f"{head}{rep_txt} ... elapsed {elapsed}, ETA {eta}", flush=True)
            meta = {
                "run_id": uuid.uuid4().hex,
                "tag": p.tag,
                "repeat": rep,
                "config": p.configs[s.num],
                "script_sha256": p.shas[s.num],
            }
            rec = run_once(s, p.flags, meta, p.tag_dir, timeout)
            durations.append(rec["sweep"]["duration_s"])
            runs_left -= 1
            if rec["status"] == "ok":
                tps = rec.get("tokens_per_sec")
                rate = f"{tps:,.0f} tok/s" if isinstance(tps, (int, float)) else "no tok/s"
                print(f"      -> ok: {rate} in {_fmt_duration(durations[-1])}", flush=True)
            else:
                print(f"      -> FAILED ({rec['status']}): {rec.get('reason')}", flush=True)
            records = load_runs(p.tag_dir)
            p.summarize(records)
            if rec["status"] != "ok":
                runs_left -= p.repeats - rep  # no point repeating a failure
                break
    return records


def _draw_charts(tag_dir: Path, results_dir: Path) -> None:
    """The tag's charts and, with several tags, the comparison; a failure is only a warning."""
    try:
        written = report.draw_charts([tag_dir], find_tags(results_dir))
        print("charts: " + ", ".join(str(p) for p in written))
    except BrokenPipeError:
        raise
    except Exception as e:  # the records and summary are safe; only the charts are missing
        print(
            f"warning: charts not drawn ({e.__class__.__name__}: {e}); results are in "
            f"{tag_dir}; retry with `python plot_results.py {tag_dir}`",
            file=sys.stderr,
        )


def sweep(args) -> int:
    p = plan(args)
    with Lock(p.tag_dir):
        copied = recover(p.tag_dir)
        if copied:
            print(f"recovered {copied} finished record(s) left by an interrupted sweep")
        records = load_runs(p.tag_dir)
        p.summarize(records)
        records = _run_steps(p, records, args.force, args.timeout)
        df = p.summarize(records)
    print()
    print(f"summary ({p.tag_dir / SUMMARY}):")
    print(format_table(df), flush=True)
    if not args.no_plots:
        _draw_charts(p.tag_dir, Path(args.results_dir))
    chosen = {s.num for s in p.selected}
    failed = [r for r in df.to_dict("records") if r["step"] in chosen and r["status"] != "ok"]
    if failed:
        print(
            "failed: " + ", ".join(f"step {r['step']} ({r['status']})" for r in failed),
            file=sys.stderr,
        )
        return 1
    return 0


# ---------------------------------------------------------------- command line
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
        description="Run every step of the ladder (00_orig.py, steps/NN_*.py) in order, each in "
        "its own process (DDP steps through torchrun), and write results/<tag>/runs.jsonl "
        "(one record per run), results/<tag>/summary.csv and the charts. A rerun skips steps "
        "that already have --repeats ok runs for the same settings and script; failed steps "
        "are retried. Exit status 1 if a step failed, 2 on bad input.",
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
        help="runs per step; the summary shows their median, min and max (default: 1)",
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
        "--nproc",
        type=positive,
        metavar="N",
        help="processes for DDP steps (default: visible CUDA GPUs, 1 on CPU)",
    )
    p.add_argument(
        "--results-dir",
        default=str(RESULTS),
        metavar="DIR",
        help="where the <tag> folders go (default: results/ in the repository)",
    )
    p.add_argument(
        "--tag",
        help="results folder name (default: hardware and process count, e.g. cpu-8c, "
        "nvidia-h100-80gb-hbm3-x1)",
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
            "python -m harness run needs Linux or macOS (it supervises each step's process "
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
    except BrokenPipeError:  # `python -m harness run | head`
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
