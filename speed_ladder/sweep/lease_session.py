"""The plan of one GPU session in the background of a lent machine (tools/gpu_lease.sh), for the
lease plan (lease_plan.py, `tools/gpu_session.sh --plan`).

The device tool ends what a command leaves running when it returns, except a process that started
a session of its own (setsid), which runs on while the machine stays warm, 30 s after each
command (/work/.library/device/README.md). gpu_lease.sh starts tools/gpu_session.sh that way in
the first call, and each call after it (the same command, within the 30 s) only waits and brings
back what is done. So, unlike calls that each run a part of the work (lease_plan.Call):
- the machine works through the idle gap between two calls;
- a session has one set-up, one sweep start and one end, not one a call;
- nothing is cut at a call's end: the session's own --budget (gpu_session.sh) bounds all of it,
  set so that even a session running to it stays within the lease.

**Fits** means: the planned session plus its longest single run (room to run one of them again:
a run that failed or was cut) within the lease, and the planned work, lease_costs.SLACK times
slower, within the session's --budget less what gpu_session.sh keeps after its sweep
(lease_costs.KEPT_S). A machine lost mid-session is not covered; each call has brought back what
was done by its end (session.tgz).

Device time: the machine's start-up, each call's transfers and its archive of OUT, the session's
work (the set-up, the sweep's runs, the tests), give_back. Costs: lease_costs.py.
"""

import math

from speed_ladder.sweep import lease_costs as lc

WAIT_MARGIN_S = 20  # a call's timeout_s over its WAIT: the archive of OUT (~2 MB) and the reply
BACK_S = 3.0  # a call's archive of OUT, no compile cache (assumed: a tar -czf of ~2 MB)
CUSHION_S = 10.0  # between the session's --budget and what the lease leaves it


class Background:
    """One gpu_session.sh run in the background for `runs`, then `tests` seconds of GPU tests,
    waited for by calls of at most `cap` seconds on one `kind` machine, within `lease`."""

    def __init__(self, runs, tests, kind, lease, cap, profile=False, resume=False):
        self.runs, self.tests, self.kind = runs, tests, kind
        self.lease, self.cap, self.profile, self.resume = lease, cap, profile, resume

    @property
    def timeout(self) -> int:
        return int(self.cap) - 10  # a call's timeout_s, under the device tool's cap

    @property
    def wait(self) -> int:
        return self.timeout - WAIT_MARGIN_S

    def work(self) -> float:
        """The session's planned seconds: set-up, sweep start, runs, tests, its end."""
        runs = sum(r.seconds + lc.BETWEEN_RUNS_S for r in self.runs)
        sweep = lc.SWEEP_START_S + runs if self.runs else 0.0
        return lc.SETUP_S + sweep + self.tests + lc.END_LEAN_S

    def calls(self, seconds: float) -> int:
        """Calls waiting for `seconds` of session: each waits `wait` at most."""
        return max(1, math.ceil((seconds + BACK_S) / self.wait))

    def _fixed(self, calls: int) -> float:
        return self.kind.start_s + calls * (lc.TRANSFER_S + BACK_S) + lc.CLOSE_S

    def budget(self) -> int:
        """gpu_session.sh's --budget: what the lease leaves after the start-up, give_back and the
        calls a session running to its budget needs (each with its transfers and archive)."""
        b = self.lease - CUSHION_S - self._fixed(1)
        while b > 0 and self._fixed(self.calls(b)) + b + CUSHION_S > self.lease:
            b -= 1
        return max(0, int(b))

    def device_seconds(self) -> float:
        """Planned: start-up, the session's work (the gaps between calls inside it), each call's
        transfers and archive, give_back."""
        return self._fixed(self.calls(self.work())) + self.work()

    def worst(self) -> float:
        """The session running to its --budget."""
        return self._fixed(self.calls(self.budget())) + self.budget()

    def in_flight(self) -> float:
        return max((r.seconds for r in self.runs), default=0.0)

    def fits(self) -> bool:
        room = self.device_seconds() + self.in_flight() <= self.lease
        slow = self.work() * lc.SLACK + lc.KEPT_S <= self.budget()  # the sweep's deadline
        return room and slow and self.worst() <= self.lease

    def steps(self) -> str:
        return ",".join(dict.fromkeys(r.step for r in self.runs))

    def command(self) -> str:
        """The shell command of every call of the session (the same each time), at most 2,000
        characters."""
        parts = [
            f"export SPEED_LADDER_HOST_ID={self.kind.host_id} PYTHONUNBUFFERED=1;",
            f"tools/gpu_lease.sh /tmp/s $OUT {self.wait} {lc.FLAGS}",
        ]
        if self.resume:
            parts.append("--resume results")
        parts.append(f"--steps {self.steps()}" if self.runs else "--no-sweep")
        if not self.tests:
            parts.append("--no-tests")
        if not self.profile:
            parts.append("--no-profile")
        parts.append(f"--budget {self.budget()}")
        cmd = " ".join(parts)
        assert len(cmd) <= 2000, len(cmd)
        return cmd

    def describe(self) -> list[str]:
        plain, n = self.device_seconds(), self.calls(self.work())
        runs = " ".join(f"{r.step}={r.seconds:.0f}s{r.mark}" for r in self.runs)
        what = f"steps {self.steps()}: {runs}" if self.runs else "no sweep"
        return [
            f"one session in the background (tools/gpu_lease.sh), "
            f"{'with' if self.profile else 'without'} --profile: {what}"
            + (f"; then the GPU tests {self.tests:.0f}s" if self.tests else ""),
            f"  {self.work():.0f} s of work (set-up {lc.SETUP_S:.0f} s, the runs, the tests), "
            f"--budget {self.budget()}; {n} call{'s' if n > 1 else ''} of the same command, each "
            f"waiting at most {self.wait} s (timeout_s {self.timeout}), the machine working "
            f"through the gaps",
            f"session: {plain:.0f} s planned + {self.in_flight():.0f} s to run its longest run "
            f"again = {plain + self.in_flight():.0f} s; {self.worst():.0f} s running to its "
            f"--budget; lease {self.lease:.0f} s",
            "not covered: a machine lost mid-session; each call brings back what is done "
            "(session.tgz), and the next session resumes from it",
        ]

    def run_calls(self) -> list[str]:
        """The exact `run` calls: the first, then the same while it exits 4, then give_back."""
        call = (
            f'run(kind="{self.kind.name}", carry={lc.CARRY!r}, timeout_s={self.timeout}, '
            f'command="{self.command()}")'
        )
        return [
            call,
            f"while it exits 4 (still running): the same call again, at once (within "
            f"{lc.IDLE_S:.0f} s); {self.calls(self.work())} planned, "
            f"{self.calls(self.budget())} at most",
            "give_back()",
        ]
