"""Where the time goes: profile a few training steps with torch.profiler and split their time
into categories (`--profile [N]`, `--trace DIR`).

When. The profiled steps are never timed. With `--max-steps` (a measuring run, as in the sweep)
they come after the timed window: the run trains N more steps (default 3) under the profiler and
only then reports finished; the window's peak memory is read before the profiler starts (its
buffers raise a CPU process's RSS). Without `--max-steps` (a tutorial run over epochs) the end
is not known in advance, so the N steps right after the warm-up are profiled and the timed
window starts after them (on a CPU its peak RSS may then include memory the profiler freed but
the process still holds; a note says so). A run whose data runs out first keeps the whole
steps it profiled (a note says so). Evaluation inside `run.paused()` during the profiled steps
is left out, as it is from the timing.

The denominator. Shares are of the profiled steps' wall time: each step runs inside a range
`speed-ladder/step: N`, from the previous step's end to its own (device synchronized), as the
timed steps are measured, minus any `run.paused()` inside it.
- CPU (and MPS, where this is the host's view): the self CPU time of every op on the training
  thread, by category; the rest of the steps' wall time, covered by no op (Python, the loop),
  is "data and host". Other threads (gloo's workers, the profiler's) run beside it and are not
  added; the training thread's wait for them, the uncovered time right before a step's
  communication op (e.g. before DDP's reducer copies the all-reduced buckets back), is
  communication.
- CUDA: the device time of the kernels and copies launched in the steps (any thread, so the
  autograd engine's device thread too), each counted in the category of the op that launched
  it (a kernel no op launched, by its name); the time the GPU is idle (waiting for the host or
  the data) is "data and host". Kernels that overlap (NCCL beside compute) are scaled down
  together to the time the GPU was busy.
Every category is a share of the same total, and "data and host" takes the remainder, so the
shares add up to 1.

The categories, by the op's name (`aten::...`, as in `prof.key_averages()`); an op with a name
below gives its category to everything it calls, except a callee with a name of its own:

- matmul: aten::mm, addmm, linear, mv: the linear layers' GEMMs, the output head's included
  (`nn.Linear` on (B, T, C) is aten::linear -> matmul -> mm).
- attention: aten::bmm and baddbmm (here only attention multiplies batches of matrices: the
  4-D `q @ k.T` is aten::matmul -> bmm), softmax, masked_fill, triu/tril (the causal mask),
  scaled_dot_product_attention and its flash/efficient/cudnn/math kernels
  (aten::_scaled_dot_product_flash_attention_for_cpu); and every op inside a module whose
  class name has "Attention" (its views, transposes, `.contiguous()`, the scaling divide).
- norm_act (normalization and activations): aten::layer_norm, native_layer_norm(_backward),
  rms_norm, gelu(_backward), silu, relu; and every op inside a module whose class name ends in
  "Norm" or is an activation's (GELU): the hand-written LayerNorm's mean, var, sub, div, sqrt,
  mul, add and GELU's pow, tanh, mul, add in steps 00-05.
- loss: aten::cross_entropy_loss, log_softmax, nll_loss and their backward (the zeroing of
  nll_loss's (N, V) gradient included); Liger's kernels. Step 12's chunked fallback: its
  cross-entropy is loss, its logits' aten::mm matmul, its loop's adds other.
- optimizer: the Optimizer.step#AdamW.step and Optimizer.zero_grad#... ranges (every
  _foreach_, lerp_, addcdiv_ or _fused_adamw_ op inside them), aten::_fused_adamw_.
- communication: nccl:*, gloo:*, c10d::* (c10d::allreduce_), record_param_comms, DDP's reducer
  ranges (its bucket copies and gradient scaling), the FSDP::* ranges (all-gather,
  reduce-scatter and their copies), NCCL kernels.
- data_host (data and host): the enumerate(DataLoader)#... range (fetch and collate), the loop's
  own copies and `.item()` (aten::to, copy_, _local_scalar_dense outside every category),
  host-device memcpy; and the steps' time that no op covers (Python, the loop).
- other: the rest: embeddings, residual adds, dropout, views outside the modules above,
  AccumulateGrad, torch.compile's fused kernels where their names do not say (below).

Backward. The autograd engine runs a backward node as `autograd::engine::evaluate_function:
XBackward0`, whose sequence number is that of the forward op that made it. The forward op's
category (found as above, the module hooks included) is the node's: e.g. the TanhBackward0 and
MulBackward0 of the hand-written GELU are norm_act, the BmmBackward0 of the attention scores
attention. Ops with a name of their own inside a node keep it (aten::mm in MmBackward0 is
matmul either way). Nodes without a forward op (AccumulateGrad) are other.

Module hooks. At the profile's start (never during the timed steps) forward pre/post hooks open
a `record_function` range `speed-ladder/<category>: <class>` around each norm, activation and
attention module, removed again when profiling ends. They only name the ops inside: a range's
own time (the Python between its ops, and the hook's) is data and host, like all Python. A
model that torch.compile compiled gets none (adding hooks would make it recompile); there the
native ops' names are enough (steps 06 on), except that on a CPU Inductor's fused C++ kernels
record no event of their own: their time is the compiled graph's own (`## Call
CompiledFxGraph ...`), in other. On CUDA Inductor names each Triton kernel
(`triton_per_fused_native_layer_norm_0`): the names it fuses decide its category (loss before
communication, attention, norm_act, optimizer, matmul), unnamed fusions are other.

The record gets `time_breakdown` ({category: share}), `time_breakdown_basis`, `profiled_steps`,
`profiled_ms` and, with `--trace DIR`, `trace`: the Chrome/Perfetto trace of the profiled steps
(`DIR/<step>-<start time>.json`, one per rank under torchrun: `-rank<r>`), for
chrome://tracing or https://ui.perfetto.dev. Under torchrun every rank is profiled (so that no
rank waits for a slower profiled one) and rank 0's breakdown is recorded.
"""

import os
import re
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from .cli import PROFILE_STEPS

CATEGORIES = (
    "matmul",
    "attention",
    "norm_act",
    "loss",
    "optimizer",
    "communication",
    "data_host",
    "other",
)
LABELS = {
    "matmul": "matmul",
    "attention": "attention",
    "norm_act": "normalization and activations",
    "loss": "loss",
    "optimizer": "optimizer",
    "communication": "communication",
    "data_host": "data and host",
    "other": "other",
}
PREFIX = "speed-ladder/"
STEP_RANGE = PREFIX + "step: "
PAUSED_RANGE = PREFIX + "paused: not counted"
BACKWARD = "autograd::engine::evaluate_function: "

# ---------------------------------------------------------------- which category an op is
_EXACT = {
    "matmul": "mm addmm linear mv addmv dot _addmm_activation _int_mm _scaled_mm mkldnn_linear",
    "attention": (
        "bmm baddbmm softmax _softmax _softmax_backward_data masked_fill masked_fill_ triu tril "
        "scaled_dot_product_attention"
    ),
    "norm_act": (
        "layer_norm native_layer_norm native_layer_norm_backward rms_norm _fused_rms_norm "
        "_fused_rms_norm_backward group_norm native_group_norm native_group_norm_backward "
        "batch_norm gelu gelu_ gelu_backward silu silu_ silu_backward relu relu_ "
        "threshold_backward"
    ),
    "loss": (
        "cross_entropy_loss log_softmax _log_softmax _log_softmax_backward_data nll_loss "
        "nll_loss_nd nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward"
    ),
    "optimizer": "_fused_adamw_ _fused_adam_ _fused_sgd_",
}
EXACT = {f"aten::{op}": cat for cat, ops in _EXACT.items() for op in ops.split()}
PREFIXES = (  # (start of the name, category), first match wins
    ("aten::_scaled_dot_product", "attention"),
    ("aten::_flash_attention", "attention"),
    ("aten::_efficient_attention", "attention"),
    ("aten::_cudnn_attention", "attention"),
    ("Optimizer.step#", "optimizer"),
    ("Optimizer.zero_grad#", "optimizer"),
    ("enumerate(DataLoader)", "data_host"),
    ("nccl:", "communication"),
    ("gloo:", "communication"),
    ("c10d::", "communication"),
    ("c10d:", "communication"),
    ("record_param_comms", "communication"),
    ("FSDP::", "communication"),
    ("torch::distributed::reducer", "communication"),  # DDP's reducer: gradient scaling,
    ("torch.distributed.ddp.reducer", "communication"),  # bucket copies
)
# what a name that is a list of fused ops (a Triton or C++ kernel of torch.compile, a backward
# node, a kernel no op launched) says, by the words in it: first match wins
KEYWORDS = (
    ("loss", "liger cross_entropy crossentropy nll_loss nllloss log_softmax logsoftmax".split()),
    ("communication", "nccl gloo all_reduce allreduce all_gather allgather reduce_scatter".split()),
    ("attention", "flash attention fmha softmax bmm".split()),
    ("norm_act", "layer_norm layernorm rms_norm rmsnorm gelu tanh silu relu".split()),
    ("optimizer", "adam sgd".split()),
)
_MATMUL_WORD = re.compile(r"(gemm|cutlass|nvjet|(^|[_:])(mm|addmm|matmul)($|[_0-9]))", re.I)
FUSED = ("triton_", "cpp_fused", "liger")
# outside every category's op and module: the loop's own host work
HOST = {
    f"aten::{op}"
    for op in (
        "to _to_copy copy_ pin_memory _pin_memory is_pinned item _local_scalar_dense empty "
        "empty_strided stack"
    ).split()
}
HOST_KERNELS = ("Memcpy HtoD", "Memcpy DtoH")


def by_keywords(name: str) -> str | None:
    low = name.lower()
    for cat, words in KEYWORDS:
        if any(w in low for w in words):
            return cat
    return "matmul" if _MATMUL_WORD.search(low) else None


def named_category(name: str) -> str | None:
    """The category an op's own name gives it (it passes it on to its callees), or None."""
    cat = EXACT.get(name)
    if cat is not None:
        return cat
    for start, cat in PREFIXES:
        if name.startswith(start):
            return cat
    if name.startswith(PREFIX):  # a module range of ours: speed-ladder/<category>: <class>
        cat = name[len(PREFIX) :].split(":", 1)[0]
        return cat if cat in CATEGORIES else None
    if name.startswith(FUSED) or "liger" in name.lower():
        return by_keywords(name)
    if name.startswith(("c10d", "ProcessGroup")) or "all_reduce" in name or "allreduce" in name:
        return "communication"
    return None


def kernel_category(name: str) -> str | None:
    """A device kernel's own category, whatever op launched it: NCCL, Liger, host copies."""
    if name.startswith(HOST_KERNELS):
        return "data_host"
    low = name.lower()
    if "nccl" in low:
        return "communication"
    if "liger" in low:
        return "loss"
    return None


# ---------------------------------------------------------------- module ranges
def _module_category(module: torch.nn.Module) -> str | None:
    name = type(module).__name__
    low = name.lower()
    if "attention" in low:
        return "attention"
    if low.endswith("norm") or low in ("gelu", "newgelu", "relu", "silu", "swiglu", "tanh"):
        return "norm_act"
    return None


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether torch.compile compiled the model or a part of it (and compiling is on)."""
    try:
        import torch._dynamo as dynamo

        if dynamo.config.disable:  # TORCH_COMPILE_DISABLE=1: runs eagerly
            return False
        compiled = dynamo.eval_frame.OptimizedModule
    except (ImportError, AttributeError):
        return False
    return any(
        isinstance(m, compiled) or getattr(m, "_compiled_call_impl", None) is not None
        for m in model.modules()
    )


class ModuleRanges:
    """Forward pre/post hooks that wrap each norm, activation and attention module's forward in a
    `record_function` range named by its category; installed for the profiled steps only."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.handles = []
        self.open: dict[int, list] = {}

    def install(self) -> int:
        from torch.autograd.profiler import record_function

        def pre(name):
            def hook(module, args):
                rf = record_function(name)
                rf.__enter__()
                self.open.setdefault(id(module), []).append(rf)

            return hook

        def post(module, args, output):
            stack = self.open.get(id(module))
            if stack:
                stack.pop().__exit__(None, None, None)

        for m in self.model.modules():
            cat = _module_category(m)
            if cat is not None:
                name = f"{PREFIX}{cat}: {type(m).__name__}"
                self.handles.append(m.register_forward_pre_hook(pre(name)))
                self.handles.append(m.register_forward_hook(post, always_call=True))
        return len(self.handles) // 2

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for stack in self.open.values():  # a forward that raised: close what it opened
            while stack:
                stack.pop().__exit__(None, None, None)


# ---------------------------------------------------------------- the breakdown
def _us(e) -> float:
    return e.time_range.end - e.time_range.start


def _within(t: float, spans) -> bool:
    return any(a <= t < b for a, b in spans)


def _resolve(events) -> dict[int, str | None]:
    """Each CPU event's category (by id()): its own name's, else its module range's or its
    backward node's forward op's, inherited down the call tree; None where nothing says."""
    roots = [e for e in events if e.cpu_parent is None]
    forward: dict[tuple, str | None] = {}  # (thread, sequence number) -> forward op's category

    def walk(record_forward: bool) -> dict[int, str | None]:
        out: dict[int, str | None] = {}
        stack = [(r, None, False, True) for r in reversed(roots)]
        while stack:
            e, ctx, in_backward, top = stack.pop()
            own = named_category(e.name)
            if own is None and ctx is None and top and e.name in HOST:
                own = "data_host"  # the loop's own copies and .item(), not the model's
            if e.name.startswith(BACKWARD):
                in_backward = True
                seq = getattr(e, "sequence_nr", -1)
                node = e.name[len(BACKWARD) :]
                found = forward.get((e.fwd_thread, seq)) if seq is not None and seq >= 0 else None
                own = found or by_keywords(node) if "AccumulateGrad" not in node else None
                ctx = own or ctx
            elif own is not None:
                ctx = own
            out[id(e)] = ctx
            seq = getattr(e, "sequence_nr", -1)
            if record_forward and not in_backward and seq is not None and seq >= 0:
                forward[(e.thread, seq)] = ctx  # the last op with a number made its node
            top = e.name.startswith(STEP_RANGE)  # its children are the loop's own ops
            for c in reversed(e.cpu_children):
                stack.append((c, ctx, in_backward, top))
        return out

    walk(record_forward=True)
    return walk(record_forward=False)


def breakdown(events, steps: int, use_device: bool, by_name: dict | None = None) -> dict:
    """{category: seconds}, the profiled steps' wall seconds and the basis, from the profiler's
    FunctionEvents (`prof.events()`); only the first `steps` step ranges count. `by_name`, if
    given, collects the microseconds per (category, op name): what each category holds."""
    from torch.autograd import DeviceType

    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    ranges = [e for e in cpu if e.name.startswith(STEP_RANGE)]
    ranges = sorted(ranges, key=lambda e: e.time_range.start)[:steps]
    if not ranges:
        return {}
    spans = [(r.time_range.start, r.time_range.end) for r in ranges]
    paused = [
        (p.time_range.start, p.time_range.end)
        for p in cpu
        if p.name == PAUSED_RANGE and _within(p.time_range.start, spans)
    ]
    wall = sum(b - a for a, b in spans) - sum(b - a for a, b in paused)
    cats = _resolve(cpu)
    in_paused = set()
    for p in cpu:  # everything under a paused range
        if p.name == PAUSED_RANGE:
            todo = list(p.cpu_children)
            while todo:
                c = todo.pop()
                in_paused.add(id(c))
                todo.extend(c.cpu_children)

    def counted(e) -> bool:
        return (
            _within(e.time_range.start, spans)
            and not _within(e.time_range.start, paused)
            and id(e) not in in_paused
            and e.name != PAUSED_RANGE
            and not e.name.startswith(STEP_RANGE)
        )

    seconds = dict.fromkeys(CATEGORIES, 0.0)
    devices = [e for e in events if e.device_type != DeviceType.CPU and _device_work(e)]
    if use_device and devices:
        by_id = {e.id: e for e in cpu if getattr(e, "linked_correlation_id", 0) == 0}
        busy = []
        for k in devices:
            op = by_id.get(getattr(k, "linked_correlation_id", 0))
            if op is not None and (op.name == PAUSED_RANGE or id(op) in in_paused):
                continue  # an evaluation's, in run.paused()
            if op is None or op.name.startswith(STEP_RANGE):  # no op launched it: its name says
                t = k.time_range.start
                if not _within(t, spans) or _within(t, paused):
                    continue
                cat = kernel_category(k.name) or by_keywords(k.name) or "other"
            elif counted(op):
                cat = kernel_category(k.name) or cats.get(id(op)) or "other"
            else:
                continue
            seconds[cat] += _us(k)
            if by_name is not None:
                by_name[cat, k.name] = by_name.get((cat, k.name), 0.0) + _us(k)
            busy.append((k.time_range.start, k.time_range.end))
        busy_us = _union(busy)
        summed = sum(seconds.values())
        if summed > busy_us > 0:  # overlapping kernels (NCCL beside compute): the busy time
            seconds = {c: v * busy_us / summed for c, v in seconds.items()}
        basis = "device time"
    else:
        training = ranges[0].thread
        for e in cpu:
            if e.thread != training or not counted(e):
                continue
            cat = cats.get(id(e)) or "other"
            if e.name.startswith(PREFIX):  # a module range's own time: Python between its ops
                cat = "data_host"
            seconds[cat] += e.self_cpu_time_total
            if by_name is not None:
                by_name[cat, e.name] = by_name.get((cat, e.name), 0.0) + e.self_cpu_time_total
        seconds["communication"] += _comm_waits(ranges, cats, counted)
        basis = "self CPU time of the training thread"
    covered = sum(seconds.values())
    total = max(wall, covered)
    seconds["data_host"] += total - covered  # the steps' time no op (no kernel) covers
    return {
        "seconds": {c: v / 1e6 for c, v in seconds.items()},
        "wall_s": total / 1e6,
        "basis": basis,
        "steps": len(ranges),
    }


DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # kineto's activity types of device work


def _device_work(e) -> bool:
    """A kernel, copy or memset on the device: not a range drawn on its timeline (a
    record_function's gpu_user_annotation), nor a synchronization or overhead record."""
    kind = getattr(e, "activity_type", None)
    if isinstance(kind, str) and kind:
        return kind in DEVICE_WORK
    return not getattr(e, "is_user_annotation", False)


def _comm_waits(ranges, cats, counted) -> float:
    """The training thread's wait for communication that other threads do (gloo's all-reduce
    on a CPU): the time no op covers right before a step's communication op, e.g. before DDP's
    reducer copies the reduced buckets back (copy_bucket_to_grad), in microseconds."""
    wait = 0.0
    for r in ranges:
        t = r.time_range.start
        for c in sorted(r.cpu_children, key=lambda e: e.time_range.start):
            if cats.get(id(c)) == "communication" and counted(c):
                wait += max(0.0, c.time_range.start - t)
            t = max(t, c.time_range.end)
    return wait


def _union(spans) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def shares(seconds: dict) -> dict:
    """{category: share of the total}, rounded to 5 digits; they add up to 1 (to 1e-4)."""
    total = sum(seconds.values())
    if total <= 0:
        return {}
    return {c: round(seconds.get(c, 0.0) / total, 5) for c in CATEGORIES}


def describe(share: dict, width: int = 3) -> str:
    """'matmul 41%, loss 22%, ...': the largest first."""
    top = sorted(share.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{LABELS[c]} {v:.0%}" for c, v in top[:width] if v > 0)


# ---------------------------------------------------------------- the run's profiler
class StepProfiler:
    """Profiles `steps` training steps for a `Run` (see the module docstring for when)."""

    def __init__(self, run, steps: int, trace_dir: str | None):
        self.run, self.steps, self.trace_dir = run, steps, trace_dir
        p = run.preset
        self.measuring = p["max_steps"] is not None
        # the step after which profiling starts: the window's end, or the warm-up's
        self.starts_after = p["max_steps"] if self.measuring else p["warmup_steps"]
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

        cuda = self.run.device.type == "cuda"
        activities = [ProfilerActivity.CPU]
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        self.first = first_step
        last = first_step + self.steps - 1
        when = "after the timed window" if self.measuring else "after the warm-up, before it"
        self.run.note(f"profiled steps {first_step}-{last} {when}: not timed (--profile)")
        try:
            if self.model is not None and not is_compiled(self.model):
                self.hooks = ModuleRanges(self.model)
                self.hooks.install()
            elif self.model is not None:
                self.run.note(
                    "profile: compiled model, no module ranges: its fused kernels' time is in "
                    "'other' where their names do not say what they fuse"
                )
            self.prof = profile(activities=activities)
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

    def close(self) -> None:
        """At the run's end: a profile still running (the data ran out) keeps its whole steps."""
        if self.state == "running":
            if self.range is not None:
                self.range.__exit__(None, None, None)  # a step that never ended: not counted
                self.range = None
            self.run.note(
                f"profile: the data ran out after {self.profiled} of {self.steps} profiled steps"
            )
            self._stop()
        elif self.state == "waiting":
            self.run.note(
                f"profile: the run ended after {self.run.steps_done} steps, before step "
                f"{self.starts_after + 1}, the first to profile: no time breakdown"
            )
            self.state = "failed"

    def _stop(self) -> None:
        self.state = "done"
        t0 = time.perf_counter()
        try:
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
                self.run.note(f"profile: no breakdown: {e.__class__.__name__}: {e}")
            if self.trace_dir is not None:
                self._export()
        self.prof = None
        if not self.measuring and self.run.device.type != "cuda":
            self.run.note(
                "profile: the timed window starts right after the profiled steps, and peak RSS "
                "may include memory the profiler freed but the process still holds (about "
                "0.1 GiB on tiny); --max-steps profiles after the window instead"
            )
        self.run.print(
            f"[{self.run.step}] profile analysed in {time.perf_counter() - t0:.1f} s"
            + (f"; trace: {self.trace}" if self.trace else "")
        )

    def _analyse(self) -> None:
        use_device = self.run.device.type == "cuda"
        res = breakdown(self.prof.events(), self.profiled, use_device)
        if use_device and res and res["basis"] != "device time":
            self.run.note("profile: no device activity recorded (CUPTI?): self CPU time instead")
        if not res:
            self.run.note("profile: no profiled step found in the profile: no breakdown")
            return
        share = shares(res["seconds"])
        self.result = {
            "time_breakdown": share,
            "time_breakdown_basis": f"{res['basis']}, share of {res['steps']} profiled steps' "
            "wall time (the uncovered rest is data and host)",
            "profiled_steps": res["steps"],
            "profiled_ms": round(res["wall_s"] * 1000, 3),
        }
        self.run.print(f"[{self.run.step}] where the time goes: {describe(share, 8)}")

    def _export(self) -> None:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        stamp = re.sub(r"[^0-9]", "", self.run.started_at[:19])
        name = f"{self.run.step}-{stamp[:8]}T{stamp[8:]}Z"
        if world > 1:
            name += f"-rank{rank}"
        path = Path(self.trace_dir) / f"{name}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.prof.export_chrome_trace(str(path))
        except (OSError, RuntimeError) as e:
            self.run.note(f"profile: trace not written to {path}: {e}")
            return
        self.trace = str(path)

    def _fail(self, why: str) -> None:
        self.state = "failed"
        if self.hooks is not None:
            self.hooks.remove()
            self.hooks = None
        self.run.note(f"profile: {why}; no time breakdown")

    def fields(self) -> dict:
        """The record's fields: the breakdown (None when there is none) and the trace."""
        out = {"time_breakdown": None, **self.result}
        if self.trace_dir is not None:
            out["trace"] = self.trace
        return out


def from_args(args, run) -> StepProfiler | None:
    """The run's profiler when `--profile` (or `--trace`, which implies it) is given; the trace
    folder is checked now, before the model is built."""
    steps = getattr(args, "profile", None)
    trace = getattr(args, "trace", None)
    if steps is None and trace is None:
        return None
    if trace is not None:
        from .outputs import check_dir

        check_dir(trace, "--trace")
    return StepProfiler(run, steps or PROFILE_STEPS, trace)


def excluded(profiler: StepProfiler | None):
    """`run.paused()`'s part: what runs inside is left out of a running profile."""
    return nullcontext() if profiler is None else profiler.excluded()


def profiled_runs(records: list[dict]) -> int:
    """How many of a step's latest records in a row are ok and have a time breakdown: the runs
    a profiled sweep (`python -m harness run --profile`) counts as done."""
    n = 0
    for r in reversed(records):
        if r.get("status") != "ok" or not isinstance(r.get("time_breakdown"), dict):
            break
        n += 1
    return n
