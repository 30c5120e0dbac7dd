"""The sweep's store, `results/<tag>/runs.jsonl`: one record per run, never lost, never doubled.

Each run writes its record to a temporary results file in the tag folder (`.tmp-NN-<id>.jsonl`,
whose first line is the sweep's metadata for the run); the sweep then appends that record, plus
a `"sweep"` field, to runs.jsonl (append + fsync) and deletes the temporary file. A sweep killed
at any moment loses no finished record and never duplicates one: on start, a torn last line of
runs.jsonl is cut off (and kept in runs.jsonl.cut), and every leftover temporary file that holds
a step's record is copied in unless runs.jsonl already has its run id. A last line that parses
but lacks its newline (an editor saved it so) is a record: it gets its newline, not cut.

A line the sweep cannot use (not UTF-8, not JSON, JSON of the wrong shape) is skipped with one
warning naming it, and left in the file as it is.

Which of its records count (a step's runs, done, used by its summary row) is selection.py's.
"""

import json
import os
from pathlib import Path

from speed_ladder.errors import warn
from speed_ladder.ladder import Step
from speed_ladder.records import append_jsonl, jsonl_lines, read_jsonl

RUNS = "runs.jsonl"
CUT = "runs.jsonl.cut"  # torn last lines cut off by a repair, kept here
TMP_GLOB = ".tmp-*.jsonl"


def tmp_path(tag_dir: Path, step: Step, run_id: str) -> Path:
    """The temporary results file one run of `step` writes its record to."""
    return Path(tag_dir) / f".tmp-{step.num}-{run_id[:12]}.jsonl"


def step_records(tmp: Path) -> list[dict]:
    """The step's own records in a temporary results file (not the sweep's metadata line)."""
    return [
        x
        for x in read_jsonl(tmp)
        if isinstance(x, dict) and "sweep_meta" not in x and record_problem(x) is None
    ]


def _parses(line: bytes) -> bool:
    try:
        json.loads(line.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
        return True
    except ValueError:
        return False


def _snippet(raw: bytes, width: int = 60) -> str:
    text = raw.decode("utf-8", errors="backslashreplace").strip()
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def _repair_tail(path: Path) -> None:
    """End runs.jsonl with a newline, so the next append starts a line of its own: a last line
    that parses (a record an editor saved without its newline) keeps it and gets one; a torn one
    (killed mid-append) is cut, copied to runs.jsonl.cut first, and a line says what was cut."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if not data or data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    tail = data[keep:]
    if not tail.strip() or _parses(tail):
        with open(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        return
    cut = path.with_name(CUT)
    with open(cut, "ab") as f:
        f.write(tail + b"\n")
        f.flush()
        os.fsync(f.fileno())
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    line = data.count(b"\n") + 1
    warn(
        f"{path}: cut a torn last line (line {line}, {len(tail)} bytes, kept in {cut.name}): "
        f"{_snippet(tail)}"
    )


_NUMBERS = ("tokens_per_sec", "step_time_ms", "peak_mem_reserved_bytes", "mfu", "train_loss",
            "val_loss", "world_size", "duration_s")  # fmt: skip
_HASHES = ("script_sha256", "code_sha256")
_TEXTS = ("status", "reason", "preset", "device_name", "torch_version", "script", *_HASHES)


def _kind(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else "null"
    )


def record_problem(r) -> str | None:
    """Why a runs.jsonl value is not a record the sweep can use, or None when it is one."""
    if not isinstance(r, dict):
        return f"{_kind(r)}, not a JSON object"
    if not isinstance(r.get("step"), str):
        return f'"step" is {_kind(r.get("step"))}, not a string like "05"'
    for k in _NUMBERS:
        v = r.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f'"{k}" is {_kind(v)}, not a number'
    for k in _TEXTS:
        if r.get(k) is not None and not isinstance(r.get(k), str):
            return f'"{k}" is {_kind(r.get(k))}, not a string'
    sweep = r.get("sweep")
    if sweep is not None:
        if not isinstance(sweep, dict):
            return f'"sweep" is {_kind(sweep)}, not an object'
        for k, want in (("run_id", str), ("config", dict), ("script_sha256", str),
                        ("code_sha256", str), ("machine", dict), ("round", int),
                        ("host", str)):  # fmt: skip
            if sweep.get(k) is not None and not isinstance(sweep.get(k), want):
                return f'"sweep.{k}" is {_kind(sweep.get(k))}'
    return None


def _unparsed(raw: bytes) -> str | None:
    """Why a line that read as None does not parse (None: it is JSON's null)."""
    try:
        json.loads(raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8: byte {e.start}"
    except ValueError as e:
        return f"not JSON: {e.msg} at column {e.colno}"
    return record_problem(None)


_WARNED: set = set()


def load_runs(tag_dir: Path) -> list[dict]:
    """runs.jsonl's records in order, one per run id (a duplicate would be the later copy). A
    line it cannot use is skipped, with one warning per line and process, and left in place."""
    path = Path(tag_dir) / RUNS
    out, seen = [], set()
    for n, r, raw in jsonl_lines(path):
        why = _unparsed(raw) if r is None else record_problem(r)
        if why is not None:
            key = (str(path), n, raw)
            if key not in _WARNED:
                _WARNED.add(key)
                warn(f"{path} line {n} skipped ({why}): {_snippet(raw)}; it is left in the file")
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
    for tmp in sorted(tag_dir.glob(TMP_GLOB)):
        metas = [x.get("sweep_meta") for x in read_jsonl(tmp) if isinstance(x, dict)]
        meta = next((m for m in metas if isinstance(m, dict)), None)
        recs = step_records(tmp)
        if meta and recs and meta.get("run_id") not in have:
            rec = dict(recs[0])
            rec["sweep"] = dict(meta, exit_code=None, recovered=True)
            append_jsonl(runs, rec)
            have.add(meta.get("run_id"))
            copied += 1
        tmp.unlink(missing_ok=True)
    return copied
