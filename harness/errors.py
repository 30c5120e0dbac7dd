"""One clear error line and a non-zero exit, never a bare traceback."""

import sys


class UserError(Exception):
    """Bad input or an environment problem the user can fix; printed as one line."""


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def warn(message: str) -> None:
    """One `warning: ...` line on stderr (never fatal, even when stderr is gone)."""
    try:
        print(f"warning: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


# ---------------------------------------------------------------- out of memory
_OOM_MARKERS = (
    "DefaultCPUAllocator: can't allocate memory",  # torch's CPU allocator
    "std::bad_alloc",  # C++ new failing inside an op
    "MPS backend out of memory",  # Apple GPUs
    "CUDA out of memory",
)


def out_of_memory_line(e: BaseException) -> str | None:
    """The first line of an out-of-memory error on any device, else None.

    torch.OutOfMemoryError is CUDA's; on a CPU torch raises a RuntimeError from its allocator
    (`DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes`), C++ code a
    std::bad_alloc, Python a MemoryError.
    """
    if isinstance(e, MemoryError):
        return (str(e).strip().splitlines() or ["MemoryError"])[0] or "MemoryError"
    if e.__class__.__name__ == "OutOfMemoryError" or (
        isinstance(e, RuntimeError) and any(m in str(e) for m in _OOM_MARKERS)
    ):
        text = str(e).strip()
        for marker in _OOM_MARKERS:  # drop a "[enforce fail at alloc_cpu.cpp:127] ..." prefix
            i = text.find(marker)
            if i > 0:
                text = text[i:]
                break
        return (text.splitlines() or ["out of memory"])[0]
    return None
