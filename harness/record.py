"""Results records: one JSON line per run, appended and fsynced so no finished run is lost."""

import hashlib
import json
import os
import subprocess
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
    "script_sha256",
    "started_at",
    "duration_s",
    "notes",
]


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one line and fsync it: a crash or kill -9 after this returns loses nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a file; a torn last line (killed mid-write) is skipped, not fatal."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_sha(where: Path) -> str | None:
    """HEAD of the checkout, with '-dirty' when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        )
        sha = head.stdout.strip()
        if head.returncode != 0 or not sha:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
