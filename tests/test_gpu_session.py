"""tools/gpu_session.sh, the set-up and phases of a session on a lent GPU machine, in its CPU
smoke mode: the staged inputs, the GPU tests (skipped without CUDA), the sweep, the archive a later
call resumes from, Liger's status and wheel, the budget and signals, bad flags. (Its own file,
apart from tests/test_tools.py's brief runs of tools/*.py: under pytest-xdist a file runs in one
worker, and together they were the suite's longest, about 140 s.)
"""

import sys
import tarfile

import pytest
from conftest import ROOT, VERDICT, run_script


def test_gpu_session_runs_its_phases_into_one_folder_on_a_cpu(tmp_path):
    """tools/gpu_session.sh in its CPU smoke mode: offline inputs staged, versions, the GPU tests
    (all skipped without CUDA), a one-step sweep; everything lands in OUT, and in one archive
    (--pack) that a second call, on a "fresh machine" of the same pool, resumes (--resume)."""
    import json
    import shutil

    from conftest import BPE

    if not BPE.is_dir() or not shutil.which("bash"):
        pytest.skip("needs bash and the offline BPE mirror")
    out, back = tmp_path / "session", tmp_path / "back"
    env = {"PYTHON": sys.executable, "SPEED_LADDER_HOST_ID": "smoke-pool"}
    common = ["--device", "cpu", "--preset", "tiny", "--max-steps", 3, "--warmup-steps", 1,
              "--data", VERDICT, "--bpe", BPE, "--no-plots"]  # fmt: skip
    gpu_session = ["bash", ROOT / "tools" / "gpu_session.sh"]
    default_text = ROOT / "data" / "middlemarch.txt"  # read by every later test that wants it
    before = default_text.read_bytes() if default_text.is_file() else None
    proc = run_script([*gpu_session, out, *common, "--steps", "00", "--budget", 280,
                       "--pack", back / "one.tgz"], timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the session's text (here The Verdict) stays in its own mirror, not the checkout's data/
    assert (default_text.read_bytes() if default_text.is_file() else None) == before
    for name in ["session.log", "status.txt", "versions.txt", "pip-freeze.txt", "nvidia-smi.txt",
                 "pytest-gpu.log", "pytest-gpu.xml", "sweep.log"]:  # fmt: skip
        assert (out / name).is_file(), name
    status = (out / "status.txt").read_text().splitlines()
    n_fast = len(run_script([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m",
                             "gpu and not slow", ROOT / "tests" / "test_gpu.py"]).stdout
                 .split("::")) - 1  # fmt: skip
    assert n_fast >= 8
    # the sweep first, then the tests (each test skipped without CUDA: a result, not a failure)
    assert [ln for ln in status if not ln.startswith("liger: ")] == [
        "sweep: ok", f"tests: ok (0 passed, {n_fast} skipped)"]  # fmt: skip
    assert len([ln for ln in status if ln.startswith("liger: ")]) == 1  # ok or missing, said
    assert "skipped" in (out / "pytest-gpu.log").read_text()  # no CUDA here: skipped, not failed
    (runs,) = list((out / "results").glob("*/runs.jsonl"))
    rec = json.loads(runs.read_text().splitlines()[-1])
    assert rec["status"] == "ok" and rec["step"] == "00" and rec["preset"] == "tiny"
    assert rec["sweep"]["machine"]["host_id"] == "pool:smoke-pool"
    assert (out / "offline" / "tiktoken").is_dir()  # the BPE files staged for tiktoken
    assert "budget: " in (out / "sweep.log").read_text()  # what is left of the call's 280 s

    with tarfile.open(back / "one.tgz") as tar:  # one file holds the session, inputs left out
        names = tar.getnames()
        tar.extractall(back / "one", filter="data")
    assert f"./results/{runs.parent.name}/runs.jsonl" in names and "./status.txt" in names
    assert not [n for n in names if n.startswith("./offline")]

    # the next call, from the archive: results carried back in, nothing left to run for step 00,
    # and no test left either (the state says each finished)
    proc = run_script([*gpu_session, tmp_path / "two", *common, "--steps", "00",
                       "--resume", back / "one.tgz", "--pack", back / "two.tgz"],
                      timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "up to date" in proc.stdout
    log = (tmp_path / "two" / "pytest-gpu.log").read_text()
    assert "SKIPPED" not in log and "deselected" in log, log  # none run again
    assert (
        f"tests: ok (0 passed, {n_fast} skipped)" in (tmp_path / "two" / "status.txt").read_text()
    )
    assert not (tmp_path / "two" / ".resume").exists()  # the unpacked archive, cleaned up
    with tarfile.open(back / "two.tgz") as tar:
        kept = tar.extractfile(f"./results/{runs.parent.name}/runs.jsonl").read()
    assert kept == runs.read_bytes()


def _fake_liger_wheel(folder) -> None:
    """A wheel named liger-kernel that holds the module step 12 imports (an empty stand-in)."""
    import zipfile

    info = "liger_kernel-0.0.1.dist-info"
    files = {
        "liger_kernel/__init__.py": "",
        "liger_kernel/transformers/__init__.py": "LigerFusedLinearCrossEntropyLoss = None\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: liger-kernel\nVersion: 0.0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "liger_kernel-0.0.1-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def test_gpu_session_says_whether_liger_is_there_and_installs_beside_a_read_only_site(tmp_path):
    """status.txt says `liger: missing (...)` where step 12 would fall back; with --wheels where
    site-packages refuses the install (a stand-in for a read-only image: as root here, a real
    read-only folder would not refuse), the wheel goes to OUT/site on PYTHONPATH: `liger: ok`."""
    import shutil

    if not shutil.which("bash"):
        pytest.skip("needs bash")
    gpu_session = ["bash", ROOT / "tools" / "gpu_session.sh"]
    proc = run_script([*gpu_session, tmp_path / "a", "--no-tests", "--no-sweep"], timeout=120,
                      env={"PYTHON": sys.executable, "PYTHONPATH": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (liger,) = [ln for ln in (tmp_path / "a" / "status.txt").read_text().splitlines()
                if ln.startswith("liger: ")]  # fmt: skip
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        assert liger.startswith("liger: missing (ModuleNotFoundError: No module named 'liger")
        assert "step 12 runs step 11's PyTorch loss instead" in liger
    _fake_liger_wheel(tmp_path / "wheels")
    shim = tmp_path / "python"  # pip into site-packages fails as on a read-only file system
    shim.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2 $3" = "-m pip install" ] && [[ " $* " != *" --target "* ]]; then
    echo "ERROR: [Errno 30] Read-only file system: 'site-packages/liger_kernel'" >&2; exit 1
fi
if [ "$1" = "-c" ] && [[ "$2" == *"import liger_kernel"* ]] && [[ "$2" != *"ops"* ]] \
    && [ -z "${{PYTHONPATH:-}}" ]; then exit 1; fi  # not installed yet, whatever is here
exec {sys.executable} "$@"
""")
    shim.chmod(0o755)
    out = tmp_path / "b"
    proc = run_script([*gpu_session, out, "--no-tests", "--no-sweep", "--wheels",
                       tmp_path / "wheels"], timeout=120,
                      env={"PYTHON": shim, "PYTHONPATH": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    status = (out / "status.txt").read_text().splitlines()
    assert "wheels: ok (site-packages read-only: installed into OUT/site, on PYTHONPATH)" in status
    assert (out / "site" / "liger_kernel" / "transformers" / "__init__.py").is_file()
    assert "liger: ok (liger-kernel 0.0.1)" in status
    # a later call into the same OUT on the same machine (a lease's call 2): the set-up is not
    # done again (pip would fail now), its status lines and OUT/site come back; --no-cache-pack
    # leaves the compile caches out of the archive without trying them
    versions = (out / "versions.txt").stat().st_mtime_ns
    shutil.rmtree(tmp_path / "wheels")
    (out / "cache" / "triton").mkdir(parents=True)
    (out / "cache" / "triton" / "kernel.so").write_bytes(b"\0" * 4096)
    proc = run_script([*gpu_session, out, "--no-tests", "--no-sweep", "--no-cache-pack", "--pack",
                       tmp_path / "c.tgz"], timeout=120, env={"PYTHON": "false"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "set-up: done by an earlier call on this machine" in proc.stdout
    again = (out / "status.txt").read_text().splitlines()
    assert again[:2] == status[:2] and "cache: not packed (--no-cache-pack)" in again
    assert (out / "versions.txt").stat().st_mtime_ns == versions
    with tarfile.open(tmp_path / "c.tgz") as tar:
        names = tar.getnames()
    assert "./status.txt" in names and not any("cache" in n for n in names), names


@pytest.mark.slow
@pytest.mark.parametrize(
    "steps, budget, says",
    [("01", 70, "sweep: not started (under a minute of --budget left"),
     ("08", 170, "sweep: partial (not run, --budget")],
)  # fmt: skip
def test_gpu_session_with_too_short_a_budget_says_so_exits_3_and_packs(
    tmp_path, steps, budget, says
):
    """The sweep not started, or its one step (08: 130 s by the rough model with its compile)
    left for the next call: said in status.txt, exit 3 (runs left, nothing failed), packed.
    Slow (~22 s each on a 2-core CPU): the fast suite's gpu_session test is
    test_gpu_session_runs_its_phases_into_one_folder_on_a_cpu (its budget line included), and
    the sweep's own budget handling is tests/test_lease.py's."""
    import shutil

    from conftest import BPE

    if not BPE.is_dir() or not shutil.which("bash"):
        pytest.skip("needs bash and the offline BPE mirror")
    proc = run_script(["bash", ROOT / "tools" / "gpu_session.sh", tmp_path / "s", "--device",
                       "cpu", "--preset", "tiny", "--data", VERDICT, "--bpe", BPE, "--no-plots",
                       "--steps", steps, "--no-tests", "--budget", budget,
                       "--pack", tmp_path / "s.tgz"],
                      timeout=300, env={"PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert says in (tmp_path / "s" / "status.txt").read_text()
    assert (tmp_path / "s.tgz").is_file()


@pytest.mark.slow
def test_gpu_session_stopped_by_a_signal_still_packs_what_it_finished(tmp_path):
    """The lease ends (SIGTERM to the whole process group, the log's tee included) while the
    sweep runs: the archive is still written, with the finished runs, and says it was stopped.
    Slow (~32 s on a 2-core CPU: real steps): the fast suite packs a session in
    test_gpu_session_runs_its_phases_into_one_folder_on_a_cpu."""
    import os
    import shutil
    import signal
    import subprocess
    import time

    from conftest import BPE

    if not BPE.is_dir() or not shutil.which("bash"):
        pytest.skip("needs bash and the offline BPE mirror")
    out, pack = tmp_path / "session", tmp_path / "back" / "s.tgz"
    proc = subprocess.Popen(
        ["bash", str(ROOT / "tools" / "gpu_session.sh"), str(out), "--device", "cpu", "--preset",
         "tiny", "--steps", "00-03", "--max-steps", "3", "--warmup-steps", "1", "--data",
         str(VERDICT), "--bpe", str(BPE), "--no-plots", "--no-tests", "--pack", str(pack)],
        env=dict(os.environ, PYTHON=sys.executable), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("results/*/runs.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.5)  # the first step's record is in
        assert proc.poll() is None, "the session ended before it could be stopped"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with tarfile.open(pack) as tar:
        status = tar.extractfile("./status.txt").read().decode()
        (runs,) = [n for n in tar.getnames() if n.endswith("/runs.jsonl")]
        assert b'"step": "00"' in tar.extractfile(runs).read()
    assert "session: stopped by a signal" in status


@pytest.mark.parametrize(
    "flags, says",
    [(["--budget", "soon"], "--budget soon: a whole number of seconds"),
     (["--budget", "0"], "--budget 0: a whole number of seconds"),
     (["--resume", "/nonexistent/results"],
      "--resume /nonexistent/results: no such archive or folder")],
)  # fmt: skip
def test_gpu_session_bad_flags_are_one_line_and_exit_2(tmp_path, flags, says):
    import shutil

    if not shutil.which("bash"):
        pytest.skip("needs bash")
    proc = run_script(["bash", ROOT / "tools" / "gpu_session.sh", tmp_path / "s", *flags],
                      timeout=60)  # fmt: skip
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
