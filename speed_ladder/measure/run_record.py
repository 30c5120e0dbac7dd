"""A run's record: the fields that say what ran and where (`base_record`, of an ok run and of a
failed one alike), its MFU judged before it is written (`mfu_of`), and its HFU where the rung
recomputes (`hfu_of`)."""

import math
import time

import torch

from speed_ladder import ladder, machine, parity
from speed_ladder.errors import UserError
from speed_ladder.files import ROOT, portable_path
from speed_ladder.measure import device as dev
from speed_ladder.measure import precision
from speed_ladder.measure.inactive import interpreted
from speed_ladder.measure.memory_model import param_counts
from speed_ladder.records import code_sha256, file_sha256, git_state, mfu_problem


def base_record(run, status: str, world: int) -> dict:
    """The fields every record of `run` (a measure.run.Run) holds, with `status`."""
    cuda = run.device.type == "cuda"
    return {
        "step": run.step,
        "script": portable_path(run.script),
        "status": status,
        "device": run.device.type,
        "device_name": dev.name(run.device),
        "world_size": world,
        "preset": run.preset_name,
        "batch_size": run.batch_size,
        "workers": run.settings["workers"],  # the training DataLoader's worker processes
        "context_length": (run.cfg or {}).get("context_length"),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        **git_state(ROOT),  # git_sha, git_sha_reason
        "script_sha256": file_sha256(run.script),
        "code_sha256": code_sha256(run.script),  # what a row is stale by: not its docstrings
        "started_at": run.started_at,
        "duration_s": round(time.time() - run.t_begin, 2),
        "notes": run.notes,
        "machine": machine.of_device(run.device),
        "step_active": run.inactive_reason is None,
        "inactive_reason": run.inactive_reason,
        "inactive_rungs": run.inactive_rungs,  # every rung of its chain that did nothing here
        "attention_kernel": run.attention.kernel,  # flash, efficient, cudnn, math; or none
        "interpreted": interpreted(run.notes),  # Liger through Triton's interpreter
        "regime": precision.regime(run.device),  # fp32, tf32, bf16 (+ -compiled): parity.py
        "compiles": parity.compiles(),  # torch.compile's graphs, frames, seconds; or None
        "batch_rule": run.settings["batch_rule"],
        "spec": run.spec.record(),  # the one configuration (speed_ladder.spec)
        **run.memory_prediction,
    }


def mfu_of(tps: float, run, world: int) -> tuple[float | None, dict | None]:
    """(MFU, None), or (None, {value, reason}) where the MFU cannot be right (a CPU peak measured
    on a busy machine): never a number then. Notes what it is over, and why it is left empty."""
    mfu = None
    if run.peak:
        mfu = tps * run.flops_per_token / (run.peak * world)
    run.note(f"MFU over {run.peak_source}")
    why = mfu_problem(mfu)
    if why is None:
        return mfu, None
    value = mfu if isinstance(mfu, (int, float)) and math.isfinite(mfu) else str(mfu)
    again = ""
    if run.device.type != "cuda":
        again = "; delete matmul_peak.json in the cache folder to measure it again"
    run.note(f"{why}: MFU left empty{again}")
    return None, {"value": value, "reason": why}


def hfu_of(mfu: float | None, run) -> float | None:
    """HFU (hardware FLOPs utilization) where the rung checkpoints its blocks: the hardware also
    runs every block's forward again in backward, 2 FLOPs per block parameter and 4*L*H*Q*T of
    attention per token (a third of the blocks' share of MFU's formula), which MFU leaves out;
    None where nothing is recomputed (HFU is MFU there) or MFU is unknown."""
    try:
        recomputes = ladder.rung(run.step).memory.checkpointing
    except UserError:  # not a rung of the ladder (a test's script)
        return None
    if mfu is None or not recomputes or not run.flops_per_token:
        return None
    c = run.cfg
    L, H, T = c["n_layers"], c["n_heads"], c["context_length"]
    again = 2 * L * param_counts(c, c["vocab_size"])["block"] + 4 * L * H * (c["emb_dim"] // H) * T
    return mfu * (run.flops_per_token + again) / run.flops_per_token
