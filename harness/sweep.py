"""`python -m harness run`: every step of the ladder in order, each in its own process.

Each run writes its record to a temporary results file in the tag folder (`.tmp-NN-<id>.jsonl`,
whose first line is the sweep's metadata for the run); the sweep then appends that record, plus a
`"sweep"` field, to `results/<tag>/runs.jsonl` (append + fsync) and deletes the temporary file.
A sweep killed at any moment loses no finished record and never duplicates one: on start, a
torn last line of runs.jsonl is cut off, and every leftover temporary file that holds a step's
record is copied in unless runs.jsonl already has its run id. `results/<tag>/summary.csv` is
rewritten atomically after every step.

A step counts as done (and is skipped on a rerun) when runs.jsonl holds `--repeats` `ok` records
for the same sweep configuration (preset, device, max_steps, warmup_steps, seed, data, nproc)
and the same script sha256, none of them followed by a failure. Failed steps are retried.
"""

import argparse
import collections
import ctypes
import datetime as dt
import json
import math
import os
import re
import selectors
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .cli import _non_negative, _positive
from .data import atomic_write_bytes
from .errors import UserError
from .record import append_jsonl, file_sha256, read_jsonl

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 1800
KILL_GRACE_S = 10.0  # SIGTERM first (torchrun then stops its workers), SIGKILL after this
RUNS = "runs.jsonl"
SUMMARY = "summary.csv"
SUMMARY_COLUMNS = [
    "step",
    "title",
    "tokens_per_sec_median",
    "tokens_per_sec_min",
    "tokens_per_sec_max",
    "speedup_vs_00",
    "peak_reserved_gib",
    "mfu",
    "train_loss",
    "val_loss",
    "status",
    "runs",
    "reason",
    "world_size",
    "preset",
    "device_name",
    "torch_version",
    "script",
]
NUMBER_COLUMNS = SUMMARY_COLUMNS[2:10]


# ---------------------------------------------------------------- the ladder
@dataclass(frozen=True)
class Step:
    num: str  # "05"
    path: Path
    title: str
    ddp: bool  # launched through torchrun

    @property
    def rel(self) -> str:
        try:
            return self.path.relative_to(ROOT).as_posix()
        except ValueError:
            return str(self.path)


_TITLE = re.compile(r"^\s*(?:[rRuU]?)(?:\"\"\"|''')\s*Step\s+\d+:\s*(.*?)\.(?:\s|$)")


def step_title(path: Path) -> str:
    """`Step NN: <title>.` from the docstring's first line; the file name if there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        first = ""
    m = _TITLE.match(first)
    if m and m.group(1).strip():
        return m.group(1).strip()
    return path.stem[3:].replace("_", " ") if path.stem[:2].isdigit() else path.stem


def discover(ladder_dir: Path = ROOT) -> list[Step]:
    """00_orig.py, then steps/NN_*.py in order; a `_ddp` in the name means torchrun."""
    ladder_dir = Path(ladder_dir).resolve()
    files = [ladder_dir / "00_orig.py"] if (ladder_dir / "00_orig.py").is_file() else []
    files += sorted((ladder_dir / "steps").glob("[0-9][0-9]_*.py"))
    steps, seen = [], set()
    for f in files:
        num = f.name[:2]
        if num in seen:
            raise UserError(f"two scripts for step {num} in {ladder_dir}: check steps/{num}_*.py")
        seen.add(num)
        steps.append(Step(num, f, step_title(f), "_ddp" in f.stem))
    if not steps:
        raise UserError(f"no step scripts in {ladder_dir} (00_orig.py, steps/NN_*.py)")
    return steps


def parse_steps(spec: str | None, steps: list[Step]) -> list[Step]:
    """`05-08`, `00,07,10` or a mix (`00-02,07`); every number named must be a step."""
    if spec is None or spec.strip() in ("", "all"):
        return list(steps)
    by_num = {s.num: s for s in steps}
    known = f"{steps[0].num}-{steps[-1].num}" if len(steps) > 1 else steps[0].num

    def num(text: str) -> str:
        text = text.strip()
        if not text.isdigit():
            raise UserError(f"--steps {spec}: {text!r} is not a step number (e.g. 05-08,10)")
        n = text.zfill(2)
        if n not in by_num:
            raise UserError(f"--steps {spec}: no step {n} in the ladder (steps {known})")
        return n

    chosen: set[str] = set()
    for part in spec.split(","):
        if not part.strip():
            continue
        if "-" in part:
            lo, _, hi = part.partition("-")
            lo, hi = num(lo), num(hi)
            if lo > hi:
                raise UserError(f"--steps {spec}: range {lo}-{hi} runs backwards")
            chosen.update(n for n in by_num if lo <= n <= hi)
        else:
            chosen.add(num(part))
    if not chosen:
        raise UserError(f"--steps {spec}: no steps named (e.g. 05-08 or 00,07,10)")
    return [s for s in steps if s.num in chosen]


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
        return f"{slug(cuda_info()[1])}-x{nproc}"
    if device_type == "mps":
        import platform

        base = f"apple-mps-{slug(platform.machine())}"
    else:
        base = f"cpu-{os.cpu_count()}c"
    return base if nproc == 1 else f"{base}-x{nproc}"


# ---------------------------------------------------------------- records
def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _repair_tail(path: Path) -> None:
    """Cut a torn last line (killed mid-append) so the next append starts on a fresh line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())


def load_runs(tag_dir: Path) -> list[dict]:
    """runs.jsonl's records in order, one per run id (a duplicate would be the later copy)."""
    out, seen = [], set()
    for r in read_jsonl(Path(tag_dir) / RUNS):
        if not isinstance(r, dict) or "step" not in r:
            continue
        rid = (r.get("sweep") or {}).get("run_id")
        if rid is not None:
            if rid in seen:
                continue
            seen.add(rid)
        out.append(r)
    return out


def recover(tag_dir: Path) -> int:
    """Copy finished records left in temporary files by a killed sweep; delete the files.

    Returns how many records were copied. A temporary file without a step record (the run was
    cut short) is just deleted; one whose run id runs.jsonl already has (killed between append
    and delete) too.
    """
    tag_dir = Path(tag_dir)
    runs = tag_dir / RUNS
    _repair_tail(runs)
    have = {(r.get("sweep") or {}).get("run_id") for r in load_runs(tag_dir)}
    copied = 0
    for tmp in sorted(tag_dir.glob(".tmp-*.jsonl")):
        lines = read_jsonl(tmp)
        meta = next((x["sweep_meta"] for x in lines if "sweep_meta" in x), None)
        recs = [x for x in lines if "step" in x and "sweep_meta" not in x]
        if meta and recs and meta.get("run_id") not in have:
            rec = dict(recs[0])
            rec["sweep"] = dict(meta, exit_code=None, recovered=True)
            append_jsonl(runs, rec)
            have.add(meta.get("run_id"))
            copied += 1
        tmp.unlink(missing_ok=True)
    return copied


def _matching(records: list[dict], step: Step, config: dict, sha: str) -> list[dict]:
    return [
        r
        for r in records
        if r.get("step") == step.num
        and (r.get("sweep") or {}).get("config") == config
        and (r.get("sweep") or {}).get("script_sha256") == sha
    ]


def _ok_since_failure(matching: list[dict]) -> list[dict]:
    last_fail = max((i for i, r in enumerate(matching) if r.get("status") != "ok"), default=-1)
    return matching[last_fail + 1 :]


def done_runs(records, step: Step, config: dict, sha: str) -> int:
    """ok runs that count toward --repeats (same config and script, after the last failure)."""
    return len(_ok_since_failure(_matching(records, step, config, sha)))


def _median(values):
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def summarize(steps, records, configs: dict, shas: dict, repeats: int):
    """The tidy table: one row per ladder step, numbers only for steps whose last run was ok."""
    import pandas as pd

    rows = []
    for s in steps:
        matching = _matching(records, s, configs[s.num], shas[s.num])
        row = dict.fromkeys(SUMMARY_COLUMNS)
        row.update(step=s.num, title=s.title, script=s.rel, runs=0)
        if not matching:
            row["status"] = "not run"
        elif matching[-1].get("status") != "ok":
            last = matching[-1]
            fails = 0
            for r in reversed(matching):
                if r.get("status") == "ok":
                    break
                fails += 1
            row.update(status=last.get("status") or "error", reason=last.get("reason"), runs=fails)
        else:
            oks = _ok_since_failure(matching)[-repeats:]
            tps = [r["tokens_per_sec"] for r in oks if r.get("tokens_per_sec") is not None]
            reserved = [
                r["peak_mem_reserved_bytes"]
                for r in oks
                if r.get("peak_mem_reserved_bytes") is not None
            ]
            last = oks[-1]
            row.update(
                status="ok",
                runs=len(oks),
                tokens_per_sec_median=_median(tps),
                tokens_per_sec_min=min(tps) if tps else None,
                tokens_per_sec_max=max(tps) if tps else None,
                peak_reserved_gib=max(reserved) / 2**30 if reserved else None,
                mfu=_median(r.get("mfu") for r in oks),
                train_loss=_median(r.get("train_loss") for r in oks),
                val_loss=_median(r.get("val_loss") for r in oks),
            )
        if matching:
            last = matching[-1]
            row.update(
                world_size=last.get("world_size"),
                preset=last.get("preset") or configs[s.num].get("preset"),
                device_name=last.get("device_name"),
                torch_version=last.get("torch_version"),
            )
        rows.append(row)
    base = next((r for r in rows if r["step"] == "00"), None)
    base_tps = base["tokens_per_sec_median"] if base and base["status"] == "ok" else None
    for r in rows:
        if base_tps and r["status"] == "ok" and r["tokens_per_sec_median"] is not None:
            r["speedup_vs_00"] = r["tokens_per_sec_median"] / base_tps
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    for col in NUMBER_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.round(
        {
            "tokens_per_sec_median": 1,
            "tokens_per_sec_min": 1,
            "tokens_per_sec_max": 1,
            "speedup_vs_00": 3,
            "peak_reserved_gib": 4,
            "mfu": 5,
            "train_loss": 4,
            "val_loss": 4,
        }
    )
    df["runs"] = df["runs"].astype(int)
    df["world_size"] = df["world_size"].astype("Int64")
    return df


def write_summary(tag_dir: Path, df) -> Path:
    """summary.csv, replaced atomically (readers never see half a file)."""
    path = Path(tag_dir) / SUMMARY
    atomic_write_bytes(path, df.to_csv(index=False).encode("utf-8"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp made it 0600
    return path


def format_table(df) -> str:
    """The summary as a fixed-width text table for the terminal."""

    def num(v, fmt):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    head = ["step", "title", "tok/s", "speedup", "peak GiB", "MFU", "val loss", "status", "runs"]
    lines = []
    for r in df.to_dict("records"):
        status = r["status"]
        if status not in ("ok", "not run") and isinstance(r.get("reason"), str):
            status = f"{status}: {r['reason'][:60]}"
        lines.append(
            [
                r["step"],
                str(r["title"])[:42],
                num(r["tokens_per_sec_median"], "{:,.0f}"),
                num(r["speedup_vs_00"], "{:.2f}x"),
                num(r["peak_reserved_gib"], "{:.2f}"),
                num(r["mfu"] * 100 if r["mfu"] == r["mfu"] else None, "{:.1f}%"),
                num(r["val_loss"], "{:.3f}"),
                status,
                str(r["runs"]),
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=False)]
    right = {2, 3, 4, 5, 6, 8}

    def fmt(cells):
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        ).rstrip()

    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines)])


# ---------------------------------------------------------------- running one step
_LIBC = None
if sys.platform.startswith("linux"):
    try:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    except OSError:
        _LIBC = None
_PR_SET_PDEATHSIG = 1


def _child_setup(parent_pid: int):
    """In the child before exec: its own process group (so a timeout can kill all of it) and,
    on Linux, SIGTERM when the sweep dies (a kill -9'd sweep leaves no step running)."""

    def setup():
        os.setpgid(0, 0)
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent_pid:  # the sweep died before prctl took effect
                os._exit(143)

    return setup


def _descendants(pid: int) -> list[int]:
    """All processes below `pid` (Linux /proc), torchrun's workers in their own sessions too."""
    children = collections.defaultdict(list)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[ppid].append(int(e))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the step's process group, SIGKILL it (and any stray descendant) after `grace`."""
    below = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


@dataclass
class ChildResult:
    exit_code: int | None
    timed_out: bool
    stderr_tail: list[str]
    duration_s: float


def run_child(cmd: list[str], timeout: float, indent: str = "      ") -> ChildResult:
    """Run `cmd`, pass its output through live (indented), keep its last stderr lines."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        preexec_fn=_child_setup(os.getpid()),
    )
    tail: collections.deque[str] = collections.deque(maxlen=60)
    sel = selectors.DefaultSelector()
    bufs = {}
    for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
        sel.register(stream, selectors.EVENT_READ, out)
        bufs[stream.fileno()] = b""

    def emit(line: bytes, out) -> None:
        text = line.decode("utf-8", errors="replace").rstrip()
        if out is sys.stderr and text.strip():
            tail.append(text)
        print(indent + text if text else "", file=out, flush=True)

    timed_out = False
    exited_at = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now - t0 > timeout:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 5.0:
                break  # the step is gone; a stray grandchild keeps the pipe open
            for key, _ in sel.select(timeout=0.5):
                fd = key.fileobj.fileno()
                chunk = os.read(fd, 65536)
                if not chunk:
                    if bufs[fd]:
                        emit(bufs[fd], key.data)
                        bufs[fd] = b""
                    sel.unregister(key.fileobj)
                    continue
                data = bufs[fd] + chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                *lines, bufs[fd] = data.split(b"\n")
                for line in lines:
                    emit(line, key.data)
        if timed_out:
            kill_tree(proc)
        else:
            remaining = max(0.1, timeout - (time.monotonic() - t0))
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_tree(proc)
    except BaseException:  # Ctrl-C / SIGTERM on the sweep: take the step down with it
        kill_tree(proc, grace=5.0)
        raise
    finally:
        for fd, rest in bufs.items():
            if rest:
                print(indent + rest.decode("utf-8", errors="replace"), flush=True)
                bufs[fd] = b""
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    return ChildResult(
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        stderr_tail=list(tail),
        duration_s=round(time.monotonic() - t0, 2),
    )


_EXC_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")


def failure_reason(tail: list[str], exit_code: int | None) -> str:
    """The informative last stderr line: the last `error: ...`, else the last exception line
    (torchrun's ChildFailedError summary skipped), else the last line, else the exit code."""
    lines = [ln.strip() for ln in tail if ln.strip() and not set(ln.strip()) <= set("=-*")]
    for ln in reversed(lines):
        if ln.startswith("error:"):
            return ln[len("error:") :].strip()
    for ln in reversed(lines):
        if _EXC_LINE.match(ln) and "ChildFailedError" not in ln:
            return ln
    if lines:
        return lines[-1]
    if exit_code is not None and exit_code < 0:
        try:
            return f"killed by signal {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


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


class _Lock:
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


def _flags(args, data: str | None) -> list[str]:
    out = ["--device", args.device, "--seed", str(args.seed)]
    if args.preset is not None:
        out += ["--preset", args.preset]
    if args.max_steps is not None:
        out += ["--max-steps", str(args.max_steps)]
    if args.warmup_steps is not None:
        out += ["--warmup-steps", str(args.warmup_steps)]
    if data is not None:
        out += ["--data", data]
    return out


def step_command(step: Step, flags: list[str], nproc: int, results: Path) -> list[str]:
    cmd = [sys.executable]
    if step.ddp:  # stock torchrun, with this interpreter
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return cmd + [str(step.path), *flags, "--results", str(results)]


def run_once(step: Step, flags: list[str], meta: dict, tag_dir: Path, timeout: float) -> dict:
    """One run of one step: temp results file -> record (the step's, or a synthesized one) ->
    appended to runs.jsonl -> temp file deleted."""
    tmp = tag_dir / f".tmp-{step.num}-{meta['run_id'][:12]}.jsonl"
    cmd = step_command(step, flags, meta["config"]["nproc"], tmp)
    meta = dict(meta, command=cmd)
    append_jsonl(tmp, {"sweep_meta": meta})
    started_at = _now_iso()
    try:
        res = run_child(cmd, timeout)
    except BaseException:  # interrupted: keep the temp file only if it holds a record to recover
        if not [x for x in read_jsonl(tmp) if "step" in x and "sweep_meta" not in x]:
            tmp.unlink(missing_ok=True)
        raise
    recs = [x for x in read_jsonl(tmp) if "step" in x and "sweep_meta" not in x]
    rec = dict(recs[0]) if recs else None
    if res.timed_out or rec is None:
        if res.timed_out:
            status, reason = "timeout", f"timed out after {timeout:g} s"
        elif res.exit_code == 0:
            status = "error"
            reason = "exited 0 without writing a record"
        else:
            status = "oom" if res.exit_code == 3 else "error"
            reason = failure_reason(res.stderr_tail, res.exit_code)
        rec = {
            "step": step.num,
            "script": step.rel,
            "status": status,
            "reason": reason,
            "script_sha256": meta["script_sha256"],
            "started_at": started_at,
            "duration_s": res.duration_s,
        }
    elif res.exit_code != 0 and rec.get("status") == "ok":  # e.g. another DDP rank failed
        rec["status"] = "error"
        rec["reason"] = (
            f"exit code {res.exit_code} after an ok record: "
            f"{failure_reason(res.stderr_tail, res.exit_code)}"
        )
    elif rec.get("status") != "ok" and not rec.get("reason"):
        rec["reason"] = failure_reason(res.stderr_tail, res.exit_code)
    rec["sweep"] = dict(meta, exit_code=res.exit_code, duration_s=res.duration_s)
    append_jsonl(tag_dir / RUNS, rec)
    tmp.unlink(missing_ok=True)
    return rec


def sweep(args) -> int:
    ladder = discover(Path(args.ladder_dir) if args.ladder_dir else ROOT)
    selected = parse_steps(args.steps, ladder)
    if args.data is not None and not Path(args.data).is_file():
        raise UserError(f"--data {args.data}: no such file")
    data = str(Path(args.data).resolve()) if args.data is not None else None
    device_type = resolve_device(args.device)
    nproc = args.nproc or default_nproc(device_type)
    tag = args.tag or hardware_tag(device_type, nproc)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", tag):
        raise UserError(f"--tag {tag!r}: use letters, digits, '.', '_' and '-'")
    tag_dir = Path(args.results_dir) / tag
    tag_dir.mkdir(parents=True, exist_ok=True)
    flags = _flags(args, data)

    configs, shas = {}, {}
    for s in ladder:
        configs[s.num] = {
            "preset": args.preset,
            "device": args.device,
            "max_steps": args.max_steps,
            "warmup_steps": args.warmup_steps,
            "seed": args.seed,
            "data": data,
            "nproc": nproc if s.ddp else 1,
        }
        shas[s.num] = file_sha256(s.path)

    with _Lock(tag_dir):
        copied = recover(tag_dir)
        if copied:
            print(f"recovered {copied} finished record(s) left by an interrupted sweep")
        records = load_runs(tag_dir)
        write_summary(tag_dir, summarize(ladder, records, configs, shas, args.repeats))

        plan = {}
        for s in selected:
            have = 0 if args.force else done_runs(records, s, configs[s.num], shas[s.num])
            plan[s.num] = max(0, args.repeats - have)
        runs_left = sum(plan.values())
        print(
            f"sweep {tag}: {len(selected)} step(s), {runs_left} run(s) to do, "
            f"{args.repeats} per step; results in {tag_dir}",
            flush=True,
        )
        t_start = time.monotonic()
        durations: list[float] = []
        for i, s in enumerate(selected, 1):
            head = f"[{i}/{len(selected)}] step {s.num} {s.title}"
            if plan[s.num] == 0:
                print(f"{head}: up to date ({args.repeats} ok run(s)), skipped", flush=True)
                continue
            first = args.repeats - plan[s.num] + 1
            for rep in range(first, args.repeats + 1):
                elapsed = time.monotonic() - t_start
                eta = _fmt_duration(statistics.mean(durations) * runs_left) if durations else "?"
                rep_txt = f" (run {rep}/{args.repeats})" if args.repeats > 1 else ""
                print(
                    f"{head}{rep_txt} ... elapsed {_fmt_duration(elapsed)}, ETA {eta}",
                    flush=True,
                )
                meta = {
                    "run_id": uuid.uuid4().hex,
                    "tag": tag,
                    "repeat": rep,
                    "config": configs[s.num],
                    "script_sha256": shas[s.num],
                }
                rec = run_once(s, flags, meta, tag_dir, args.timeout)
                durations.append(rec["sweep"]["duration_s"])
                runs_left -= 1
                if rec["status"] == "ok":
                    tps = rec.get("tokens_per_sec")
                    rate = f"{tps:,.0f} tok/s" if isinstance(tps, (int, float)) else "no tok/s"
                    print(f"      -> ok: {rate} in {_fmt_duration(durations[-1])}", flush=True)
                else:
                    print(f"      -> FAILED ({rec['status']}): {rec.get('reason')}", flush=True)
                records = load_runs(tag_dir)
                write_summary(tag_dir, summarize(ladder, records, configs, shas, args.repeats))
                if rec["status"] != "ok":
                    runs_left -= args.repeats - rep  # no point repeating a failure
                    break

        df = summarize(ladder, records, configs, shas, args.repeats)
        write_summary(tag_dir, df)
    print()
    print(f"summary ({tag_dir / SUMMARY}):")
    print(format_table(df), flush=True)
    if not args.no_plots:
        try:
            plots = _plot_results()
            written = plots.plot_tag(tag_dir)
            tags = plots.find_tags(Path(args.results_dir))
            if len(tags) > 1:
                written.append(plots.plot_comparison(tags))
            print("charts: " + ", ".join(str(p) for p in written))
        except Exception as e:  # the records and summary are safe; only the charts are missing
            print(
                f"warning: charts not drawn ({e.__class__.__name__}: {e}); results are in "
                f"{tag_dir}; retry with `python plot_results.py {tag_dir}`",
                file=sys.stderr,
            )
    failed = [r for r in df.to_dict("records") if r["step"] in {s.num for s in selected}]
    failed = [r for r in failed if r["status"] != "ok"]
    if failed:
        print(
            "failed: " + ", ".join(f"step {r['step']} ({r['status']})" for r in failed),
            file=sys.stderr,
        )
        return 1
    return 0


def _plot_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("plot_results", ROOT / "plot_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    p.add_argument("--preset", metavar="NAME", help="passed to each step (default: the step's)")
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda", "mps"],
        default="auto",
        help="passed to each step (default: auto)",
    )
    p.add_argument("--max-steps", type=_positive, metavar="N", help="passed to each step")
    p.add_argument("--warmup-steps", type=_non_negative, metavar="N", help="passed to each step")
    p.add_argument("--data", metavar="PATH", help="training text, passed to each step")
    p.add_argument("--seed", type=int, default=123, help="passed to each step (default: 123)")
    p.add_argument(
        "--repeats",
        type=_positive,
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
        type=_positive,
        metavar="N",
        help="processes for DDP steps (default: visible CUDA GPUs, 1 on CPU)",
    )
    p.add_argument(
        "--results-dir",
        default=str(ROOT / "results"),
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
    if args.preset is not None:
        from .presets import PRESETS

        if args.preset not in PRESETS:
            raise UserError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        return sweep(args)
    except KeyboardInterrupt:
        print("error: interrupted; finished runs are kept, rerun to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
