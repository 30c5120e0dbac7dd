"""The step clock: each step's time and loss, read without draining the GPU at every step.

A step's time is end-to-end: from the previous step's end to its own, data loading included.
`Run.step_done` marks every step's end here (`step_end`); the steps the run times (not warm-up,
not profiled) keep the interval from the mark before. `restart` puts a fresh mark down where a
new interval begins: the clock's start, the timed window's start (after its synchronize), the
end of a `run.paused()` block. A pause first reads what is pending (`read(wait=True)`, the
device just synchronized) and then restarts, so paused work lies between a step's end and the
restart, inside no interval: never timed. Warm-up and profiled steps set the mark their
successor starts from but keep no time. The same marks begin and end each step's phases (data,
forward, backward, optimizer: `phases`, phases.py), marked in between the same way.

CUDA: the mark is a `torch.cuda.Event(enable_timing=True)` recorded on the current stream
(nothing waits), and a step's time is `elapsed_time` between two consecutive marks, read when
the window ends, at a pause or at the run's end (after one synchronize there, outside the
per-step loop); the progress line reads only the pairs the GPU has passed (`Event.query()`,
which never waits). This is the quantity the host clock measured after a per-step synchronize:
the time between two step ends. The event gap measures it on the GPU's timeline, where a step
ends when its last kernel does. In steady state the host runs ahead, queueing step n+1 while
the GPU runs step n, and the GPU ends one step per host step: the two rates are the same, and
the event gap does not charge a step for the idle pipeline that a per-step drain creates (on
the H200, 4.7 ms of 80 at batch 32). Where the host is slower than the GPU (a host-bound step:
launches, Python, data loading), the GPU waits for it: those waits are gaps between kernels,
still inside the interval, so the step time stays the host's rate, and gpu_idle.py measures
how much of it the GPU was idle.

Elsewhere the host clock (`time.perf_counter()`): on a CPU the work is done when the
op returns, so no synchronize is needed (none is called); on MPS every step still
synchronizes before the clock is read, because this harness has never been measured on an
Apple GPU with MPS events and MPS commits its queued work lazily: an unsynchronized host mark
would be a launch time, not a step end, and the numbers MPS runs recorded before would change
meaning.

Losses. A step's loss stays a tensor: `loss.item()` every step would wait for the GPU (one
drain per step, what the per-step synchronize cost). On CUDA each step's loss is copied with
`non_blocking=True` into pinned host memory, queued behind the step's work and before the
step's end event, so its value is there once that event has passed; keeping the device tensor
instead would make each batched read queue its copy behind all the work in flight, a drain
at every progress line. On a CPU and MPS the detached tensor is kept. They become floats in
batches, `torch.stack(...).tolist()`, when the progress line prints (at most every 2 s: the
losses of the steps the GPU has passed, so the line may show a loss a few steps old, and says
at which step) and when the window ends, a pause begins or the run ends (all of them). The
record's `losses` is one float per step, in order, the same values `.item()` gave.
"""

import statistics
import time

import torch

from speed_ladder.measure import device as dev
from speed_ladder.measure.phases import Phases


def _cuda_event():
    return torch.cuda.Event(enable_timing=True)


class StepClock:
    """Step times and losses of one run on `device` (see the module docstring).
    `event` makes a timing event (CUDA; a fake in the CPU tests)."""

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
        """Turn the pending steps into numbers. `wait=True` (the window's end, a pause, the
        run's end: the device was just synchronized) reads them all; `wait=False` (the
        progress line) only the steps whose end event the GPU has passed, never waiting."""
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
        """The progress line: the steps the GPU has passed are read (never waiting), so its
        loss may be a few steps old, and then names its step; tok/s over the median step."""
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
