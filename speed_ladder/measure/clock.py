"""The step clock: each step's time and loss, read without draining the GPU at every step.

A step's time runs from the previous step's end to its own. On CUDA each end is a CUDA event,
recorded without waiting, read at the window's end, a pause or the run's end; on a CPU the host
clock; on MPS the host clock after a synchronize. Losses stay tensors (CUDA: copied to pinned
memory behind the step's work) and become floats in batches. Warm-up, paused and profiled steps
are never timed. Why: docs/measurement.md, "Timed window" and "Inside the harness"."""

import statistics
import time

import torch

from speed_ladder.measure import device as dev
from speed_ladder.measure.phases import Phases


def _cuda_event():
    return torch.cuda.Event(enable_timing=True)


class StepClock:
    """Step times and losses of one run on `device`; `event` makes a CUDA timing event (a fake in
    the CPU tests)."""

    def __init__(self, device: torch.device, event=_cuda_event):
        self.device = device
        self.cuda = device.type == "cuda"
        self._event = event
        self.times: list[float] = []  # seconds, of the timed steps read so far, in order
        self.losses: list[float] = []  # one per step read so far, in order
        self._mark = None  # the last step end (or restart): an event, or perf_counter seconds
        self._pending: list[tuple] = []  # CUDA: (start, end) events of timed steps, not read
        self._held: list[tuple] = []  # (loss tensor, the step's end event or None), not read
        self.phases = Phases(self._now, device.type)  # each step's phases, on these marks

    def _now(self):
        if self.cuda:
            e = self._event()
            e.record()
            return e
        if self.device.type == "mps":
            dev.synchronize(self.device)  # why MPS still drains: the module docstring
        return time.perf_counter()

    def restart(self) -> None:
        """A new interval begins here (the start, the window's start, a pause's end)."""
        self._mark = self._now()
        self.phases.clear()

    def step_end(self, loss: torch.Tensor, timed: bool) -> None:
        """A step ended: keep its loss, mark its end, and its interval if it is `timed`."""
        held = loss.detach()
        if self.cuda and held.is_cuda:  # pinned and queued: read once the end event passed
            held = held.to("cpu", non_blocking=True)
        end = self._now()
        self._held.append((held, end if self.cuda else None))
        if timed:
            if self.cuda:
                self._pending.append((self._mark, end))
            else:
                self.times.append(end - self._mark)
        self.phases.step_end(self._mark, end, timed)
        self._mark = end

    def read(self, wait: bool) -> None:
        """Turn the pending steps into numbers: all of them with `wait` (the device was just
        synchronized), else those whose end event the GPU has passed, never waiting."""
        if self.cuda and wait and self._held:
            self._held[-1][1].synchronize()  # already passed after the caller's synchronize
        if wait:
            self.phases.read()
        n = len(self._pending) if wait else _passed(e for _, e in self._pending)
        self.times += [a.elapsed_time(b) / 1000 for a, b in self._pending[:n]]
        del self._pending[:n]
        n = len(self._held) if wait else _passed(e for _, e in self._held)
        if n:
            batch = torch.stack([t.reshape(()) for t, _ in self._held[:n]])
            self.losses += batch.tolist()  # one conversion for the batch, no .item() per step
            del self._held[:n]

    def progress(self, steps_done: int, total, tokens: int) -> str:
        """The progress line, read without waiting: its loss may be a few steps old, and then
        names its step; tok/s over the median step."""
        self.read(wait=False)
        rate = f"{tokens / statistics.median(self.times):,.0f} tok/s" if self.times else "warm-up"
        at = f" (step {len(self.losses)})" if self._held and self.losses else ""
        loss = f"{self.losses[-1]:.3f}{at}" if self.losses else "-"
        return f"  step {steps_done:>5}/{total}  loss {loss}  {rate}"


def _passed(events) -> int:
    """How many of the events, in order, the GPU has passed (None: a host mark, passed)."""
    n = 0
    for e in events:
        if e is not None and not e.query():
            break
        n += 1
    return n
