"""Bad input: one clear `error:` line on stderr, a non-zero exit, never a traceback.

The flag cases run a script's main() in this process, through the same guard
(`speed_ladder.main`) its `__main__` calls, its stderr captured: a process of its own would add
only ~3 s of torch import per case. One case, and a text too short to train on, run as processes of
their own (the exit code and stderr a user sees).
"""

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, VERDICT, load_script, py

import speed_ladder
from speed_ladder import errors


def one_error_line(proc):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


CASES = {
    "missing data": (["--data", "/no/such/text.txt"], "no such file"),
    "unknown preset": (["--preset", "gpt5"], "unknown preset"),
    "zero steps": (["--max-steps", "0"], "at least 1"),
    "negative steps": (["--max-steps", "-3"], "at least 1"),
    "negative epochs": (["--epochs", "-1"], "at least 1"),
    "not a number": (["--max-steps", "ten"], "whole number"),
    "no timed step": (["--max-steps", "2", "--warmup-steps", "2"], "no timed step"),
    "no cuda": (["--device", "cuda"], "no CUDA GPU"),
}


SCRIPTS = {}


def main_here(script, args, capsys, monkeypatch, env=None):
    """`python SCRIPT ARGS` in this process: its main() under speed_ladder.main, the guard its
    `__main__` runs. Returns a CompletedProcess of its exit code and captured output."""
    if script not in SCRIPTS:
        SCRIPTS[script] = load_script(script)
    monkeypatch.setattr(sys, "argv", [str(ROOT / script), *map(str, args)])
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(errors.on_failure, "_write", None)  # no earlier case's Run records this
    capsys.readouterr()
    environ = dict(os.environ)
    try:
        with pytest.raises(SystemExit) as exit:
            speed_ladder.main(SCRIPTS[script].main)
    finally:  # what the step set up before it stopped: a process group, its variables
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, exit.value.code, out.out, out.err)


def skip_with_cuda(case):
    if case == "no cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is visible")


# every script shares the harness's checks: all cases on 00, a sample on the DDP step
@pytest.mark.parametrize(
    "script,case",
    [("00_orig.py", c) for c in CASES]
    + [("steps/11_ddp.py", c) for c in ["missing data", "zero steps", "unknown preset"]],
)
def test_bad_input(script, case, capsys, monkeypatch):
    args, expected = CASES[case]
    skip_with_cuda(case)
    proc = main_here(script, ["--preset", "tiny", "--data", VERDICT, *args], capsys, monkeypatch)
    assert expected in one_error_line(proc)


def test_bad_input_in_a_process_of_its_own():
    """A case from a fresh interpreter: the exit code and stderr a user sees."""
    args, expected = CASES["unknown preset"]
    proc = py("00_orig.py", "--preset", "tiny", "--data", VERDICT, *args, timeout=120)
    assert expected in one_error_line(proc)


def test_text_too_short(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Far too short to fill a batch of windows.")
    res = tmp_path / "r.jsonl"
    proc = py("00_orig.py", "--preset", "tiny", "--data", short, "--results", res, timeout=120)
    assert "text too short" in one_error_line(proc)
    assert '"status": "error"' in res.read_text()  # the failure is recorded, not lost


def test_nccl_where_not_built(capsys, monkeypatch):
    proc = main_here("steps/11_ddp.py", ["--preset", "tiny", "--device", "cpu", "--data", VERDICT],
                     capsys, monkeypatch, env={"DDP_BACKEND": "nccl"})  # fmt: skip
    assert "nccl" in one_error_line(proc)
