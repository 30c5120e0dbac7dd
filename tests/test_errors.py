"""Bad input: one clear `error:` line on stderr, a non-zero exit, never a traceback."""

import pytest
from conftest import VERDICT, py


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


# every script shares the harness's checks: all cases on 00, a sample on the DDP step
@pytest.mark.parametrize(
    "script,case",
    [("00_orig.py", c) for c in CASES]
    + [("steps/11_ddp.py", c) for c in ["missing data", "zero steps", "unknown preset"]],
)
def test_bad_input(script, case):
    args, expected = CASES[case]
    if case == "no cuda":
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is visible")
    proc = py(script, "--preset", "tiny", "--data", VERDICT, *args, timeout=120)
    assert expected in one_error_line(proc)


def test_text_too_short(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Far too short to fill a batch of windows.")
    res = tmp_path / "r.jsonl"
    proc = py("00_orig.py", "--preset", "tiny", "--data", short, "--results", res, timeout=120)
    assert "text too short" in one_error_line(proc)
    assert '"status": "error"' in res.read_text()  # the failure is recorded, not lost


def test_nccl_where_not_built():
    proc = py("steps/11_ddp.py", "--preset", "tiny", "--device", "cpu", "--data", VERDICT,
              env={"DDP_BACKEND": "nccl"}, timeout=120)  # fmt: skip
    assert "nccl" in one_error_line(proc)
