"""What tools/gpu_session.sh's own sweep measured, for the GPU tests that would otherwise run it
again.

tools/gpu_session.sh runs the bounded sweep on gpt2-124m first, then `pytest -m "gpu and not
slow" tests/test_gpu.py`, and exports the sweep's results folder as SPEED_LADDER_SESSION_RESULTS.
Two fast GPU tests check what that sweep has just run on this GPU: steps 10, 12 and 13 at
gpt2-124m (their peak memory, and that Liger's kernel ran in 12) and step 11 under torchrun with
nccl as a world of one. Reading the sweep's records saves three gpt2-124m processes and a
torchrun; run alone, or where the sweep has no such record, the tests run their own processes.

A record counts only when it is an ok run of the step's file as it is now (its sha256, as the
summary matches records), of `preset`, on this GPU (its name): a resumed, committed record of
another version of the script, or another GPU's, is not this session's measurement.
"""

import os
from pathlib import Path

from speed_ladder.ladder import rung
from speed_ladder.records import file_sha256, read_jsonl

ENV = "SPEED_LADDER_SESSION_RESULTS"


def session_record(step: str, device_name: str, preset: str = "gpt2-124m", env=None) -> dict | None:
    """The newest ok record of `step` in the session's results (every tag folder under ENV's
    folder) that is of the file as it is now, `preset` and `device_name`; None when there is none
    or ENV is not set."""
    folder = (os.environ if env is None else env).get(ENV)
    if not folder:
        return None
    sha = file_sha256(rung(step).path)
    found = None
    for path in sorted(Path(folder).glob("*/runs.jsonl")):
        for r in read_jsonl(path):
            if not isinstance(r, dict):
                continue
            sweep = r.get("sweep") if isinstance(r.get("sweep"), dict) else {}
            if (r.get("step") == step and r.get("status") == "ok" and r.get("preset") == preset
                    and r.get("device_name") == device_name
                    and sweep.get("script_sha256") == sha):  # fmt: skip
                found = r  # runs.jsonl is appended to: the last is the newest
    return found
