"""tests/alone.py: under pytest-xdist (`-n 2`, README's test command) a test marked `alone` runs
while no other worker is inside a test, the others still run two at a time, and the CPU matmul
peak is measured once per run into a cache folder every worker shares. pytest runs on a small
generated test file, each test logging when it started and ended."""

import json
import os
import subprocess
import sys
from pathlib import Path

import alone
import pytest

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent)!r}]
pytest_plugins = ["alone"]
"""

CASES = """
import json, os, time
import alone
import pytest

def peak():
    table = json.loads((alone.cache() / "matmul_peak.json").read_text())
    return sorted(table)

def span(name):
    t0 = time.time()
    time.sleep(0.6)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, t0, time.time(), str(alone.cache()), peak()]) + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_shared(i):
    span(f"shared{i}")

@pytest.mark.alone
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    span(f"alone{i}")
"""


# Not `alone` itself: its controller measures the CPU peak beside the other worker's test, which
# may read as busy; the controller then caches what it measured all the same (tests/alone.py)
def test_an_alone_test_overlaps_no_other_and_the_rest_run_two_at_a_time(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(CASES)
    spans = tmp_path / "spans.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "-o", "markers=alone: runs alone", "--rootdir", tmp_path, tmp_path / "test_cases.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "SPANS": str(spans), "OMP_NUM_THREADS": "1"},  # one peak to measure
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    assert len(rows) == 8
    alone = [r for r in rows if r[0].startswith("alone")]
    for name, t0, t1, *_ in alone:
        others = [r[0] for r in rows if r[0] != name and r[1] < t1 and r[2] > t0]
        assert not others, f"{name} overlapped {others}"
    shared = [r for r in rows if r[0].startswith("shared")]
    assert any(a[1] < b[2] and a[2] > b[1] for a in shared for b in shared if a is not b), (
        "no two tests ran at once: the workers ran one after the other"
    )
    caches = {r[3] for r in rows}
    assert len(caches) == 1, caches  # one folder for both workers
    assert not Path(caches.pop()).exists()  # removed when the run ended
    # measured once by the controller before the workers started, and cached (busy or not)
    assert all(any(k.startswith("cpu|") for k in r[4]) for r in rows), rows


@pytest.mark.skipif(alone.fcntl is None, reason="no flock (Windows): the workers never lock")
def test_a_run_of_alone_tests_holds_the_lock_from_the_first_to_the_last(tmp_path, monkeypatch):
    """An `alone` test followed by another keeps its exclusive hold; the last lets it go."""
    fcntl = alone.fcntl
    monkeypatch.setattr(alone, "SHARED", tmp_path)
    monkeypatch.setattr(alone, "KEPT", None)  # put back as it was, whatever this test leaves

    def another_test_could_start():  # the other worker's shared lock, not waited for
        with open(tmp_path / "tests", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    with alone.lock(exclusive=True, keep=True):
        assert not another_test_could_start()
    assert not another_test_could_start()  # between two `alone` tests
    with alone.lock(exclusive=True, keep=False):
        assert not another_test_could_start()
    assert another_test_could_start() and alone.KEPT is None
    with alone.lock(exclusive=False, keep=True):  # only an exclusive hold is kept
        assert another_test_could_start()
    assert alone.KEPT is None
