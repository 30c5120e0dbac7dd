"""Running one child process under supervision: its output passed through live, a timeout that
takes down its whole process tree, and, when it fails, the one line of stderr that says why
(and whether any of its ranks ran out of memory)."""

import collections
import ctypes
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from speed_ladder.measure import cpu_load

LOG_LINES = 2000  # stderr lines kept for a failed run's log (a compile error's traceback)
KILL_GRACE_S = 10.0  # SIGTERM first (torchrun then stops its workers), SIGKILL after this
EXITED_GRACE_S = 5.0  # a stray grandchild may hold the pipes open after the child exits

_LIBC = None
if sys.platform.startswith("linux"):
    try:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    except OSError:
        _LIBC = None
_PR_SET_PDEATHSIG = 1


def _child_setup(parent_pid: int):
    """In the child before exec: its own process group (so a timeout can kill all of it) and,
    on Linux, SIGTERM when the parent dies (a kill -9'd sweep leaves no step running)."""

    def setup():
        os.setpgid(0, 0)
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent_pid:  # the parent died before prctl took effect
                os._exit(143)

    return setup


def _descendants(pid: int) -> list[int]:
    """All processes below `pid` (Linux /proc), torchrun's workers in their own sessions too."""
    return sorted(cpu_load.tree(cpu_load.processes(), pid) - {pid})


def kill_tree(proc: subprocess.Popen, grace: float | None = None) -> None:
    """SIGTERM the child's process group, SIGKILL it (and any descendant, also one in a session
    of its own, seen before the SIGTERM or, if the child outlived the grace, after it) after
    `grace` (KILL_GRACE_S, read when called)."""
    grace = KILL_GRACE_S if grace is None else grace
    below = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # still there: so may be what it started in the grace
        below = sorted(set(below) | set(_descendants(proc.pid)))
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
    exit_code: int | None  # None when it timed out
    timed_out: bool
    stderr_tail: list[str]
    duration_s: float
    oom_line: str | None = None  # an out-of-memory line of any rank, seen on stderr
    stderr_log: list[str] = field(default_factory=list)  # the last LOG_LINES lines, blank too


# a rank's own line (speed_ladder.main) or torchrun's summary of a rank that exited with 3
_OOM = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?error: out of memory\b|exitcode\s*:\s*3\b")


class _Relay:
    """Passes the child's stdout and stderr through, line by line and indented, and keeps the
    last 60 non-blank stderr lines (and the last LOG_LINES of any kind, for a failure's log)."""

    def __init__(self, proc: subprocess.Popen, indent: str):
        self.indent = indent
        self.tail: collections.deque[str] = collections.deque(maxlen=60)
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self.oom: str | None = None  # the first out-of-memory line, from any rank
        self.sel = selectors.DefaultSelector()
        self.bufs: dict[int, bytes] = {}
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            self.sel.register(stream, selectors.EVENT_READ, out)
            self.bufs[stream.fileno()] = b""

    @property
    def open(self) -> bool:
        return bool(self.sel.get_map())

    def emit(self, line: bytes, out) -> None:
        text = line.decode("utf-8", errors="replace").rstrip()
        if out is sys.stderr:
            self.log.append(text)
        if out is sys.stderr and text.strip():
            self.tail.append(text)
            if self.oom is None and _OOM.search(text):
                self.oom = text.strip()
        print(self.indent + text if text else "", file=out, flush=True)

    def pump(self, wait: float) -> None:
        """Pass through whatever arrives within `wait` seconds; unregister closed pipes."""
        for key, _ in self.sel.select(timeout=wait):
            fd = key.fileobj.fileno()
            chunk = os.read(fd, 65536)
            if not chunk:
                if self.bufs[fd]:
                    self.emit(self.bufs[fd], key.data)
                    self.bufs[fd] = b""
                self.sel.unregister(key.fileobj)
                continue
            data = self.bufs[fd] + chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            *lines, self.bufs[fd] = data.split(b"\n")
            for line in lines:
                self.emit(line, key.data)

    def close(self) -> None:
        """Print what is left of an unfinished last line (on stdout, whichever pipe it was)."""
        for fd, rest in self.bufs.items():
            if rest:
                print(self.indent + rest.decode("utf-8", errors="replace"), flush=True)
                self.bufs[fd] = b""
        self.sel.close()


def _supervise(proc: subprocess.Popen, relay: _Relay, t0: float, timeout: float) -> bool:
    """Relay the output until the pipes close, the child is gone, or the timeout passes; kill
    the tree on a timeout. Returns whether it timed out."""
    exited_at = None
    while relay.open:
        now = time.monotonic()
        if now - t0 > timeout:
            kill_tree(proc)
            return True
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > EXITED_GRACE_S:
            break  # the child is gone; a stray grandchild keeps the pipe open
        relay.pump(0.5)
    try:
        proc.wait(timeout=max(0.1, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return True
    return False


def run_child(cmd: list[str], timeout: float, indent: str = "      ",
              env: dict | None = None) -> ChildResult:  # fmt: skip
    """Run `cmd` (with `env` added to the environment), pass its output through live
    (indented), keep its last stderr lines."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        preexec_fn=_child_setup(os.getpid()),
    )
    relay = _Relay(proc, indent)
    try:
        timed_out = _supervise(proc, relay, t0, timeout)
    except BaseException:  # Ctrl-C / SIGTERM on the parent: take the child down with it
        kill_tree(proc, grace=5.0)
        raise
    finally:
        relay.close()
        proc.stdout.close()
        proc.stderr.close()
    return ChildResult(
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        stderr_tail=list(relay.tail),
        duration_s=round(time.monotonic() - t0, 2),
        oom_line=relay.oom,
        stderr_log=list(relay.log),
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
