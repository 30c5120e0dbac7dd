"""The published reference ladder: the single-A100 figures of Raschka's LLMs-from-scratch
(ch05/10), results/reference/published_a100_ladder.csv, which the charts draw beside this
project's measurements, always labelled as published figures, never as ours.

Like with like: each published step sits beside the rung of ours that does what it did (the
csv's `rungs`, with why in `like`), not beside our step of the same number: his 05 casts the
whole model to bf16, as our 15 does; his 07 bundles our 07 and 19 (his figure beside the first
of them, `counterpart`)."""

from pathlib import Path

from speed_ladder.errors import warn
from speed_ladder.files import RESULTS
from speed_ladder.ladder import tag_processes
from speed_ladder.records import read_jsonl
from speed_ladder.store import RUNS

REFERENCE_CSV = RESULTS / "reference" / "published_a100_ladder.csv"
REF_LABEL = "published A100 figures (Raschka), not our measurement"


def read_reference(path: Path = REFERENCE_CSV):
    """The published reference figures, or None when the file is missing."""
    import pandas as pd

    if not Path(path).is_file():
        return None
    try:
        df = pd.read_csv(
            path, dtype={"step": str, "rungs": str, "like": str}, keep_default_na=False
        )
        df["step"] = df["step"].str.zfill(2)
        missing = {"tokens_per_sec", "reserved_memory_gb", "optimization", "hardware"} - set(df)
        if missing:
            raise KeyError(f"no column {sorted(missing)[0]!r}")
        df["tokens_per_sec"] = df["tokens_per_sec"].astype(float)
        df["reserved_memory_gb"] = df["reserved_memory_gb"].astype(float)
    except (OSError, ValueError, KeyError, AttributeError, pd.errors.ParserError) as e:
        warn(f"{path} unreadable ({e.__class__.__name__}: {e}); charts drawn without it")
        return None
    return df


def resolve_reference(reference):
    """`reference` as a chart takes it: "default" reads the published figures; anything else
    (a DataFrame, or None for none) is used as given."""
    return read_reference() if isinstance(reference, str) and reference == "default" else reference


def _gpus(hardware) -> int | None:
    """4 from '4x A100 (PyTorch 2.6)'; None when the csv's hardware says no count."""
    head = str(hardware).split("x", 1)[0].strip()
    return int(head) if head.isdigit() else None


def is_gpu_tag(tag_dir: Path) -> bool:
    """Whether a tag's runs ran on CUDA (their records' `device`): only such a tag's table and
    ladder-page lines set the published A100 figures beside its steps."""
    return any(isinstance(r, dict) and r.get("device") == "cuda"
               for r in read_jsonl(Path(tag_dir) / RUNS))  # fmt: skip


def gpu_ladders(tag_dirs) -> list[Path]:
    """The 1-process tags that ran on CUDA: the ladders the README sets beside the published
    single-A100 ladder."""
    return [Path(t) for t in tag_dirs if tag_processes(Path(t).name) == 1 and is_gpu_tag(t)]


def single_gpu(ref):
    """The reference's rows measured on one GPU (step 11's 4x A100 left out), or None."""
    if ref is None or not len(ref):
        return None
    one = ref[ref["hardware"].astype(str).str.startswith("1x ")]
    return one if len(one) else None


def records(ref) -> list[dict]:
    """The reference's rows as dicts; none without a reference."""
    return [] if ref is None else ref.to_dict("records")


def rungs_of(row: dict) -> list[str]:
    """Our rungs that do what a published step did: its `rungs` ('07 19'), else its own step."""
    return str(row.get("rungs") or row["step"]).split()


def counterpart(ref, rung: str) -> dict | None:
    """The published row whose `rungs` hold our `rung` (the first of them carries his figure),
    or None."""
    return next((r for r in records(ref) if rung in rungs_of(r)), None)


def published(ref, step: str, processes: int = 1) -> tuple[float, float | None] | None:
    """(the tok/s of the published step that our rung `step` is the first counterpart of, its
    gain over the csv's previous step) for a tag of `processes` processes; None where no
    published step maps to it or it ran on another number of GPUs than the tag's processes
    (step 11: 4x A100, no like for like on one process). The gain is None for step 00 and where
    the metric changes between the two rows (avg tok/s up to 07, step tok/s from 08: no ratio
    across them)."""
    row = counterpart(ref, step)
    if row is None or rungs_of(row)[0] != step or _gpus(row["hardware"]) not in (None, processes):
        return None
    rows = records(ref)
    at = next(i for i, r in enumerate(rows) if r["step"] == row["step"])
    prev = rows[at - 1] if at > 0 else None  # the csv's row before: its previous step
    same = prev is not None and prev.get("metric") == row.get("metric") and prev["tokens_per_sec"]
    gain = row["tokens_per_sec"] / prev["tokens_per_sec"] if same else None
    return float(row["tokens_per_sec"]), gain


def his_step(ref, step: str) -> str:
    """'05', or '07 (our 07 + 19)' where his step bundles several of ours: the published step
    beside our rung `step`; '' where none maps to it."""
    row = counterpart(ref, step)
    if row is None:
        return ""
    ours = rungs_of(row)
    return row["step"] + (f" (our {' + '.join(ours)})" if len(ours) > 1 else "")


def published_cell(ref, step: str, processes: int = 1) -> str:
    """'142,156 (1.12x)' for a tag page's column, 'his 05: 45,486 (1.60x)' where his step has
    another number; '112,046' without a gain; '–' without one."""
    fig = published(ref, step, processes)
    if fig is None:
        return "–"
    his = his_step(ref, step)
    head = "" if his == step else f"his {his}: "
    return head + f"{fig[0]:,.0f}" + (f" ({fig[1]:.2f}x)" if fig[1] is not None else "")


def mapping_note(ref) -> str:
    """'His step 05 (our 15) casts ...': each published step that is not our step of its number,
    or says more (the csv's `like`); '' where none is."""
    moved = [r for r in records(ref) if rungs_of(r) != [r["step"]] or r.get("like")]
    said = [f"His step {r['step']} (our {' + '.join(rungs_of(r))}) {r['like']}." for r in moved]
    return " ".join(said)


def metric_switch(ref) -> str | None:
    """The first step whose metric is not the one before's ('08'), or None."""
    if ref is None:
        return None
    rows = ref.to_dict("records")
    pairs = zip(rows, rows[1:], strict=False)
    return next((b["step"] for a, b in pairs if a.get("metric") != b.get("metric")), None)


def published_note(ref) -> str:
    """The note under a GPU tag's table (its page): what the published column is, and is not."""
    switch = metric_switch(ref)
    metric = (
        f" Up to step {int(switch) - 1:02d} they are average tok/s, from step {switch} tok/s "
        f"of a training step (after torch.compile's warm-up), so step {switch} shows no gain."
        if switch
        else ""
    )
    return (
        "*published A100 tok/s (its gain)*: Raschka's **published** figures for the step of his "
        "that does what this rung does (LLMs-from-scratch ch05/10, one A100, PyTorch 2.6; step "
        "11 on 4x A100), not measured here, and that step's gain over his previous step."
        + metric
        + " *–*: his ladder has no such step, or it ran on another number of GPUs "
        "than this tag's processes. " + mapping_note(ref)
    ).rstrip()
