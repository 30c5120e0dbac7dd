"""Results records: one JSON line per run, appended and fsynced so no finished run is lost."""

import ast
import hashlib
import io
import json
import math
import os
import subprocess
import tokenize
from pathlib import Path

FIELDS = [
    "step",
    "script",
    "status",
    "device",
    "device_name",
    "world_size",
    "preset",
    "batch_size",
    "workers",  # the training DataLoader's worker processes (--workers)
    "context_length",
    "tokens_per_sec",
    "step_time_ms",
    "peak_mem_reserved_bytes",
    "peak_mem_allocated_bytes",
    "mfu",
    "train_loss",
    "val_loss",
    "losses",
    "torch_version",
    "cuda_version",
    "git_sha",
    "git_sha_reason",  # why git_sha is null (no git, or the git repository is not the project's)
    "script_sha256",
    "code_sha256",  # the code that runs: the script without docstrings and comments (code_sha256)
    "started_at",
    "duration_s",
    "notes",
    "step_active",  # false: this step's own optimization did nothing here (see inactive_reason)
    "inactive_reason",
    "interpreted",  # true: Triton's interpreter ran step 12's kernel on a CPU: numerics only
    "regime",  # the numbers it computed with: fp32, tf32, bf16, +compiled (speed_ladder.parity)
    "compiles",  # torch.compile: {graphs, frames, seconds}, null when eager (speed_ladder.parity)
    "batch_rule",  # null, or how the batch was lowered to fit this GPU (measure/settings.fit_batch)
    "gpu_idle_share",  # the timed window's share with no kernel running (measure/gpu_idle.py)
    "gpu_idle_ms_per_step",
    "gpu_idle_source",  # how it was measured, or why it is null
    "phase_ms",  # median ms of data, forward, backward, optimizer (measure/phases.py)
    "data_share",  # data's median over the median step: the share of a step waiting on data
]


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one line and fsync it: a crash or kill -9 after this returns loses nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=False) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.filename is None:  # a failed write names no file: name it
            e.filename = str(path)
        raise


def jsonl_lines(path: str | Path):
    """(line number, value or None, raw bytes) per non-blank line; a line that is not UTF-8 or
    not JSON has the value None. Missing file: nothing."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return
    for n, raw in enumerate(data.split(b"\n"), 1):
        line = raw.removeprefix(b"\xef\xbb\xbf") if n == 1 else raw  # a BOM (Windows editors)
        if not line.strip():
            continue
        try:
            yield n, json.loads(line.decode("utf-8")), raw
        except ValueError:  # UnicodeDecodeError is one too
            yield n, None, raw


def read_jsonl(path: str | Path) -> list:
    """Records of a file; a torn or unreadable line (killed mid-write) is skipped, not fatal."""
    return [v for _, v, _ in jsonl_lines(path) if v is not None]


def mfu_problem(value) -> str | None:
    """Why an MFU cannot be right, or None when it can: a fraction in (0, 1]. Above 1 the peak
    it was taken over is too low (a CPU peak measured on a busy machine, a wrong cache). The
    reason never repeats the absurd number (the record keeps it in `mfu_invalid.value`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "MFU is not a number"
    if value <= 0:
        return "MFU is not above 0: the peak FLOP/s or the throughput it comes from is wrong"
    if value > 1:
        return "MFU above 100%: the peak FLOP/s it divides by is too low"
    return None


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_sha256(path: str | Path) -> str:
    """sha256 of the code that runs: the file's text less its docstrings (module, class and
    function: ast's positions), its comments (tokenize's) and blank lines, trailing spaces and
    line ends. A docstring or comment edit keeps it; a code edit changes it. Text cut at source
    positions, which every Python 3.10-3.13 reports alike, where ast.dump (3.13 drops empty
    fields) and the token stream (3.12 splits f-strings) change with the version."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    text = "\n".join(lines) + "\n"
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    cuts = [(*t.start, *t.end) for t in tokens if t.type == tokenize.COMMENT]
    for doc in _docstrings(ast.parse(text)):
        chars = lambda row, col: len(lines[row - 1].encode()[:col].decode())  # noqa: E731
        start = (doc.lineno, chars(doc.lineno, doc.col_offset))
        cuts.append((*start, doc.end_lineno, chars(doc.end_lineno, doc.end_col_offset)))
    for row, col, end_row, end_col in sorted(cuts, reverse=True):
        lines[row - 1 : end_row] = [lines[row - 1][:col] + lines[end_row - 1][end_col:]]
    code = "\n".join(ln.rstrip() for ln in lines if ln.strip())
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def _docstrings(tree: ast.AST) -> list[ast.Expr]:
    """The docstring statements of a module and of its classes and functions."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    firsts = [n.body[0] for n in ast.walk(tree) if isinstance(n, kinds) and n.body]
    return [
        d
        for d in firsts
        if isinstance(d, ast.Expr)
        and isinstance(d.value, ast.Constant)
        and isinstance(d.value.value, str)
    ]


def _git(where: Path, *args: str) -> str | None:
    res = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
    return res.stdout.strip() if res.returncode == 0 else None


def git_state(where: Path) -> dict:
    """{"git_sha": HEAD of the checkout (with '-dirty' when tracked files differ from it),
    "git_sha_reason": None}, or a null sha and why. A sha is recorded only when the git
    repository's top level is `where` itself (the project's root): a copy of the project (a `git
    archive` export, an unpacked tarball) inside another repository would otherwise record that
    repository's HEAD, a commit that is not this project's."""
    try:
        top = _git(where, "rev-parse", "--show-toplevel")
        if top is None:
            return {"git_sha": None, "git_sha_reason": "not a git checkout"}
        if Path(top).resolve() != Path(where).resolve():
            return {"git_sha": None, "git_sha_reason": "the project's folder is not the top of "
                    "its git repository (a copy inside another repository?)"}  # fmt: skip
        sha = _git(where, "rev-parse", "--verify", "-q", "HEAD")
        if not sha:
            return {"git_sha": None, "git_sha_reason": "a git repository without a commit"}
        dirty = _git(where, "status", "--porcelain", "--untracked-files=no") or ""
        return {"git_sha": sha + ("-dirty" if dirty else ""), "git_sha_reason": None}
    except (OSError, subprocess.SubprocessError) as e:
        return {"git_sha": None, "git_sha_reason": f"git did not run ({e.__class__.__name__})"}


def git_sha(where: Path) -> str | None:
    """The checkout's HEAD (`git_state`), or None."""
    return git_state(where)["git_sha"]
