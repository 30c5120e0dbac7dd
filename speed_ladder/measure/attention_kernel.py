"""Which scaled_dot_product_attention kernel a run's training call ran (the record's
`attention_kernel`: flash, efficient, cudnn, math, mps; `materialized` before step 07), read off
the aten ops torch.profiler records in the last warm-up step (CPU ops only, never timed); with no
warm-up step, torch's dispatcher is asked. The rungs that judge by it (07, 17) are asked then."""

import atexit
from contextlib import nullcontext, suppress

import torch

from speed_ladder import ladder
from speed_ladder.errors import UserError
from speed_ladder.measure import precision
from speed_ladder.measure.breakdown import PAUSED_RANGE
from speed_ladder.measure.profile import quiet_native_stderr
from speed_ladder.measure.sdpa_dispatch import dispatcher_choice

# the aten op that says which kernel SDPA dispatched to
OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math_for_mps": "mps",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "aten::_scaled_dot_product_attention_math": "math",
}
DECOMPOSED = "no SDPA op ran: the compiled graph computes attention as matmuls and a softmax"


def kernel_of(names: list[str]) -> tuple[str | None, str]:
    """(kernel, what says so) from the op names of one training step, in the order they ran:
    the first fused kernel's op; else the math op; else, where ops ran but no SDPA op, math
    (a compiled graph's); (None, why) where no op ran at all."""
    ops = [n for n in names if n in OPS]
    fused = [n for n in ops if OPS[n] != "math"]
    if fused:
        others = sorted({OPS[n] for n in fused} - {OPS[fused[0]]})
        return OPS[fused[0]], fused[0] + (f" (also {', '.join(others)})" if others else "")
    if ops:
        return "math", ops[0]
    return ("math", DECOMPOSED) if names else (None, "the profiler recorded no op")


def _attention_of(step: str) -> str | None:
    """The rung's attention (ladder.json's `attention`), or None where `step` is no rung."""
    try:
        return ladder.rung(step).memory.attention
    except (UserError, AttributeError):
        return None


class Watch:
    """A run's attention kernel: profiles its last warm-up step (`at`, at each step boundary),
    then hands it, with how it was found, to `found(kernel, how)`. `kernel` is the record's
    `attention_kernel`."""

    def __init__(self, step: str, device, warmup_steps: int, found):
        self.step, self.device, self.warmup, self.found = step, device, warmup_steps, found
        self.prof, self.watched, self.cfg = None, 0, None  # cfg: Run.set_model's
        attention = _attention_of(step)
        self.kernel = "materialized" if attention == "materialized" else None
        self.pending = attention not in (None, "materialized")  # SDPA: the kernel to find

    def at(self, done: int) -> bool:
        """At the step boundary after step `done` (set_model's is 0): stop a watch that ran and
        judge, or start one before the last warm-up step; True if it did either (the run's
        clock then restarts after it). `cfg`, the model's config, is set by then."""
        if self.prof is not None:
            self._stop()
            return True
        warmup = self.warmup
        if not self.pending or done != max(warmup - 1, 0):
            return False
        if warmup == 0:  # no step to watch before the timed window: ask the dispatcher
            self._decide(*self._dispatcher("no warm-up step to profile"))
            return True
        from torch.profiler import ProfilerActivity, profile

        self.watched = done + 1
        try:
            self.prof = profile(activities=[ProfilerActivity.CPU])
            with quiet_native_stderr():
                self.prof.start()
        except Exception as e:  # noqa: BLE001 - never lose a run to the profiler
            self.prof = None
            self._decide(*self._dispatcher(f"torch.profiler failed: {type(e).__name__}: {e}"))
            return True
        atexit.register(self._abandon)  # a run that fails in this step: a process left
        return True  # profiling at its exit ends in a segmentation fault, not its own exit code

    def _abandon(self) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            with suppress(Exception), quiet_native_stderr():
                prof.stop()

    def excluded(self):
        """run.paused(): what runs inside (evaluation, sampling) is not the training call."""
        from torch.autograd.profiler import record_function

        return nullcontext() if self.prof is None else record_function(PAUSED_RANGE)

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        atexit.unregister(self._abandon)
        try:
            with quiet_native_stderr():
                prof.stop()
            kernel, op = kernel_of(_training_ops(prof.events()))
        except Exception as e:  # noqa: BLE001
            kernel, op = None, f"torch.profiler failed: {type(e).__name__}: {e}"
        if kernel is None:
            self._decide(*self._dispatcher(op))
        else:
            self._decide(kernel, f"{op}, in warm-up step {self.watched}")

    def _dispatcher(self, why: str) -> tuple[str | None, str]:
        on = ladder.rung(self.step).memory.bf16_autocast  # step 05's autocast (bf16 or fp16)
        dtype = precision.DTYPES[precision.choice(self.device)[0]] if on else torch.float32
        kernel = dispatcher_choice(self.device, self.cfg, dtype)
        return kernel, f"{why}: torch's dispatcher's choice for the training call"

    def _decide(self, kernel: str | None, how: str) -> None:
        self.kernel, self.pending = kernel, False
        self.found(kernel, how)


def _training_ops(events) -> list[str]:
    """The profiled ops' names in the order they started, those inside run.paused() left out."""

    def paused(e) -> bool:
        while e is not None:
            if e.name == PAUSED_RANGE:
                return True
            e = e.cpu_parent
        return False

    ordered = sorted(events, key=lambda e: e.time_range.start)
    return [e.name for e in ordered if not (e.name in OPS and paused(e))]
