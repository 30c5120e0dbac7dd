"""The GPU's idle share over the timed window, without the profiler: 1 - the mean of NVML's
utilization samples the driver took inside it (pauses left out), as every CUDA record's
`gpu_idle_share`, `gpu_idle_ms_per_step` and `gpu_idle_source`. Where it cannot be read the
fields are None and the source says why: never a made-up number (docs/measurement.md)."""

import torch

from speed_ladder.measure.device import is_rocm

NO_GPU = "no GPU"
METHOD = (
    "NVML GPU utilization: 1 - mean of {n} driver samples inside the timed window (each the "
    "percent of its 1/6-1 s period with a kernel running, whole percents, every process on "
    "this GPU)"
)


class NvmlSamples:
    """The driver's buffered GPU-utilization samples of one GPU: [(timestamp µs, percent)]."""

    def __init__(self, pynvml, handle):
        self.nvml, self.handle = pynvml, handle

    def since(self, last_seen: int) -> list[tuple[int, int]]:
        nv = self.nvml
        kind = nv.NVML_GPU_UTILIZATION_SAMPLES
        try:
            _, got = nv.nvmlDeviceGetSamples(self.handle, kind, last_seen)
        except nv.NVMLError_NotFound:  # no sample newer than last_seen
            return []
        return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in got]


def nvml_source(device: torch.device):
    """(NvmlSamples of `device`'s GPU, "") or (None, why it cannot be read)."""
    if device.type != "cuda":
        return None, NO_GPU
    if is_rocm():
        return None, "ROCm GPU: NVML does not read it (amdsmi is not used here)"
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:  # initializes NVML; maps the CUDA index to NVML's (CUDA_VISIBLE_DEVICES)
        src = NvmlSamples(pynvml, torch.cuda._get_pynvml_handler(device))
        src.since(0)
    except Exception as e:  # e.g. NVMLError_NotSupported on a MIG slice
        return None, f"NVML utilization samples unavailable: {e.__class__.__name__}: {e}"
    return src, ""


class IdleMeter:
    """Samples kept over the timed window's segments. `source` (tests: a fake) has
    `since(last_seen) -> [(timestamp, percent)]`; by default nvml_source(device)."""

    def __init__(self, device: torch.device, source=None, why: str = ""):
        self.device = device
        self.source, self.why = source, why
        self._asked = source is not None or bool(why)
        self.values: list[int] = []
        self.read = 0  # samples read inside the segments, the dropped first ones included
        self._last: int = 0
        self.running = self.paused = False

    def _since(self, last: int) -> list[tuple[int, int]]:
        try:
            return sorted(self.source.since(last))
        except Exception as e:  # never lose a run to the counter
            self.source, self.why = None, f"NVML read failed: {e.__class__.__name__}: {e}"
            return []

    def _ask(self) -> None:
        if not self._asked:
            self._asked = True
            self.source, self.why = nvml_source(self.device)

    def start(self) -> None:
        """The window's start, or a pause's end: samples from here on count."""
        self._ask()
        if self.source is None:
            return
        seen = self._since(self._last)
        self._last = seen[-1][0] if seen else self._last
        self.running = self.source is not None

    def pause(self) -> None:
        """`run.paused()` inside the window: its samples are left out."""
        if self.running:
            self.stop()
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.start()

    def stop(self) -> None:
        """A pause, or the window's end: keep the samples since the start, the first left out."""
        self.paused = False
        if not self.running:
            return
        self.running = False
        new = self._since(self._last)
        if new:
            self._last = new[-1][0]
            self.read += len(new)
            self.values += [v for _, v in new[1:]]  # the first straddles the segment's start

    def share(self) -> tuple[float | None, str]:
        """(idle share, its source) or (None, why not)."""
        self._ask()
        if self.source is None:
            return None, self.why or NO_GPU
        if not self.values:
            return None, (
                f"no NVML utilization sample inside the timed window ({self.read} read, the "
                "first of each segment dropped): a window shorter than the driver's sample "
                "period (1/6-1 s); run more steps"
            )
        if max(self.values) > 100:
            return None, f"NVML utilization samples up to {max(self.values)}: not percents"
        return 1 - sum(self.values) / len(self.values) / 100, METHOD.format(n=len(self.values))

    def fields(self, mean_step_s: float | None) -> dict:
        """The record's fields; a None share's reason is `gpu_idle_source`."""
        share, source = self.share()
        ms = None
        if share is not None and mean_step_s:
            ms = round(share * mean_step_s * 1000, 3)
        return {
            "gpu_idle_share": None if share is None else round(share, 4),
            "gpu_idle_ms_per_step": ms,
            "gpu_idle_source": source,
        }
