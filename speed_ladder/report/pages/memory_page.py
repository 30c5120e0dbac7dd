"""The memory ladder beside the speed ladder (docs/memory-ladder.md, written by plot_results.py,
and docs/memory.md's fit table between its markers): which model fits which GPU, rung by rung
(measure/fit.py, what `python -m speed_ladder fit` prints); a published memory ladder beside our
model's prediction of the same changes (Ailing Zhang's, results/reference/zhang_2024_*.csv, her
figures as published); and every committed tag's measured peak beside its prediction (the
summaries' `peak_reserved_gib` and `predicted_peak_gib`). Generated; edits are overwritten."""

import csv
import math
from dataclasses import replace
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import ROOT, atomic_write_bytes
from speed_ladder.measure import fit
from speed_ladder.measure import memory_model as mm
from speed_ladder.report.fit_command import table, time_costs
from speed_ladder.report.rows import number
from speed_ladder.report.summary import find_tags, read_summary

PAGE = ROOT / "docs" / "memory-ladder.md"
MEMORY_DOC = ROOT / "docs" / "memory.md"
BEGIN = (
    "<!-- fit:begin (python plot_results.py writes this table from speed_ladder/measure/fit.py) -->"
)
END = "<!-- fit:end -->"
ZHANG = ROOT / "results" / "reference" / "zhang_2024_memory.csv"
ZHANG_LARGEST = ROOT / "results" / "reference" / "zhang_2024_largest.csv"
MB = 10**6  # her "MB", read as 10^6 bytes (the unit is not defined there)
CONTEXTS = (128, 256, 512, 1024, 2048)
# What differs between her change and ours, row by row (the rungs' terms: measure/memory_model.py)
DIFFERS = [
    "ours: step 11's terms on one GPU: bf16 autocast over fp32 weights, flash attention, an "
    "untied output layer over the padded vocabulary, the loss's fp32 logits in full; her "
    "precision and kernels are not stated",
    "the same change: step 18's 2 micro-batches, the activations of 16 sequences",
    "step 13's checkpointing (each block's input kept, one block recomputed) without step 12's "
    "fused loss: the full logits stay",
    "none in ours: step 03's fused AdamW updates every parameter in one kernel, no temporaries; "
    "PyTorch's default foreach AdamW (hers before) keeps intermediates the size of the "
    "parameters, its for-loop mode one parameter's at a time",
    "step 14's FSDP2 on 2 processes: 16/2 B of state a parameter, the root and 2 blocks gathered",
]


def _rows(path: Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None


def her_memories() -> list[tuple[mm.Memory, int]]:
    """Her five changes on our rungs' terms, each on the one before: (terms, processes)."""
    base = fit.rungs()[0].memory  # the ladder as it is
    accum = replace(base, accumulation="accum_steps")
    ckpt = replace(accum, checkpointing=True)
    return [(base, 1), (accum, 1), (ckpt, 1), (ckpt, 1), (replace(ckpt, state="fsdp2"), 2)]


def _predict(memory, world: int, context: int, batch: int) -> int:
    return mm.predict(
        fit.model("gpt2-large", context), world, batch=batch, memory=memory
    ).total_bytes


def infer_context(hers: list[dict]) -> tuple[int, int]:
    """(T, our predicted saving in bytes): the context of CONTEXTS at which our prediction of
    her first change (accumulation x2: the same model and state, half the activations) is
    nearest her measured saving, as a ratio."""
    saving = (float(hers[0]["peak_mb"]) - float(hers[1]["peak_mb"])) * MB
    (a, _), (b, _) = her_memories()[:2]
    batch = int(hers[0]["batch"])
    ours = {t: _predict(a, 1, t, batch) - _predict(b, 1, t, batch) for t in CONTEXTS}
    best = min(ours, key=lambda t: abs(math.log(ours[t] / saving)))
    return best, ours[best]


def _largest(memory, gpus: int, context: int, batch: int, size: int) -> tuple[str, int] | None:
    fits = [
        (n, p)
        for n in fit.FAMILY
        if mm.fits(p := mm.predict(fit.model(n, context), gpus, batch=batch, memory=memory), size)
    ]
    return (fits[-1][0], fits[-1][1].params) if fits else None


def zhang_section() -> list[str]:
    hers, claim = _rows(ZHANG), _rows(ZHANG_LARGEST)[0]
    context, saving = infer_context(hers)
    batch = int(hers[0]["batch"])
    out = [
        "## Beside a published memory ladder",
        "",
        f"Ailing Zhang's *Efficient Training in PyTorch* (2024) measured GPT-2 large (36 layers, "
        f"width 1280, 20 heads) at batch {batch}, each change on the one before; her figures as "
        f"published ([{ZHANG.name}](../results/reference/{ZHANG.name})) beside our memory "
        "model's *predicted* peak for the same change on our rungs' terms. Her context length "
        f"is not stated; **{context}** is inferred: her first change (accumulation x2) keeps the "
        "model and its state and halves the activations, so her saving is the activations of "
        f"{batch // 2} sequences; among {', '.join(map(str, CONTEXTS))} tokens, {context} is "
        f"where our predicted saving ({saving / MB:,.0f} MB) is nearest hers. Her MB are read "
        "as 10^6 bytes.",
        "",
        "| her change | her peak MB | her step time s | our rungs | *predicted* MB | "
        "predicted / hers | what differs |",
        "|---|--:|--:|---|--:|--:|---|",
    ]
    labels = [
        "step 11",
        "+ step 18's accumulation",
        "+ step 13's checkpointing",
        "+ step 03's fused AdamW (already in)",
        "+ step 14's FSDP2, 2 processes",
    ]
    for h, (memory, world), label, why in zip(hers, her_memories(), labels, DIFFERS, strict=True):
        ours = _predict(memory, world, context, batch)
        out.append(
            f"| {h['change']} | {float(h['peak_mb']):,.0f} | {h['step_time_s']} | {label} | "
            f"{ours / MB:,.0f} | {ours / (float(h['peak_mb']) * MB):.2f} | {why} |"
        )
    size = int(claim["gpu_memory_gb"]) * fit.GB
    gpus = int(claim["after_gpus"])
    (first, _), *_, (last, _) = her_memories()
    every = fit.rungs()[-1]
    found = [
        _largest(first, 1, context, batch, size),
        _largest(last, gpus, context, batch, size),
        _largest(every.memory, gpus, context, batch, size),
    ]
    said = [
        f"{n} ({p / 1e6:,.0f}M)" if (n, p) != (None, None) else "none"
        for n, p in (f or (None, None) for f in found)
    ]
    ratio = found[1][1] / found[0][1] if found[0] and found[1] else None
    out += [
        "",
        f"**The largest model on {claim['gpu_memory_gb']} GB, before and after.** Hers "
        f"(published, {claim['gpu']}): {float(claim['before_params_m']):,.0f}M before her "
        f"changes, {float(claim['after_params_m']):,.0f}M after them with FSDP on {gpus} GPUs: "
        f"{claim['claim']}. Ours (*predicted*, batch {batch}, context {context}, of the GPT-2 "
        f"family and the GPT-3 paper's shapes): {said[0]} on step 11's terms, {said[1]} after "
        f"her changes on our rungs with FSDP2 on {gpus} GPUs"
        + (f" ({ratio:.1f}x the parameters)" if ratio else "")
        + f", and {said[2]} with all our memory rungs (CPU offload too).",
        "",
    ]
    return out


def checked_section(tags) -> list[str]:
    """Every committed tag's measured peak (GiB, per rank) beside its prediction, per step."""
    summaries = [(t, {r["step"]: r for r in read_summary(t).to_dict("records")}) for t in tags]
    steps = sorted({s for _, rows in summaries for s in rows})
    out = [
        "## The predictions checked",
        "",
        "Every committed results tag's measured peak beside the memory model's prediction for "
        "the same run, GiB per rank: *measured / predicted = ratio* (the summaries' "
        "`peak_reserved_gib` and `predicted_peak_gib`). On a CPU the peak is the process's RSS, "
        "PyTorch itself included (about 0.5 GiB the model does not count); on a GPU the "
        "allocator's reserved bytes.",
        "",
        "| step | " + " | ".join(f"`{t.name}`" for t, _ in summaries) + " |",
        "|---|" + "--:|" * len(summaries),
    ]
    for s in steps:
        cells = []
        for _, rows in summaries:
            r = rows.get(s) or {}
            got, want = number(r.get("peak_reserved_gib")), number(r.get("predicted_peak_gib"))
            ok = r.get("status") == "ok" and got is not None and want
            cells.append(f"{got:.2f} / {want:.2f} = {got / want:.2f}" if ok else "–")
        if any(c != "–" for c in cells):
            out.append(f"| {s} | " + " | ".join(cells) + " |")
    return [*out, ""]


def page_markdown(tags=None) -> str:
    tags = find_tags(ROOT / "results") if tags is None else tags
    costs = time_costs(tags)
    out = [
        "# The memory ladder: how large a model fits",
        "",
        "Beside the speed ladder, the memory one: which rungs make room for which model, as the "
        "memory model predicts it ([memory.md](memory.md)), a published memory ladder beside "
        "it, and every measured peak beside its prediction. Back to [README.md](../README.md). "
        "Your GPU: `python -m speed_ladder fit` (`--memory 24GiB --nproc 2`, `--json`).",
        "",
        "<!-- generated by plot_results.py from speed_ladder/measure/fit.py, "
        "results/reference/zhang_2024_*.csv and results/<tag>/summary.csv; edits here are "
        "overwritten -->",
        "",
        "## Which model fits which GPU",
        "",
        f"*Predicted*: the largest model at batch {fit.BATCH} per GPU, context {fit.CONTEXT}, "
        "bf16 autocast, a fit being the prediction x 1.1 and 1 GiB of CUDA context:",
        "",
        fit.fit_table(fit.COMMON_GB, (1, 2)),
        "",
        "On one 80 GB GPU and on two, with the largest batch of each GPT-2 preset:",
        "",
        table(fit.fit_rows(80 * fit.GB, 1)),
        "",
        table(fit.fit_rows(80 * fit.GB, 2)),
        "",
        "Each rung's time cost, its tok/s over the rung it builds on, where a committed GPU "
        "record measured it:",
        "",
        *(f"- {r.step or '–'} {r.name}: {costs[r.step]}" for r in fit.rungs()),
        "",
        *zhang_section(),
        *checked_section(tags),
    ]
    return "\n".join(out).rstrip() + "\n"


def memory_doc(text: str) -> str:
    """docs/memory.md's text with the fit table between its markers regenerated."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise UserError(f"{MEMORY_DOC.name}: no fit table markers ({BEGIN} ... {END})")
    return text[: i + len(BEGIN)] + "\n" + fit.fit_table() + "\n" + text[j:]


def write(tags, root: Path = ROOT) -> list[Path]:
    """docs/memory-ladder.md and docs/memory.md's fit table, in `root` (the README's folder)
    where it has a docs/memory.md; nothing elsewhere."""
    doc = Path(root) / "docs" / MEMORY_DOC.name
    if not doc.is_file():
        return []
    page = doc.parent / PAGE.name
    atomic_write_bytes(page, page_markdown(tags).encode("utf-8"))
    atomic_write_bytes(doc, memory_doc(doc.read_text(encoding="utf-8")).encode("utf-8"))
    return [page, doc]
