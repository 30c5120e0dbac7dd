"""The ladder itself: which step scripts there are, their titles, which are distributed, how a
`--steps` spec names them, and which of them a results tag of N processes holds.

The sweep, the charts and tools/ladder.py all find the steps here, and nowhere else.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import ROOT

_PROCESS_GROUP = re.compile(r"^[^#\n]*\binit_process_group\s*\(", re.MULTILINE)


def is_distributed(path: Path) -> bool:
    """Whether a step is distributed: its source sets up a process group (a call of
    `init_process_group(`, outside a comment), as steps 11-14 do. The sweep launches such a step
    through torchrun, on one process in the `-x1` tag and on N in the `-xN` tag."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return _PROCESS_GROUP.search(text) is not None


@dataclass(frozen=True)
class Step:
    num: str  # "05"
    path: Path
    title: str
    distributed: bool  # sets up a process group: launched through torchrun

    @property
    def ddp(self) -> bool:  # the older name of `distributed`
        return self.distributed

    @property
    def rel(self) -> str:
        try:
            return self.path.relative_to(ROOT).as_posix()
        except ValueError:
            return str(self.path)


_TITLE = re.compile(r"^\s*(?:[rRuU]?)(?:\"\"\"|''')\s*Step\s+\d+:\s*(.*?)\.(?:\s|$)")


def step_title(path: Path) -> str:
    """`Step NN: <title>.` from the docstring's first line; the file name if there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        first = ""
    m = _TITLE.match(first)
    if m and m.group(1).strip():
        return m.group(1).strip()
    return path.stem[3:].replace("_", " ") if path.stem[:2].isdigit() else path.stem


def discover(ladder_dir: Path = ROOT) -> list[Step]:
    """00_orig.py, then steps/NN_*.py in order."""
    ladder_dir = Path(ladder_dir).resolve()
    files = [ladder_dir / "00_orig.py"] if (ladder_dir / "00_orig.py").is_file() else []
    files += sorted((ladder_dir / "steps").glob("[0-9][0-9]_*.py"))
    steps, seen = [], set()
    for f in files:
        num = f.name[:2]
        if num in seen:
            raise UserError(f"two scripts for step {num} in {ladder_dir}: check steps/{num}_*.py")
        seen.add(num)
        steps.append(Step(num, f, step_title(f), is_distributed(f)))
    if not steps:
        raise UserError(f"no step scripts in {ladder_dir} (00_orig.py, steps/NN_*.py)")
    return steps


def parse_steps(spec: str | None, steps: list[Step]) -> list[Step]:
    """`05-08`, `00,07,10` or a mix (`00-02,07`); every number named must be a step."""
    if spec is None or spec.strip() in ("", "all"):
        return list(steps)
    by_num = {s.num: s for s in steps}
    known = f"{steps[0].num}-{steps[-1].num}" if len(steps) > 1 else steps[0].num

    def num(text: str) -> str:
        text = text.strip()
        if not text.isdigit():
            raise UserError(f"--steps {spec}: {text!r} is not a step number (e.g. 05-08,10)")
        n = text.zfill(2)
        if n not in by_num:
            raise UserError(f"--steps {spec}: no step {n} in the ladder (steps {known})")
        return n

    chosen: set[str] = set()
    for part in spec.split(","):
        if not part.strip():
            continue
        if "-" in part:
            lo, _, hi = part.partition("-")
            lo, hi = num(lo), num(hi)
            if lo > hi:
                raise UserError(f"--steps {spec}: range {lo}-{hi} runs backwards")
            chosen.update(n for n in by_num if lo <= n <= hi)
        else:
            chosen.add(num(part))
    if not chosen:
        raise UserError(f"--steps {spec}: no steps named (e.g. 05-08 or 00,07,10)")
    return [s for s in steps if s.num in chosen]


# ---------------------------------------------------------------- results tags of N processes
_PROCESSES = re.compile(r"-x(\d+)$")


def processes_suffix(nproc: int) -> str:
    """`-xN`: how a results tag says it ran its distributed steps on N processes."""
    return f"-x{nproc}"


def tag_processes(tag: str) -> int:
    """N of a tag's `-xN` suffix; 1 without one."""
    m = _PROCESSES.search(tag)
    return int(m.group(1)) if m else 1


def expected_steps(steps: list[Step], tag: str) -> list[Step]:
    """The steps a results tag holds: all of them; for a tag of N > 1 processes only the
    distributed ones, since the sweep runs every other step as one process, the same as the
    single-process tag."""
    if tag_processes(tag) > 1:
        return [s for s in steps if s.distributed]
    return list(steps)
