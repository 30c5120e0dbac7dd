"""Where the time goes, counted: the profiled steps' events (torch.profiler's FunctionEvents) as
seconds and shares per category of op_categories.py (`--profile`, profile.py). The denominator
and how backward is attributed: docs/measurement.md, "The time breakdown"."""

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Breakdown:
    """The profiled steps' time: seconds per category, adding up to their wall time."""

    seconds: dict[str, float]
    wall_s: float
    idle_s: float  # the part of data_host that no op (CUDA: no kernel) covers
    basis: str  # "device time", or the training thread's self CPU time
    steps: int


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


@dataclass(frozen=True)
class _Window:
    """The profiled steps' spans, the pauses inside them and the events those pauses hold."""

    spans: list[tuple[float, float]]
    paused: list[tuple[float, float]]
    in_paused: set[int]

    @property
    def wall(self) -> float:
        return sum(b - a for a, b in self.spans) - sum(b - a for a, b in self.paused)

    def holds(self, t: float) -> bool:
        return _within(t, self.spans) and not _within(t, self.paused)

    def counted(self, e) -> bool:
        """An op of the profiled steps' own: not a pause's, nor a range of ours."""
        return (
            self.holds(e.time_range.start)
            and id(e) not in self.in_paused
            and e.name != PAUSED_RANGE
            and not e.name.startswith(STEP_RANGE)
        )


def _window(cpu, ranges) -> _Window:
    spans = [(r.time_range.start, r.time_range.end) for r in ranges]
    pauses = [p for p in cpu if p.name == PAUSED_RANGE and _within(p.time_range.start, spans)]
    in_paused = set()
    for p in (p for p in cpu if p.name == PAUSED_RANGE):  # everything under a paused range
        todo = list(p.cpu_children)
        while todo:
            c = todo.pop()
            in_paused.add(id(c))
            todo.extend(c.cpu_children)
    paused = [(p.time_range.start, p.time_range.end) for p in pauses]
    return _Window(spans, paused, in_paused)


def _tally(by_name: dict | None, cat: str, name: str, us: float) -> None:
    if by_name is not None:
        by_name[cat, name] = by_name.get((cat, name), 0.0) + us


def _kernel_category(k, op, cats: dict, window: _Window) -> str | None:
    """The category a kernel counts in (its launching op's, else its own name's), or None
    where it does not count: a pause's, or outside the profiled steps."""
    if op is not None and (op.name == PAUSED_RANGE or id(op) in window.in_paused):
        return None  # an evaluation's, in run.paused()
    if op is None or op.name.startswith(STEP_RANGE):  # no op launched it: its name says
        if not window.holds(k.time_range.start):
            return None
        return kernel_category(k.name) or by_keywords(k.name) or "other"
    if not window.counted(op):
        return None
    return kernel_category(k.name) or cats.get(id(op)) or "other"


def _device_seconds(kernels, cpu, cats, window: _Window, by_name) -> dict[str, float]:
    """Microseconds per category of the kernels and copies launched in the profiled steps;
    kernels that overlap (NCCL beside compute) are scaled down to the time the GPU was busy."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    by_id = {e.id: e for e in cpu if getattr(e, "linked_correlation_id", 0) == 0}
    busy = []
    for k in kernels:
        cat = _kernel_category(k, by_id.get(getattr(k, "linked_correlation_id", 0)), cats, window)
        if cat is not None:
            seconds[cat] += _us(k)
            _tally(by_name, cat, k.name, _us(k))
            busy.append((k.time_range.start, k.time_range.end))
    busy_us, summed = _union(busy), sum(seconds.values())
    if summed > busy_us > 0:
        seconds = {c: v * busy_us / summed for c, v in seconds.items()}
    return seconds


def _cpu_seconds(cpu, ranges, cats, window: _Window, by_name) -> dict[str, float]:
    """Microseconds per category of the training thread's self CPU time in the profiled steps,
    and its wait for communication other threads do."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    training = ranges[0].thread
    for e in cpu:
        if e.thread == training and window.counted(e):
            # a module range's own time is the Python between its ops: data and host
            cat = "data_host" if e.name.startswith(PREFIX) else cats.get(id(e)) or "other"
            seconds[cat] += e.self_cpu_time_total
            _tally(by_name, cat, e.name, e.self_cpu_time_total)
    seconds["communication"] += _comm_waits(ranges, cats, window.counted)
    return seconds


def breakdown(events, steps: int, use_device: bool, by_name: dict | None = None):
    """The Breakdown of the profiler's FunctionEvents (`prof.events()`), None without a step
    range; only the first `steps` step ranges count. `by_name`, if given, collects the
    microseconds per (category, op name): what each category holds."""
    from torch.autograd import DeviceType

    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    ranges = [e for e in cpu if e.name.startswith(STEP_RANGE)]
    ranges = sorted(ranges, key=lambda e: e.time_range.start)[:steps]
    if not ranges:
        return None
    window, cats = _window(cpu, ranges), _resolve(cpu)
    kernels = [e for e in events if e.device_type != DeviceType.CPU and _device_work(e)]
    if use_device and kernels:
        seconds, basis = _device_seconds(kernels, cpu, cats, window, by_name), "device time"
    else:
        seconds = _cpu_seconds(cpu, ranges, cats, window, by_name)
        basis = "self CPU time of the training thread"
    covered = sum(seconds.values())
    total = max(window.wall, covered)
    seconds["data_host"] += total - covered  # the steps' time no op (no kernel) covers
    return Breakdown(
        seconds={c: v / 1e6 for c, v in seconds.items()},
        wall_s=total / 1e6,
        idle_s=(total - covered) / 1e6,
        basis=basis,
        steps=len(ranges),
    )


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
    call) to the op that launched it, where this torch leaves it out (2.11; with 2.13 nothing
    is linked: 0), copied from the profiler's own kineto events, matched as torch built them:
    by correlation id, device and start. Returns how many events were linked."""
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
    """The training thread's wait for communication other threads do (gloo's all-reduce on a
    CPU): the time no op covers right before a step's communication op, in microseconds."""
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


def per_step_ms(res: Breakdown) -> dict[str, float]:
    """{category: ms per profiled step} of the work alone, and `idle`: the rest of the steps'
    time; they add up to the steps' wall time per step."""
    ms = {c: v - (res.idle_s if c == "data_host" else 0) for c, v in res.seconds.items()}
    return {c: round(v * 1000 / res.steps, 4) for c, v in {**ms, "idle": res.idle_s}.items()}


def shares(seconds: dict) -> dict:
    """{category: share of the total} of a Breakdown's seconds, rounded to 5 digits."""
    total = sum(seconds.values())
    if total <= 0:
        return {}
    return {c: round(seconds[c] / total, 5) for c in CATEGORIES}


def describe(share: dict, width: int = 3) -> str:
    """'matmul 41%, loss 22%, ...': the largest first."""
    top = sorted(share.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{LABELS[c]} {v:.0%}" for c, v in top[:width] if v > 0)


def profiled_runs(records: list[dict]) -> int:
    """How many of a step's latest records in a row are ok and have a time breakdown: the runs
    a profiled sweep (`python -m speed_ladder run --profile`) counts as done."""
    n = 0
    for r in reversed(records):
        if r.get("status") != "ok" or not isinstance(r.get("time_breakdown"), dict):
            break
        n += 1
    return n
