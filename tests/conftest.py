"""Shared test set-up: offline tokenizer cache, a private cache dir, a fixed CPU matmul peak,
helpers to run scripts."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# idle OpenMP threads sleep, not spin: spinning starves the other worker's processes on 2 cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# a fixed CPU matmul peak (MFU's denominator; bf16 = fp32, so step 05's rule says fp32), above
# what any CPU trains `tiny` at: no process measures the machine; the measurement's tests unset it
os.environ.setdefault("SPEED_LADDER_PEAK_FLOPS", "1e12")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speed_ladder.errors import UserError  # noqa: E402
from speed_ladder.files import ROOT, atomic_write_bytes, mirror  # noqa: E402
from speed_ladder.measure.data import gpt2_tokenizer, read_text, stage_bpe  # noqa: E402

BPE = mirror() / "gpt2_bpe"
# The small test text: the mirror's The Verdict (CI: ../shared), else the first 20,000 characters
# of Middlemarch, which the harness downloads once (a user with internet and no mirror).
VERDICT = mirror() / "the-verdict.txt"
if not VERDICT.is_file():
    VERDICT = ROOT / "data" / "cache" / "test-text.txt"

# A peak-RSS test's runs: glibc's malloc hands large blocks to mmap, freed back to the system at
# once, until a large block is freed; then it raises that threshold and the next steps' 4-16 MB
# activations come from the heap, whose fragmentation (it differs between torch wheels and
# Pythons) adds to the peak. Torch 2.11 on Python 3.12 held 150-300 MB more than its live tensors
# (which equal 2.13's, counted with the profiler's memory events). A fixed 1 MiB threshold keeps
# RSS at the live tensors; only those tests set it (a step runs ~25% slower so). Not glibc: no-op.
RSS_FOLLOWS_TENSORS = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def missing_inputs() -> str | None:
    """Why the tests cannot have their text and GPT-2's tokenizer (offline, no mirror), or None.
    The text is made here when missing: the first 20,000 characters of Middlemarch, the mirror's
    where it has one. It is not read_text(None): that copies a mirror's text into the checkout's
    data/middlemarch.txt, which every later test reads as Middlemarch, and a mirror of another
    text (tools/gpu_session.sh's, of its --data text only) would be taken for it."""
    try:
        if not VERDICT.is_file():
            staged = mirror() / "middlemarch.txt"
            text = read_text(str(staged))[0] if staged.is_file() else ""
            text = text or read_text(None)[0]
            atomic_write_bytes(VERDICT, text[:20_000].encode())
        if not BPE.is_dir():
            gpt2_tokenizer()  # tiktoken's own download and cache
    except UserError as e:
        return (
            f"the tests need a text and GPT-2's BPE files ({str(e).split('; ')[0]}); "
            f"offline, put the-verdict.txt (any text) and gpt2_bpe/ (encoder.json, vocab.bpe) in "
            f"{mirror()}, or set SPEED_LADDER_SHARED to a folder whose data/ holds them"
        )
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Before any test (under xdist in the controller, before the workers start): one line and
    exit 4 (a usage error) when the inputs cannot be had, not the same error in every test."""
    if not hasattr(session.config, "workerinput") and (why := missing_inputs()):
        raise pytest.UsageError(why)


def load_script(rel: str):
    """A ladder script (ROOT / rel: `00_orig.py`, `steps/12_liger_fused_ce.py`) imported as a
    module (its main() not run), under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"step_{abs(hash(rel))}", ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_step(name: str):
    """steps/<name>.py imported as a module: load_step("12_liger_fused_ce")."""
    return load_script(f"steps/{name}.py")


LIGER = "liger_kernel.transformers"


def fake_liger(monkeypatch, forward=None) -> list:
    """liger_kernel (and its .transformers) in sys.modules, with a LigerFusedLinearCrossEntropyLoss
    in torch (or one whose forward is `forward`, one that raises); no Triton is imported. Returns
    the list of the modules built, each with the keywords it was built with (`made`) and its
    calls' shapes (`calls`)."""
    import types

    import torch

    built = []

    class LigerFusedLinearCrossEntropyLoss(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            self.made, self.calls = kwargs, []
            built.append(self)

        def forward(self, lin_weight, _input, target):
            self.calls.append((tuple(lin_weight.shape), tuple(_input.shape), tuple(target.shape)))
            if forward is not None:
                return forward()
            return torch.nn.functional.cross_entropy(_input @ lin_weight.T, target)

    package, mod = types.ModuleType("liger_kernel"), types.ModuleType(LIGER)
    mod.LigerFusedLinearCrossEntropyLoss = LigerFusedLinearCrossEntropyLoss
    package.transformers = mod
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, LIGER, mod)
    return built


@pytest.fixture(scope="session", autouse=True)
def offline_env(tmp_path_factory):
    """tiktoken reads a copy of the mirror's BPE files (offline); the harness a private cache."""
    if BPE.is_dir():
        tk = stage_bpe(BPE, tmp_path_factory.mktemp("tiktoken"))
        os.environ["TIKTOKEN_CACHE_DIR"] = str(tk)
    os.environ["SPEED_LADDER_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    # the sweep's 1-s load check before each run: off, except in the tests that check it
    # (tests/test_load.py); the fixture ladders' runs take milliseconds
    os.environ.setdefault("SPEED_LADDER_CHECK_S", "0")
    yield


@pytest.fixture
def eager():
    """torch.compile off for one test (no minute of compiling), through torch's own config API.
    Never `monkeypatch.setattr` on a torch config module: pytest 9.2 restores an option that
    lives behind the module's `__getattr__` by deleting it, and every later read of that option
    in the worker then raises AttributeError (tests/test_layout.py forbids it)."""
    import torch._dynamo.config

    with torch._dynamo.config.patch(disable=True):
        yield


def command_here(capsys, command: str, *args) -> tuple[int, str, str]:
    """`python -m speed_ladder COMMAND ARGS` in this process (no interpreter start, torch is
    loaded). Returns (exit code, stdout, stderr)."""
    from speed_ladder.__main__ import main

    capsys.readouterr()
    try:
        code = main([command, *map(str, args)])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def sweep_here(capsys, *args) -> tuple[int, str, str]:
    """`python -m speed_ladder run ARGS` in this process; the steps still run as child
    processes. Returns (exit code, stdout, stderr)."""
    return command_here(capsys, "run", *args)


def run_script(args, timeout=600, env=None, cwd=ROOT):
    """Run a command, return CompletedProcess with text output. The command gets a process group
    of its own; a timeout, the test's (pytest-timeout) or Ctrl-C kills the whole group, so no
    worker (torchrun's) is left holding a GPU. `env` is added to this process's environment; a
    variable set to None is left out."""
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    proc = subprocess.Popen(
        [str(a) for a in args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def py(script, *args, **kw):
    return run_script([sys.executable, str(ROOT / script), *map(str, args)], **kw)


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a zombie (killed, its parent not yet reaping it) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:  # no /proc (macOS): os.kill said it exists
        return True


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def count_host_syncs(monkeypatch, counting) -> None:
    """Every way the harness could make the host wait for the device, or read a tensor back,
    wrapped by `counting(name, real)`: synchronize (the harness's and torch.cuda's) as "sync",
    `Tensor.item` and `Tensor.tolist` as themselves."""
    import torch

    from speed_ladder.measure import device as dev

    monkeypatch.setattr(dev, "synchronize", counting("sync", dev.synchronize))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("sync", torch.cuda.synchronize))
    monkeypatch.setattr(torch.Tensor, "item", counting("item", torch.Tensor.item))
    monkeypatch.setattr(torch.Tensor, "tolist", counting("tolist", torch.Tensor.tolist))


def rung_reasons(step, device, cfg, kernel=None, batch=8, preset="tiny", **values):
    """[(rung, why it does nothing or None, what ran)] of `step` and the rungs it builds on, as
    a run of `preset` (with the flag `values`) asks them (measure/rung_checks.py): the checks
    that judge by the attention kernel too where `kernel` is given."""
    from speed_ladder.measure.rung_checks import Facts, reasons
    from speed_ladder.measure.settings import resolve_spec

    spec = resolve_spec({"preset": preset, **values}, device.type)
    return reasons(Facts(step, device, cfg, spec, batch, kernel))
