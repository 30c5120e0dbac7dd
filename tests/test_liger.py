"""Step 12's real Liger kernels on a CPU, through Triton's interpreter (TRITON_INTERPRET=1).

Triton reads TRITON_INTERPRET when it is first imported, and pytest imports every test module
in one process (others import triton without the interpreter), so every check here runs in a
subprocess with the variable set in its environment:
- the numerics cases of tests/liger_cases.py (shared with tests/test_gpu.py, which runs them on
  CUDA compiled): step 12's loss, Liger's public module as the step builds it,
  against plain linear + cross-entropy in fp32 and under bf16 autocast with ignored targets,
  over several chunks, the weight gradient's fp32 accumulation, and a control that sums in bf16
  and must fail (so the accumulation case can);
- Liger's public module imports without the transformers package;
- step 12 end to end on `tiny` against step 11 (slow: ~3 s a step interpreted), its record
  `step_active: true` and `interpreted: true`;
- steps 12 and 14 under torchrun with 2 gloo processes (slow): the out_head gradient equals the
  single-process one, and FSDP2's root hands Liger the full weight.
What only a GPU shows (speed, memory, shared-memory limits, warps) is no part of this.
"""

import importlib.util
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ROOT, VERDICT, records, run_script

sys.path.insert(0, str(ROOT / "tests"))
import liger_cases  # noqa: E402

from speed_ladder import parity  # noqa: E402

# found, not imported: importing liger here would import triton in pytest's process
for _mod in ("liger_kernel", "triton", "numpy"):
    if importlib.util.find_spec(_mod) is None:
        pytest.skip(f"{_mod} not installed (liger-kernel: Linux only)", allow_module_level=True)

INTERPRET = {"TRITON_INTERPRET": "1", "TORCH_COMPILE_DISABLE": "1", "SPEED_LADDER_BF16": "0"}
TINY = ["--device", "cpu", "--preset", "tiny", "--max-steps", 3, "--warmup-steps", 1,
        "--batch-size", 2, "--data", VERDICT]  # fmt: skip
# Triton 3.6's interpreter (the GPU image's Triton) with numpy >= 2.4 (2.2 and 2.3 pass): a loop
# bound `range(0, n_cols, BLOCK)` becomes int() of a one-element array, an error in numpy 2.4.
# Triton 3.9 runs it. Not step 12's fault, and no GPU runs the interpreter: skipped, saying so.
NUMPY_VS_INTERPRETER = "only 0-dimensional arrays can be converted to Python scalars"


def interpreted_ok(proc) -> None:
    """Assert an interpreted run passed; skip where this Triton's interpreter cannot run on this
    numpy (NUMPY_VS_INTERPRETER), a known incompatibility of the two."""
    if (
        proc.returncode != 0
        and NUMPY_VS_INTERPRETER in proc.stderr
        and "interpreter" in proc.stderr
    ):
        from importlib.metadata import version  # triton not imported here (the docstring)

        versions = f"Triton {version('triton')}'s interpreter on numpy {version('numpy')}"
        pytest.skip(f"{versions} fails ({NUMPY_VS_INTERPRETER}): numpy < 2.4 or a newer Triton")
    assert proc.returncode == 0, proc.stderr[-3000:]


def interpreted_cases(*names):
    """{case: result} of tests/liger_cases.py run through the interpreter in a subprocess."""
    proc = run_script([sys.executable, ROOT / "tests" / "liger_cases.py", "cpu", *names],
                      env=INTERPRET, timeout=300)  # fmt: skip
    interpreted_ok(proc)
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}


def test_step12_liger_call_matches_plain_cross_entropy_through_the_interpreter():
    results = interpreted_cases()
    assert set(results) == set(liger_cases.CASES)
    for name, res in results.items():
        bad = liger_cases.check(res)
        if name.endswith("-control"):  # bf16 accumulation loses the small rows: must be caught
            assert any("contributions were lost" in b for b in bad), res
        else:
            assert not bad, (name, bad, res)


def test_liger_public_module_imports_without_the_transformers_package():
    """liger_kernel.transformers imports `transformers` only where it is installed: with it
    blocked (an import of it raises), step 12 still builds Liger's module."""
    code = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); sys.modules['transformers'] = None\n"
        "from speed_ladder.measure.inactive import liger_unavailable\n"
        "why = liger_unavailable(torch.device('cpu'), torch.bfloat16)\n"
        "assert why is None, why\n"
        "from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss as L\n"
        "print(type(L(accum_dtype=torch.float32)).__name__)"
    )
    proc = run_script([sys.executable, "-c", code, ROOT], env=INTERPRET, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["LigerFusedLinearCrossEntropyLoss"]


def step_run(tmp_path, script, name, env=INTERPRET, launcher=(sys.executable,), args=TINY):
    res = tmp_path / f"{name}.jsonl"
    proc = run_script([*launcher, ROOT / "steps" / script, *args, "--results", res], env=env)
    interpreted_ok(proc)
    (rec,) = records(res)
    return rec


@pytest.mark.slow
def test_step12_end_to_end_through_the_interpreter_keeps_step11s_loss(tmp_path):
    plain = {k: v for k, v in INTERPRET.items() if k != "TRITON_INTERPRET"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        f11 = pool.submit(step_run, tmp_path, "11_ddp.py", "s11", plain)
        f12 = pool.submit(step_run, tmp_path, "12_liger_fused_ce.py", "s12")
        r11, r12 = f11.result(), f12.result()
    assert r12["status"] == "ok" and r12["step_active"] is True, r12["inactive_reason"]
    assert r12["interpreted"] is True and r11["interpreted"] is False
    assert any(n.startswith("step 12: Liger's kernel ran through Triton") for n in r12["notes"])
    ok, how = parity.check("12", r11, r12)
    assert ok, (how, r11["losses"], r12["losses"])


def test_step12_without_the_interpreter_on_a_cpu_keeps_the_fallback():
    import torch

    from speed_ladder.measure.inactive import liger_unavailable

    assert "no CUDA device" in liger_unavailable(torch.device("cpu"), torch.float32)


# Rank 0 writes out_head's full weight gradient after the first step (gathered from FSDP2's
# shards), and the shape and kind of the weight Liger read (FSDP2: the root's unsharded one).
GRAD = """import os, runpy, sys
sys.path.insert(0, {root!r})
import torch
from speed_ladder.measure.run import Run
step_done = Run.step_done
def step_done_(self, loss, *a, **k):
    if self.steps_done == 0:
        w = self._out_head.weight
        g = w.grad.full_tensor() if hasattr(w.grad, "full_tensor") else w.grad
        full = w.full_tensor() if hasattr(w, "full_tensor") else w
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save({{"grad": g.detach().cpu(), "weight": full.detach().cpu(),
                        "shape": list(w.shape), "kind": type(w.data).__name__}}, {out!r})
    return step_done(self, loss, *a, **k)
Run.step_done = step_done_
set_model = Run.set_model
def set_model_(self, model, *a, **k):
    inner = getattr(model, "module", model)
    inner = getattr(inner, "_orig_mod", inner)
    self._out_head = inner.out_head
    return set_model(self, model, *a, **k)
Run.set_model = set_model_
from torch.autograd.function import Function
apply = Function.apply.__func__
def apply_(cls, *args, **kwargs):  # the weight the step's Liger loss reads: shape, kind, once
    if (cls.__name__ == "LigerFusedLinearCrossEntropyFunction"
            and int(os.environ.get("RANK", "0")) == 0
            and not os.path.exists({seen!r})):
        with open({seen!r}, "w") as f:
            f.write(repr((list(args[1].shape), type(args[1]).__name__)))
    return apply(cls, *args, **kwargs)
Function.apply = classmethod(apply_)
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def first_grad(tmp_path, script, name, nproc):
    wrapper = tmp_path / f"grad_{name}.py"
    out, seen = tmp_path / f"{name}.pt", tmp_path / f"{name}.seen"
    wrapper.write_text(GRAD.format(root=str(ROOT), script=str(ROOT / "steps" / script),
                                   out=str(out), seen=str(seen)))  # fmt: skip
    args = [
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--max-steps",
        2,
        "--warmup-steps",
        1,
        "--batch-size",
        4 // nproc,
        "--data",
        VERDICT,
        "--results",
        tmp_path / f"{name}.jsonl",
    ]
    launch = (
        [sys.executable]
        if nproc == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
        ]
    )
    proc = run_script([*launch, wrapper, *args], env=INTERPRET, timeout=900)
    interpreted_ok(proc)
    import torch

    (rec,) = records(tmp_path / f"{name}.jsonl")
    return torch.load(out), eval(seen.read_text()), rec


@pytest.mark.slow
def test_steps_12_and_14_with_two_gloo_processes_give_liger_the_full_weight_and_its_gradient(
    tmp_path,
):

    one, seen1, _ = first_grad(tmp_path, "12_liger_fused_ce.py", "one", 1)
    vocab_dim = one["shape"]
    assert seen1[0] == vocab_dim and seen1[1] != "DTensor", seen1
    for script, name in (("12_liger_fused_ce.py", "ddp"), ("14_fsdp2.py", "fsdp2")):
        two, seen, rec = first_grad(tmp_path, script, name, 2)
        assert rec["world_size"] == 2 and rec["interpreted"] is True, name
        # FSDP2's root (reshard_after_forward=False) keeps out_head gathered: Liger reads the
        # whole (V, C) weight, not a rank's shard
        assert seen[0] == vocab_dim and seen[1] != "DTensor", (name, seen)
        # mean over 2 ranks' halves == the mean over the whole batch: fp32, another order
        err = (two["grad"] - one["grad"]).abs().max().item()
        assert err <= 1e-5 * one["grad"].abs().max().item(), (name, err)


@pytest.mark.slow
def test_the_liger_kernel_floor_in_pyproject_passes_the_cases(tmp_path):
    """pyproject's floor (0.6.2: the first whose public module takes accum_dtype), fetched with
    pip and put first on the path (no dependencies: this environment's triton and torch);
    skipped where pip cannot fetch it."""
    import re
    import zipfile

    pyproject = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"liger-kernel>=([0-9.]+)', pyproject).group(1)
    got = run_script([sys.executable, "-m", "pip", "download", f"liger-kernel=={floor}",
                      "--no-deps", "-q", "-d", tmp_path], timeout=120)  # fmt: skip
    wheels = list(tmp_path.glob(f"liger_kernel-{floor}-*.whl"))
    if got.returncode != 0 or not wheels:
        pytest.skip(f"pip could not fetch liger-kernel {floor}: {got.stderr[-300:]}")
    zipfile.ZipFile(wheels[0]).extractall(tmp_path / "site")
    site, cases = str(tmp_path / "site"), str(ROOT / "tests" / "liger_cases.py")
    code = (
        f"import sys, runpy, liger_kernel; assert liger_kernel.__file__.startswith({site!r}); "
        f"sys.argv = ['x', 'cpu']; runpy.run_path({cases!r}, run_name='__main__')"
    )
    proc = run_script([sys.executable, "-c", code], timeout=300,
                      env={**INTERPRET, "PYTHONPATH": site})  # fmt: skip
    interpreted_ok(proc)
    for res in map(json.loads, proc.stdout.splitlines()):
        bad = liger_cases.check(res)
        assert bool(bad) == res["case"].endswith("-control"), (res["case"], bad)
