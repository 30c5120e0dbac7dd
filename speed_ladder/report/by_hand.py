"""Runs started by hand beside a tag's sweep (`results/<tag>/by-hand/*.jsonl`, each with its log):
not sweep runs, so never rows of its summary, never in a gain chain or a chart; the tag's page
(pages/tag_page.py) names them in one labelled line under its table."""

from pathlib import Path

from speed_ladder.records import read_jsonl
from speed_ladder.report.rows import short_tps

BY_HAND = "by-hand"


def records(tag_dir: Path) -> list[dict]:
    """The ok records run by hand beside this tag, by step."""
    out = []
    for path in sorted((Path(tag_dir) / BY_HAND).glob("*.jsonl")):
        out += [r for r in read_jsonl(path) if isinstance(r, dict) and r.get("status") == "ok"]
    return sorted(out, key=lambda r: str(r.get("step")))


def line(tag_dir: Path) -> str | None:
    """'By hand, not sweep runs (`by-hand/`): step 11 398.5K tok/s (1 process, 40 steps); ...'"""
    recs = [r for r in records(tag_dir) if isinstance(r.get("tokens_per_sec"), (int, float))]
    if not recs:
        return None
    bits = []
    for r in recs:
        steps = (r.get("spec") or {}).get("max_steps") or len(r.get("losses") or [])
        n = r.get("world_size")
        bits.append(f"step {r.get('step')} {short_tps(r['tokens_per_sec'])} tok/s ({n} process"
                    f"{'es' if n != 1 else ''}, {steps} steps)")  # fmt: skip
    return (f"Run by hand, not sweep runs (in `{BY_HAND}/`, with their logs; not in the table, "
            "the gains or the charts): " + "; ".join(bits) + ".")  # fmt: skip
