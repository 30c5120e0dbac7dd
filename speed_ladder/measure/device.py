"""A torch device: which one a run gets, its name, the wait for its queued work, and its peak
memory over the timed window: what differs between a CPU, CUDA (and ROCm) and MPS."""

import os
import platform
from pathlib import Path

import torch

from speed_ladder import machine
from speed_ladder.errors import UserError
from speed_ladder.measure import gpu_specs


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
        return torch.device("cuda", _local_rank_gpu())
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("--device mps: MPS is not available here; use --device cpu")
    return torch.device(name)


def _local_rank_gpu() -> int:
    """This process's GPU index (torchrun's LOCAL_RANK), checked against the visible GPUs before
    anything asks for its name or properties (they assert on a missing device)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    count = torch.cuda.device_count()
    if local_rank >= count:
        local_world = os.environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1))
        raise UserError(
            f"{local_world} processes on this node but {count} GPU{'s' * (count != 1)} visible "
            f"(LOCAL_RANK {local_rank} has none): use --nproc_per_node at most {count}, or "
            "check CUDA_VISIBLE_DEVICES"
        )
    return local_rank


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
    return machine.cpu_model()


def is_rocm() -> bool:
    """ROCm builds report AMD GPUs through torch.cuda (torch.version.hip is set)."""
    return getattr(torch.version, "hip", None) is not None


def gpu_memory(device: torch.device) -> tuple[int, str] | None:
    """(total bytes, step 05's autocast there) of a CUDA device, for the batch rule; else None."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return props.total_memory, gpu_specs.autocast_for(props, is_rocm())


def ddp_backend(device: torch.device) -> str:
    """The backend of a step's process group (step 11 on): $DDP_BACKEND, else nccl on CUDA and
    gloo elsewhere; each problem one line before any process group exists."""
    import torch.distributed as dist

    backend = os.environ.get("DDP_BACKEND") or ("nccl" if device.type == "cuda" else "gloo")
    known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
    if backend not in known:
        raise UserError(
            f"DDP_BACKEND={backend}: not a torch.distributed backend; use one of "
            f"{', '.join(known)} (unset: nccl on CUDA, gloo elsewhere)"
        )
    if backend == "nccl" and (device.type != "cuda" or not dist.is_nccl_available()):
        raise UserError(
            f"DDP backend nccl needs CUDA GPUs and a torch built with NCCL (device "
            f"{device.type}, NCCL built: {dist.is_nccl_available()}); use DDP_BACKEND=gloo"
        )
    if not dist.is_backend_available(backend):
        raise UserError(
            f"DDP_BACKEND={backend}: this torch ({torch.__version__}) was built without it; "
            "use gloo (CPU) or nccl (CUDA)"
        )
    if device.type == "cuda":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if local_world > torch.cuda.device_count():
            raise UserError(
                f"{local_world} processes on this node but {torch.cuda.device_count()} GPUs "
                "visible: use --nproc_per_node at most the GPU count"
            )
    return backend


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
            return (
                "peak RSS is since process start, evaluation included: /proc/self/clear_refs "
                "not writable here"
            )
    return None  # MPS: no counter to reset; PeakWindow samples it at every step's end


def peak_memory(device: torch.device) -> tuple[int | None, int | None]:
    """(reserved, allocated) peak bytes since the reset. CPU: peak RSS, allocated unknown
    (torch.cuda's counters say 0 there). MPS: what the driver holds now (it keeps no peak)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)
    if device.type == "mps":
        return torch.mps.driver_allocated_memory(), torch.mps.current_allocated_memory()
    hwm = _vm_hwm()
    if hwm is None:  # macOS and friends: ru_maxrss, bytes on macOS
        try:
            import resource
        except ImportError:  # Windows: no peak RSS without extra packages
            return None, None
        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return hwm, None


def _malloc_trim() -> None:
    """Hand the C heap's free pages back to the OS (glibc), so the RSS after an evaluation is
    what training holds."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # musl, macOS, Windows
        pass


def release_cached(device: torch.device) -> None:
    """Return freed memory that the allocator keeps cached (after an evaluation)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
    else:
        _malloc_trim()


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class PeakWindow:
    """Peak memory of the timed window's training steps: evaluation and sampling never count.
    The counters know only "the peak since the last reset", so the window keeps its own
    running peak: a pause folds the peak so far in; its end releases what the pause cached and
    resets the counters. MPS keeps no peak: sampled at every step's end. Without a resettable
    counter (macOS, Windows) evaluation counts, and `start()` returns a note saying so."""

    def __init__(self, device: torch.device):
        self.device = device
        self.open = False
        self.reserved: int | None = None
        self.allocated: int | None = None
        self.held = 0  # CUDA: bytes reserved at the last pause

    def _fold(self) -> None:
        r, a = peak_memory(self.device)
        self.reserved, self.allocated = _max(self.reserved, r), _max(self.allocated, a)

    def start(self) -> str | None:
        """Open the window (the first timed step); returns a note when it cannot reset."""
        self.open, self.reserved, self.allocated = True, None, None
        return reset_peak_memory(self.device)

    def step_end(self) -> None:
        if self.open and self.device.type == "mps":
            self._fold()

    def pause(self) -> None:
        """Before an evaluation or a sample: keep the training peak so far, and what the CUDA
        allocator holds (training's pool)."""
        if self.open:
            self._fold()
            if self.device.type == "cuda":
                self.held = torch.cuda.memory_reserved(self.device)

    def resume(self) -> None:
        """After it: drop what it cached and restart the counters here. On CUDA only where it
        grew the pool: training's own cached blocks stay warm for the next step."""
        if self.open:
            grew = self.device.type != "cuda" or torch.cuda.memory_reserved(self.device) > self.held
            if grew:
                release_cached(self.device)
            reset_peak_memory(self.device)

    def peak(self) -> tuple[int | None, int | None]:
        """(reserved, allocated) peak bytes of the window's training steps."""
        if self.open and self.device.type != "mps":
            self._fold()  # since the last pause: the steps after it (or what is held now)
        return self.reserved, self.allocated
