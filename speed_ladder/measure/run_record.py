"""A run's record: the `Recorder` that gathers its notes and writes it once, the fields that say
what ran and where (`base_record`, of an ok run and of a failed one alike), its MFU judged before
it is written (`mfu_of`), and its HFU where the rung recomputes (`hfu_of`)."""

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from speed_ladder import ladder, machine, parity
from speed_ladder.errors import UserError, os_error_why
from speed_ladder.files import ROOT, portable_path
from speed_ladder.measure import device as dev
from speed_ladder.measure import precision
from speed_ladder.measure.inactive import (
    LIGER_INTERPRETED,
    LIGER_RAN,
    interpreted,
    triton_interpreted,
)
from speed_ladder.measure.memory_model import param_counts
from speed_ladder.records import append_jsonl, code_sha256, file_sha256, git_state, mfu_problem
from speed_ladder.spec import RunSpec


@dataclass
class Recorder:
    """A run's notes and the rungs that did nothing in it, as they come, and its record,
    written once to --results by rank 0."""

    step: str
    results: str | None
    is_rank0: bool
    notes: list[str] = field(default_factory=list)
    inactive_rungs: dict[str, str] = field(default_factory=dict)  # {rung: why it did nothing}
    written: bool = False

    @property
    def inactive_reason(self) -> str | None:
        """Why the run's own rung did nothing here (its record then says step_active: false)."""
        return self.inactive_rungs.get(self.step)

    def say(self, *a, **k) -> None:
        if self.is_rank0:
            print(*a, **k, flush=True)

    def note(self, text: str) -> None:
        """A remark for the record, e.g. why an optimization does nothing on this device."""
        if text not in self.notes:
            self.notes.append(text)
            self.say(f"[{self.step}] note: {text}")
            if text.startswith(LIGER_RAN) and triton_interpreted():  # said where it is seen
                self.note(LIGER_INTERPRETED)

    def inactive(self, step: str, reason: str | None, acted: str | None = None) -> None:
        """What rung `step`'s check found (rung_checks.py): None, its idea acts (noted `step NN:
        acted` where it says what ran); a text, it does nothing in this run. Asked again:
        nothing new."""
        if reason is None and acted is not None:
            self.note(f"step {step}: {acted}")
        elif reason is not None:
            self.note(f"step {step}: {reason}")
            self.inactive_rungs.setdefault(step, reason)

    def write(self, rec: dict) -> None:
        if not (self.results and self.is_rank0) or self.written:
            return
        self.written = True  # one try: a failure record would fail the same way
        try:
            append_jsonl(self.results, rec)
        except OSError as e:  # a disk that filled up during the run: keep the record
            print(json.dumps(rec), flush=True)
            raise UserError(
                f"cannot write the record to {self.results}: {os_error_why(e)}; the record is "
                "printed on stdout above: append that line to the file by hand"
            ) from None


def base_record(
    recorder: Recorder,
    status: str,
    *,
    script: Path,
    device: torch.device,
    spec: RunSpec,
    world: int,
    batch: int | None,
    cfg: dict | None,
    attention_kernel: str | None,
    memory_prediction: dict,
    started: tuple[str, float],
) -> dict:
    """The fields every record holds, with `status`; `started`: (ISO time, time.time())."""
    cuda = device.type == "cuda"
    return {
        "step": recorder.step,
        "script": portable_path(script),
        "status": status,
        "device": device.type,
        "device_name": dev.name(device),
        "world_size": world,
        "preset": spec.preset,
        "batch_size": batch,
        "workers": spec.workers,  # the training DataLoader's worker processes
        "context_length": (cfg or {}).get("context_length"),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        **git_state(ROOT),  # git_sha, git_sha_reason
        "script_sha256": file_sha256(script),
        "code_sha256": code_sha256(script),  # what a row is stale by: not its docstrings
        "started_at": started[0],
        "duration_s": round(time.time() - started[1], 2),
        "notes": recorder.notes,
        "machine": machine.of_device(device),
        "step_active": recorder.inactive_reason is None,
        "inactive_reason": recorder.inactive_reason,
        "inactive_rungs": recorder.inactive_rungs,  # every rung of its chain that did nothing
        "attention_kernel": attention_kernel,  # flash, efficient, cudnn, math; or none
        "interpreted": interpreted(recorder.notes),  # Liger through Triton's interpreter
        "regime": precision.regime(device),  # fp32, tf32, bf16 (+ -compiled): parity.py
        "compiles": parity.compiles(),  # torch.compile's graphs, frames, seconds; or None
        "batch_rule": asdict(spec.batch_rule) if spec.batch_rule else None,
        "spec": spec.record(),  # the one configuration (speed_ladder.spec)
        **memory_prediction,
    }


def flops_per_token(model: torch.nn.Module, cfg: dict) -> int:
    """MFU's FLOPs per token (measure/run.py's docstring): 6N + 12*L*H*Q*T, N the parameters that
    take part in matmuls (embedding tables left out)."""
    tables = (m for m in model.modules() if isinstance(m, torch.nn.Embedding))
    emb = {id(p) for m in tables for p in m.parameters()}
    n = sum(p.numel() for p in model.parameters() if id(p) not in emb)
    L, H, T = cfg["n_layers"], cfg["n_heads"], cfg["context_length"]
    return 6 * n + 12 * L * H * (cfg["emb_dim"] // H) * T


def mfu_of(tps: float, flops: int, peak: tuple, world: int, device, note) -> tuple:
    """(MFU, None), or (None, {value, reason}) where the MFU cannot be right (a CPU peak measured
    on a busy machine): never a number then. `peak`: (FLOP/s, what it is); `note` says what it is
    over, and why it is left empty."""
    peak_flops, source = peak
    mfu = tps * flops / (peak_flops * world) if peak_flops else None
    note(f"MFU over {source}")
    why = mfu_problem(mfu)
    if why is None:
        return mfu, None
    value = mfu if isinstance(mfu, (int, float)) and math.isfinite(mfu) else str(mfu)
    again = ""
    if device.type != "cuda":
        again = "; delete matmul_peak.json in the cache folder to measure it again"
    note(f"{why}: MFU left empty{again}")
    return None, {"value": value, "reason": why}


def hfu_of(mfu: float | None, step: str, cfg: dict, flops: int) -> float | None:
    """HFU (hardware FLOPs utilization) where the rung checkpoints its blocks: the hardware also
    runs every block's forward again in backward, 2 FLOPs per block parameter and 4*L*H*Q*T of
    attention per token, which MFU leaves out; None where nothing is recomputed (HFU is MFU
    there) or MFU is unknown."""
    try:
        recomputes = ladder.rung(step).memory.checkpointing
    except UserError:  # not a rung of the ladder (a test's script)
        return None
    if mfu is None or not recomputes or not flops:
        return None
    L, H, T, C = cfg["n_layers"], cfg["n_heads"], cfg["context_length"], cfg["emb_dim"]
    again = 2 * L * param_counts(cfg, cfg["vocab_size"])["block"] + 4 * L * H * (C // H) * T
    return mfu * (flops + again) / flops
