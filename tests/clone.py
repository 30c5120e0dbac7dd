"""A fresh clone of this checkout, for the tests that check what a user's run leaves in one.

`fresh_clone(dest)`: the files git would clone (tracked ones, and new ones not yet committed
that .gitignore does not exclude) as they are in the working tree, committed in a new
repository at `dest`: what `git clone` of this change gives. `git_status(repo)`: what
`git status` shows there (untracked files each named; ignored ones not)."""

import shutil
import subprocess
from pathlib import Path

from speed_ladder.files import ROOT

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def fresh_clone(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "clone"], cwd=dest, check=True)
    return dest


def git_status(repo: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=repo, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
