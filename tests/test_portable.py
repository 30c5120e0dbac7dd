"""Records name no place of the machine that made them: no absolute path, no home folder, no
host name (files.portable_path, files.data_id). The same text in another folder is the same
run configuration; another text is not."""

import json
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import BPE, ROOT, VERDICT, sweep_here
from test_sweep import TAG, runs_of

from speed_ladder.files import data_id, portable_path
from speed_ladder.ladder import discover
from speed_ladder.records import file_sha256
from speed_ladder.sweep.launch import recorded_command, step_command


def strings(value):
    """Every string in a record, keys too, through dicts and lists."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, str):
        yield value


def places(tmp_path: Path) -> list[str]:
    """This machine's places, as written and with links followed: the home folder, the
    checkout, the temp folder, the test's own folder and the interpreter."""
    found = set()
    for p in (Path.home(), ROOT, tempfile.gettempdir(), tmp_path, sys.executable):
        for form in (str(p), os.path.realpath(p)):
            if form.rstrip(os.sep):  # a home of "/" would be in every path
                found.add(form)
    return sorted(found)


def host_in(text: str, host: str) -> bool:
    """The host name as a word of its own ("vm" is not in "VmHWM")."""
    return re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", text) is not None


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


def test_a_text_is_known_by_what_it_holds_not_where_it_lives(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    (a / "t.txt").write_text("I had always thought Jack Gisburn rather a cheap genius")
    shutil.copy(a / "t.txt", b / "t.txt")
    (b / "u.txt").write_text("I had always thought Jack Gisburn rather a cheap genius.")
    same = data_id(a / "t.txt")
    assert same == data_id(b / "t.txt") == f"t.txt sha256:{file_sha256(a / 't.txt')[:12]}"
    assert data_id(b / "u.txt").removeprefix("u.txt ") != same.removeprefix("t.txt ")
    (b / "t.txt").write_text("another text under the same name")
    assert data_id(b / "t.txt") != same
    assert data_id(ROOT / "README.md") == "README.md"  # in the checkout: its path there
    assert data_id(None) is None  # the default text
    assert data_id(tmp_path / "missing.txt") == "missing.txt"  # a failure record still gets one


def test_a_sweeps_records_name_no_place_of_this_machine(tmp_path, capsys, monkeypatch):
    """Steps 00 and 01 on tiny, the text outside the checkout: no string in a record is an
    absolute path, or holds the home folder, the checkout, the temp folder, the interpreter or
    the host name. Then the same text in another folder: the runs are up to date."""
    if not BPE.is_dir() or not VERDICT.is_file():
        pytest.skip(f"needs {BPE} and {VERDICT}")
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    here, there = tmp_path / "here", tmp_path / "there"
    for d in (here, there):
        d.mkdir()
        shutil.copy(VERDICT, d / "verdict.txt")
    results = tmp_path / "results"
    args = ["--steps", "00,01", "--preset", "tiny", "--device", "cpu", "--max-steps", 3]
    args += ["--warmup-steps", 1, "--results-dir", results, "--no-plots"]
    code, out, err = sweep_here(capsys, *args, "--data", here / "verdict.txt")
    assert code == 0, out[-3000:] + err[-3000:]
    assert out.count("predicted per rank (tiny") == 2  # once a run: the sweep's, not the step's
    recs = runs_of(results)
    assert [r["step"] for r in recs] == ["00", "01"]
    forbidden, host = places(tmp_path), socket.gethostname()
    for r in recs:
        for s in strings(r):
            assert not os.path.isabs(s), s
            assert not [p for p in forbidden if p in s], s
            assert not (host and host_in(s, host)), s
        text = f"verdict.txt sha256:{file_sha256(VERDICT)[:12]}"
        assert r["spec"]["data"] == r["sweep"]["config"]["data"] == text
        tmp = f"{TAG}/.tmp-{r['step']}-{r['sweep']['run_id'][:12]}.jsonl"
        assert r["sweep"]["command"][:2] == ["python", r["script"]]
        assert r["sweep"]["command"][-2:] == ["--results", tmp]
        assert "verdict.txt" in r["sweep"]["command"]
    assert recs[1]["script"] == "steps/01_dynamic_causal_mask.py"
    before = (results / TAG / "runs.jsonl").read_bytes()
    code, out, err = sweep_here(capsys, *args, "--data", there / "verdict.txt")
    assert code == 0 and out.count("up to date") == 2, out[-3000:] + err[-3000:]
    assert (results / TAG / "runs.jsonl").read_bytes() == before
    assert json.loads(before.splitlines()[0])["sweep"]["config"]["data"].startswith("verdict.txt ")
