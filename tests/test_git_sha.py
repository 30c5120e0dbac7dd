"""A record's git_sha is the project's commit or nothing, never the HEAD of another repository
that holds the project's files (an export with `git archive` into a folder inside it). Real
layouts in tmp: that export, and a plain folder outside any repository."""

import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from speed_ladder.records import git_state

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _git(cwd, *args) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def _state_in(project) -> dict:
    """git_state(ROOT) as a step run from `project` computes it (its own speed_ladder)."""
    code = "import json; from speed_ladder.files import ROOT; from speed_ladder.records import "
    code += "git_state; print(json.dumps([str(ROOT), git_state(ROOT)]))"
    res = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True,
                         text=True, check=True)  # fmt: skip
    root, state = json.loads(res.stdout)
    assert root == str(project.resolve())
    return state


def test_the_checkout_records_its_head():
    if shutil.which("git") is None or git_state(ROOT)["git_sha"] is None:
        pytest.skip("not a git checkout")
    state = git_state(ROOT)
    head = _git(ROOT, "rev-parse", "HEAD")
    assert state["git_sha"].removesuffix("-dirty") == head
    assert state["git_sha_reason"] is None


def test_a_copy_inside_another_repository_records_no_sha(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "notes.txt").write_text("another project\n")
    _git(outer, "add", "notes.txt")
    _git(outer, "commit", "-q", "-m", "another project's commit")
    foreign = _git(outer, "rev-parse", "HEAD")
    project = outer / "ladder"  # an export of this project's files (as `git archive`) inside it
    shutil.copytree(ROOT / "speed_ladder", project / "speed_ladder",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", project)
    state = _state_in(project)
    assert state["git_sha"] is None, f"recorded {state['git_sha']} (the outer HEAD is {foreign})"
    assert "not the top of its git repository" in state["git_sha_reason"]
    alone = tmp_path / "alone"  # the same export outside any repository
    shutil.copytree(project, alone)
    assert _state_in(alone) == {"git_sha": None, "git_sha_reason": "not a git checkout"}
    _git(project, "init", "-q")  # made a repository of its own: its HEAD is the project's
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "the export, committed")
    assert _state_in(project) == {"git_sha": _git(project, "rev-parse", "HEAD"),
                                  "git_sha_reason": None}  # fmt: skip
