"""The README's ladder table (step, the rung it builds on, what it changes, its diff command),
written from the registry (speed_ladder/data/ladder.json: each rung's `summary` and `after`)
between two markers in README.md. `python tools/ladder.py goldens` writes it and `check` fails
where it is stale, so a new rung's row comes with its entry. Every row but the first gives the
exact `code --diff BASE FILE` that shows its one idea; a rung that builds on another than the
file before it (its `after`) has its base in bold, and a line under the table says so and why
(its `after_why`)."""

from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import ROOT, atomic_write_bytes
from speed_ladder.ladder import Step, skips

BEGIN = "<!-- ladder:begin (python tools/ladder.py goldens writes this table) -->"
END = "<!-- ladder:end -->"


STEPS_DOC = "docs/steps.md"  # each step at length (docs/steps.md); LADDER.md shows it


def diff_command(step: Step, base: Step | None) -> str:
    """`code --diff BASE FILE`: the one idea of `step`, against the rung it builds on."""
    return f"`code --diff {base.rel} {step.rel}`" if base else f"`{step.rel}` (the first rung)"


def ladder_table(steps: list[Step]) -> str:
    by_num = {s.num: s for s in steps}
    rows = ["| step | after | what it changes | diff against its base |", "|---|---|---|---|"]
    skipping = skips(steps)
    for s, skip in zip(steps, skipping, strict=True):
        after = "–" if s.after is None else f"**{s.after}**" if skip else s.after
        rows.append(f"| {s.num} | {after} | {s.summary} | {diff_command(s, by_num.get(s.after))} |")
    rows += ["", f"Each step at length (why it helps, what it costs, where it comes from): "
             f"[{STEPS_DOC}]({STEPS_DOC}); its code change and measured effect: "
             "[LADDER.md](LADDER.md)."]  # fmt: skip
    if any(skipping):
        bases = [s for s, skip in zip(steps, skipping, strict=True) if skip]
        said = [
            f"{s.num} builds on {s.after}" + f": {s.after_why}" * bool(s.after_why) for s in bases
        ]
        why = "; ".join(said)
        rows[-1] += (" A base in **bold** is not the file before: that rung builds on an earlier "
                     "one (`after` in speed_ladder/data/ladder.json), and is diffed and measured "
                     f"against it ({why}).")  # fmt: skip
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
