"""How large a model fits a GPU, rung by rung (`python -m speed_ladder fit`), as the memory model
predicts it: for the ladder's first rung that changes each memory term, and all of them
combined, the largest model of a family and the largest batch of each GPT-2 preset. Predicted,
not measured; docs/memory.md's table and docs/memory-ladder.md come from here."""

import re
from dataclasses import dataclass, replace

from speed_ladder import ladder
from speed_ladder.errors import UserError
from speed_ladder.ladder import Memory
from speed_ladder.measure import memory_model as mm
from speed_ladder.presets import PRESETS

GB = 10**9
COMMON_GB = (24, 40, 80, 141)  # the usual GPU memory sizes: without a GPU and --memory
# Beyond gpt2-xl, the GPT-3 paper's shapes (Brown et al. 2020, Table 2.1): layers, width, heads.
# Its 13B row says width 5140 and 40 heads of 128: 5120 here, so that the heads divide it.
GPT3 = {"gpt3-2.7b": (32, 2560, 32), "gpt3-6.7b": (32, 4096, 32), "gpt3-13b": (40, 5120, 40)}
FAMILY = (*mm.GPT2_FAMILY, *GPT3)
BATCH = 8  # sequences per GPU the largest model is fitted at: gpt2-124m's before step 10
CONTEXT = 1024  # GPT-2's
MAX_BATCH = 2**16


def model(name: str, context: int = CONTEXT) -> dict:
    """A model of FAMILY as a preset's settings, at `context` tokens."""
    if name in GPT3:
        layers, width, heads = GPT3[name]
        shape = {"n_layers": layers, "emb_dim": width, "n_heads": heads}
        return {**PRESETS["gpt2-xl"], **shape, "context_length": context}
    return {**PRESETS[name], "context_length": context}


@dataclass(frozen=True)
class Rung:
    """A memory rung: what it adds, the ladder's step it is (None: the rungs combined), its
    memory terms and the step it adds them to."""

    name: str
    step: str | None
    memory: Memory
    base: str | None


def rungs() -> list[Rung]:
    """The ladder as it is (its first distributed rung: DDP), then the first rung that changes
    each memory term, then all of them together (offload's terms with accumulation's)."""

    def first(pred):
        return ladder.first(lambda r: r.distributed and pred(r.memory))

    found = [
        ("the ladder as it is", first(lambda m: True)),
        ("Liger's fused loss", first(lambda m: m.loss == "fused")),
        ("checkpointing", first(lambda m: m.checkpointing)),
        ("gradient accumulation", first(lambda m: m.accumulation)),
        ("FSDP2 over the processes", first(lambda m: m.state == "fsdp2")),
        ("CPU offload", first(lambda m: m.state == "fsdp2-offload")),
    ]
    out = [Rung(name, r.num, r.memory, r.after) for name, r in found]
    every = replace(out[-1].memory, accumulation=out[3].memory.accumulation)
    return [*out, Rung("all of them together", None, every, out[-1].step)]


def predict(rung: Rung, name: str, batch: int, nproc: int, context: int) -> mm.Prediction:
    p = mm.predict(model(name, context), nproc, batch=batch, memory=rung.memory)
    p.preset = name
    return p


def largest_batch(rung: Rung, name: str, memory: int, nproc: int, context: int) -> int:
    """The largest batch per GPU of model `name` that fits (0: none); with accumulation, a
    multiple of its micro-batches (a batch they do not split stays whole)."""
    k = rung.memory.micro_batches(model(name).get("accum_steps", 1), MAX_BATCH)
    ok = lambda m: mm.fits(predict(rung, name, k * m, nproc, context), memory)
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi * k <= MAX_BATCH and ok(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return k * lo


@dataclass
class FitRow:
    """One rung on one memory size: the largest model of FAMILY at `batch` (the smallest's
    prediction where none fits) and the largest batch of each GPT-2 preset (0: none fits)."""

    rung: str
    step: str | None
    memory_bytes: int
    nproc: int
    context: int
    batch: int
    model: str | None
    params: int | None
    predicted_bytes: int
    host_bytes: int
    fits: bool
    batches: dict


def fit_row(
    rung: Rung, memory: int, nproc: int = 1, context: int = CONTEXT, batch: int = BATCH
) -> FitRow:
    preds = [predict(rung, name, batch, nproc, context) for name in FAMILY]
    fitting = [p for p in preds if mm.fits(p, memory)]
    p = fitting[-1] if fitting else preds[0]
    batches = {n: largest_batch(rung, n, memory, nproc, context) for n in mm.GPT2_FAMILY}
    return FitRow(
        rung.name,
        rung.step,
        memory,
        nproc,
        context,
        batch,
        p.preset if fitting else None,
        p.params if fitting else None,
        p.total_bytes,
        p.host_bytes,
        bool(fitting),
        batches,
    )


def fit_rows(memory: int, nproc: int = 1, context: int = CONTEXT, batch: int = BATCH):
    return [fit_row(r, memory, nproc, context, batch) for r in rungs()]


ROOM = (80, 2)  # the GPUs a memory rung's room is shown on (LADDER.md): 2 of 80 GB


def room(step: str, gb: int = ROOM[0], nproc: int = ROOM[1]) -> tuple[FitRow, FitRow] | None:
    """(the rung it builds on, the rung) fitted on `nproc` GPUs of `gb` GB, for a memory rung
    of the ladder (rungs(), after the first); None for another."""
    r = next((r for r in rungs()[1:] if r.step == step), None)
    if r is None:
        return None
    base = Rung("its base", r.base, ladder.rung(r.base).memory, None)
    return fit_row(base, gb * GB, nproc), fit_row(r, gb * GB, nproc)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|GB|G)?\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes of `24GiB` (2^30), `80GB` or a bare `24` (10^9: GB)."""
    m = _SIZE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"{text!r} is not a size: use 24GiB, 80GB or 24 (GB)")
    gib = (m.group(2) or "").lower() == "gib"
    return int(float(m.group(1)) * (mm.GIB if gib else GB))


def size_text(n: int) -> str:
    """`80 GB` for a whole number of GB, else GiB: `79.2 GiB`."""
    return f"{n // GB} GB" if n % GB == 0 else f"{n / mm.GIB:.1f} GiB"


def fit_table(sizes=COMMON_GB, nprocs=(1, 4), batch: int = BATCH) -> str:
    """Markdown: the largest model of FAMILY per rung (rows) and GPU count x size (columns), at
    `batch` sequences per GPU and GPT-2's context."""
    cols = [(n, g) for n in nprocs for g in sizes]
    rows = [
        "| rung | step | " + " | ".join(f"{n}x {g} GB" for n, g in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for r in rungs():
        cells = [fit_row(r, g * GB, n, CONTEXT, batch).model or "none" for n, g in cols]
        rows.append(f"| {r.name} | {r.step or '–'} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
