"""The peers against the ladder on the same machine: each peer's record (tools/peer.py makes the
peer, whose run writes it into TAG_DIR/peer.jsonl) beside the runs of the rungs that train its
model (TAG_DIR/runs.jsonl, the sweep's), as a ratio of tok/s.

    python tools/peer_compare.py TAG_DIR   # this module's comparison, printed

A tag's page (report/pages/tag_page.py) shows the same lines where the tag holds a peer.jsonl.

The rungs, from the registry (speed_ladder/data/ladder.json): the peer as published trains bf16
weights with the preset's dropout, so it stands beside the first rung with bf16 working weights
and dropout; the peer with --no-dropout beside the first rung with bf16 weights and dropout off,
and the last rung that trains that model too. A run of the ladder counts where it is an ok
run (not the A/A control) of the same preset, batch, context, warm-up and timed steps, on the
same machine (its fingerprint, speed_ladder/machine.py) as the peer's latest ok record; a rung
that fits its batch to the GPU (step 20) at its own batch, both batches named: on this GPU,
which trains faster. The
peer's tok/s is the median of its ok records of that same peer (source, changes, machine and
window): a peer run once per round of the sweep gives its rounds. Both sides were timed the same
way (tools/peer.py's `train` drives the ladder's clock): the ratio is each of our runs over the
peer's median (its median, min and max). The last line sums it up.
"""

import statistics
from pathlib import Path

from speed_ladder.ladder import Step, rungs
from speed_ladder.records import read_jsonl
from speed_ladder.store import RUNS

PEERS = "peer.jsonl"
# what makes two peer records rounds of one measurement
SAME = ("source_sha256", "changes", "machine", "preset", "batch_size", "timed_steps",
        "warmup_steps")  # fmt: skip


def rungs_for(dropout_off: bool, steps=None) -> list[Step]:
    """The rungs that train the peer's model: bf16 weights, dropout as the peer has it (see the
    module doc); the last of them too, for the peer without dropout."""
    steps = list(rungs() if steps is None else steps)
    off = lambda s: s.memory.dropout == "off"
    same = [s for s in steps if s.memory.bf16_weights and off(s) == dropout_off]
    return same[:1] + (same[-1:] if dropout_off and len(same) > 1 else [])


def comparable(run: dict, peer: dict, same_batch: bool = True) -> bool:
    """Whether a ladder record measured what the peer's did: the same preset, batch (unless
    `same_batch` is False), context, window and machine, an ok run that is not the A/A
    control."""
    sweep = run.get("sweep") if isinstance(run.get("sweep"), dict) else {}
    spec = run.get("spec") if isinstance(run.get("spec"), dict) else {}
    return (
        run.get("status") == "ok"
        and not sweep.get("control")
        and run.get("interpreted") is not True
        and isinstance(run.get("tokens_per_sec"), (int, float))
        and run.get("preset") == peer.get("preset")
        and (not same_batch or run.get("batch_size") == peer.get("batch_size"))
        and run.get("context_length") == peer.get("context_length")
        and run.get("timed_steps") == peer.get("timed_steps")
        and spec.get("warmup_steps") == peer.get("warmup_steps")
        and run.get("machine") == peer.get("machine")
    )


def latest_peers(records: list) -> dict[str, list[dict]]:
    """{peer name: its ok records of the same peer as its latest ok one (source, changes,
    machine: the rounds of one measurement)}, in the order the names first appear."""
    ok: dict[str, list[dict]] = {}
    for r in records:
        if isinstance(r, dict) and r.get("status") == "ok" and isinstance(r.get("peer"), str):
            if isinstance(r.get("tokens_per_sec"), (int, float)) and r["tokens_per_sec"] > 0:
                ok.setdefault(r["peer"], []).append(r)
    same = lambda r, last: all(r.get(k) == last.get(k) for k in SAME)  # noqa: E731
    return {name: [r for r in recs if same(r, recs[-1])] for name, recs in ok.items()}


def _gib(v) -> str:
    return f"{v / 2**30:.2f} GiB" if isinstance(v, (int, float)) else "-"


def compare(tag_dir: Path, steps=None) -> tuple[list[str], str]:
    """(the comparison's lines, its one-line sum) of TAG_DIR's peers and runs."""
    tag_dir = Path(tag_dir)
    peers = latest_peers(read_jsonl(tag_dir / PEERS) if (tag_dir / PEERS).is_file() else [])
    if not peers:
        raise ValueError(f"{tag_dir / PEERS}: no ok peer record")
    runs = [r for r in read_jsonl(tag_dir / RUNS) if isinstance(r, dict)] if (
        tag_dir / RUNS
    ).is_file() else []  # fmt: skip
    first = next(iter(peers.values()))[-1]
    lines = [
        f"the peer against the ladder in {tag_dir.name}, on {first.get('device_name')} "
        f"({first.get('preset')}: batch {first.get('batch_size')} x {first.get('context_length')} "
        f"tokens, {first.get('warmup_steps')} warm-up + {first.get('timed_steps')} timed steps; "
        "both timed by the ladder's clock, tools/peer.py)"
    ]
    short = []
    for name, recs in peers.items():
        p = recs[-1]
        theirs = [r["tokens_per_sec"] for r in recs]
        peer_tps = statistics.median(theirs)
        over = f" [{min(theirs):,.0f}-{max(theirs):,.0f}]" if len(theirs) > 1 else ""
        step_ms = statistics.median(r.get("step_time_ms") or 0 for r in recs)
        lines.append(
            f"{name} ({p.get('source')}, {p.get('dtype')} weights, dropout {p.get('drop_rate')}): "
            f"{peer_tps:,.0f} tok/s{over} over {len(recs)} run(s), {step_ms:g} ms a step, peak "
            f"{_gib(max(r.get('peak_mem_reserved_bytes') or 0 for r in recs) or None)} reserved"
        )
        for s in rungs_for(bool(p.get("dropout_off")), steps):
            fits = s.memory.batch == "fits"  # its own batch, beside the peer's
            ours = [r for r in runs if r.get("step") == s.num and comparable(r, p, not fits)]
            if not ours:
                lines.append(f"  step {s.num} {s.title}: no ok run here with the peer's preset, "
                             "batch, window and machine to compare with")  # fmt: skip
                short.append(f"step {s.num} not run")
                continue
            tps = [r["tokens_per_sec"] for r in ours]
            ratios = [t / peer_tps for t in tps]  # each of our runs over the peer's median
            med = statistics.median(ratios)
            spread = f" [{min(ratios):.3f}-{max(ratios):.3f}]" if len(ratios) > 1 else ""
            peak = max((r.get("peak_mem_reserved_bytes") or 0) for r in ours) or None
            batches = sorted({r.get("batch_size") for r in ours}, key=str)
            at = f" at batch {', '.join(map(str, batches))} (the peer's {p.get('batch_size')})"
            lines.append(
                f"  step {s.num} {s.title}{at if fits else ''}: {statistics.median(tps):,.0f} "
                f"tok/s over {len(tps)} run(s), peak {_gib(peak)}: {med:.3f}x{spread} the peer's "
                "median tok/s"
            )
            short.append(f"step {s.num} {med:.3f}x {name}")
    return lines, "; ".join(short)


def page_section(tag_dir: Path) -> list[str]:
    """A tag page's lines on its peer (pages/tag_page.py): the comparison, or [] without one."""
    try:
        lines, _ = compare(tag_dir)
    except (OSError, ValueError):
        return []
    intro = (f"`python tools/peer_compare.py` on this folder's [{PEERS}]({PEERS}): Raschka's "
             "script, changed only for config, text and timing (tools/peer.py), timed by the "
             "ladder's clock on the same machine.")  # fmt: skip
    return ["## Beside the peer", "", intro, "", "```", *lines, "```", ""]
