"""tests/preload.py: a script forked off a preloaded process runs as `python SCRIPT ARGS` does."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT, VERDICT, alive, records, run_script

# what a run sees of itself, and how it ends (argv[1])
PROBE = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    how = sys.argv[1]
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                      "main": __name__, "env": dict(os.environ),
                      "stdin": sys.stdin.read(), "torch": "torch" in sys.modules}))
    print("to stderr", file=sys.stderr)
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise ValueError("boom")
    if how == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
    if how == "hang":  # a child of its own, then never ends
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
        open(sys.argv[2], "w").write(str(child.pid))
        time.sleep(600)
""")


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "sub" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    return script


def run(probe, *args, **kw):
    return run_script([sys.executable, probe, *args], preload=True, **kw)


def test_a_run_sees_what_python_script_gives_it(probe, tmp_path):
    import json

    p = run(probe, "ok", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    assert seen["argv"] == [str(probe), "ok"] and seen["cwd"] == str(tmp_path)
    assert seen["path0"] == str(probe.parent) and seen["main"] == "__main__"
    assert seen["env"] == dict(os.environ) and seen["stdin"] == ""  # the test's own test name too
    assert seen["torch"]  # preloaded: the point
    assert p.stderr == "to stderr\n"


def test_exit_codes_are_the_shells(probe):
    assert run(probe, "exit").returncode == 3
    p = run(probe, "raise")
    assert p.returncode == 1 and "ValueError: boom" in p.stderr
    assert run(probe, "signal").returncode == -15


def wait_gone(pid, what):
    for _ in range(100):
        if not alive(pid):
            return
        time.sleep(0.05)
    pytest.fail(f"{what} {pid} is still running")


def test_a_timeout_ends_the_run_and_what_it_started(probe, tmp_path):
    pid_file = tmp_path / "child.pid"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run(probe, "hang", pid_file, timeout=3)
    assert time.monotonic() - t0 < 10
    wait_gone(int(pid_file.read_text()), "the run's child, after the timeout,")


def test_a_client_gone_mid_run_takes_the_run_with_it(probe, tmp_path):
    """A pytest worker killed while its run goes on: the handler sees the socket close."""
    import json
    import socket

    import preload

    run(probe, "ok")  # this environment's server, started
    server = preload._SERVERS[preload._key(dict(os.environ))]
    pid_file = tmp_path / "child.pid"
    req = {"argv": [str(probe), "hang", str(pid_file)], "cwd": str(tmp_path),
           "env": dict(os.environ), "out": str(tmp_path / "o"),
           "err": str(tmp_path / "e")}  # fmt: skip
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(server.sock)
        conn.sendall(json.dumps(req).encode() + b"\n")
        pid = int(conn.makefile().readline())
        for _ in range(200):
            if pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.05)
    wait_gone(pid, "the run")
    wait_gone(int(pid_file.read_text()), "the run's child")


def test_a_step_trains_as_in_a_process_of_its_own(tmp_path):
    """The same losses, bit for bit, and the same record, forked or started."""
    base = ["00_orig.py", "--preset", "tiny", "--device", "cpu", "--max-steps", 2,
            "--warmup-steps", 1, "--data", VERDICT]  # fmt: skip
    recs = []
    for preload in (True, False):
        res = tmp_path / f"{preload}.jsonl"
        p = run_script([sys.executable, ROOT / base[0], *base[1:], "--results", res],
                       preload=preload, timeout=300)  # fmt: skip
        assert p.returncode == 0, p.stderr[-2000:]
        recs.append(records(res)[0])
    forked, started = recs
    assert forked["losses"] == started["losses"] and forked["val_loss"] == started["val_loss"]
    assert forked["status"] == started["status"] == "ok"
    assert forked["script"] == started["script"] == "00_orig.py"
