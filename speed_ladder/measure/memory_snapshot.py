"""`--memory-snapshot FILE`: the CUDA caching allocator's history of a run's training steps, the
pickle that pytorch.org/memory_viz draws (torch.cuda.memory._record_memory_history and
_dump_snapshot): every allocation and free with its stack, to check the memory model's terms
one by one on a GPU. Recording starts with the run, before the model is built, and the file is
written at the timed window's end (at a failure too, out of memory included); under torchrun
each rank writes its own (`FILE-rank<r>`). Recording stacks slows the steps, and a note says
so. CUDA only: on another device the flag is refused."""

import os
from pathlib import Path

import torch

from speed_ladder.errors import UserError
from speed_ladder.writable import check_file

MAX_ENTRIES = 100_000  # the allocator events kept, the newest


class MemorySnapshot:
    def __init__(self, path: str, device: torch.device):
        if device.type != "cuda":
            raise UserError(
                f"--memory-snapshot records the CUDA allocator: no CUDA device here ({device.type})"
            )
        rank = int(os.environ.get("RANK", "0"))
        p = Path(path)
        self.path = p if rank == 0 else p.with_name(f"{p.stem}-rank{rank}{p.suffix}")
        check_file(self.path, "--memory-snapshot")
        self.written = False
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)

    def dump(self, note) -> None:
        """Write the snapshot and stop recording, once; `note` says where it went, or why it
        did not (a full disk after an out-of-memory must not cost the run its record)."""
        if self.written:
            return
        self.written = True
        try:
            torch.cuda.memory._dump_snapshot(str(self.path))
        except (OSError, RuntimeError) as e:
            note(f"memory snapshot not written: {type(e).__name__}: {e}")
            return
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        note(
            f"memory snapshot: {self.path} (pytorch.org/memory_viz); recording it slowed the "
            "steps: their tok/s is no measurement"
        )


def from_args(args, device: torch.device) -> MemorySnapshot | None:
    path = getattr(args, "memory_snapshot", None)
    return None if path is None else MemorySnapshot(path, device)
