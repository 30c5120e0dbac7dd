"""Output locations, checked before the work: a step's `--results` file, the sweep's tag folder
and the files in it, the cache folder.

Each check finds what would make the write at the end fail (a folder where the file should be,
a file where a folder should be, no permission or a read-only disk, a name the filesystem
refuses, a full disk) and names it in one line, so that a run fails in its first second rather
than after an hour of training. None creates what it checks: missing folders are left to the
writer, and writing is tried with a probe file, created and removed again, in the nearest
folder that exists (a name the sweep's temporary files never have).
"""

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


def problem(path, kind: str = "file") -> str | None:
    """Why a file (`kind="file"`) or a folder (`kind="dir"`) at `path` cannot be written, or
    None when it can. A folder may be missing (the writer makes it), a file too."""
    if str(path) == "":
        return "no name given"
    path = Path(os.path.abspath(os.path.expanduser(str(path))))
    try:
        base, missing = _nearest_existing(path)
        st = os.stat(base)
    except OSError as e:
        return f"cannot look there ({_why(e)})"
    if not stat.S_ISDIR(st.st_mode) and missing:
        return f"{base} is a file, not a folder"
    if len(str(path)) > _path_max(base):
        return f"path too long ({len(str(path))} characters; at most {_path_max(base)})"
    limit = _name_max(base)
    longest = max((len(n.encode()) for n in missing), default=0)
    if longest > limit:
        return f"name too long ({longest} bytes; at most {limit} per file or folder name)"
    if not missing:  # it exists
        if kind == "file":
            if stat.S_ISDIR(st.st_mode):
                return "is a folder, not a file"
            if stat.S_ISREG(st.st_mode):
                try:
                    with open(path, "ab"):  # exists: opening to append changes nothing
                        pass
                except OSError as e:
                    return f"cannot write it ({_why(e)})"
            elif not os.access(path, os.W_OK):  # /dev/null and friends: not opened here
                return "cannot write it (permission denied)"
            folder = path.parent
        else:
            if not stat.S_ISDIR(st.st_mode):
                return "is a file, not a folder"
            folder = path
            e = probe(folder)
            if e is not None:
                return f"cannot write in it ({_why(e)})"
        return _space_problem(folder) if stat.S_ISREG(st.st_mode) or kind == "dir" else None
    e = probe(base)
    if e is not None:
        return f"cannot write in {base} ({_why(e)})"
    return _space_problem(base)


def check_file(path, what: str) -> None:
    """A file that will be written (appended to or replaced) at the end; UserError if it can't."""
    why = problem(path, "file")
    if why:
        raise UserError(f"{what} {str(path) or repr('')}: {why}")


def check_dir(path, what: str) -> None:
    """A folder files will be written into; UserError if they can't."""
    why = problem(path, "dir")
    if why:
        raise UserError(f"{what} {str(path) or repr('')}: {why}")
