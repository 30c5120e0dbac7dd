"""tests/budget.py: per-test time limits, a budget's cut recorded as cut (never passed), and a
later run that runs only the tests that did not finish. Each case runs pytest on a small
generated test file, as tools/gpu_session.sh runs the GPU tests."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import alive

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from budget import (pytest_addoption, pytest_collection_finish,
                    pytest_collection_modifyitems, pytest_configure,
                    pytest_runtest_logreport, pytest_runtest_protocol, pytest_sessionfinish)
"""

CASES = """
import os, subprocess, sys, time
from pathlib import Path
import pytest

HERE = Path(__file__).parent

def test_a():
    pass

@pytest.mark.limit(60)
def test_b_waits():
    (HERE / "b-started").write_text("")
    if not os.environ.get("B_QUICK"):
        time.sleep(60)

def test_c_skips():
    pytest.skip("nothing to do here")

def test_d_fails():
    assert 1 == 2
"""

HANG = """
import subprocess, sys, time
from pathlib import Path
import pytest

import importlib.util
spec = importlib.util.spec_from_file_location("real_conftest", {tests!r} + "/conftest.py")
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
run_script = real.run_script  # the GPU tests' way to run a script

@pytest.mark.limit(2)
def test_hangs_with_a_deaf_grandchild(tmp_path):
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']);"
            "open({pids!r}, 'w').write(str(p.pid)); time.sleep(120)")
    run_script([sys.executable, "-c", code], timeout=300)

def test_after():
    pass
"""


def pytest_run(folder: Path, *args, env=None, sigint_ignored=False) -> subprocess.Popen:
    """pytest on `folder`; `sigint_ignored`: started as a script's background job is (SIG_IGN)."""
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--rootdir", str(folder), str(folder), *args],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})}, preexec_fn=ignore,
    )  # fmt: skip


def folder_with(tmp_path: Path, cases: str) -> Path:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(cases)
    return tmp_path


def interrupt_during_b(folder: Path, state: Path, **how) -> tuple[int, str]:
    """Run the cases under --state and SIGINT pytest while test_b waits (a budget's end)."""
    started = folder / "b-started"
    started.unlink(missing_ok=True)
    proc = pytest_run(folder, "--state", state, **how)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    return proc.returncode, out


def test_a_cut_test_is_recorded_cut_and_a_later_run_runs_only_what_did_not_finish(tmp_path):
    folder, state = folder_with(tmp_path, CASES), tmp_path / "state.json"
    rc, out = interrupt_during_b(folder, state)
    assert rc == 2, out  # pytest's "interrupted"
    st = json.loads(state.read_text())
    assert st["passed"] == ["test_cases.py::test_a"], st
    assert st["cut"] == ["test_cases.py::test_b_waits"], st  # cut, never passed
    # b was cut, c and d never started: all three are left for the next call...
    assert st["left"] == [f"test_cases.py::{t}" for t in ("test_b_waits", "test_c_skips",
                                                          "test_d_fails")], st  # fmt: skip
    assert st["failed"] == {} and st["skipped"] == []

    # ...and the next call runs b, c and d, never a again
    proc = pytest_run(folder, "--state", state, "-v", env={"B_QUICK": "1"})
    out = proc.communicate(timeout=120)[0]
    assert "::test_a PASSED" not in out and "1 deselected" in out, out
    assert "test_b_waits PASSED" in out, out
    assert "test_c_skips SKIPPED" in out and "test_d_fails FAILED" in out, out
    st = json.loads(state.read_text())
    assert sorted(st["passed"]) == ["test_cases.py::test_a", "test_cases.py::test_b_waits"]
    assert st["skipped"] == ["test_cases.py::test_c_skips"] and st["cut"] == [] == st["left"]
    assert list(st["failed"]) == ["test_cases.py::test_d_fails"]
    assert "assert 1 == 2" in st["failed"]["test_cases.py::test_d_fails"]

    # a third call has nothing left to run, and the status line says what the calls found
    proc = pytest_run(folder, "--state", state)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 5, out  # pytest: no tests collected (all deselected)
    line = subprocess.run([sys.executable, str(TESTS / "budget.py"), str(state)],
                          capture_output=True, text=True)  # fmt: skip
    assert line.returncode == 1  # a failure is a failure
    assert line.stdout.startswith("2 passed, 1 failed (test_d_fails: "), line.stdout
    assert line.stdout.strip().endswith("1 skipped")


def test_a_test_cut_twice_is_failed_not_retried_forever(tmp_path):
    folder, state = folder_with(tmp_path, CASES), tmp_path / "state.json"
    interrupt_during_b(folder, state)
    interrupt_during_b(folder, state)
    st = json.loads(state.read_text())
    assert st["failed"] == {"test_cases.py::test_b_waits": "cut twice by the budget"}, st
    assert st["cut"] == [], st
    assert st["left"] == ["test_cases.py::test_c_skips", "test_cases.py::test_d_fails"], st
    line = subprocess.run([sys.executable, str(TESTS / "budget.py"), str(state)],
                          capture_output=True, text=True)  # fmt: skip
    assert "test_b_waits: cut twice by the budget" in line.stdout, line.stdout


def test_a_test_over_its_limit_fails_and_leaves_no_process(tmp_path):
    pids = tmp_path / "grandchild.pid"
    folder = folder_with(tmp_path, HANG.format(tests=str(TESTS), pids=str(pids)))
    state = tmp_path / "state.json"
    t0 = time.monotonic()
    proc = pytest_run(folder, "--state", state)
    out = proc.communicate(timeout=120)[0]
    took = time.monotonic() - t0
    assert proc.returncode == 1, out
    assert "over its 2 s limit" in out, out
    assert took < 60, took  # the limit, not the child's 120 s sleep
    st = json.loads(state.read_text())
    assert st["passed"] == ["test_cases.py::test_after"], st  # the run went on
    assert "over its 2 s limit" in st["failed"]["test_cases.py::test_hangs_with_a_deaf_grandchild"]
    grandchild = int(pids.read_text())
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "a process of the test outlived its limit"


def limits(path: Path) -> dict[str, tuple[float | None, bool]]:
    """{test name: (its limit marker's seconds or None, marked slow)} of a test file."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            limit, slow = None, False
            for d in node.decorator_list:
                text = ast.unparse(d)
                if text.startswith("pytest.mark.limit("):
                    limit = float(ast.literal_eval(d.args[0]))
                slow |= text == "pytest.mark.slow"
            out[node.name] = (limit, slow)
    return out


def test_every_gpu_test_has_a_limit_and_the_fast_part_fits_about_four_minutes():
    """Each GPU test's limit is its worst case: the fast part's limits together (parametrized
    cases each count) stay within 1000 s; a test past tools/gpu_session.sh's --budget is cut."""
    tests = limits(TESTS / "test_gpu.py")
    assert tests and all(limit for limit, _ in tests.values()), tests
    cases = {
        "test_liger_cases_shared_with_the_cpu_interpreter_tests": 4,
        "test_liger_loss_and_gradients_match_plain_cross_entropy": 2,
        "test_ddp_with_nccl_as_a_world_of_one": 2,
    }
    fast = sum(limit * cases.get(name, 1) for name, (limit, slow) in tests.items() if not slow)
    assert fast <= 1000, fast  # worst cases; the expected run is ~70 s
    # the order: the quick, most telling checks first (the MFU table, then Liger)
    names = [n for n, (_, slow) in tests.items() if not slow]
    assert names[0] == "test_the_peak_table_resolves_this_gpu", names
    assert names.index("test_liger_cases_shared_with_the_cpu_interpreter_tests") < names.index(
        "test_steps_12_and_13_peak_below_step_10_where_activations_dominate"
    )


def test_the_status_line_of_a_clean_state(tmp_path):
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"passed": ["t::a", "t::b"], "failed": {}, "skipped": [],
                                 "cut": [], "left": []}))  # fmt: skip
    res = subprocess.run([sys.executable, str(TESTS / "budget.py"), str(state)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == "2 passed"


def test_state_with_xdist_workers_is_one_usage_error(tmp_path):
    """Every worker would write its own part over the one state file: refused at the start."""
    folder, state = folder_with(tmp_path, "def test_a():\n    pass\n"), tmp_path / "state.json"
    out, _ = (proc := pytest_run(folder, "-n", "2", "--state", state)).communicate(timeout=120)
    assert proc.returncode == 4 and "--state runs in one process: leave out -n" in out, out
    assert not state.exists()


def test_a_run_started_with_sigint_ignored_is_still_cut(tmp_path):
    """A script's background job starts with SIGINT ignored; the budget's SIGINT still cuts."""
    folder, state = folder_with(tmp_path, CASES), tmp_path / "state.json"
    rc, out = interrupt_during_b(folder, state, sigint_ignored=True)
    assert rc == 2, out
    assert json.loads(state.read_text())["cut"] == ["test_cases.py::test_b_waits"]
