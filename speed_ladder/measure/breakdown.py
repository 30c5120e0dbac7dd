"""Where the time goes, counted: the profiled steps' events (torch.profiler's FunctionEvents) turned
into seconds and shares per category (`--profile`, speed_ladder.measure.profile); which category an
op is, speed_ladder.measure.op_categories says.

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

Milliseconds per step (`per_step_ms`, the record's `time_breakdown_ms`): each category's work
alone divided by the profiled steps (CUDA: the device time of its kernels and copies, which the
profiler does not slow; CPU: the training thread's self CPU time), and `idle`, the remainder:
the steps' time no kernel (CPU: no op) covers. On CUDA `idle` is the GPU's idle time per
profiled step, under the profiler: its host overhead and the synchronize that ends each
profiled step make it larger than a timed step's (gpu_idle.py measures that one).

Backward. The autograd engine runs a backward node as `autograd::engine::evaluate_function:
XBackward0`, whose sequence number is that of the forward op that made it. The forward op's
category (by speed_ladder.measure.op_categories, its module range included) is the node's: e.g. the
TanhBackward0 and MulBackward0 of the hand-written GELU are norm_act, the BmmBackward0 of the
attention scores attention. Ops with a name of their own inside a node keep it (aten::mm in
MmBackward0 is matmul either way). Nodes without a forward op (AccumulateGrad) are other.
"""

from speed_ladder.measure.op_categories import (
    CATEGORIES,
    HOST,
    LABELS,
    PREFIX,
    by_keywords,
    kernel_category,
    named_category,
)

STEP_RANGE = PREFIX + "step: "
PAUSED_RANGE = PREFIX + "paused: not counted"
BACKWARD = "autograd::engine::evaluate_function: "


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
        "idle_s": (total - covered) / 1e6,  # that part of data_host
        "basis": basis,
        "steps": len(ranges),
    }


DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # kineto's activity types of device work
# CUPTI's synchronization records (kineto's cuda_sync; only with enable_cuda_sync_events): a wait,
# not work. Named here for a torch whose events carry no activity type
SYNC_NAMES = ("Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync")


def _device_work(e) -> bool:
    """A kernel, copy or memset on the device: not a range drawn on its timeline (a
    record_function's gpu_user_annotation), nor a synchronization or overhead record."""
    kind = getattr(e, "activity_type", None)
    if isinstance(kind, str) and kind:
        return kind in DEVICE_WORK
    return not getattr(e, "is_user_annotation", False) and e.name not in SYNC_NAMES


def link_kernels(events, kineto_results) -> int:
    """Give each FunctionEvent the `linked_correlation_id` that ties a kernel (and a runtime
    call) to the op that launched it, where this torch leaves it out: torch 2.11 (the GPU
    image's) reads it from kineto only to append the kernels' names and durations to their
    op, without their start, so a kernel could not be placed in its op's category, nor left
    out with a paused evaluation. Copied here from the profiler's own kineto events, matched
    as torch built them: by correlation id, device and start (the same integer nanoseconds
    from the trace's start, / 1000). Returns how many events were linked; with a torch whose
    events have it (2.13), 0 and nothing changes."""
    if not events or all(hasattr(e, "linked_correlation_id") for e in events):
        return 0
    linked = kineto_links(kineto_results)
    n = 0
    for e in events:
        if not hasattr(e, "linked_correlation_id"):
            e.linked_correlation_id = linked.get(event_key(e), 0)
            n += e.linked_correlation_id > 0
    return n


def event_key(e) -> tuple:
    """A FunctionEvent's kineto event: correlation id, device and start (µs from the trace's)."""
    return e.id, e.device_type, e.time_range.start


def kineto_links(kineto_results) -> dict[tuple, int]:
    """{event_key: linked correlation id} of the profiler's kineto events (0: an op of its own)."""
    t0 = kineto_results.trace_start_ns()
    return {
        (k.correlation_id(), k.device_type(), (k.start_ns() - t0) / 1000): k.linked_correlation_id()
        for k in kineto_results.events()
    }


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


def per_step_ms(res: dict) -> dict:
    """{category: ms per profiled step} of the work alone, and `idle`: the rest of the steps'
    time (see the module docstring); they add up to the steps' wall time per step."""
    n = res["steps"]
    ms = {c: v - (res["idle_s"] if c == "data_host" else 0) for c, v in res["seconds"].items()}
    return {c: round(v * 1000 / n, 4) for c, v in {**ms, "idle": res["idle_s"]}.items()}


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
