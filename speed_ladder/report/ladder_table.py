"""The README's ladder table (file, step, what it changes), written from the registry
(speed_ladder/data/ladder.json: each rung's `summary`) between two markers in README.md.
`python tools/ladder.py goldens` writes it and `check` fails where it is stale, so a new rung's
row comes with its entry. A rung that builds on another than the file before it (its `after`)
says so first: "after 12: ..."."""

from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import ROOT, atomic_write_bytes
from speed_ladder.ladder import Step, skips

BEGIN = "<!-- ladder:begin (python tools/ladder.py goldens writes this table) -->"
END = "<!-- ladder:end -->"


def ladder_table(steps: list[Step]) -> str:
    rows = ["| file | step | what it changes |", "|---|---|---|"]
    for s, skip in zip(steps, skips(steps), strict=True):
        after = f"after {s.after}: " if skip else ""
        rows.append(f"| `{s.rel}` | {s.num} | {after}{s.summary} |")
    return "\n".join(rows)


def splice(text: str, body: str, where: str = "README.md") -> str:
    """`text` with what lies between the markers replaced by `body`."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise UserError(f"{where}: no ladder table markers ({BEGIN} ... {END})")
    return text[: i + len(BEGIN)] + "\n" + body + "\n" + text[j:]


def stale(steps: list[Step], readme: Path = ROOT / "README.md") -> bool:
    text = readme.read_text(encoding="utf-8")
    return splice(text, ladder_table(steps), readme.name) != text


def update(steps: list[Step], readme: Path = ROOT / "README.md") -> bool:
    """Write the table into the README; whether it changed."""
    text = readme.read_text(encoding="utf-8")
    new = splice(text, ladder_table(steps), readme.name)
    if new != text:
        atomic_write_bytes(readme, new.encode("utf-8"))
    return new != text
