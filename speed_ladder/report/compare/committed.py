"""This machine's numbers beside the committed ones: the sweep's closing table.

A sweep writes its own folder (results/local/<tag>/, which git ignores); the committed
results/<tag>/ folders are reference data. After the summary the sweep prints, per tag, each
step's tok/s here beside a committed tag's, with their ratio and each side's speedup over its
own step 00, and writes the same table to `vs_committed.csv` in its own folder (never into a
committed one). The committed tag is the one of the same hardware (this machine's hardware tag,
whatever --tag named the folder; a `-<6 hex>` of a machine that found another's records in its
folder aside) where there is one, else
the closest of the same device kind and process count: the same preset first, then the same
device name, then the same native bf16 marker, then the longest common start of the tag. A
preset that differs from this sweep's is said in the heading: the tok/s of two presets do not
compare, their speedups do only roughly.
"""

import csv
import io
import math
import re
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import RESULTS, atomic_write_bytes, portable_path, shown
from speed_ladder.report.summary import find_tags, read_summary

COMPARED = "vs_committed.csv"
_SUFFIX = re.compile(r"-x\d+$")


def same_hardware(tag: str) -> str:
    """The committed tag of this tag's hardware: `cpu-...-2c-1a2b3c-x1` -> `cpu-...-2c-x1`."""
    return re.sub(r"-[0-9a-f]{6}(-x\d+)$", r"\1", tag)


def _kind(tag: str) -> str:
    return tag.split("-", 1)[0] if tag.startswith(("cpu-", "mps-")) else "gpu"


def _marker(tag: str) -> str | None:
    found = re.search(r"-(bf16|amx)-", tag)
    return found.group(1) if found else None


def _first(df, column: str):
    values = [v for v in df[column] if isinstance(v, str) and v]
    return values[0] if values else None


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else None


def choose(
    tag: str, preset: str | None, name: str | None, committed: list[Path]
) -> tuple[Path, str] | None:
    """(the committed tag folder to compare `tag` with, why that one), or None. `tag`: the
    hardware's (machine.tag_base and -xN); `preset`, `name`: this sweep's preset and device
    name. The sweep's closing table and its first guess of each run's duration
    (sweep/preflight.py) both take it."""
    exact = same_hardware(tag)
    for d in committed:
        if d.name == exact:
            return d, "the same hardware"
    suffix = _SUFFIX.search(tag)
    scored = []
    for d in committed:
        same_processes = suffix is not None and d.name.endswith(suffix.group(0))
        if _kind(d.name) != _kind(tag) or not same_processes:
            continue
        try:
            theirs = read_summary(d)
        except UserError:
            continue
        score = (
            _first(theirs, "preset") == preset,
            _first(theirs, "device_name") == name,
            _marker(d.name) == _marker(tag),
            _common(d.name, tag),
        )
        scored.append((score, d))
    if not scored:
        return None
    best = max(sorted(scored, key=lambda s: s[1].name), key=lambda s: s[0])  # ties: by name
    return best[1], "the closest committed tag"


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def rows(mine, theirs) -> list[dict]:
    """One row per step with a tok/s here: that tok/s, the committed tag's, their ratio, and
    each side's speedup over its own step 00 (None where a side has no number)."""
    by_step = {r["step"]: r for r in theirs.to_dict("records")}
    out = []
    for r in mine.to_dict("records"):
        tps = _number(r.get("tokens_per_sec_median")) if r.get("status") == "ok" else None
        if tps is None:
            continue
        other = by_step.get(r["step"]) or {}
        ref = _number(other.get("tokens_per_sec_median")) if other.get("status") == "ok" else None
        out.append({
            "step": r["step"],
            "title": r.get("title"),
            "tokens_per_sec": tps,
            "committed_tokens_per_sec": ref,
            "ratio": tps / ref if ref else None,
            "speedup_vs_00": _number(r.get("speedup_vs_00")),
            "committed_speedup_vs_00": _number(other.get("speedup_vs_00")) if ref else None,
        })  # fmt: skip
    return out


def _cell(v, fmt: str, unit: str = "") -> str:
    return "-" if v is None else format(v, fmt) + unit


def table(table_rows: list[dict], their_tag: str) -> str:
    head = ["step", "title", "your tok/s", f"{their_tag} tok/s", "ratio", "your speedup",
            "its speedup"]  # fmt: skip
    body = [[r["step"], str(r["title"] or "")[:30], _cell(r["tokens_per_sec"], ",.0f"),
             _cell(r["committed_tokens_per_sec"], ",.0f"), _cell(r["ratio"], ".2f", "x"),
             _cell(r["speedup_vs_00"], ".2f", "x"),
             _cell(r["committed_speedup_vs_00"], ".2f", "x")]
            for r in table_rows]  # fmt: skip
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    left = {0, 1}
    lines = [
        "  ".join(c.ljust(w) if i in left else c.rjust(w)
                  for i, (c, w) in enumerate(zip(line, widths, strict=True))).rstrip()
        for line in [head, ["-" * w for w in widths], *body]
    ]  # fmt: skip
    return "\n".join(lines)


def committed_tags(results: Path = RESULTS, mine: Path | None = None) -> list[Path]:
    """The committed tag folders, `mine` (a sweep's own, where it is one of them) left out."""
    return [d for d in find_tags(results) if mine is None or d.resolve() != Path(mine).resolve()]


def compare(tag_dir: Path, mine, results: Path = RESULTS, hardware: str | None = None) -> str:
    """The closing text for one tag folder of this sweep (its summary `mine`), and its table
    written to `tag_dir / COMPARED`. `hardware`: the tag of this machine's hardware (default:
    the folder's name; a --tag names it otherwise)."""
    tag_dir = Path(tag_dir)
    hardware = hardware or tag_dir.name
    chosen = choose(hardware, _first(mine, "preset"), _first(mine, "device_name"),
                    committed_tags(results, tag_dir))  # fmt: skip
    if chosen is None:
        return f"no committed tag in {results} of this kind ({_kind(hardware)}) to compare with"
    theirs_dir, why = chosen
    theirs = read_summary(theirs_dir)
    found = rows(mine, theirs)
    preset, their_preset = _first(mine, "preset"), _first(theirs, "preset")
    details = ", ".join(
        x for x in (_first(theirs, "device_name"), their_preset and f"preset {their_preset}",
                    _first(theirs, "torch_version") and f"torch {_first(theirs, 'torch_version')}")
        if x
    )  # fmt: skip
    heading = f"this machine against {portable_path(theirs_dir)} ({why}: {details})"
    if preset != their_preset:
        heading += f"; here preset {preset}: tok/s do not compare across presets"
    if not found:
        return heading + ": no step has a tok/s here yet"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["committed_tag", *found[0]], lineterminator="\n")
    writer.writeheader()
    for r in found:
        writer.writerow({"committed_tag": theirs_dir.name,
                         **{k: "" if v is None else v for k, v in r.items()}})  # fmt: skip
    path = tag_dir / COMPARED
    atomic_write_bytes(path, buf.getvalue().encode())
    return f"{heading}:\n{table(found, theirs_dir.name)}\n(also in {shown(path)})"
