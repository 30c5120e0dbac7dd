"""`--profile [N]` and `--trace DIR`: a run's N profiled steps under torch.profiler, never timed,
after the timed window (with `--max-steps`) or right after the warm-up (without), and their time
by category (breakdown.py) in the record. docs/measurement.md, "Where the time goes", says when
and what; under torchrun every rank is profiled and rank 0's breakdown is recorded."""

import os
import re
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from speed_ladder.errors import os_error_why
from speed_ladder.files import portable_path
from speed_ladder.flags import PROFILE_STEPS
from speed_ladder.measure.breakdown import (
    PAUSED_RANGE,
    STEP_RANGE,
    breakdown,
    describe,
    link_kernels,
    per_step_ms,
    shares,
)
from speed_ladder.measure.op_categories import ModuleRanges, is_compiled
from speed_ladder.writable import check_dir


@contextmanager
def quiet_native_stderr():
    """Native stderr (fd 2) sent to /dev/null while torch.profiler starts or stops: kineto prints
    a `USDT: ... profiler_start` line there on every start and stop, which would stand beside a
    run's own lines (and its one error line). Python's own stderr is flushed first."""
    import sys

    sys.stderr.flush()
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no fd 2 to redirect: nothing to quiet
        yield
        return
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class StepProfiler:
    """Profiles `steps` training steps of a run (see the module docstring for when), noting
    what it found in the run's record (`recorder`, measure/run_record.py)."""

    def __init__(self, spec, device, recorder, started_at: str, steps: int, trace_dir):
        self.device, self.recorder, self.started_at = device, recorder, started_at
        self.steps, self.trace_dir = steps, trace_dir
        self.measuring = spec.max_steps is not None
        # the step after which profiling starts: the window's end, or the warm-up's
        self.starts_after = spec.max_steps if self.measuring else spec.warmup_steps
        self.state = "waiting"  # -> running -> done; or failed
        self.model = None
        self.prof = None
        self.hooks = None
        self.range = None
        self.first = self.profiled = 0
        self.started = True  # False once a start failed: nothing was profiled
        self.result: dict = {}
        self.trace: str | None = None

    # -- the Run's schedule
    @property
    def wants_more(self) -> bool:
        """A measuring run is not finished while its profiled steps are to come."""
        return self.state in ("waiting", "running")

    @property
    def window_delay(self) -> int:
        """Steps the timed window starts later: the profiled ones, without --max-steps."""
        return 0 if self.measuring or not self.started else self.steps

    def attach(self, model: torch.nn.Module) -> None:
        self.model = model

    def start(self, first_step: int) -> None:
        """Begin profiling with step `first_step` (at a step boundary, after the device sync)."""
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU]
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        self.first = first_step
        last = first_step + self.steps - 1
        when = "after the timed window" if self.measuring else "after the warm-up, before it"
        self.recorder.note(f"profiled steps {first_step}-{last} {when}: not timed (--profile)")
        try:
            if self.model is not None and not is_compiled(self.model):
                self.hooks = ModuleRanges(self.model)
                self.hooks.install()
            elif self.model is not None:
                self.recorder.note(
                    "profile: compiled model, no module ranges: its fused kernels' time is in "
                    "'other' where their names do not say what they fuse"
                )
            self.prof = profile(activities=activities)
            with quiet_native_stderr():
                self.prof.start()
        except Exception as e:  # never lose a measuring run to the profiler
            self.started = False
            self._fail(f"could not start torch.profiler: {e.__class__.__name__}: {e}")
            return
        self.state = "running"
        self._open(first_step)

    def _open(self, n: int) -> None:
        from torch.autograd.profiler import record_function

        self.range = record_function(f"{STEP_RANGE}{n}")
        self.range.__enter__()

    def step_ended(self, n: int) -> bool:
        """Step `n` ended (its device work synchronized): True if it was a profiled step."""
        if self.state != "running":
            return False
        self.range.__exit__(None, None, None)
        self.range = None
        self.profiled += 1
        if self.profiled >= self.steps:
            self._stop()
        else:
            self._open(n + 1)
        return True

    @contextmanager
    def excluded(self):
        """`run.paused()` during the profiled steps: left out of the breakdown."""
        if self.state != "running":
            yield
            return
        from torch.autograd.profiler import record_function

        with record_function(PAUSED_RANGE):
            yield

    def close(self, steps_done: int) -> None:
        """At the run's end: a profile still running (the data ran out) keeps its whole steps."""
        if self.state == "running":
            if self.range is not None:
                self.range.__exit__(None, None, None)  # a step that never ended: not counted
                self.range = None
            self.recorder.note(
                f"profile: the data ran out after {self.profiled} of {self.steps} profiled steps"
            )
            self._stop()
        elif self.state == "waiting":
            self.recorder.note(
                f"profile: the run ended after {steps_done} steps, before step "
                f"{self.starts_after + 1}, the first to profile: no time breakdown"
            )
            self.state = "failed"

    def _stop(self) -> None:
        self.state = "done"
        t0 = time.perf_counter()
        try:
            with quiet_native_stderr():
                self.prof.stop()
        except Exception as e:
            self._fail(f"torch.profiler failed to stop: {e.__class__.__name__}: {e}")
            return
        finally:
            if self.hooks is not None:
                self.hooks.remove()
                self.hooks = None
        if self.profiled:
            try:
                self._analyse()
            except Exception as e:
                self.recorder.note(f"profile: no breakdown: {e.__class__.__name__}: {e}")
            if self.trace_dir is not None:
                self._export()
        self.prof = None
        if not self.measuring and self.device.type != "cuda":
            self.recorder.note(
                "profile: the timed window starts right after the profiled steps, and peak RSS "
                "may include memory the profiler freed but the process still holds (about "
                "0.1 GiB on tiny); --max-steps profiles after the window instead"
            )
        self.recorder.say(
            f"[{self.recorder.step}] profile analysed in {time.perf_counter() - t0:.1f} s"
            + (f"; trace: {self.trace}" if self.trace else "")
        )

    def _analyse(self) -> None:
        use_device = self.device.type == "cuda"
        events = self.prof.events()
        if use_device:  # torch 2.11: a kernel's launching op, from kineto (breakdown.py)
            link_kernels(events, self.prof.profiler.kineto_results)
        res = breakdown(events, self.profiled, use_device)
        if res is None:
            self.recorder.note("profile: no profiled step found in the profile: no breakdown")
            return
        if use_device and res.basis != "device time":
            self.recorder.note(
                "profile: no device activity recorded (CUPTI?): self CPU time instead"
            )
        share, ms = shares(res.seconds), per_step_ms(res)
        self.result = {
            "time_breakdown": share,
            "time_breakdown_ms": ms,
            "time_breakdown_basis": f"{res.basis}, share of {res.steps} profiled steps' "
            "wall time (the uncovered rest is data and host); time_breakdown_ms: ms per step, "
            "the uncovered rest is idle",
            "profiled_steps": res.steps,
            "profiled_ms": round(res.wall_s * 1000, 3),
        }
        self.recorder.say(
            f"[{self.recorder.step}] where the time goes: {describe(share, 8)}; per step "
            f"{res.wall_s * 1000 / res.steps:.1f} ms, of it {ms['idle']:.1f} ms idle"
        )

    def _export(self) -> None:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        stamp = re.sub(r"[^0-9]", "", self.started_at[:19])
        name = f"{self.recorder.step}-{stamp[:8]}T{stamp[8:]}Z"
        if world > 1:
            name += f"-rank{rank}"
        path = Path(self.trace_dir) / f"{name}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.prof.export_chrome_trace(str(path))
        except (OSError, RuntimeError) as e:
            why = os_error_why(e) if isinstance(e, OSError) else e  # str(e) names the path
            where = portable_path(path, self.trace_dir)  # the record names no place of this host
            self.recorder.note(f"profile: trace not written to {where}: {why}")
            return
        self.trace = str(path)

    def _fail(self, why: str) -> None:
        self.state = "failed"
        if self.hooks is not None:
            self.hooks.remove()
            self.hooks = None
        self.recorder.note(f"profile: {why}; no time breakdown")

    def fields(self) -> dict:
        """The record's fields: the breakdown (None when there is none) and the trace."""
        out = {"time_breakdown": None, **self.result}
        if self.trace_dir is not None:
            out["trace"] = portable_path(self.trace, self.trace_dir) if self.trace else None
        return out


def from_args(args, spec, device, recorder, started_at: str) -> StepProfiler | None:
    """The run's profiler when `--profile` (or `--trace`, which implies it) is given; the trace
    folder is checked now, before the model is built."""
    steps = getattr(args, "profile", None)
    trace = getattr(args, "trace", None)
    if steps is None and trace is None:
        return None
    if trace is not None:
        check_dir(trace, "--trace")
    return StepProfiler(spec, device, recorder, started_at, steps or PROFILE_STEPS, trace)


def excluded(profiler: StepProfiler | None):
    """`run.paused()`'s part: what runs inside is left out of a running profile."""
    return nullcontext() if profiler is None else profiler.excluded()
