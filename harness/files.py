"""Where things live (the repository, its results, the offline mirror, the cache) and the one
atomic write every file the harness replaces goes through."""

import os
import tempfile
from pathlib import Path

from . import outputs
from .errors import UserError

ROOT = Path(__file__).resolve().parent.parent  # the repository: 00_orig.py, steps/, harness/
RESULTS = ROOT / "results"


def mirror() -> Path:
    """An offline mirror: SPEED_LADDER_SHARED, else a `shared/` folder beside the checkout,
    holding data/middlemarch.txt and data/gpt2_bpe/{encoder.json,vocab.bpe}."""
    return Path(os.environ.get("SPEED_LADDER_SHARED", ROOT.parent / "shared")) / "data"


def cache_dir() -> Path:
    """Where token ids and the CPU peak go; SPEED_LADDER_CACHE overrides (tests use a temp dir)."""
    return Path(os.environ.get("SPEED_LADDER_CACHE", ROOT / "data" / "cache"))


def check_cache_dir() -> Path:
    """The cache folder, checked before the work (a SPEED_LADDER_CACHE that is a file, or
    read-only, is one error line)."""
    path = cache_dir()
    why = outputs.problem(path, "dir")
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

    The file gets the mode an ordinary write would (0666 less the umask), not mkstemp's 0600.
    """
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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
