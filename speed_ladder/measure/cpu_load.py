"""Machine load: how many CPU cores *other* processes used while a run was measured (`other_load`:
Linux /proc/stat's busy time less the run's own process tree's; null elsewhere), the load
average at the window's start, and the sweep's check of the machine before each run. Above
`threshold()` a run is marked unreliable (docs/measurement.md, "A busy machine")."""

import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

MIN_WINDOW_S = 0.5  # a shorter window has no other_load (ticks of 10 ms: too coarse)
CHECK_S = 1.0  # how long the sweep's check before each run measures (SPEED_LADDER_CHECK_S)


def threshold(cores: int | None = None) -> float:
    """Cores other processes may use before a measurement is called unreliable."""
    cores = cores or os.cpu_count() or 1
    return round(max(0.1, 0.02 * cores), 3)


def supported() -> bool:
    return sys.platform.startswith("linux") and os.path.exists("/proc/stat")


def _hz() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def busy_ticks() -> int | None:
    """All CPUs' busy time since boot, in clock ticks: user, nice, system, irq, softirq, steal
    (guest time is inside user already); None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:9]] + [0] * max(0, 9 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return user + nice + system + irq + softirq + steal


@dataclass(frozen=True)
class Proc:
    ppid: int
    name: str
    own: int  # utime + stime, ticks
    reaped: int  # cutime + cstime: children it has waited for


def processes() -> dict[int, Proc]:
    """Every process in /proc: parent, name and CPU ticks (a process that ends meanwhile is
    skipped)."""
    out = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            head, _, tail = stat.rpartition(")")
            name = head.partition("(")[2]
            x = tail.split()
            out[int(e)] = Proc(int(x[1]), name, int(x[11]) + int(x[12]), int(x[13]) + int(x[14]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def tree(procs: dict[int, Proc], root: int) -> set[int]:
    """`root` and all its descendants."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, p in procs.items():
        children[p.ppid].append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo += children[pid]
    return out


def own_root() -> int:
    """The root of this run's process tree: torchrun's agent for a rank it launched (all ranks
    are ours), else this process."""
    if os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("TORCHELASTIC_RESTART_COUNT"):
        return os.getppid()
    return os.getpid()


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


@dataclass
class Sample:
    t: float
    busy: int | None
    procs: dict[int, Proc]


def sample() -> Sample:
    return Sample(time.monotonic(), busy_ticks(), processes() if supported() else {})


def other_cores(a: Sample, b: Sample, root: int) -> float | None:
    """Mean cores used by processes outside `root`'s tree between two samples; None when the
    window is under MIN_WINDOW_S (CPU time is counted in ticks of 10 ms: over a few ms one tick
    reads as several cores)."""
    if a.busy is None or b.busy is None or b.t - a.t < MIN_WINDOW_S:
        return None
    ours = tree(a.procs, root) | tree(b.procs, root)
    mine = lambda s: sum(s.procs[p].own + s.procs[p].reaped for p in ours if p in s.procs)
    others = (b.busy - a.busy) - (mine(b) - mine(a))
    return max(0.0, others / _hz() / (b.t - a.t))


def top_others(a: Sample, b: Sample, root: int, n: int = 3) -> list[tuple[str, float]]:
    """The `n` processes outside `root`'s tree that used most CPU between two samples."""
    ours = tree(a.procs, root) | tree(b.procs, root)
    dt = max(b.t - a.t, 1e-9)
    used = [
        (p.name, (p.own - a.procs[pid].own) / _hz() / dt)
        for pid, p in b.procs.items()
        if pid not in ours and pid in a.procs
    ]
    return sorted((u for u in used if u[1] >= 0.05), key=lambda u: -u[1])[:n]


# ---------------------------------------------------------------- a run's timed window
class Meter:
    """other_load over a run's timed window: `start()` when it opens, `stop()` at the end."""

    def __init__(self, root: int | None = None):
        self.root = own_root() if root is None else root
        self.a: Sample | None = None
        self.loadavg_start: float | None = None

    def start(self) -> None:
        self.loadavg_start = loadavg()
        self.a = sample() if supported() else None

    def stop(self) -> dict:
        """The record's fields: other_load (cores, null where unknown), loadavg_start."""
        load = None
        if self.a is not None:
            load = other_cores(self.a, sample(), self.root)
        return {
            "other_load": None if load is None else round(load, 3),
            "loadavg_start": self.loadavg_start,
        }


def busy_note(other_load) -> str | None:
    """The record's note when other processes were busy during its window, else None."""
    if not is_busy(other_load):
        return None
    return (
        f"unreliable: other processes used {other_load:.2f} CPU cores on average during the timed "
        f"window (busy above {threshold():g}); rerun on a quiet machine "
        "(python -m speed_ladder run --wait-quiet)"
    )


def is_busy(other_load) -> bool:
    return (
        isinstance(other_load, (int, float))
        and not isinstance(other_load, bool)
        and other_load > threshold()
    )


# ---------------------------------------------------------------- the sweep's check
def measure_others(seconds: float = CHECK_S) -> tuple[float | None, list[tuple[str, float]]]:
    """(cores other processes use, the top ones) over `seconds`, this process's tree excluded;
    (None, []) where it cannot be measured."""
    if not supported():
        return None, []
    a = sample()
    time.sleep(seconds)
    b = sample()
    root = os.getpid()
    return other_cores(a, b, root), top_others(a, b, root)


def describe(load: float, top: list[tuple[str, float]]) -> str:
    who = ", ".join(f"{name} {cores:.1f}" for name, cores in top)
    return f"other processes are using {load:.2f} CPU cores" + (f" ({who})" if who else "")


def quiet_check(say=print, measure=measure_others) -> float | None:
    """Measure the machine's load from others; say so when it is busy. Returns the load."""
    load, top = measure()
    if is_busy(load):
        say(
            f"machine busy: {describe(load, top)}; numbers measured now are marked unreliable "
            "(--wait-quiet waits for a quiet machine)"
        )
    return load


def wait_quiet(limit_s: float, say=print, measure=measure_others, clock=time.monotonic) -> bool:
    """Wait until other processes use at most `threshold()` cores, at most `limit_s` seconds,
    saying how it goes every few seconds. Returns whether the machine is quiet."""
    t0, last_said = clock(), None
    while True:
        load, top = measure()
        if load is None or not is_busy(load):
            if last_said is not None:
                say(f"machine quiet ({0.0 if load is None else load:.2f} cores), going on")
            return True
        waited = clock() - t0
        if waited >= limit_s:
            say(
                f"still busy after {waited:.0f} s: {describe(load, top)}; running anyway, the "
                "records say so"
            )
            return False
        if last_said is None or clock() - last_said >= 5:
            last_said = clock()
            say(f"waiting for a quiet machine: {describe(load, top)}; {waited:.0f}/{limit_s:.0f} s")
