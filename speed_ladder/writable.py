"""Whether a path can be written, checked before the work (a step's `--results`, the sweep's tag
folder and its files, `--trace`, the cache folder): a problem is one line in a run's first
second, not after an hour of training. Nothing is created: writing is tried with a probe file,
made and removed again in the nearest folder that exists."""

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from speed_ladder.errors import UserError

MIN_FREE_BYTES = 1 << 20  # a record is a few KB, a summary a few more: 1 MiB free is enough
PROBE_PREFIX = ".speed-ladder-probe-"


def _stat(path: Path):
    """os.stat, or None when nothing is (or can be) there; other errors propagate."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # a name this long cannot exist
            return None
        raise


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # Windows has no pathconf
        return 255


def _path_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return 4096 if os.name != "nt" else 32767


def _why(e: OSError) -> str:
    return e.strerror or e.__class__.__name__


def probe(folder: Path) -> OSError | None:
    """Try to create (and remove) a file in `folder`: the honest test of writing there, which
    os.access is not (root passes it on a folder of mode 0500, sysfs refuses root)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=PROBE_PREFIX)
    except OSError as e:
        return e
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return None


def _nearest_existing(path: Path) -> tuple[Path, list[str]]:
    """The deepest ancestor of `path` that exists (it may be a file), and the names below it."""
    missing = []
    p = path
    while _stat(p) is None:
        if p.parent == p:
            break
        missing.append(p.name)
        p = p.parent
    return p, missing[::-1]


def _space_problem(folder: Path) -> str | None:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < MIN_FREE_BYTES:
        return f"the disk is full ({free // 1024} KiB free in {folder})"
    return None


def _name_problem(path: Path, base: Path, base_is_dir: bool, missing: list[str]) -> str | None:
    """A file in the way of the folders to make, or a path or name too long."""
    if not base_is_dir and missing:
        return f"{base} is a file, not a folder"
    if len(str(path)) > _path_max(base):
        return f"path too long ({len(str(path))} characters; at most {_path_max(base)})"
    limit = _name_max(base)
    longest = max((len(n.encode()) for n in missing), default=0)
    if longest > limit:
        return f"name too long ({longest} bytes; at most {limit} per file or folder name)"
    return None


def _file_problem(path: Path, mode: int) -> str | None:
    """An existing file: opening it to append changes nothing."""
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):  # /dev/null and friends: not opened here
        return None if os.access(path, os.W_OK) else "cannot write it (permission denied)"
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        return f"cannot write it ({_why(e)})"
    return _space_problem(path.parent)


def _dir_problem(path: Path, mode: int) -> str | None:
    if not stat.S_ISDIR(mode):
        return "is a file, not a folder"
    e = probe(path)
    return f"cannot write in it ({_why(e)})" if e is not None else _space_problem(path)


def why_unwritable(path, kind: str = "file") -> str | None:
    """Why a file (`kind="file"`) or a folder (`kind="dir"`) at `path` cannot be written, or
    None when it can. A folder may be missing (the writer makes it), a file too."""
    if str(path) == "":
        return "no name given"
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    try:
        base, missing = _nearest_existing(path)
        mode = os.stat(base).st_mode
    except OSError as e:
        return f"cannot look there ({_why(e)})"
    why = _name_problem(path, base, stat.S_ISDIR(mode), missing)
    if why is not None or not missing:
        return why or (_file_problem if kind == "file" else _dir_problem)(path, mode)
    e = probe(base)
    return f"cannot write in {base} ({_why(e)})" if e is not None else _space_problem(base)


def _check(path, what: str, kind: str) -> None:
    why = why_unwritable(path, kind)
    if why:
        raise UserError(f"{what} {str(path) or repr('')}: {why}")


def check_file(path, what: str) -> None:
    """A file that will be written (appended to or replaced) at the end; UserError if it can't."""
    _check(path, what, "file")


def check_dir(path, what: str) -> None:
    """A folder files will be written into; UserError if they can't."""
    _check(path, what, "dir")
