"""`python -m speed_ladder fit`: how large a model fits a GPU's memory, rung by rung.

    python -m speed_ladder fit                      # this GPU's memory; no GPU: 24, 40, 80, 141 GB
    python -m speed_ladder fit --memory 24GiB --nproc 2
    python -m speed_ladder fit --memory 80GB --context 2048 --json

For each memory rung (measure/fit.py): the largest model of the GPT-2 family and the GPT-3
paper's larger shapes that fits at a stated batch per GPU, and the largest batch of each GPT-2
preset, as the memory model predicts them; then each rung's time cost, its tok/s over the rung it
builds on where a committed GPU record measured it. Sizes: `24GiB` (2^30 bytes), `80GB` or a
bare `24` (10^9 bytes)."""

import argparse
import json
from dataclasses import asdict

from speed_ladder.errors import UserError
from speed_ladder.files import ROOT
from speed_ladder.flags import positive
from speed_ladder.measure import fit
from speed_ladder.measure.memory_model import GIB, GPT2_FAMILY
from speed_ladder.report.compare.reference import is_gpu_tag
from speed_ladder.report.rows import number
from speed_ladder.report.summary import find_tags, read_summary


def this_gpu() -> int | None:
    """The first CUDA GPU's memory in bytes, or None without one."""
    import torch  # imported here: a `fit --memory` needs no torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory


def time_costs(tags=None) -> dict[str | None, str]:
    """{step: its tok/s over the rung it builds on, on each GPU tag of `tags` (default: every
    committed one) that measured it active} for the memory rungs; "not measured" where none
    did."""
    out = {}
    tags = find_tags(ROOT / "results") if tags is None else tags
    gpu = [t for t in tags if is_gpu_tag(t)]
    for r in fit.rungs():
        said = []
        for t in gpu:
            row = next((x for x in read_summary(t).to_dict("records") if x["step"] == r.step), {})
            gain = number(row.get("gain_vs_prev"))
            if row.get("status") == "ok" and row.get("step_active") and gain is not None:
                said.append(f"{gain:.2f}x the tok/s of step {row['prev_step']} ({t.name})")
        out[r.step] = "; ".join(said) or "not measured"
    return out


def table(rows: list[fit.FitRow]) -> str:
    """Markdown: one memory size and process count, a line per rung."""
    head = [
        "| rung | step | largest model | params | predicted GiB | host GiB | "
        + " | ".join(GPT2_FAMILY)
        + " |",
        "|---|---|---|--:|--:|--:|" + "--:|" * 4,
    ]
    for r in rows:
        host = f"{r.host_bytes / GIB:.1f}" if r.host_bytes else "–"
        cells = [
            r.rung,
            r.step or "–",
            r.model or "none",
            f"{r.params / 1e6:,.0f}M" if r.params else "–",
            f"{r.predicted_bytes / GIB:.1f}",
            host,
            *(str(b) if b else "–" for b in r.batches.values()),
        ]
        head.append("| " + " | ".join(cells) + " |")
    return "\n".join(head)


def report(sizes: list[int], nproc: int, context: int, batch: int) -> str:
    out = [
        f"*Predicted*, not measured (measure/memory_model.py): per GPU, {nproc} process"
        f"{'es' if nproc > 1 else ''}, context {context}, bf16 autocast; a model fits where its "
        "prediction x 1.1 and 1 GiB of CUDA context fit the memory. *largest model*: of the "
        f"GPT-2 family and the GPT-3 paper's 2.7B, 6.7B and 13B shapes, at batch {batch} per "
        "GPU; then the largest batch per GPU of each GPT-2 preset (–: none); *host*: the state "
        "CPU offload keeps in host memory, per process."
    ]
    for size in sizes:
        out += [
            "",
            f"{fit.size_text(size)} per GPU:",
            "",
            table(fit.fit_rows(size, nproc, context, batch)),
        ]
    out += ["", "Time cost (tok/s over the rung it builds on, measured on a GPU):"]
    costs = time_costs()
    out += [f"- {r.step or '–'} {r.name}: {costs[r.step]}" for r in fit.rungs()]
    return "\n".join(out)


def _command(args) -> int:
    sizes = [args.memory] if args.memory else [this_gpu()]
    if sizes == [None]:  # no GPU here: the common sizes
        sizes = [g * fit.GB for g in fit.COMMON_GB]
    if args.json:
        costs = time_costs()
        rows = [
            asdict(r) | {"time_cost": costs[r.step]}
            for s in sizes
            for r in fit.fit_rows(s, args.nproc, args.context, args.batch)
        ]
        print(json.dumps(rows, indent=1))
    else:
        print(report(sizes, args.nproc, args.context, args.batch))
    return 0


def _size(text: str) -> int:
    try:
        return fit.parse_size(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_fit_parser(sub):
    p = sub.add_parser(
        "fit",
        help="how large a model fits a GPU's memory, rung by rung (predicted)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--memory",
        type=_size,
        metavar="SIZE",
        help="memory per GPU: 24GiB, 80GB, 24 (GB) (default: this GPU's; without a "
        "GPU, 24, 40, 80 and 141 GB)",
    )
    p.add_argument(
        "--nproc",
        type=positive,
        default=1,
        metavar="N",
        help="GPUs (processes) training together (default 1)",
    )
    p.add_argument(
        "--context",
        type=positive,
        default=fit.CONTEXT,
        metavar="T",
        help=f"tokens per sequence (default {fit.CONTEXT}, GPT-2's)",
    )
    p.add_argument(
        "--batch",
        type=positive,
        default=fit.BATCH,
        metavar="N",
        help=f"sequences per GPU for the largest model (default {fit.BATCH})",
    )
    p.add_argument("--json", action="store_true", help="the rows as JSON, one per rung and size")
    p.set_defaults(func=_command)
    return p
