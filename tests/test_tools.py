"""Every tool in tools/ runs, briefly, on `tiny`-sized work: a broken tool cannot land.

The tools are found by globbing tools/*.py; a new one fails here until it is given its brief
arguments in TOOL_ARGS.
"""

import sys

import pytest
from conftest import ROOT, VERDICT, run_script

TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
TOOL_ARGS = {
    "bf16_evidence.py": ["--steps", 1, "--data", VERDICT],  # bf16 is emulated on many CPUs
    "checkpoint_trade.py": [
        "--quick",
        "steps/12_liger_fused_ce.py",
        "steps/13_gradient_checkpointing.py",
    ],
    "fsdp2_evidence.py": ["--steps", 2, "--variants", "fsdp2", "--data", VERDICT],
    "ladder.py": ["check"],  # reads only: goldens and propagate write the ladder's files
    "peer.py": ["--help"],  # its input stays outside the repo: tests/test_peer_tool.py runs it
    "peer_compare.py": ["--help"],  # reads a GPU session's records: tests/test_peer_tool.py
}


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_runs(tool):
    assert tool in TOOL_ARGS, f"tools/{tool}: add its brief arguments to TOOL_ARGS here"
    proc = run_script([sys.executable, ROOT / "tools" / tool, *TOOL_ARGS[tool]], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip(), f"tools/{tool} printed nothing"
    assert "Traceback" not in proc.stderr
