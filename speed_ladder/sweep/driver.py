"""`python -m speed_ladder run`: the ladder's steps in rounds, each run in its own process, recorded
in `results/local/<tag>/` (the tag names the hardware; git ignores results/local/), one sweep per
tag folder at a time.

- **Committed results are reference data.** A run never writes a folder git tracks (the committed
  results/<tag>/, or any with --results-dir): that is one error line. It closes with this machine's
  tok/s beside the committed tag of the same hardware, else the closest
  (report/compare/committed.py); `python -m speed_ladder publish` (report/publish.py) adds its
  folder to results/ after `check`.

- **Passes.** Every chosen step runs on one process (distributed steps through torchrun with
  one process) in `<hardware>-x1`; on N GPUs (or with --nproc N) the distributed steps run again
  on N processes in `<hardware>-xN`, whose summary gives their scaling efficiency against the
  `-x1` runs. 1-process and N-process results never share a folder.
- **Rounds.** With `--repeats K` the sweep runs K rounds, every chosen step once per round
  (all of them in order, then again), so slow drift of the machine spreads over all steps instead
  of landing on a few; from 2 rounds an A/A control (the first step run again right after
  itself) measures the noise floor (gains.py). A killed sweep resumes in its round: a step's
  round is one more than its ok runs so far (`sweep.round` in the record).
- **Up to date.** A step is skipped when runs.jsonl holds K `ok` records for the same sweep
  configuration (`sweep.config`, spec.sweep_config: the RunSpec's preset, device, max_steps,
  warmup_steps, seed and data as resolved, so a default and the flag that names it are one,
  and nproc; the text named by what it holds, not where it lives: files.data_id; a record from
  before the RunSpec is resolved as its step resolved it), the same code (the script's
  `code_sha256`: a docstring or comment edit reruns nothing; a record without one, by its
  `script_sha256`) and this machine's fingerprint (machine.py), none followed by a failure.
  Failed steps are retried; a failure ends that step's rounds in this sweep. `--profile` and
  `--trace` (speed_ladder.measure.profile) do not change the configuration, but a profiled sweep
  counts only the latest runs that have a time breakdown, and reruns the others.
- **Another machine's folder.** A tag folder holding records of another machine (committed
  results, or records without a fingerprint) is never written: the sweep uses
  `<hardware>-<6 hex digits of this machine's fingerprint>-xN` instead and says so.
- **A budget** (`--budget SECONDS`, for a GPU rented by the hour or a batch job's limit): a
  run starts only when its expected duration (preflight.py) fits in what is left (one that does
  not is passed over; a later one that fits still runs), a run still going when it ends is
  stopped and not recorded (`cuts.jsonl` keeps how long it lasted, so the next sweep does not
  start it again in less), and the sweep exits 3 naming the runs left; the same command resumes
  with them. The runs end within the budget; the summary and charts follow.
- **Before each run** it checks that other processes leave the machine quiet (measure/cpu_load.py;
  with --wait-quiet it waits, bounded), and prints the memory model's prediction for the run (the
  step does not print it again); before the first, the expected duration (preflight.py).
- **One RunSpec.** The plan resolves the runs' settings (speed_ladder.spec: preset, run length, the
  batch rule on this GPU, bf16) with the function every step resolves them with, so what it
  predicts and plans is the run the step does. Its types (Plan, Pass, Job) are plan.py's.

`<tag>/summary.csv` is rewritten atomically after every run. How the records survive a
kill is in store.py; how one run is launched and recorded, in launch.py.
"""

import json
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

from speed_ladder import machine, writable
from speed_ladder.errors import UserError
from speed_ladder.files import LOCAL_RESULTS, RESULTS, ROOT, portable_path, shown, tracked
from speed_ladder.flags import child_argv
from speed_ladder.ladder import (
    TO_LOSS_TAG,
    discover,
    expected_steps,
    parse_steps,
    processes_suffix,
)
from speed_ladder.measure.data import check_text_file
from speed_ladder.measure.device import is_rocm
from speed_ladder.measure.device import resolve as resolve_torch_device
from speed_ladder.measure.gpu_specs import autocast_for
from speed_ladder.measure.settings import resolve_spec
from speed_ladder.records import code_sha256
from speed_ladder.report import to_loss
from speed_ladder.report.compare import committed
from speed_ladder.report.pages import redraw as report
from speed_ladder.report.rows import format_table, pooled_text
from speed_ladder.report.summary import SUMMARY
from speed_ladder.selection import foreign
from speed_ladder.spec import RunSpec, sweep_config
from speed_ladder.store import RUNS, load_runs, recover
from speed_ladder.sweep import preflight
from speed_ladder.sweep.launch import Lock
from speed_ladder.sweep.plan import Job, Pass, Plan, summarize
from speed_ladder.sweep.rounds import labels, run_rounds

BUDGET_EXIT = 3  # --budget ended the sweep with runs left, none failed: rerun to resume


# ---------------------------------------------------------------- hardware
def resolve_device(name: str) -> str:
    """--device auto|cpu|cuda|mps -> the device type the steps will use (as the harness does)."""
    return resolve_torch_device(name).type


_CUDA_INFO = None


def cuda_info() -> tuple[int, str, int | None, list[dict]]:
    """(visible GPUs, name of GPU 0, its total memory in bytes, every visible GPU's properties
    for the fingerprint), asked in a short child process: the sweep itself never initializes
    CUDA, so it holds no GPU memory while the steps run."""
    global _CUDA_INFO
    if _CUDA_INFO is None:
        code = (
            f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from speed_ladder.machine import cuda_props; p = cuda_props(); "
            "print(json.dumps([len(p), p[0]['name'], p[0]['total_memory'], p]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"cannot query the CUDA GPUs: {last}")
        count, name, total, props = json.loads(out.stdout.strip().splitlines()[-1])
        _CUDA_INFO = (int(count), str(name), int(total), props)
    info = tuple(_CUDA_INFO) + (None,) * (4 - len(_CUDA_INFO))  # tests set the first three
    return info[0], info[1], info[2], info[3] or []


def default_nproc(device_type: str) -> int:
    return max(1, cuda_info()[0]) if device_type == "cuda" else 1


def tag_base(device_type: str) -> str:
    return machine.tag_base(device_type, cuda_info()[1] if device_type == "cuda" else None)


def this_machine(device_type: str) -> dict:
    if device_type == "cuda":
        count, name, _, props = cuda_info()
        return machine.fingerprint("cuda", name, count, props)
    return machine.fingerprint(device_type)


def capacity(device_type: str) -> int | None:
    """Memory one device offers: the GPU's total (CUDA), else the machine's RAM."""
    return cuda_info()[2] if device_type == "cuda" else machine.ram_bytes()


def gpu_of(device_type: str) -> tuple[int, str] | None:
    """(total memory, step 05's autocast there) of GPU 0, what device.gpu_memory gives a step on
    it: the batch rule's input for the sweep's RunSpec. None off CUDA (or without its
    properties)."""
    if device_type != "cuda":
        return None
    _, _, total, props = cuda_info()
    if not props or total is None:
        return None
    return int(total), autocast_for(SimpleNamespace(**props[0]), is_rocm())


def run_spec(values: dict, device_type: str) -> RunSpec:
    """The RunSpec every step of this sweep resolves (speed_ladder.spec), resolved here the same
    way: the same flags, the same device."""
    return resolve_spec(values, device_type, gpu_of(device_type))


# ---------------------------------------------------------------- the plan
def check_outputs(tag_dir: Path) -> None:
    """Before any step runs: the tag folder (and --results-dir) can be made and written, and
    runs.jsonl and summary.csv in it, where they exist, are files that can be written, and git
    tracks nothing in it (committed results are reference data, never written by a run)."""
    held = tracked(tag_dir)
    if held:
        raise UserError(
            f"{tag_dir} holds files git tracks ({held[0]}{', ...' if len(held) > 1 else ''}): "
            "committed results are reference data, never written by a run; leave out "
            f"--results-dir (this machine's go to {portable_path(LOCAL_RESULTS)}/), and `python "
            "-m speed_ladder publish` adds them to results/"
        )
    try:
        writable.check_dir(tag_dir, "results folder")
    except UserError as e:  # e.g. results/ in a read-only checkout
        raise UserError(f"{e}; --results-dir DIR chooses another place") from None
    for name in (RUNS, SUMMARY):
        writable.check_file(tag_dir / name, "results file")


def _others(tag_dir: Path, fp: dict) -> list[dict]:
    return foreign(load_runs(tag_dir), fp) if (tag_dir / RUNS).is_file() else []


def choose_base(results_dir: Path, base: str, nprocs: list[int], fp: dict, explicit: bool) -> str:
    """The tag base whose folders hold no other machine's records: `base`, else (for the
    default tag) `base-<short id of this machine>`; an explicit --tag of another's is an error."""
    taken_before = None
    for candidate in (base, f"{base}-{machine.short_id(fp)}"):
        taken = []
        for n in nprocs:
            tag_dir = Path(results_dir) / (candidate + processes_suffix(n))
            check_outputs(tag_dir)
            others = _others(tag_dir, fp)
            if others:
                taken.append((tag_dir, others[-1]))
        if not taken:
            if taken_before is not None:
                where, rec = taken_before
                print(
                    f"{where} holds another machine's records "
                    f"({machine.describe((rec.get('sweep') or {}).get('machine'))}); they are "
                    "left as they are, and this machine's go to "
                    + ", ".join(candidate + processes_suffix(n) for n in nprocs),
                    flush=True,
                )
            return candidate
        if explicit:
            where, rec = taken[0]
            raise UserError(
                f"{where} holds another machine's records "
                f"({machine.describe((rec.get('sweep') or {}).get('machine'))}); results of two "
                "machines never share a folder: choose another --tag"
            )
        taken_before = taken[0]
    raise UserError(f"{results_dir}: {base} and its variant hold other machines' records")


def _values(args) -> dict:
    """The flags' values, --data and --trace absolute: the steps' command lines (sweep_config
    names the text portably for the records, files.data_id)."""
    if args.data is not None:
        check_text_file(args.data)
    data = str(Path(args.data).resolve()) if args.data is not None else None
    values = dict(vars(args), data=data)
    if args.trace is not None:  # every step writes its trace there (speed_ladder.measure.profile)
        writable.check_dir(args.trace, "--trace")
        values["trace"] = str(Path(args.trace).resolve())
    return values


def plan(args) -> Plan:
    ladder = discover(Path(args.ladder_dir) if args.ladder_dir else ROOT)
    selected = parse_steps(args.steps, ladder)
    device_type = resolve_device(args.device)
    values = preflight.measuring_values(_values(args), device_type)
    nproc = args.nproc or default_nproc(device_type)
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.tag):
        raise UserError(f"--tag {args.tag!r}: use letters, digits, '.', '_' and '-'")
    hardware = tag_base(device_type)
    mode = TO_LOSS_TAG if args.to_loss is not None else ""  # its own folder: other records
    base = re.sub(r"-x\d+$", "", args.tag) if args.tag else hardware + mode
    fp = this_machine(device_type)
    nprocs = [1] + ([nproc] if nproc > 1 and any(s.distributed for s in selected) else [])
    base = choose_base(Path(args.results_dir), base, nprocs, fp, args.tag is not None)
    spec = run_spec(values, device_type)  # the text by name and sha256 (files.data_id)
    passes = []
    for n in nprocs:
        tag = base + processes_suffix(n)
        tag_dir = Path(args.results_dir) / tag
        tag_dir.mkdir(parents=True, exist_ok=True)
        held = expected_steps(ladder, tag)
        configs = {s.num: sweep_config(spec, n if s.distributed else 1) for s in held}
        shas = {s.num: code_sha256(s.path) for s in held}
        chosen = [s for s in selected if s in held]
        hw = hardware + processes_suffix(n)
        passes.append(Pass(tag, tag_dir, n, held, chosen, configs, shas, hw))
    # the A/A control: on from 2 rounds, and always for time to loss (its second seed)
    control = args.control if args.control is not None else args.repeats > 1 or bool(mode)
    p = Plan(passes, child_argv(values), args.repeats, fp, spec, control, capacity(device_type))
    p.committed = None if args.ladder_dir else RESULTS  # they measured this checkout's ladder
    p.data = values["data"]
    for i, ps in enumerate(passes):
        for k, s in enumerate(ps.steps):
            p.jobs.append(Job(i, s))
            if control and i == 0 and k == 0:
                p.jobs.append(Job(i, s, control=True))
    return p


def _draw_charts(tag_dir: Path) -> None:
    """The tag's charts; a failure is only a warning. (The comparison of every tag and the
    README table are plot_results.py's: a sweep never rewrites another tag's files.)"""
    try:
        written = report.draw_charts([tag_dir], [])
        print("charts: " + ", ".join(str(p) for p in written))
    except BrokenPipeError:
        raise
    except Exception as e:  # the records and summary are safe; only the charts are missing
        print(
            f"warning: charts not drawn ({e.__class__.__name__}: {e}); results are in "
            f"{tag_dir}; retry with `python plot_results.py {tag_dir}`",
            file=sys.stderr,
        )


def _compare(tag_dir: Path, df, hardware: str) -> None:
    """This tag's tok/s beside the committed tag of the same hardware (`hardware`, whatever
    --tag named the folder), else the closest (report/compare/committed.py); a failure is only a
    warning."""
    try:
        print(committed.compare(tag_dir, df, hardware=hardware), flush=True)
    except BrokenPipeError:
        raise
    except (UserError, ValueError, KeyError, OSError) as e:
        print(f"warning: no comparison with the committed results ({e})", file=sys.stderr)


def sweep(args) -> int:
    """Run the plan's rounds, then print each tag's summary, its comparison with the committed
    results (report/compare/committed.py) and the closing status lines: the runs --budget left,
    `parity off: step NN (...)` for a chosen step whose losses left the previous step's beyond its
    rule (speed_ladder/data/ladder.json; summary `parity`, parity.py), and `failed: ...`. Exit code:
    1 when a step failed, else BUDGET_EXIT (3) when runs were left, else 0; parity is information
    and never changes it (the run measured what it measured; the tests, tests/test_ladder.py, are
    where a step's numerics must hold)."""
    budget = getattr(args, "budget", None)
    deadline = time.monotonic() + budget if budget else None
    p = plan(args)
    with ExitStack() as stack:
        for ps in p.passes:
            stack.enter_context(Lock(ps.tag_dir))
        for ps in p.passes:
            copied = recover(ps.tag_dir)
            if copied:
                print(f"recovered {copied} finished record(s) left by an interrupted sweep")
        summarize(p)
        left = run_rounds(p, args.force, args.timeout, args.wait_quiet, deadline)
        dfs = summarize(p)
    # steps the --budget left undone are "not run", not failed; one whose last record (from an
    # earlier sweep) is a failure is still reported failed
    unfinished = {(p.passes[j.pass_index].tag, j.step.num) for j in left}
    failed, parity_off = [], []
    for ps in p.passes:
        df = dfs[ps.tag]
        print()
        print(f"summary ({shown(ps.tag_dir / SUMMARY)}):")
        print(format_table(df), flush=True)
        pooled = pooled_text(df.to_dict("records"))
        if pooled:
            print(pooled, flush=True)
        if p.spec.to_loss is not None:  # the times to the target, not tok/s alone
            path = to_loss.write(ps.tag_dir, ps.ladder)
            if path is not None:
                print(f"\ntime to loss {p.spec.to_loss.target:g} ({shown(path)}):")
                print(to_loss.format_rows(to_loss.read(ps.tag_dir)), flush=True)
        if not args.no_plots:
            _draw_charts(ps.tag_dir)
        if p.spec.to_loss is None:
            _compare(ps.tag_dir, df, ps.hardware)
        chosen = {s.num for s in ps.steps}
        failed += [
            f"step {r['step']} ({r['status']}{', ' + ps.tag if len(p.passes) > 1 else ''})"
            for r in df.to_dict("records")
            if r["step"] in chosen
            and r["status"] != "ok"
            and not (r["status"] == "not run" and (ps.tag, r["step"]) in unfinished)
        ]
        where = f", {ps.tag}" if len(p.passes) > 1 else ""
        parity_off += [
            f"step {r['step']} ({r.get('parity_detail')}{where})"
            for r in df.to_dict("records")
            if r["step"] in chosen and r.get("parity") == "off"
        ]
    if Path(args.results_dir).resolve() == LOCAL_RESULTS.resolve():
        print(f"these results are this machine's own ({LOCAL_RESULTS.name}/, which git ignores); "
              "`python -m speed_ladder publish` checks them and adds them to results/, the "
              "README and LADDER.md")  # fmt: skip
    if left:
        print(f"not run, --budget {budget:g} s ran out: {', '.join(labels(p, left))}; the same "
              "command resumes with them", file=sys.stderr)  # fmt: skip
    if parity_off:  # information: the exit code stays what the runs make it
        print("parity off: " + "; ".join(parity_off), file=sys.stderr)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return BUDGET_EXIT if left else 0
