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
