"""Every tool in tools/ runs, briefly, on `tiny`-sized work: a broken tool cannot land.

The tools are found by globbing tools/*.py; a new one fails here until it is given its brief
arguments in TOOL_ARGS.
"""

import sys

import pytest
from conftest import ROOT, VERDICT, run_script

TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
TOOL_ARGS = {
    "bf16_evidence.py": ["--steps", 2, "--data", VERDICT],
    "checkpoint_trade.py": [
        "--quick",
        "steps/12_liger_fused_ce.py",
        "steps/13_gradient_checkpointing.py",
    ],
    "fsdp2_evidence.py": ["--steps", 2, "--variants", "ddp", "fsdp2", "--data", VERDICT],
    "ladder.py": ["check"],  # reads only: goldens and propagate write the ladder's files
}


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_runs(tool):
    assert tool in TOOL_ARGS, f"tools/{tool}: add its brief arguments to TOOL_ARGS here"
    proc = run_script([sys.executable, ROOT / "tools" / tool, *TOOL_ARGS[tool]], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip(), f"tools/{tool} printed nothing"
    assert "Traceback" not in proc.stderr


def test_gpu_session_runs_its_phases_into_one_folder_on_a_cpu(tmp_path):
    """tools/gpu_session.sh in its CPU smoke mode: offline inputs staged, versions, the GPU tests
    (all skipped without CUDA), a one-step sweep; everything lands in OUT."""
    import shutil

    from conftest import BPE

    if not BPE.is_dir() or not shutil.which("bash"):
        pytest.skip("needs bash and the offline BPE mirror")
    out = tmp_path / "session"
    proc = run_script(["bash", ROOT / "tools" / "gpu_session.sh", out, "--device", "cpu",
                       "--preset", "tiny", "--steps", "00", "--max-steps", 3, "--warmup-steps", 1,
                       "--data", VERDICT, "--bpe", BPE, "--no-plots"],
                      timeout=300, env={"PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for name in ["session.log", "status.txt", "versions.txt", "pip-freeze.txt", "nvidia-smi.txt",
                 "pytest-gpu.log", "pytest-gpu.xml", "sweep.log"]:  # fmt: skip
        assert (out / name).is_file(), name
    assert (out / "status.txt").read_text().splitlines() == ["tests: ok", "sweep: ok"]
    assert "skipped" in (out / "pytest-gpu.log").read_text()  # no CUDA here: skipped, not failed
    (runs,) = list((out / "results").glob("*/runs.jsonl"))
    rec = __import__("json").loads(runs.read_text().splitlines()[-1])
    assert rec["status"] == "ok" and rec["step"] == "00" and rec["preset"] == "tiny"
    assert (out / "offline" / "tiktoken").is_dir()  # the BPE files staged for tiktoken
