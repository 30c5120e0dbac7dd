"""Where a step's time goes, by phase: every record's `phase_ms` (data, forward, backward,
optimizer: the median timed step's, ms) and `data_share`, marked by hooks `run.set_model`
installs on the clock's marks (docs/measurement.md, "Phases"). Importing it needs no torch: the
summary reads PHASES."""

import statistics
from itertools import pairwise

PHASES = ("data", "forward", "backward", "optimizer")
MARKS = PHASES[1:]  # the boundaries a step marks between its start and its end
PHASE_MS = [f"phase_{p}_ms" for p in PHASES]  # a summary's columns (phase_columns)
PHASE_COLUMNS = [*PHASE_MS, "data_share"]


class Phases:
    """The phase boundaries of one run's steps, on its clock's marks (`now`: a CUDA event
    recorded, or perf_counter seconds); clock.py calls `clear`, `step_end` and `read`."""

    def __init__(self, now, device_type: str):
        self._now = now
        self.cuda = device_type == "cuda"
        self.why_none = None
        if device_type not in ("cuda", "cpu"):
            self.why_none = f"no phase times on {device_type}: its clock synchronizes every mark"
        self._marks: dict = {}  # the step in progress: forward, backward, optimizer
        self._pending: list[tuple] = []  # CUDA: the timed steps' five marks, not read
        self.ms: dict[str, list[float]] = {p: [] for p in PHASES}  # the timed steps', read
        self.incomplete = 0  # timed steps that missed a boundary
        self.interleaved = False  # a step ran forward again after its backward began
        self._hooks: list = []
        self._queue = None

    def attach(self, *modules) -> None:
        """Hook the model (and the fused loss, where the step has one; None is skipped)."""
        if self.why_none is not None:
            return
        import torch

        self._queue = torch.autograd.Variable._execution_engine.queue_callback
        for m in (m for m in modules if m is not None):
            self._hooks.append(m.register_forward_pre_hook(self._forward_begins, prepend=True))
            self._hooks.append(m.register_forward_hook(self._forward_ended))

    def _forward_begins(self, module, args) -> None:
        if "forward" not in self._marks:  # the step's first call: the model's, not the loss's
            self._marks["forward"] = self._now()
        elif "backward" in self._marks:  # a forward after a backward: micro-batches (step 18)
            self.interleaved = True

    def _forward_ended(self, module, args, out) -> None:
        if "forward" in self._marks and getattr(out, "requires_grad", False):
            out.register_hook(self._backward_begins)

    def _backward_begins(self, grad) -> None:
        if "backward" not in self._marks:  # the loss's hook fires before the model output's
            self._marks["backward"] = self._now()
            self._queue(lambda: self._queue(self._backward_ended))  # after DDP's and FSDP2's

    def _backward_ended(self) -> None:
        self._marks["optimizer"] = self._now()

    def clear(self) -> None:
        """A new interval begins (the clock's restart): the marks so far belong to no step."""
        self._marks = {}

    def step_end(self, start, end, timed: bool) -> None:
        """A step ran from the clock's mark `start` to `end`; keep its phases if `timed`."""
        marks, self._marks = self._marks, {}
        if not timed or self.why_none is not None:
            return
        if any(m not in marks for m in MARKS):
            self.incomplete += 1
            return
        bounds = (start, *(marks[m] for m in MARKS), end)
        if self.cuda:
            self._pending.append(bounds)
        else:
            self._add([(b - a) * 1000 for a, b in pairwise(bounds)])

    def read(self) -> None:
        """The pending CUDA steps as numbers (after the caller's synchronize)."""
        for bounds in self._pending:
            self._add([a.elapsed_time(b) for a, b in pairwise(bounds)])
        self._pending = []

    def _add(self, ms: list[float]) -> None:
        for p, v in zip(PHASES, ms, strict=True):
            self.ms[p].append(v)

    def fields(self, note) -> dict:
        """The record's `phase_ms` and `data_share`; null, with a `note` saying why, where not
        every timed step marked its phases. The hooks come off: the run is over."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        why = self.why_none
        if why is None and self.interleaved:
            why = (
                "no phase times: forward and backward interleave within a step (micro-batches), "
                "so four phases in a row do not split it"
            )
        if why is None and (self.incomplete or not self.ms["data"]):
            why = (
                f"no phase times: {self.incomplete} timed step(s) missed a boundary (a forward "
                "of the model handed to run.set_model, a backward from its output, its end)"
            )
        if why is not None:
            note(why)
            return {"phase_ms": None, "data_share": None}
        ms = median_step(self.ms)
        return {"phase_ms": ms, "data_share": round(ms["data"] / sum(ms.values()), 4)}


def median_step(ms: dict[str, list[float]]) -> dict[str, float]:
    """The phases (ms) of the median step, so that the four add up to the median step time
    (each phase's own median would not: it skips a disturbance in one phase of one step)."""
    totals = [sum(step) for step in zip(*ms.values(), strict=True)]
    order = sorted(range(len(totals)), key=totals.__getitem__)
    n = len(order)
    mid = order[(n - 1) // 2 : n // 2 + 1]
    return {p: round(statistics.fmean(v[i] for i in mid), 3) for p, v in ms.items()}


def phase_columns(runs: list[dict]) -> dict:
    """A summary row's `phase_<name>_ms` and `data_share`: the medians over the runs that have
    phases (None where none has)."""
    have = [r for r in runs if isinstance(r.get("phase_ms"), dict)]

    def median(values):
        values = [v for v in values if isinstance(v, (int, float))]
        return statistics.median(values) if values else None

    cols = [median(r["phase_ms"].get(p) for r in have) for p in PHASES]
    cols.append(median(r.get("data_share") for r in have))
    return dict(zip(PHASE_COLUMNS, cols, strict=True))
