"""A fresh clone leaves tracked files alone: README's main command, shortened to one real step
on `tiny`, writes this machine's results where git does not track them
(results/local/<tag>/), compares them with the committed tags all the same, and leaves
`git status` clean; a run pointed at a committed tag folder is refused in one line."""

import os
import subprocess
import sys

import pytest
from clone import fresh_clone, git_status

from speed_ladder.files import mirror
from speed_ladder.ladder import processes_suffix
from speed_ladder.sweep import driver as sweep

TAG = sweep.tag_base("cpu") + processes_suffix(1)  # this machine's 1-process tag


def run(clone, *args, timeout=300):
    """`python -m speed_ladder run ARGS` in the clone, as a user's: its caches where a user's go
    (data/cache in the checkout, the matmul peak measured and cached there), the text from the
    offline mirror."""
    env = {**os.environ, "SPEED_LADDER_CHECK_S": "0", "SPEED_LADDER_SHARED": str(mirror().parent)}
    for own in ("SPEED_LADDER_CACHE", "SPEED_LADDER_PEAK_FLOPS"):  # the tests', not a user's
        env.pop(own, None)
    return subprocess.run(
        [sys.executable, "-m", "speed_ladder", "run", *map(str, args)],
        cwd=clone, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow  # a real step, Middlemarch tokenized and the matmul peak measured: 40-100 s
def test_the_main_command_in_a_fresh_clone_leaves_git_status_clean(tmp_path):
    """The fast suite has the same check on fixture steps (tests/test_machine.py's Zen 4 clone);
    this one is the user's run: a real step, its caches and text where a user's go."""
    clone = fresh_clone(tmp_path / "clone")
    readme = (clone / "README.md").read_bytes()
    args = ["--steps", "00", "--preset", "tiny", "--max-steps", 2, "--warmup-steps", 1]
    proc = run(clone, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert git_status(clone) == ""
    assert (clone / "data" / "middlemarch.txt").is_file() and (clone / "data" / "cache").is_dir()
    assert (clone / "README.md").read_bytes() == readme
    mine = clone / "results" / "local" / TAG
    assert (mine / "runs.jsonl").is_file() and (mine / "summary.csv").is_file()
    assert (mine / "tokens_per_sec.png").is_file()
    assert f"results in results/local/{TAG}" in proc.stdout
    assert "python -m speed_ladder publish" in proc.stdout

    # the closing table: this machine's step 00 beside a committed tag's (the preset differs)
    lines = proc.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("this machine against results/"))
    assert "here preset tiny: tok/s do not compare across presets" in lines[head]
    assert lines[head + 1].split()[:4] == ["step", "title", "your", "tok/s"]
    (row,) = [x for x in lines[head + 3 : head + 4] if x.startswith("00 ")]
    assert "the baseline" in row and row.rstrip().endswith("1.00x")
    csv = (mine / "vs_committed.csv").read_text().splitlines()
    assert csv[0].startswith("committed_tag,step,title,tokens_per_sec,committed_tokens_per_sec")
    assert len(csv) == 2 and csv[1].split(",")[1] == "00"

    # a rerun skips the finished step in results/local/ and still leaves git status clean
    proc = run(clone, *args, "--no-plots")
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stderr[-2000:]
    assert git_status(clone) == ""


def test_a_run_never_writes_a_folder_git_tracks(tmp_path):
    """--results-dir results with the tag of a committed folder: one error line, nothing
    written, before any step runs."""
    clone = fresh_clone(tmp_path / "clone")
    proc = run(clone, "--results-dir", "results", "--tag", "cpu-amd-epyc-2c", "--steps", "00",
               "--device", "cpu")  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: results/cpu-amd-epyc-2c-x1 holds files git tracks (results/")
    assert "never written by a run" in line and "python -m speed_ladder publish" in line
    assert git_status(clone) == ""
