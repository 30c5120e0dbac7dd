"""The timed window of a run: its peak memory with the pauses left out (device.PeakWindow), the
GPU's idle share (gpu_idle.py) and, on rank 0, other processes' CPU load (cpu_load.py), from the
warm-up's end to the last timed step. The step times are the clock's (clock.py)."""

from speed_ladder.measure import cpu_load
from speed_ladder.measure import device as dev
from speed_ladder.measure.gpu_idle import IdleMeter


class TimedWindow:
    """Opened once the warm-up is over, closed after the last timed step (or at the run's end)."""

    def __init__(self, device, is_rank0: bool):
        self.device, self.is_rank0 = device, is_rank0
        self.state = "before"  # -> open -> closed
        self.memory = dev.PeakWindow(device)
        self.idle = IdleMeter(device)
        self.load = cpu_load.Meter()
        self.busy: dict = {}  # cpu_load.Meter.stop() of rank 0, at the end
        self.peak: tuple | None = None  # (reserved, allocated) at the end
        self.start_note: str | None = None  # what PeakWindow said of its start, if anything

    def open(self) -> None:
        dev.synchronize(self.device)
        self.state = "open"
        self.start_note = self.memory.start()
        if self.is_rank0:
            self.load.start()
        self.idle.start()

    def close(self, clock) -> None:
        """Read the window at its end, before profiled steps (whose profiler buffers raise a
        CPU process's RSS) or the final evaluation."""
        self.state = "closed"
        dev.synchronize(self.device)
        self.idle.stop()
        clock.read(wait=True)
        self.peak = self.memory.peak()
        if self.is_rank0:
            self.busy = self.load.stop()

    def pause(self) -> None:
        """Evaluation or sampling follows: neither in the peak nor in the idle share."""
        self.memory.pause()
        self.idle.pause()

    def resume(self) -> None:
        self.memory.resume()
        self.idle.resume()
