"""The sweep's store, `results/<tag>/runs.jsonl`: one record per run, never lost, never doubled.

Each run writes its record to a temporary results file in the tag folder (`.tmp-NN-<id>.jsonl`,
whose first line is the sweep's metadata for the run); the sweep then appends that record, plus
a `"sweep"` field, to runs.jsonl (append + fsync) and deletes the temporary file. A sweep killed
at any moment loses no finished record and never duplicates one: on start, a torn last line of
runs.jsonl is cut off, and every leftover temporary file that holds a step's record is copied in
unless runs.jsonl already has its run id.

A step counts as done when runs.jsonl holds enough `ok` records for the same sweep
configuration and the same script sha256, none of them followed by a failure.
"""

import os
from pathlib import Path

from .ladder import Step
from .record import append_jsonl, read_jsonl

RUNS = "runs.jsonl"
TMP_GLOB = ".tmp-*.jsonl"


def tmp_path(tag_dir: Path, step: Step, run_id: str) -> Path:
    """The temporary results file one run of `step` writes its record to."""
    return Path(tag_dir) / f".tmp-{step.num}-{run_id[:12]}.jsonl"


def step_records(tmp: Path) -> list[dict]:
    """The step's own records in a temporary results file (not the sweep's metadata line)."""
    return [x for x in read_jsonl(tmp) if "step" in x and "sweep_meta" not in x]


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
    for tmp in sorted(tag_dir.glob(TMP_GLOB)):
        meta = next((x["sweep_meta"] for x in read_jsonl(tmp) if "sweep_meta" in x), None)
        recs = step_records(tmp)
        if meta and recs and meta.get("run_id") not in have:
            rec = dict(recs[0])
            rec["sweep"] = dict(meta, exit_code=None, recovered=True)
            append_jsonl(runs, rec)
            have.add(meta.get("run_id"))
            copied += 1
        tmp.unlink(missing_ok=True)
    return copied


def matching(records: list[dict], step: Step, config: dict, sha: str) -> list[dict]:
    """The records of `step` run with this sweep configuration and this script."""
    return [
        r
        for r in records
        if r.get("step") == step.num
        and (r.get("sweep") or {}).get("config") == config
        and (r.get("sweep") or {}).get("script_sha256") == sha
    ]


def ok_since_failure(records: list[dict]) -> list[dict]:
    """The ok records after the last failed one."""
    last_fail = max((i for i, r in enumerate(records) if r.get("status") != "ok"), default=-1)
    return records[last_fail + 1 :]


def done_runs(records, step: Step, config: dict, sha: str) -> int:
    """ok runs that count toward --repeats (same config and script, after the last failure)."""
    return len(ok_since_failure(matching(records, step, config, sha)))
