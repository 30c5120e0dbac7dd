"""A running rank's memory beside the prediction (memory_model.py): the prediction announced
and recorded before the first step, the parallel mode read off the model, the state a rank
holds (measured), and the memory a rank may use."""

import os
from dataclasses import asdict

from speed_ladder.measure import precision
from speed_ladder.measure.data import train_windows
from speed_ladder.measure.inactive import liger_unavailable
from speed_ladder.measure.memory_model import GIB, PREDICTED_ENV, VOCAB, predict_run
from speed_ladder.measure.settings import batch_fits_gpu
from speed_ladder.presets import PRESETS


def announce(spec, step: str, cfg: dict, batch: int, device, model, fused: bool, recorder) -> dict:
    """Before the first step: the prediction for this run (the preset's shape, its accum_steps,
    step 05's autocast, the loss it computes: Liger's chunks where `fused`, else the full
    logits; the mode read off the model), printed (not under the sweep, which printed it) and
    noted where it exceeds the device's memory; returns the record's fields."""
    shape = {**PRESETS[spec.preset], **cfg, "accum_steps": spec.accum_steps}
    vocab = cfg.get("vocab_size", VOCAB)  # every step passes it; a bare test config may not
    p = predict_run(
        shape,
        step,
        _world(),
        batch,
        spec.half,
        device.type,
        detect_mode(model, device),
        vocab,
        spec.preset,
        fused,
    )
    if not os.environ.get(PREDICTED_ENV):
        recorder.say(f"[{step}] {p.line()}")
    cap = capacity_bytes(device)
    if cap and p.total_bytes > cap:
        recorder.note(
            f"predicted {p.total_bytes / GIB:.1f} GiB per rank exceeds this {device.type}'s "
            f"{cap / GIB:.1f} GiB: expect out-of-memory "
            "(python -m speed_ladder.measure.memory_model)"
        )
    return {
        "predicted_state_bytes_per_rank": p.state_bytes,
        "predicted_peak_bytes_per_rank": p.total_bytes,
        "memory_model": asdict(p),
    }


def batch_fits(run, cfg: dict, batch: int, capacity: int) -> bool:
    """Step 20's rule (measure/settings.py's batch_fits_gpu): whether `batch` sequences per
    process of this run's rung fit the text's training windows and, as the memory model predicts
    them with the loss that will run here (Liger's where it can, else the full logits), a GPU of
    `capacity` bytes."""
    spec = run.spec
    shape = {**PRESETS[spec.preset], **cfg, "accum_steps": spec.accum_steps}
    windows = train_windows(run.args.data, cfg["context_length"])
    dtype = precision.DTYPES[precision.choice(run.device)[0]]  # step 05's autocast
    fused = liger_unavailable(run.device, dtype) is None
    world, half, name = _world(), spec.half, spec.preset
    return batch_fits_gpu(shape, run.step, world, batch, half, capacity, windows, fused, name)


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def detect_mode(model, device) -> str:
    """fsdp2 when parameters are DTensors (fsdp2-offload where their shards are in host memory
    and `device`, the run's, is not the CPU: step 21), ddp under DistributedDataParallel, else
    single."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed
        DTensor = ()
    shards = [p for p in model.parameters() if isinstance(p, DTensor)]
    if shards:
        host = device.type != "cpu" and shards[0].to_local().device.type == "cpu"
        return "fsdp2-offload" if host else "fsdp2"
    from torch.nn.parallel import DistributedDataParallel

    return "ddp" if isinstance(model, DistributedDataParallel) else "single"


def local_state_bytes(model, optimizer) -> int:
    """Measured: bytes this rank holds of params, grads and optimizer state (local shards)."""
    import torch

    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    total = 0
    for p in model.parameters():
        total += local(p) + (local(p.grad) if p.grad is not None else 0)
    for st in optimizer.state.values():
        total += sum(local(v) for v in st.values() if torch.is_tensor(v) and v.dim())
    return total


def capacity_bytes(device) -> int | None:
    """Memory a rank may use: its GPU's total, else the machine's RAM over the local ranks."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 // max(1, _local_world())
    except OSError:
        pass
    return None


def _local_world() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
