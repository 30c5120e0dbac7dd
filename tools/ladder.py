"""Maintain the ladder: golden diffs and fix propagation, by tool, never by hand-copying.

python tools/ladder.py goldens            # rewrite steps/diffs/NN.diff and README's ladder table
python tools/ladder.py check              # exit 1 if a diff left its file, or the table is stale
python tools/ladder.py propagate 00_orig.py [--base REV]
    # carry the uncommitted change of one file (against REV, default HEAD) into every step that
    # builds on it (its `after`, transitively; by default every later step) with
    # `git merge-file` (a 3-way merge: later file, old file, new file), then copy step 10 / 11
    # onto the summary files. Conflicts are left marked for you to resolve.

A rung's diff, steps/diffs/NN.diff (the golden diff the tests hold each step to, and what
LADDER.md links for learners), is against the rung it builds on: the registry's `after`
(speed_ladder/data/ladder.json), by default the file before it. README's ladder table gives the
same pair as a `code --diff BASE FILE` command.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from speed_ladder.errors import UserError  # noqa: E402
from speed_ladder.files import ROOT  # noqa: E402
from speed_ladder.ladder import DIFFS, descendants, discover, rungs  # noqa: E402
from speed_ladder.ladder import step_of as _step_of  # noqa: E402
from speed_ladder.ladder import unified as _unified  # noqa: E402
from speed_ladder.report.pages import ladder_table  # noqa: E402

GOLDEN = ROOT / DIFFS
try:  # file: the rung it copies
    SUMMARIES = {r.summary_file: r.num for r in rungs() if r.summary_file}
except UserError as e:  # a step file without its entry, a bad entry: one line
    sys.exit(f"error: {e}")


def ladder() -> list[Path]:
    """00_orig.py, then steps/NN_*.py in order (speed_ladder.ladder's discovery)."""
    return [step.path for step in discover(ROOT)]


def step_of(path: Path) -> str:
    """The rung number of a step file of this ladder."""
    return _step_of(path)


def unified(a: Path, b: Path) -> str:
    return _unified(a, b, ROOT)


def pairs() -> list[tuple[Path, Path]]:
    """(the file of the rung it builds on, the file) for every rung but the first."""
    steps = discover(ROOT)
    path = {s.num: s.path for s in steps}
    return [(path[s.after], s.path) for s in steps if s.after is not None]


def goldens() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for a, b in pairs():
        (GOLDEN / f"{step_of(b)}.diff").write_text(unified(a, b))
    print(f"wrote {len(pairs())} golden diffs to {GOLDEN.relative_to(ROOT)}")
    changed = ladder_table.update(discover(ROOT))
    print("README.md's ladder table: " + ("rewritten" if changed else "up to date"))


def check() -> int:
    bad = []
    for a, b in pairs():
        golden = GOLDEN / f"{step_of(b)}.diff"
        if not golden.is_file():
            bad.append(f"{b.name} (no golden diff)")
        elif golden.read_text() != unified(a, b):
            bad.append(b.name)
    for name, step in SUMMARIES.items():
        src = next((p for p in ladder() if step_of(p) == step), None)
        if src and (ROOT / name).read_bytes() != src.read_bytes():
            bad.append(name)
    print("golden diffs: " + ("ok" if not bad else "differ: " + ", ".join(bad)))
    table = ladder_table.stale(discover(ROOT))
    if table:
        print("README.md's ladder table: stale, run python tools/ladder.py goldens")
    return 1 if bad or table else 0


def propagate(name: str, base: str) -> int:
    steps = discover(ROOT)
    files = [s.path for s in steps]
    changed = (ROOT / name).resolve()
    if changed not in files:
        sys.exit(f"{name} is not a ladder file")
    later = [s.path for s in descendants(step_of(changed), steps)]
    old = subprocess.run(["git", "show", f"{base}:{changed.relative_to(ROOT).as_posix()}"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    conflicts = 0
    with tempfile.TemporaryDirectory() as tmp:
        old_path, new_path = Path(tmp) / "old.py", Path(tmp) / "new.py"
        old_path.write_text(old)
        shutil.copy(changed, new_path)
        for f in later:
            r = subprocess.run(["git", "merge-file", "-L", f.name, "-L", "old", "-L", "new",
                                str(f), str(old_path), str(new_path)])  # fmt: skip
            conflicts += max(r.returncode, 0)
            print(f"{f.relative_to(ROOT)}: {'CONFLICT' if r.returncode else 'merged'}")
    for name_, step in SUMMARIES.items():
        src = next((p for p in files if step_of(p) == step), None)
        if src:
            shutil.copy(src, ROOT / name_)
    return 1 if conflicts else 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("goldens")
    sub.add_parser("check")
    pr = sub.add_parser("propagate")
    pr.add_argument("file")
    pr.add_argument("--base", default="HEAD")
    a = p.parse_args()
    if a.cmd == "goldens":
        goldens()
        return 0
    if a.cmd == "check":
        return check()
    return propagate(a.file, a.base)


if __name__ == "__main__":
    sys.exit(main())
