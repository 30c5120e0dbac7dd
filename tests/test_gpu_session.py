"""tools/gpu_session.sh on a CPU (tiny preset, a few steps): the offline set-up, the sweep and the
GPU tests (skipped without CUDA) into one folder, --budget, the archive (--pack) and a rerun that
goes on from it (--resume), the wheels, a signal, bad flags."""

import json
import re
import shutil
import sys
import tarfile
import zipfile

import pytest
from conftest import BPE, ROOT, VERDICT, run_script

SCRIPT = ["bash", ROOT / "tools" / "gpu_session.sh"]
TINY = ["--device", "cpu", "--preset", "tiny", "--max-steps", 3, "--warmup-steps", 1,
        "--data", VERDICT, "--bpe", BPE, "--no-plots", "--no-profile"]  # fmt: skip


def needs(*what):
    if not shutil.which("bash") or ("bpe" in what and not BPE.is_dir()):
        pytest.skip("needs bash and the offline BPE files")


def status_of(out) -> list[str]:
    return (out / "status.txt").read_text().splitlines()


def test_one_command_sets_up_offline_runs_the_ladder_packs_and_a_rerun_goes_on(tmp_path):
    """Offline (no tiktoken cache, no offline folder but the one the script stages from --data
    and --bpe): the sweep, then the tests, in one folder and one archive. A rerun from that
    archive keeps what is done; one whose --budget cannot fit the next run leaves it (exit 3)
    and packs; the next runs no test again."""
    needs("bpe")
    env = {"PYTHON": sys.executable, "TIKTOKEN_CACHE_DIR": None, "SPEED_LADDER_HOST_ID": "smoke",
           "SPEED_LADDER_SHARED": str(tmp_path / "nothing")}  # fmt: skip
    default_text = ROOT / "data" / "middlemarch.txt"  # read by every later test that wants it
    before = default_text.read_bytes() if default_text.is_file() else None
    one = tmp_path / "one"
    proc = run_script([*SCRIPT, one, *TINY, "--steps", "00", "--budget", 280, "--pack",
                       tmp_path / "one.tgz"], timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (default_text.read_bytes() if default_text.is_file() else None) == before
    for name in ["session.log", "versions.txt", "pip-freeze.txt", "nvidia-smi.txt", "sweep.log",
                 "pytest-gpu.log", "pytest-gpu.xml"]:  # fmt: skip
        assert (one / name).is_file(), name
    assert (one / "offline" / "data" / "gpt2_bpe" / "vocab.bpe").is_file()
    status = [ln for ln in status_of(one) if not ln.startswith("liger: ")]
    assert status[0] == "sweep: ok", status
    assert re.fullmatch(r"tests: ok \(0 passed, (\d+) skipped\)", status[1]), status
    assert int(status[1].split()[-2]) >= 8 and len(status) == 2
    sweep_log = (one / "sweep.log").read_text()
    assert "expected duration: about" in sweep_log and "budget: " in sweep_log
    (runs,) = list((one / "results").glob("*/runs.jsonl"))
    rec = json.loads(runs.read_text().splitlines()[-1])
    assert (rec["status"], rec["step"], rec["preset"]) == ("ok", "00", "tiny")
    assert rec["sweep"]["machine"]["host_id"] == "pool:smoke"
    with tarfile.open(tmp_path / "one.tgz") as tar:
        names = tar.getnames()
    assert f"./results/{runs.parent.name}/runs.jsonl" in names and "./status.txt" in names
    assert not [n for n in names if n.startswith("./offline")]

    # from the archive, a budget too short for step 08's compiled run: 00 is kept, 08 left
    two = tmp_path / "two"
    proc = run_script([*SCRIPT, two, *TINY, "--steps", "00,08", "--budget", 130, "--resume",
                       tmp_path / "one.tgz", "--pack", tmp_path / "two.tgz"],
                      timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "up to date" in proc.stdout
    status = [ln for ln in status_of(two) if not ln.startswith("liger: ")]
    assert status[0].startswith("sweep: partial (not run, --budget") and "step 08" in status[0]
    assert status[1] == "tests: not started (the sweep has runs left)"
    assert not (two / ".resume").exists()
    with tarfile.open(tmp_path / "two.tgz") as tar:
        assert tar.extractfile(f"./results/{runs.parent.name}/runs.jsonl").read() == (
            runs.read_bytes()
        )

    # a resumed run with the sweep done runs the GPU tests again (skipped without CUDA)
    proc = run_script([*SCRIPT, tmp_path / "three", "--no-sweep", "--data", VERDICT, "--bpe", BPE,
                       "--resume", two], timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    status = [ln for ln in status_of(tmp_path / "three") if not ln.startswith("liger: ")]
    assert re.fullmatch(r"tests: ok \(0 passed, (\d+) skipped\)", status[-1]), status
    assert (tmp_path / "three" / "results" / runs.parent.name / "runs.jsonl").is_file()


def _wheel(folder, name: str) -> None:
    """A wheel of one empty module `name`."""
    info = f"{name}-0.0.1.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-0.0.1-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def test_wheels_of_missing_packages_go_to_out_site_and_liger_is_said(tmp_path):
    """--wheels installs, offline, what this Python lacks into OUT/site (on PYTHONPATH for the
    sweep and the tests); a wheel of an installed package is left. status.txt says whether step
    12 has Liger's kernel or falls back."""
    needs()
    _wheel(tmp_path / "wheels", "speed_ladder_smoke")
    _wheel(tmp_path / "wheels", "pytest")  # installed: left alone
    out = tmp_path / "s"
    proc = run_script([*SCRIPT, out, "--no-sweep", "--no-tests", "--wheels", tmp_path / "wheels"],
                      timeout=120, env={"PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    status = status_of(out)
    assert "wheels: ok (speed_ladder_smoke-0.0.1-py3-none-any.whl into OUT/site)" in status
    assert (out / "site" / "speed_ladder_smoke" / "__init__.py").is_file()
    assert not (out / "site" / "pytest").exists()
    (liger,) = [ln for ln in status if ln.startswith("liger: ")]
    try:
        import liger_kernel  # noqa: F401

        assert liger.startswith("liger: ok (liger-kernel ")
    except ImportError:
        assert liger.startswith("liger: missing (ModuleNotFoundError: No module named 'liger")
        assert "step 12 runs step 11's PyTorch loss instead" in liger


@pytest.mark.slow
def test_stopped_by_a_signal_it_still_packs_what_it_finished(tmp_path):
    """SIGTERM to the whole process group (the log's tee included) while the sweep runs, as a
    batch scheduler ends a job: the archive is still written, with the finished runs.
    Slow (~30 s on a 2-core CPU: real steps)."""
    import os
    import signal
    import subprocess
    import time

    needs("bpe")
    out, pack = tmp_path / "s", tmp_path / "back" / "s.tgz"
    proc = subprocess.Popen(
        [*map(str, SCRIPT), str(out), *map(str, TINY), "--steps", "00-03", "--no-tests",
         "--pack", str(pack)],
        env=dict(os.environ, PYTHON=sys.executable), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("results/*/runs.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.5)  # the first step's record is in
        assert proc.poll() is None, "the run ended before it could be stopped"
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
     (["--budget"], "--budget : a whole number of seconds"),
     (["--data", "/nonexistent/text"], "--data /nonexistent/text: no such file"),
     (["--resume", "/nonexistent/results"],
      "--resume /nonexistent/results: no such archive or folder"),
     (["--resume", "text.tgz"], "text.tgz: not a .tar.gz of --pack"),
     (["--resume", "."], ": not an OUT folder or a --pack archive")],
)  # fmt: skip
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, says):
    needs()
    (tmp_path / "text.tgz").write_text("not an archive")
    proc = run_script([*SCRIPT, tmp_path / "s", *flags], timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
