"""Where things live (the checkout, its committed results and this machine's own, the offline
mirror, the cache), whether git tracks a path, how a record names a path (never where this
machine keeps it), and the one atomic write every file the harness replaces goes through."""

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.writable import why_unwritable

ROOT = Path(__file__).resolve().parent.parent  # the repository: 00_orig.py, steps/, speed_ladder/
RESULTS = ROOT / "results"  # the committed tags: reference data, never written by a run
# a sweep's own results (git ignores them: .gitignore); `python -m speed_ladder publish` adds
# them to RESULTS
LOCAL_RESULTS = RESULTS / "local"


def is_within(path: str | Path, folder: str | Path) -> bool:
    """Whether `path` is `folder` or inside it (links followed)."""
    return _relative(path, folder) is not None


def shown(path: str | Path) -> str:
    """How a message names a path: relative to the current folder when inside it
    (`results/local/cpu-...-x1`), else as given."""
    rel = _relative(path, os.getcwd())
    return rel if rel not in (None, ".") else str(path)


def tracked(path: str | Path) -> list[str]:
    """The files under `path` (a file or a folder) that git tracks in the checkout holding it:
    committed reference data, which a run never writes. [] outside a git checkout, where git
    is not installed, or where nothing there is tracked."""
    p = Path(os.path.abspath(path))
    where = p
    while not os.path.isdir(where):  # git runs in the nearest folder that exists (a name too
        if where.parent == where:  # long to exist is not one: os.path.isdir says False)
            return []
        where = where.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(where), "ls-files", "-z", "--full-name", "--", str(p)],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:  # not a git checkout, or `path` outside the one it is in
        return []
    return [x for x in out.stdout.decode(errors="replace").split("\0") if x]


def _relative(path: str | Path, base: str | Path) -> str | None:
    """`path` relative to the folder `base` (POSIX separators), or None when it is outside."""
    p, b = Path(os.path.abspath(path)), Path(os.path.abspath(base))
    for q, a in ((p, b), (p.resolve(), b.resolve())):  # as written, then links followed
        try:
            return q.relative_to(a).as_posix()
        except ValueError:
            pass
    return None


def portable_path(path: str | Path, base: str | Path | None = None) -> str:
    """How a record names a path, the same on every machine: relative to the checkout, else to
    `base` when inside it, else the file's name alone; never absolute."""
    for anchor in (ROOT, base):
        rel = None if anchor is None else _relative(path, anchor)
        if rel is not None:
            return rel
    return Path(path).name


def data_id(path: str | Path | None) -> str | None:
    """What identifies a training text (--data) in a run's configuration: None for the default,
    its path in the checkout, else its name and sha256 (`middlemarch.txt sha256:1a2b3c4d5e6f`):
    the same text anywhere is the same configuration. An unreadable file is its name alone."""
    if path is None:
        return None
    rel = _relative(path, ROOT)
    if rel is not None:
        return rel
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return Path(path).name
    return f"{Path(path).name} sha256:{digest.hexdigest()[:12]}"


def mirror() -> Path:
    """An offline mirror: SPEED_LADDER_SHARED, else a `shared/` folder beside the checkout,
    holding data/middlemarch.txt and data/gpt2_bpe/{encoder.json,vocab.bpe}."""
    return Path(os.environ.get("SPEED_LADDER_SHARED", ROOT.parent / "shared")) / "data"


def user_cache_dir() -> Path:
    """The platform's per-user cache folder for this project: $XDG_CACHE_HOME/speed-ladder or
    ~/.cache/speed-ladder (Linux), ~/Library/Caches/speed-ladder (macOS),
    %LOCALAPPDATA%\\speed-ladder (Windows); a temp folder when there is no home."""
    try:
        home = Path.home()
        if not home.is_absolute():
            home = None
    except (RuntimeError, KeyError, OSError):  # no HOME and no passwd entry (containers)
        home = None
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or (home and str(home / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = home and str(home / "Library" / "Caches")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = xdg if os.path.isabs(xdg) else (home and str(home / ".cache"))
    if not base:
        return _temp_cache()
    return Path(base) / "speed-ladder"


def _temp_cache() -> Path:
    """A per-user folder in the system's temp folder: the cache of last resort."""
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"speed-ladder-{user}"


_CACHE_CHOICE: dict[str, Path] = {}


def cache_dir() -> Path:
    """Where token ids, the CPU peak and the staged tokenizer go: SPEED_LADDER_CACHE (tests use
    a temp dir), else data/cache in the checkout, else, when the checkout is read-only (a shared
    install), the user's cache folder (`user_cache_dir`), said once in a line."""
    env = os.environ.get("SPEED_LADDER_CACHE")
    if env:
        return Path(env)  # the user's choice: checked, never replaced (see check_cache_dir)
    repo = ROOT / "data" / "cache"
    if str(repo) not in _CACHE_CHOICE:
        why = why_unwritable(repo, "dir")
        chosen = repo
        if why is not None:
            chosen = user_cache_dir()
            if why_unwritable(chosen, "dir") is not None:
                chosen = _temp_cache()
            print(
                f"note: cannot cache in {repo} ({why}); caching in {chosen} instead "
                "(SPEED_LADDER_CACHE=DIR chooses)",
                file=sys.stderr,
                flush=True,
            )
        _CACHE_CHOICE[str(repo)] = chosen
    return _CACHE_CHOICE[str(repo)]


def check_cache_dir() -> Path:
    """The cache folder, checked before the work (a SPEED_LADDER_CACHE that is a file, or
    read-only, is one error line)."""
    path = cache_dir()
    why = why_unwritable(path, "dir")
    if why is not None:
        env = os.environ.get("SPEED_LADDER_CACHE")
        what = f"SPEED_LADDER_CACHE={env}" if env else f"the cache folder {path}"
        raise UserError(f"{what}: {why}; point SPEED_LADDER_CACHE at a writable folder")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Write to a temp file beside `path`, fsync, then rename: readers never see half a file.
    The file gets the mode an ordinary write would (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a failed write names no file
            e.filename = str(path)
        raise
