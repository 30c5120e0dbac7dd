"""One clear error line and a non-zero exit, never a bare traceback: `UserError` is bad input; the
functions below name what the environment causes (out of memory, a full or read-only disk, a
closed output pipe, a torch.compile that cannot compile here), recognized by class names and
messages, without torch. `main` (`speed_ladder.main`) is a step's guard."""

import errno
import os
import sys
import traceback


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


# ---------------------------------------------------------------- OS errors
# What the machine, not the code, gets wrong: a full or read-only disk, permissions, a name the
# filesystem refuses, a path through a file, an exhausted table. (FileNotFoundError is left out:
# a missing file the harness expected is more often a bug worth its traceback.)
ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "an I/O error (a failing disk or network mount?)",
    errno.ENAMETOOLONG: "a file name too long for this file system",
    errno.EISDIR: "a folder where a file should be",
    errno.ENOTDIR: "a file where a folder should be",
    errno.EEXIST: "a file where a folder should be",
    errno.EMFILE: "too many open files",
    errno.ENFILE: "too many open files on this machine",
    errno.ENOMEM: "out of memory",
}


def is_environment_os_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS


def os_error_why(e: OSError) -> str:
    """`No space left on device (the disk is full)`."""
    what = e.strerror or str(e) or e.__class__.__name__
    why = ENVIRONMENT_ERRNOS.get(e.errno)
    return f"{what} ({why})" if why and why.lower() != what.lower() else what


def os_error_line(e: OSError) -> str:
    """`cannot use results/x/summary.csv: No space left on device (the disk is full)`."""
    return f"cannot use {e.filename}: {os_error_why(e)}" if e.filename else os_error_why(e)


# ---------------------------------------------------------------- out of memory
_OOM_MARKERS = (
    "DefaultCPUAllocator: can't allocate memory",  # torch's CPU allocator
    "std::bad_alloc",  # C++ new failing inside an op
    "MPS backend out of memory",  # Apple GPUs
    "CUDA out of memory",
)


def out_of_memory_line(e: BaseException) -> str | None:
    """The first line of an out-of-memory error on any device (torch.OutOfMemoryError on CUDA,
    a RuntimeError from the CPU allocator, C++'s std::bad_alloc, a MemoryError), else None."""
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


# ---------------------------------------------------------------- torch.compile
COMPILE_FIX_CXX = (
    "install a C++ compiler (Linux: g++; macOS: xcode-select --install; Windows: Visual Studio "
    "Build Tools, run from its developer prompt) or run with TORCH_COMPILE_DISABLE=1 "
    "(then torch.compile does nothing)"
)
COMPILE_FIX_TRITON = (
    "GPU kernels need Triton (Linux: pip install triton; Windows: pip install triton-windows); "
    "or run with TORCH_COMPILE_DISABLE=1 (then torch.compile does nothing)"
)
COMPILE_FIX_OTHER = "run with TORCH_COMPILE_DISABLE=1 to train without compiling"


def _chain(e: BaseException):
    """e, then what it wraps: dynamo's inner_exception, __cause__, __context__."""
    seen = set()
    todo = [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [getattr(x, "inner_exception", None), x.__cause__, x.__context__]


def _is_compiler_stack(x: BaseException) -> bool:
    return any(
        c.__module__.startswith(("torch._dynamo", "torch._inductor")) for c in type(x).__mro__
    )


def compile_failure_line(e: BaseException) -> str | None:
    """`torch.compile failed: <cause>; <fix>` for a failure of torch.compile's toolchain (no C++
    compiler, no Triton, a GPU too old for Triton, a compile error), else None."""
    chain = list(_chain(e))
    if not any(_is_compiler_stack(x) for x in chain):
        return None
    text = " ".join(f"{type(x).__name__}: {x}" for x in chain)
    names = {type(x).__name__ for x in chain}
    wrappers = ("BackendCompilerFailed", "InductorError")
    inner = next((x for x in chain if type(x).__name__ not in wrappers), e)
    first = next((ln.strip() for ln in str(inner).splitlines() if ln.strip()), "")
    if "CppCompileError" in names:  # the compiler's own first error line says most
        out = next((getattr(x, "output", "") for x in chain if hasattr(x, "output")), "")
        first = next((ln.strip() for ln in str(out).splitlines() if "error" in ln), first)
    first = first if len(first) <= 160 else first[:159] + "…"
    if (
        "InvalidCxxCompiler" in names
        or "No working C++ compiler" in text
        or ("Compiler:" in text and "is not found" in text)
    ):
        cause, fix = f"no working C++ compiler ({first})", COMPILE_FIX_CXX
    elif "CppCompileError" in names or "C++ compile error" in text:
        cause, fix = f"the C++ compiler failed on the generated code ({first})", COMPILE_FIX_CXX
    elif "TritonMissing" in names or "Cannot find a working triton" in text:
        cause, fix = "no working Triton installation", COMPILE_FIX_TRITON
    elif "GPUTooOldForTriton" in names or "too old to be supported by the triton" in text:
        cause, fix = first, COMPILE_FIX_OTHER
    elif set(wrappers) & names:
        cause = f"{type(inner).__name__}: {first}" if first else type(inner).__name__
        fix = COMPILE_FIX_OTHER
    else:
        return None  # a dynamo error that is not the toolchain's: a bug worth its traceback
    return f"torch.compile failed: {cause}; {fix}"


# ---------------------------------------------------------------- a closed output pipe
def flush_stdout() -> None:
    """Flush stdout now, inside the caller's handler, so that a closed pipe is a
    BrokenPipeError there rather than Python's 'Exception ignored' message at exit."""
    try:
        sys.stdout.flush()
    except ValueError:  # already closed
        pass


def broken_pipe(message: str = "output closed (broken pipe)", code: int = 1) -> "NoReturn":  # noqa: F821
    """Stdout went away (`... | head`): point it at devnull, so that Python's flush at exit
    does not raise again, say so in one line on stderr if it is still there, and exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    try:
        print(f"error: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    raise SystemExit(code)


def pipe_safe(main, *args) -> int:
    """main(*args)'s exit code, stdout flushed inside: a closed stdout (`... | head`) is one line
    on stderr and exit 1, not a traceback (`python -m speed_ladder`, the module commands)."""
    try:
        try:
            return main(*args)
        finally:
            flush_stdout()
    except BrokenPipeError:
        broken_pipe()


# ---------------------------------------------------------------- a step's guard
class FailureHandoff:
    """The hand-off from a step's `Run` (which registers the writer of its failure record) to
    `speed_ladder.main` (which calls it when the step dies); before a Run exists, nothing."""

    def __init__(self):
        self._write = None

    def register(self, write) -> None:
        self._write = write

    def __call__(self, status: str, reason: str) -> None:
        if self._write is not None:
            self._write(status, reason)


on_failure = FailureHandoff()


def main(fn) -> None:
    """Run a step's main(): bad input, out of memory (any device), a torch.compile that cannot
    compile here, a full or read-only disk and a closed stdout each become one line, a record
    (where one can still be written) and a non-zero exit; only a bug shows its traceback."""
    try:
        try:
            fn()
        finally:
            flush_stdout()  # `--help | head`: a closed pipe is caught below, not at exit
    except UserError as e:
        on_failure("error", str(e))
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    except BrokenPipeError:
        on_failure("error", "stdout was closed (broken pipe)")
        broken_pipe("stdout was closed (broken pipe): training stopped")
    except Exception as e:
        oom = out_of_memory_line(e)
        if oom is not None:
            on_failure("oom", oom)
            fail(f"out of memory: {oom}", code=3)
        line = compile_failure_line(e)
        if line is None and is_environment_os_error(e):
            line = os_error_line(e)
        if line is not None:
            on_failure("error", line)
            fail(line, code=1)
        traceback.print_exc()
        on_failure("error", f"{e.__class__.__name__}: {e}")
        sys.exit(1)
