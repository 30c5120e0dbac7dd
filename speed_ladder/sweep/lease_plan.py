"""A plan for a lent GPU (`tools/gpu_session.sh --plan`): how the bounded ladder (`--steps`,
default every step) and then the fast GPU tests (`--tests` s) fit the lease, and the exact `run`
calls, before any device time is spent. The lease (docs/gpu-machines.md, "A machine lent for a
while"): `--lease` 900 s of device time, start-ups, idle time and transfers counted; a command of
at most `--cap` 600 s; a machine gone after 30 s without one. What things cost: lease_costs.py.

First, **one session in the background** (lease_session.py, tools/gpu_lease.sh): gpu_session.sh
runs once, in a process session of its own, and the calls only wait for it, so the machine works
through the gaps between them. It fits when the plan and a rerun of its longest run are within
the lease (the default leaves the profile out: `--profile` adds ~4.5 s a run).

Where it does not, **calls that each run a part** (Call, Session): each call gpu_session.sh with
its own --budget, back to back on one warm machine. Fits means: each call running to its budget
within the lease, and the plan plus a reserve to finish a call cut mid-way (it comes back, the
machine stays warm, the same call again skips what is done: a gap, transfers, the run in flight).
Where that does not fit either: the steps the tag holds **current** records of
(lease_costs.is_current: the file's sha256 now, the lease's configuration, this kind's GPU) are
dropped, eager ones first, and resumed into the summary (`--resume results`); else the smallest
split into leases, in ladder order, each resumed on those committed before it; then, if time is
left, an extra call: `--extra` (08,09) for `--extra-rounds` 2 rounds in a fresh folder (host-bound
at batch 8: one round cannot tell them apart). A machine lost mid-call returns nothing: no
reserve covers it; the plan says what is at stake. Exit 0 when the session asked for fits, 1 when
it does not (what would fit printed after it), 2 on bad input.
"""

import argparse
import math
import sys
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.ladder import ROOT, discover, parse_steps
from speed_ladder.sweep import lease_costs as lc
from speed_ladder.sweep.lease_session import Background

RESULTS = ROOT / "results"
EXTRA = "08,09"
TESTS_KILL_S = 20  # tools/gpu_session.sh: the tests' `timeout` is what is left less 20
CUSHION_S = 30  # timeout_s over --budget: gpu_session.sh ends within its budget, this is spare


class Call:
    """One `run` call: gpu_session.sh on `out` with these steps (`rounds` rounds), then the tests
    when `tests` (seconds) is not 0; `again`: a later call into the same OUT on the same warm
    machine (gpu_session.sh skips the set-up it did there)."""

    def __init__(self, number, runs, tests=0.0, out="/tmp/s", rounds=1, resume=False, again=False):
        self.number, self.runs, self.tests = number, runs, tests
        self.out, self.rounds, self.resume, self.again = out, rounds, resume, again

    @property
    def seconds(self) -> float:
        """Planned command seconds: set-up, the sweep's runs, the tests, the pack."""
        sweep = lc.SWEEP_START_S + sum(r.seconds + lc.BETWEEN_RUNS_S for r in self.runs)
        setup = lc.SETUP_AGAIN_S if self.again else lc.SETUP_S
        return setup + (sweep if self.runs else 0.0) + self.tests + lc.END_LEAN_S

    @property
    def budget(self) -> int:
        """gpu_session.sh's --budget: the work before the summary x lc.SLACK, or more where the
        sweep's start check needs it (each run's estimate, PlannedRun.expected, within --budget less
        lc.KEPT_S, the runs before it lc.SLACK times slower), the 30 s it keeps after the last phase
        (the summary and pack), and the 20 s it keeps to stop the tests."""
        t = need = (lc.SETUP_AGAIN_S if self.again else lc.SETUP_S) + lc.SWEEP_START_S
        for r in self.runs:
            need = max(need, t + r.expected)
            t += r.seconds * lc.SLACK + lc.BETWEEN_RUNS_S
        work = max((self.seconds - lc.END_LEAN_S) * lc.SLACK, need)
        work += lc.KEPT_S + (TESTS_KILL_S if self.tests else 0)
        return int(math.ceil(work / 10) * 10)

    @property
    def timeout(self) -> int:
        return self.budget + CUSHION_S

    def steps(self) -> str:
        return ",".join(dict.fromkeys(r.step for r in self.runs))

    def command(self, host_id: str) -> str:
        """The shell command of this call's `run`, at most 2,000 characters."""
        parts = [
            f"export SPEED_LADDER_HOST_ID={host_id} PYTHONUNBUFFERED=1;",
            f"tools/gpu_session.sh {self.out} {lc.FLAGS}",
        ]
        if self.resume:
            parts.append("--resume results")
        if self.runs:
            parts.append(f"--steps {self.steps()}")
            if self.rounds > 1:
                parts.append(f"--repeats {self.rounds} --no-control")
        else:
            parts.append("--no-sweep")
        if not self.tests:
            parts.append("--no-tests")
        parts.append(f"--budget {self.budget} --no-cache-pack --pack $OUT/call{self.number}.tgz;")
        parts.append(f"cp {self.out}/status.txt $OUT/status{self.number}.txt")
        cmd = " ".join(parts)
        assert len(cmd) <= 2000, len(cmd)
        return cmd


def pack(runs: list, tests: float, cap: float, first: int = 1, resume: bool = False) -> list:
    """The runs in ladder order, then the tests, into calls whose timeout fits `cap`: a call
    takes the next run (or the tests) while its timeout stays within the cap."""
    calls: list[Call] = []

    def fits(call: Call) -> bool:
        return call.timeout <= cap

    def new() -> Call:
        return Call(first + len(calls), [], resume=resume and not calls, again=bool(calls))

    for run in runs:
        if not calls or not fits(Call(0, [*calls[-1].runs, run], again=calls[-1].again)):
            calls.append(new())
        calls[-1].runs.append(run)
    if tests:
        if not calls or not fits(Call(0, calls[-1].runs, tests, again=calls[-1].again)):
            calls.append(new())
        calls[-1].tests = tests
    return calls


class Session:
    """The calls on one machine, and what they cost of the lease."""

    def __init__(self, calls: list, kind: lc.Kind, lease: float):
        self.calls, self.kind, self.lease = calls, kind, lease

    def device_seconds(self, worst: bool = False) -> float:
        """Start-up, each call (planned, or `worst`: to its --budget) and its transfers, the idle
        gap before each later call, give_back."""
        took = sum((c.budget if worst else c.seconds) + lc.TRANSFER_S for c in self.calls)
        gaps = lc.GAP_S * max(0, len(self.calls) - 1)
        return self.kind.start_s + took + gaps + lc.CLOSE_S

    def longest(self) -> Call:
        return max(self.calls, key=lambda c: c.seconds)

    def in_flight(self) -> float:
        """The longest single thing a cut call can have been doing: a run, or one test."""
        runs = [r.seconds for c in self.calls for r in c.runs]
        tests = [lc.LONGEST_TEST_S] if any(c.tests for c in self.calls) else []
        return max(runs + tests, default=0.0)

    def reserve(self) -> float:
        """Finishing a call cut mid-way: a call that its --budget or timeout_s ended comes back,
        and the machine stays warm for the next command (the device tool keeps it 30 s after
        each), so the same call again into the same OUT skips what is done: an idle gap, its
        transfers, the set-up it skips, the sweep's start, what was in flight (the longest run
        or test) and the pack. A machine lost mid-call is not covered (describe says so)."""
        return (lc.GAP_S + lc.TRANSFER_S + lc.SETUP_AGAIN_S + lc.SWEEP_START_S
                + self.in_flight() + lc.BETWEEN_RUNS_S + lc.END_LEAN_S)  # fmt: skip

    def fits(self) -> bool:
        """Planned, with the reserve, within the lease; and each call to its --budget too."""
        within = self.device_seconds() + self.reserve() <= self.lease
        return within and self.device_seconds(worst=True) <= self.lease


def plan(
    runs: list, tests: float, kind: lc.Kind, lease: float, cap: float, resume: bool = False
) -> Session:
    return Session(pack(runs, tests, cap, resume=resume), kind, lease)


def drops(runs: list, tests: float, kind, lease, cap) -> tuple[list, Session | None]:
    """(the steps dropped, the session that then fits): current steps (lease_costs.is_current),
    the eager ones first, then the compiled ones, each in ladder order; (all of them, None) when
    nothing fits."""
    measured = [r for r in runs if r.current]
    order = [r for r in measured if not r.compiled] + [r for r in measured if r.compiled]
    dropped: list = []
    for run in order:
        dropped.append(run)
        left = [r for r in runs if r not in dropped]
        session = plan(left, tests, kind, lease, cap, resume=True)
        if session.fits():
            return dropped, session
    return dropped, None


def split(runs: list, tests: float, kind, lease, cap, resume: bool) -> list[Session] | None:
    """The fewest leases in ladder order, each the most steps that fit (the first with the tests,
    a later one resumed on those before it, committed); None when one step does not fit."""
    leases: list[Session] = []
    while runs:
        tests_here = 0.0 if leases else tests  # the tests in the first lease
        first = leases[-1].calls[-1].number + 1 if leases else 1
        for k in range(len(runs), 0, -1):
            calls = pack(runs[:k], tests_here, cap, first, resume=resume or bool(leases))
            if (session := Session(calls, kind, lease)).fits():
                break
        else:
            return None
        leases.append(session)
        runs = runs[k:]
    return leases


def extra_call(session: Session, runs: list, rounds: int, cap: float) -> Call | None:
    """The extra call, if time is left after the session (its reserve unspent)."""
    if not runs:
        return None
    call = Call(
        session.calls[-1].number + 1 if session.calls else 1,
        [r for _ in range(rounds) for r in runs],
        out="/tmp/e",
        rounds=rounds,
    )
    left = session.lease - session.device_seconds(worst=True)
    return call if call.timeout <= cap and call.budget + lc.TRANSFER_S + lc.GAP_S <= left else None


def describe(session: Session, extra: Call | None) -> list[str]:
    out = []
    for c in [*session.calls, *([extra] if extra else [])]:
        what = []
        if c.runs:
            rounds = f", {c.rounds} rounds in a fresh folder" if c.rounds > 1 else ""
            what.append(
                f"steps {c.steps()}{rounds}: "
                + " ".join(f"{r.step}={r.seconds:.0f}s{r.mark}" for r in c.runs)
            )
        if c.tests:
            what.append(f"then the GPU tests {c.tests:.0f}s")
        head = "if time is left, call" if c is extra else "call"
        out.append(
            f"{head} {c.number}: {'; '.join(what)}; {c.seconds:.0f} s planned, "
            f"--budget {c.budget}, timeout_s {c.timeout}"
        )
    plain, worst = session.device_seconds(), session.device_seconds(worst=True)
    out.append(
        f"session: {plain:.0f} s planned + {session.reserve():.0f} s reserve (a cut call "
        f"again on the warm machine: its {session.in_flight():.0f} s in flight again) = "
        f"{plain + session.reserve():.0f} s; {worst:.0f} s with each call to its --budget; "
        f"lease {session.lease:.0f} s"
    )
    out.append(
        f"not covered: a machine lost mid-call returns nothing (call {session.longest().number}: "
        f"{session.longest().seconds:.0f} s of work); the next session resumes from the last pack"
    )
    return out


def run_calls(session: Session, extra: Call | None) -> list[str]:
    """The exact `run` calls (the device tool's), one a line."""
    lines = []
    for c in [*session.calls, *([extra] if extra else [])]:
        lines.append(
            f'run(kind="{session.kind.name}", carry={lc.CARRY!r}, timeout_s={c.timeout}, '
            f'command="{c.command(session.kind.host_id)}")'
        )
    return lines + ["give_back()"]


def report(a, runs: list, kind: lc.Kind, source: str) -> tuple[list[str], bool]:
    out = [
        f"plan: gpt2-124m on {kind.name} ({kind.gpu}); lease {a.lease:.0f} s of device time, "
        f"commands of at most {a.cap:.0f} s, idle release {lc.IDLE_S:.0f} s",
        f"  durations: {source}",
        *("  " + line for line in lc.cost_lines(kind)),
    ]
    marks = {r.mark: r.why for r in runs if r.mark}
    out += [f"  {m} {why}" for m, why in marks.items()]
    asked = {r.step for r in runs}
    # --resume results: current records of steps not run stay in the summary, and every record
    # of this kind (any script version) gives the sweep its estimates: without them it expects
    # 60 s an eager run and 120 s a compiled one, and leaves the last runs of a call undone
    resume = bool(a.current - asked) or any(r.get("status") == "ok" for r in a.measured)
    bg = Background(runs, a.tests, kind, a.lease, a.cap, a.profile, resume and kind.factor == 1.0)
    out += bg.describe()
    if bg.fits():
        left = a.lease - bg.device_seconds() - bg.in_flight()
        out.append(f"fits: the session and a rerun of its longest run within the "
                   f"{a.lease / 60:.0f}-minute lease, {left:.0f} s to spare (too few for "
                   f"--extra's rounds: a lease of their own)")  # fmt: skip
        return out + ["calls:", *bg.run_calls()], True
    over = bg.device_seconds() + bg.in_flight() - a.lease
    out.append(f"does not fit in the background ({over:.0f} s over with a rerun of its longest "
               "run, or its --budget too short); as calls that each run a part:")  # fmt: skip
    session = plan(runs, a.tests, kind, a.lease, a.cap, resume=resume and kind.factor == 1.0)
    extra_runs = extras(a, kind)
    extra = extra_call(session, extra_runs, a.extra_rounds, a.cap) if session.fits() else None
    out += describe(session, extra)
    if session.fits():
        out.append(
            f"fits: the session and the reserve to finish a cut call within the "
            f"{a.lease / 60:.0f}-minute lease"
        )
        out += ["calls:", *run_calls(session, extra)]
        return out, True
    plain = session.device_seconds()
    bare = "over it even without" if plain > a.lease else f"{a.lease - plain:.0f} s left without"
    out.append(
        f"does not fit: {plain + session.reserve() - a.lease:.0f} s over the "
        f"{a.lease:.0f} s lease with the reserve ({bare} it)"
    )
    if kind.factor != 1.0:  # another kind's records: no steps of this kind to resume
        out.append(
            f"no {kind.name} run is measured: ask for a kind whose runs are "
            f"(--kind nvidia-h200), or fewer --steps"
        )
        return out, False
    dropped, fitting = drops(runs, a.tests, kind, a.lease, a.cap)
    if fitting is None:
        return out + leases(a, runs, kind, resume), False
    nums = ",".join(r.step for r in dropped)
    out.append(
        f"to fit, drop steps {nums} (measured in {rel(a.results)}: --resume results keeps "
        f"them in the summary); the session that fits, --steps "
        f"{','.join(dict.fromkeys(r.step for c in fitting.calls for r in c.runs))}:"
    )
    extra = extra_call(fitting, extra_runs, a.extra_rounds, a.cap)
    out += ["  " + line for line in describe(fitting, extra)]
    out += ["calls:", *run_calls(fitting, extra)]
    return out, False


def leases(a, runs: list, kind: lc.Kind, resume: bool) -> list[str]:
    """The split into leases, when dropping the current steps does not make one fit."""
    now = [r.step for r in runs if r.current]
    out = [
        f"current in {rel(a.results)} (an ok {kind.gpu} record of the file's sha256 now, "
        f"{lc.LEASE_CONFIG['preset']}): {','.join(now) or 'no step'}; "
        + ("leaving those out is not enough" if now else "nothing can be left out")
    ]
    todo = [r for r in runs if not r.current]
    sessions = split(todo, a.tests, kind, a.lease, a.cap, resume)
    if sessions is None:
        return out + ["a step does not fit a lease even alone: a shorter --tests, or --lease"]
    names = "ABCDEFGH"
    out.append(f"{len(sessions)} leases (sessions of their own, {a.lease / 60:.0f} minutes each):")
    for i, session in enumerate(sessions):
        last = i == len(sessions) - 1
        extra = extra_call(session, extras(a, kind), a.extra_rounds, a.cap) if last else None
        steps = ",".join(r.step for c in session.calls for r in c.runs)
        head = f"lease {names[i]}: --steps {steps}" + (", then the GPU tests" if i == 0 else "")
        if i:  # --resume results: the checkout's results/, the leases before it committed there
            head += f" (once lease {names[i - 1]}'s records are committed to {rel(a.results)}/)"
        out += [head + ":", *("  " + line for line in describe(session, extra))]
        out += ["  calls:", *("  " + line for line in run_calls(session, extra))]
    return out


def rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def extras(a, kind: lc.Kind) -> list:
    if not a.extra:
        return []
    return [lc.run_seconds(s, a.measured, kind, a.profile) for s in parse_steps(a.extra, a.ladder)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="tools/gpu_session.sh --plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--kind", default="nvidia-h200", choices=list(lc.KINDS),
                    help="the lent machine (lease_costs.KINDS)")  # fmt: skip
    ap.add_argument("--lease", type=float, default=900.0, help="device seconds a session")
    ap.add_argument("--cap", type=float, default=600.0, help="seconds a command at most")
    ap.add_argument("--steps", default="all", help="the ladder's steps in this session")
    ap.add_argument("--tests", type=float, default=lc.TESTS_S,
                    help="expected seconds of the fast GPU tests (0: none)")  # fmt: skip
    ap.add_argument("--extra", default=EXTRA, help="steps of the extra call ('' for none)")
    ap.add_argument("--extra-rounds", type=int, default=2, help="its rounds")
    ap.add_argument("--profile", action="store_true",
                    help="the sweep with --profile (each run ~4.5 s longer)")  # fmt: skip
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="the default")
    ap.add_argument("--slower", type=float, default=1.0, help="every run this many times slower")
    ap.add_argument("--results", type=Path, default=None,
                    help="the tag folder of durations (default: the kind's)")  # fmt: skip
    a = ap.parse_args(argv)
    try:
        if min(a.lease, a.cap, a.slower) <= 0 or a.tests < 0 or a.extra_rounds < 1:
            raise UserError(
                "--lease, --cap, --slower and --extra-rounds must be above 0, --tests at least 0"
            )
        kind = lc.KINDS[a.kind]
        a.results = a.results or RESULTS / kind.tag
        a.measured, source = lc.measured(a.results, rel(a.results))
        a.ladder = discover()
        a.current = {s.num for s in a.ladder if lc.is_current(s, a.measured, kind)}
        runs = [
            lc.run_seconds(s, a.measured, kind, a.profile) for s in parse_steps(a.steps, a.ladder)
        ]
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in runs:
        r.seconds *= a.slower
    lines, ok = report(a, runs, kind, source)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    from speed_ladder.errors import pipe_safe

    raise SystemExit(pipe_safe(main))
