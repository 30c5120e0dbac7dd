"""Tests that measure the machine run alone, when pytest-xdist runs the others two at a time.

The fast suite runs as `python -m pytest -n 2 --dist loadfile -m "not slow"` (README): much
of its cost is interpreter start-ups (torch and dynamo imports, 4-9 s of one core for each of
~90 step processes; tests/preload.py spares most of the ladder's), which two workers overlap.
A few tests measure the machine itself, and another worker's test beside them would be measured
too:

- `@pytest.mark.alone`: the test (set-up and tear-down included) runs while no other worker is
  inside a test. Every other test holds a shared lock; an `alone` test takes it exclusively. A
  turnstile keeps a waiting `alone` test from being starved by the other worker's next tests.
  An `alone` test followed by another keeps the lock for it, and tests/schedule.py puts the
  files with `alone` tests first, those tests at their head: an `alone` test waits for the other
  worker's test in flight, and at the start that is another short `alone` one.
- The CPU matmul peak (the MFU denominator, speed_ladder/measure/matmul_peak.py) is measured
  once per run by the controller, before it starts the workers, into a cache folder they all
  share: with this machine's threads, and with one thread, as each torchrun rank has it.
  Measured beside a worker's test it would read as "busy" and never be cached, so every step
  process would measure it again, on both cores. Where another job keeps the machine busy even
  then, the controller caches what it measured in the run's own cache all the same: the tests
  need a plausible MFU denominator, not this machine's best.

Without xdist (`python -m pytest`, `-p no:xdist`, tools/gpu_session.sh) nothing changes: no lock,
and the cache folder is the session's own. Only a real worker locks: a pytest that a test starts
(tests/test_budget.py) inherits the environment but is no worker, so it can never wait on a lock
its own parent test holds.
"""

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

try:
    import fcntl
except ImportError:  # Windows: no flock; the workers run every test side by side
    fcntl = None

ENV = "SPEED_LADDER_TESTS_SHARED"  # the run's shared folder: the controller's, for its workers
OWNED: Path | None = None  # the controller made it: removed when the run ends
SHARED: Path | None = None  # in a worker: the lock files, and cache/ (conftest's offline_env)


def cache() -> Path | None:
    """The cache folder every worker of this run shares, or None (no xdist)."""
    return SHARED / "cache" if SHARED else None


KEPT = None  # the exclusive hold an `alone` test leaves to the next test, `alone` too


def _acquire(exclusive: bool):
    tests = open(SHARED / "tests", "a")  # closed by lock(), maybe a test later
    with open(SHARED / "turnstile", "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)  # behind a waiting exclusive test, not past it
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
    return tests


@contextmanager
def lock(exclusive: bool, keep: bool = False):
    """Held around one test: shared by default, exclusive for an `alone` test. `keep` (the next
    test is `alone` too): an exclusive hold is not let go, so that a run of `alone` tests waits
    for the other worker's test in flight once, not once a test."""
    global KEPT
    if SHARED is None or fcntl is None:
        yield
        return
    held, KEPT = KEPT, None
    if held is None:
        held = _acquire(exclusive)
    try:
        yield
    finally:
        if exclusive and keep:
            KEPT = held
        else:
            fcntl.flock(held, fcntl.LOCK_UN)
            held.close()


def pytest_configure(config):
    global SHARED
    if hasattr(config, "workerinput") and os.environ.get(ENV):
        SHARED = Path(os.environ[ENV])


def pytest_sessionstart(session):
    """The controller, before it starts the workers (xdist's own sessionstart is trylast):
    make the shared folder and cache the CPU matmul peak in it, on a machine still quiet."""
    global OWNED
    if not session.config.pluginmanager.hasplugin("dsession"):
        return
    OWNED = Path(tempfile.mkdtemp(prefix="speed-ladder-tests-"))
    (OWNED / "cache").mkdir()
    os.environ[ENV] = str(OWNED)
    import torch

    from speed_ladder.measure import matmul_peak

    before = os.environ.get("SPEED_LADDER_CACHE")
    os.environ["SPEED_LADDER_CACHE"] = str(OWNED / "cache")
    threads = torch.get_num_threads()
    try:
        cpu = torch.device("cpu")
        path = OWNED / "cache" / "matmul_peak.json"
        for n in sorted({threads, 1}, reverse=True):  # 1: each torchrun rank's (OMP_NUM_THREADS=1)
            torch.set_num_threads(n)
            rates = matmul_peak.measured_matmul_rates(cpu)
            # Measured while other jobs kept a core busy, the harness returns the rates but never
            # caches them: then every step process of the run (about a hundred) would measure
            # them again, ~7 s each under the other worker's load. The tests need a plausible MFU
            # denominator, not this machine's best: their private cache keeps what was measured.
            table = matmul_peak._read_table(path)  # the harness's own reading of it
            key = matmul_peak.rates_key(cpu)
            if key not in table and matmul_peak.rates_problem(cpu, rates) is None:
                path.write_text(json.dumps({**table, key: rates}))
    finally:
        torch.set_num_threads(threads)
        if before is None:
            del os.environ["SPEED_LADDER_CACHE"]
        else:
            os.environ["SPEED_LADDER_CACHE"] = before


def pytest_unconfigure(config):
    if OWNED is not None:
        shutil.rmtree(OWNED, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    with lock(exclusive=is_alone(item), keep=nextitem is not None and is_alone(nextitem)):
        yield


def is_alone(item) -> bool:
    return item.get_closest_marker("alone") is not None
