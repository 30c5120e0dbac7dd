"""Device choice, clocks, memory and peak FLOP/s: everything that differs between CPU and GPUs."""

import json
import os
import platform
import time
from pathlib import Path

import torch

from .errors import UserError
from .files import atomic_write_bytes, cache_dir

# Dense bf16 tensor-core peaks (FLOP/s) from NVIDIA's datasheets; first match on the device name
# wins, so the more specific names come first. MFU of every step, fp32 ones too, is taken over
# this bf16 peak: one denominator for the whole ladder (as nanoGPT's estimate_mfu does).
GPU_PEAK_BF16 = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),  # same chip and tensor-core rate as the H100 SXM
    ("A100", 312e12),
]


def resolve(name: str) -> torch.device:
    """--device auto|cpu|cuda|mps -> a torch.device (cuda: the LOCAL_RANK's GPU)."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                f"--device cuda: no CUDA GPU visible (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda}); use --device cpu"
            )
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps: MPS is not available here; use --device cpu")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a host clock read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple MPS ({platform.machine()})"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------- peak memory
def _vm_hwm() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_memory(device: torch.device) -> str | None:
    """Start a peak-memory window; returns a note when the device cannot reset its peak."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return None
    if device.type == "cpu":
        try:  # "5" resets the peak resident set size (VmHWM) to the current RSS (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")
            return None
        except OSError:
            return "peak RSS is since process start: /proc/self/clear_refs not writable here"
    return "MPS has no peak-memory counter: the driver's allocation at the end is reported"


def peak_memory(device: torch.device) -> tuple[int | None, int | None]:
    """(reserved, allocated) peak bytes since the reset. CPU: peak RSS, allocated unknown.

    torch.cuda.max_memory_* return 0 silently on a CPU-only run, so they are only asked on CUDA.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory(), torch.mps.current_allocated_memory()
    hwm = _vm_hwm()
    if hwm is None:  # macOS and friends: ru_maxrss, bytes on macOS
        import resource

        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return hwm, None


# ---------------------------------------------------------------- peak FLOP/s
def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 1024) -> float:
    """Best of 5 timed bursts of n^3 matmuls: a busy moment lowers one burst, not the best."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    best = 0.0
    for _ in range(5):
        synchronize(device)
        reps, t0 = 0, time.perf_counter()
        while reps < 2 or time.perf_counter() - t0 < 0.2:
            a @ b
            reps += 1
        synchronize(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def rates_key(device: torch.device) -> str:
    return (
        f"{device.type}|{name(device)}|threads={torch.get_num_threads()}|torch={torch.__version__}"
    )


def measured_matmul_rates(device: torch.device) -> dict:
    """{"fp32": FLOP/s, "bf16": FLOP/s} of a 1024^3 matmul, measured once and cached per
    device name, thread count and torch version (CPU/MPS have no datasheet table here)."""
    key = rates_key(device)
    path = cache_dir() / "matmul_peak.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if key not in table:
        table[key] = {
            "fp32": _matmul_rate(device, torch.float32),
            "bf16": _matmul_rate(device, torch.bfloat16),
        }
        atomic_write_bytes(path, json.dumps(table, indent=1).encode())
    return table[key]


def gpu_peak(gpu_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU by its name, None when unknown."""
    return next((flops for tag, flops in GPU_PEAK_BF16 if tag in gpu_name), None)


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The MFU denominator for one device and where it comes from."""
    if device.type == "cuda":
        gpu = name(device)
        flops = gpu_peak(gpu)
        if flops is None:
            return None, f"no bf16 peak known for {gpu}: MFU left empty"
        return flops, f"{gpu} dense bf16 datasheet peak {flops / 1e12:.0f} TFLOP/s"
    rates = measured_matmul_rates(device)
    best = max(rates, key=rates.get)
    return rates[best], (
        f"measured {device.type} matmul peak {rates[best] / 1e9:.0f} GFLOP/s ({best}; "
        f"fp32 {rates['fp32'] / 1e9:.0f}, bf16 {rates['bf16'] / 1e9:.0f})"
    )


def bf16_is_fast(device: torch.device) -> tuple[bool, str]:
    """Whether bf16 matmuls beat fp32 here, with the evidence (used by the bf16 step)."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{name(device)} {'has' if ok else 'lacks'} bf16 tensor cores"
    r = measured_matmul_rates(device)
    why = f"measured matmul: bf16 {r['bf16'] / 1e9:.0f} vs fp32 {r['fp32'] / 1e9:.0f} GFLOP/s"
    return r["bf16"] > r["fp32"], why
