"""One run of one step in the sweep: its command (torchrun for a distributed step), its
process, and its record, the step's own or one made up for a run that wrote none, appended to
runs.jsonl. Also the lock that keeps one sweep per tag folder.

An out-of-memory on any rank is `oom`, not `error`: the rank's `error: out of memory` line (or
torchrun's `exitcode: 3` for it) on the job's stderr makes it so, whatever rank 0 recorded.
"""

import datetime as dt
import os
import sys
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import portable_path
from speed_ladder.ladder import Step
from speed_ladder.measure.memory_model import PREDICTED_ENV
from speed_ladder.records import append_jsonl
from speed_ladder.store import RUNS, step_records, tmp_path
from speed_ladder.sweep.child import failure_reason, run_child


def _oom_reason(res) -> str:
    line = res.oom_line or ""
    if "error: out of memory" in line:
        return line[line.index("error: out of memory") + len("error: ") :].strip()
    reason = failure_reason(res.stderr_tail, res.exit_code)
    return reason if "out of memory" in reason else f"out of memory on a rank: {reason}"


class Lock:
    """One sweep per tag folder at a time (flock; released by the OS if the sweep is killed)."""

    def __init__(self, tag_dir: Path):
        self.path = tag_dir / ".lock"
        self.f = None

    WAIT_S = 5  # a sweep killed just now: its processes' files close a moment after the kill

    def __enter__(self):
        import fcntl
        import time

        deadline = time.monotonic() + self.WAIT_S
        while True:
            self.f = open(self.path, "a+")  # noqa: SIM115
            try:
                fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.f.close()
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
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
    if step.distributed:  # stock torchrun, with this interpreter, on 1 or N processes
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return cmd + [str(step.path), *flags, "--results", str(results)]


def recorded_command(cmd: list[str], tag_dir: Path) -> list[str]:
    """The command as the record keeps it, the same on every machine: the interpreter as
    `python`, each absolute path portable (files.portable_path: the script relative to the
    checkout, the temp results file to the results folder). The child runs `cmd` itself."""
    base = Path(tag_dir).parent
    return ["python"] + [portable_path(a, base) if os.path.isabs(a) else a for a in cmd[1:]]


def _synthesized(step: Step, status: str, reason: str, meta: dict, started_at: str,
                 duration_s: float) -> dict:  # fmt: skip
    """The record of a run that wrote none of its own."""
    return {
        "step": step.num,
        "script": portable_path(step.path),
        "status": status,
        "reason": reason,
        "script_sha256": meta["script_sha256"],
        "code_sha256": meta.get("code_sha256"),
        "started_at": started_at,
        "duration_s": duration_s,
    }


def _outcome(step: Step, rec: dict | None, res, meta: dict, started_at: str, timeout: float):
    """The run's record: the step's own, its status corrected by how the process ended, or one
    synthesized for a run that wrote none."""
    if res.timed_out or rec is None:
        if res.timed_out:
            status, reason = "timeout", f"timed out after {timeout:g} s"
        elif res.exit_code == 0:
            status = "error"
            reason = "exited 0 without writing a record"
        elif res.exit_code == 3 or res.oom_line:
            status, reason = "oom", _oom_reason(res)
        else:
            status = "error"
            reason = failure_reason(res.stderr_tail, res.exit_code)
        return _synthesized(step, status, reason, meta, started_at, res.duration_s)
    if res.exit_code != 0 and res.oom_line and rec.get("status") != "oom":  # another rank's
        rec["status"], rec["reason"] = "oom", _oom_reason(res)
    elif res.exit_code != 0 and rec.get("status") == "ok":  # e.g. another DDP rank failed
        rec["status"] = "error"
        rec["reason"] = (
            f"exit code {res.exit_code} after an ok record: "
            f"{failure_reason(res.stderr_tail, res.exit_code)}"
        )
    elif rec.get("status") != "ok" and not rec.get("reason"):
        rec["reason"] = failure_reason(res.stderr_tail, res.exit_code)
    return rec


def cut_twice_reason(longest_s: float) -> str:
    """The reason of a run cut at a --budget's end a second time (`longest_s`: its longest)."""
    return (f"cut twice at {longest_s:.0f} s: the --budget's end stopped it twice unfinished; "
            "give it a call with more time")  # fmt: skip


LOGS = "logs"  # a failed run's stderr (its whole traceback), beside the records


def write_log(tag_dir: Path, step: Step, run_id: str, lines: list[str]) -> str | None:
    """Write a failed run's stderr to `logs/<step>-<run id>.log` in the tag folder; returns
    that path relative to the tag folder (records hold no absolute path), or None when it
    cannot be written (the record, with its one-line reason, matters more)."""
    rel = f"{LOGS}/{step.num}-{run_id[:12]}.log"
    try:
        (Path(tag_dir) / LOGS).mkdir(exist_ok=True)
        (Path(tag_dir) / rel).write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as e:
        print(f"      warning: the run's stderr not kept ({e.__class__.__name__}: {e})",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    return rel


def run_once(step: Step, flags: list[str], meta: dict, tag_dir: Path, timeout: float,
             keep_timeout: bool = True, cut_before: float = 0.0) -> dict | None:  # fmt: skip
    """One run of one step: temp results file -> record (the step's, or a synthesized one) ->
    appended to runs.jsonl -> temp file deleted. A failed run's stderr (its last
    child.LOG_LINES lines: a torch.compile, Triton or NCCL traceback whole) goes to
    `logs/<step>-<run id>.log` in the tag folder, which the record's `log` names. With
    `keep_timeout` False (the sweep's --budget, not the step, set the timeout) a run that
    times out is not recorded: None; unless an earlier run of the same job was already cut
    (`cut_before`, its longest seconds): then this second cut is a real result, status
    `failed`, reason "cut twice at N s"."""
    tmp = tmp_path(tag_dir, step, meta["run_id"])
    cmd = step_command(step, flags, meta["config"]["nproc"], tmp)
    meta = dict(meta, command=recorded_command(cmd, tag_dir))
    append_jsonl(tmp, {"sweep_meta": meta})
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        res = run_child(cmd, timeout, env={PREDICTED_ENV: "1"})  # the sweep printed it
    except BaseException:  # interrupted: keep the temp file only if it holds a record to recover
        if not step_records(tmp):
            tmp.unlink(missing_ok=True)
        raise
    if res.timed_out and not keep_timeout and not cut_before:
        tmp.unlink(missing_ok=True)
        return None
    if res.timed_out and not keep_timeout:
        reason = cut_twice_reason(max(cut_before, timeout))
        rec = _synthesized(step, "failed", reason, meta, started_at, res.duration_s)
    else:
        recs = step_records(tmp)
        rec = _outcome(step, dict(recs[0]) if recs else None, res, meta, started_at, timeout)
    rec["sweep"] = dict(meta, exit_code=res.exit_code, duration_s=res.duration_s)
    if rec.get("status") != "ok" and any(ln.strip() for ln in res.stderr_log):
        log = write_log(tag_dir, step, meta["run_id"], res.stderr_log)
        if log:
            rec["log"] = log
    append_jsonl(tag_dir / RUNS, rec)
    tmp.unlink(missing_ok=True)
    return rec
