"""Per-test time limits and a resumable state, for tests that run where time is lent (the GPU
tests in tools/gpu_session.sh). Its hooks are conftest.py's, so every pytest run has them.

- `@pytest.mark.limit(S)`: the test (its set-up, call and tear-down) fails after S seconds with
  "over its S s limit" (SIGALRM; run_script kills the process group a test started). A test that
  hangs on a GPU (an NCCL rendezvous, a compile) costs its limit, not the whole call.
- `--state FILE`: a JSON file of what every earlier call finished, read at the start and written
  at the end (also when a budget's SIGINT stopped the run). Tests it lists as finished (passed,
  failed or skipped) are deselected: a later call runs only the tests that did not finish. The
  test a SIGINT interrupted is recorded `cut`, never passed; cut a second time, it is `failed`
  ("cut twice"), so a test that can never fit is not retried forever.

The state: {"passed": [...], "failed": {nodeid: why}, "skipped": [...], "cut": [...],
"left": [...]} ("left": selected here and not finished, the cut one included).
"""

import json
import os
import signal
from pathlib import Path

import pytest

# this session's: the test running, its results, the tests selected (pytest_configure fills it)
_RUN: dict = {}


class OverLimit(Exception):
    """A test ran past its `limit` marker."""


def pytest_addoption(parser):
    parser.addoption("--state", default=None, metavar="FILE",
                     help="resumable test state (tests/budget.py): finished tests are skipped "
                          "over, this run's results are added")  # fmt: skip


def pytest_configure(config):
    config.addinivalue_line("markers", "limit(seconds): the test fails after this many seconds")
    state = config.getoption("--state")
    if state and getattr(config.option, "numprocesses", None):
        # every xdist worker would write its own part over the one file
        raise pytest.UsageError("--state runs in one process: leave out -n")
    if state and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # started with SIGINT ignored (a script's background job inherits that), a budget's
        # `timeout --signal=INT` would never cut this run: the SIGINT is ours again
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _RUN.update(current=None, results={}, why={}, selected=[])


def _load(path) -> dict:
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"passed": [], "failed": {}, "skipped": [], "cut": [], "left": []}
    return {k: state.get(k, {} if k == "failed" else []) for k in
            ("passed", "failed", "skipped", "cut", "left")}  # fmt: skip


def _finished(state: dict) -> set:
    return set(state["passed"]) | set(state["failed"]) | set(state["skipped"])


def pytest_collection_modifyitems(config, items):
    path = config.getoption("--state")
    if path:
        done = _finished(_load(path))
        keep = [i for i in items if i.nodeid not in done]
        dropped = [i for i in items if i.nodeid in done]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep


def pytest_collection_finish(session):
    _RUN["selected"] = [i.nodeid for i in session.items]  # after -m and -k


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The test's set-up, call and tear-down under one alarm of its `limit` marker."""
    _RUN["current"] = item.nodeid
    mark = item.get_closest_marker("limit")
    seconds = float(mark.args[0]) if mark else 0.0
    old = None
    if seconds > 0 and hasattr(signal, "SIGALRM"):

        def over(signum, frame):
            raise OverLimit(f"over its {seconds:g} s limit (@pytest.mark.limit)")

        old = signal.signal(signal.SIGALRM, over)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    outcome = yield
    if old is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if outcome.excinfo is None or not issubclass(outcome.excinfo[0], KeyboardInterrupt):
        _RUN["current"] = None  # else: stopped by a SIGINT (a budget), recorded cut at the end


def pytest_runtest_logreport(report):
    res = _RUN["results"]
    if report.failed:
        res[report.nodeid] = "failed"
        _RUN["why"][report.nodeid] = _why(report)
    elif report.skipped and res.get(report.nodeid) != "failed":
        res[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and report.nodeid not in res:
        res[report.nodeid] = "passed"


def _why(report) -> str:
    """The failure's one line: pytest's crash message ("assert 1 == 2", "OverLimit: over its
    ..."), else the report's last line."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "failed")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if crash is not None and lines else lines[-1] if lines else "failed")[:300]


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--state")
    if not path:
        return
    b = _RUN
    state = _load(path)
    cut_before = set(state["cut"])
    # the test a SIGINT stopped is still current (its protocol never finished)
    cut_now = b["current"] if b["current"] and b["current"] not in b["results"] else None
    for nodeid, outcome in b["results"].items():
        if outcome == "failed":
            state["failed"][nodeid] = b["why"].get(nodeid, "failed")
        else:
            state[outcome].append(nodeid)
    state["cut"] = [c for c in state["cut"] if c not in b["results"]]
    if cut_now:
        if cut_now in cut_before:
            state["failed"][cut_now] = "cut twice by the budget"
            state["cut"].remove(cut_now)
        elif cut_now not in state["cut"]:
            state["cut"].append(cut_now)
    done = _finished(state)
    state["left"] = [n for n in b["selected"] if n not in done]
    for k in ("passed", "skipped"):
        state[k] = sorted(set(state[k]))
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    os.replace(tmp, path)


def summary(state: dict) -> str:
    """One line for status.txt: "3 passed, 1 failed (name: why), 1 skipped, cut: X, left: N"."""
    parts = [f"{len(state['passed'])} passed"]
    if state["failed"]:
        parts.append(f"{len(state['failed'])} failed (" + "; ".join(
            f"{n.split('::')[-1]}: {w}" for n, w in state["failed"].items()) + ")")  # fmt: skip
    if state["skipped"]:
        parts.append(f"{len(state['skipped'])} skipped")
    if state["cut"]:
        parts.append("cut: " + ", ".join(n.split("::")[-1] for n in state["cut"]))
    left = [n for n in state["left"] if n not in state["cut"]]
    if left:
        parts.append(f"{len(left)} not started")
    return ", ".join(parts)


if __name__ == "__main__":  # python tests/budget.py STATE: the line, exit 1 failed, 3 left, 0 ok
    import sys

    st = _load(sys.argv[1])
    print(summary(st))
    sys.exit(1 if st["failed"] else 3 if st["left"] or st["cut"] else 0)
