"""Records name no place of the machine that made them: no absolute path, no home folder, no
host name (files.portable_path)."""

import sys
from pathlib import Path

from conftest import ROOT

from harness.files import portable_path
from harness.ladder import discover
from harness.launch import recorded_command, step_command


def test_a_path_is_relative_to_the_checkout_or_the_base_never_absolute(tmp_path, monkeypatch):
    assert portable_path(ROOT / "steps" / "11_ddp.py") == "steps/11_ddp.py"
    assert portable_path(ROOT / "00_orig.py", base=tmp_path) == "00_orig.py"  # the checkout first
    tmp = tmp_path / "cpu-x1" / ".tmp-00-40b8f7fc4b7b.jsonl"
    assert portable_path(tmp, base=tmp_path) == "cpu-x1/.tmp-00-40b8f7fc4b7b.jsonl"
    assert portable_path(tmp) == ".tmp-00-40b8f7fc4b7b.jsonl"  # outside both: its name
    assert portable_path(Path.home() / "texts" / "a.txt") == "a.txt"
    monkeypatch.chdir(ROOT)
    assert portable_path("steps/../00_orig.py") == "00_orig.py"


def test_the_recorded_command_names_python_and_portable_paths(tmp_path):
    steps = {s.num: s for s in discover(ROOT)}
    tag_dir = tmp_path / "results" / "cpu-x2"
    tmp = tag_dir / ".tmp-11-0123456789ab.jsonl"
    flags = ["--device", "cpu", "--data", str(tmp_path / "t.txt"), "--trace", str(tmp_path)]
    cmd = step_command(steps["11"], flags, 2, tmp)
    assert cmd[0] == sys.executable and cmd[-1] == str(tmp)  # the child runs absolute paths
    assert recorded_command(cmd, tag_dir) == [
        "python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "steps/11_ddp.py", "--device", "cpu", "--data", "t.txt", "--trace", tmp_path.name,
        "--results", "cpu-x2/.tmp-11-0123456789ab.jsonl",
    ]  # fmt: skip
