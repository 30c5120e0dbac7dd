"""What steps 09, 11 and 12 do on a GPU, shown on a CPU by simulating the GPU's side.

Step 12: on CUDA the step's loss is Liger's public module (a stand-in for it here, in torch),
built with fp32 accumulation; it falls back to step 11's loss only where Liger cannot run; a CUDA
out-of-memory or a Triton error inside it is the run's result; no step reaches into Liger's
internals. Step 11: a bad DDP_BACKEND is one line. Step 09: generation never picks a padded id.
"""

import sys
import types

import pytest
import torch
from conftest import ROOT, load_step
from test_memory_steps import _Run, report

import speed_ladder
from speed_ladder import errors
from speed_ladder.fused_loss import fused_linear_cross_entropy

LIGER = "liger_kernel.transformers"


def fake_liger(monkeypatch, forward=None):
    """liger_kernel.transformers with a LigerFusedLinearCrossEntropyLoss in torch (or one whose
    forward is `forward`, one that raises); returns the list of the modules built, each with the
    keywords it was built with (`made`) and its calls (`calls`)."""
    built = []

    class LigerFusedLinearCrossEntropyLoss(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            self.made, self.calls = kwargs, []
            built.append(self)

        def forward(self, lin_weight, _input, target):
            self.calls.append((lin_weight.shape, _input.shape, target.shape))
            if forward is not None:
                return forward()
            return torch.nn.functional.cross_entropy(_input @ lin_weight.T, target)

    mod = types.ModuleType(LIGER)
    mod.LigerFusedLinearCrossEntropyLoss = LigerFusedLinearCrossEntropyLoss
    monkeypatch.setitem(sys.modules, LIGER, mod)
    return built


def data():
    torch.manual_seed(0)
    return torch.randn(50, 8), torch.randn(20, 8), torch.randint(0, 50, (20,))


CUDA = torch.device("cuda", 0)  # only a name here: nothing is allocated on it


def test_on_cuda_step_12_runs_liger_public_module_with_fp32_accumulation(monkeypatch):
    built = fake_liger(monkeypatch)
    fused = fused_linear_cross_entropy(CUDA)
    ((liger,),) = [built]
    assert fused is liger and fused.fallback_reason is None
    assert liger.made == {"accum_dtype": torch.float32}  # the weight gradient summed in fp32
    w, h, t = data()
    torch.testing.assert_close(fused(w, h, t), torch.nn.functional.cross_entropy(h @ w.T, t))
    assert liger.calls == [((50, 8), (20, 8), (20,))]  # weight, hidden, targets
    run = _Run()
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    report(run, fused, device=torch.device("cpu"))  # the record: Liger ran, step 12 active
    assert run.inactive_reason is None
    assert "step 12: Liger fused linear cross-entropy kernel ran (fp32 accumulation)" in run.notes


def _fails_inside_liger(monkeypatch, error):
    """Liger raises `error` in a step run under the flags' main wrapper: (exit code, the failure
    records it wrote as [(status, reason)], the step's loss)."""

    def raise_():
        raise error

    fake_liger(monkeypatch, raise_)
    fused = fused_linear_cross_entropy(CUDA)
    recorded = []
    monkeypatch.setattr(errors.on_failure, "_write", lambda s, r: recorded.append((s, r)))
    with pytest.raises(SystemExit) as e:
        errors.main(lambda: fused(*data()))
    return e.value.code, recorded, fused


def test_a_cuda_oom_inside_liger_is_recorded_oom_not_a_fallback(monkeypatch):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0)")
    code, recorded, fused = _fails_inside_liger(monkeypatch, oom)
    assert code == 3
    assert recorded == [("oom", "CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0)")]
    assert fused.fallback_reason is None  # no silent fallback


def test_a_triton_error_inside_liger_is_recorded_error_with_its_reason(monkeypatch):
    CompilationError = type("CompilationError", (Exception,), {"__module__": "triton.compiler"})
    error = CompilationError("at 12:4: out of resources: shared memory")
    code, recorded, _ = _fails_inside_liger(monkeypatch, error)
    assert code == 1
    ((status, reason),) = recorded
    assert status == "error" and "CompilationError" in reason and "shared memory" in reason


def test_liger_not_installed_falls_back_to_step_11s_loss_and_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, LIGER, None)  # import raises ModuleNotFoundError
    fused = fused_linear_cross_entropy(CUDA)
    assert "liger-kernel unavailable: ModuleNotFoundError" in fused.fallback_reason
    assert "linear + cross-entropy ran" in fused.fallback_reason


def test_without_cuda_liger_is_never_built(monkeypatch):
    built = fake_liger(monkeypatch)
    fused = fused_linear_cross_entropy(torch.device("cpu"))
    w, h, t = data()
    with torch.compiler.set_stance("force_eager"):
        torch.testing.assert_close(fused(w, h, t), torch.nn.functional.cross_entropy(h @ w.T, t))
    assert built == [] and "no CUDA device" in fused.fallback_reason


def test_the_installed_liger_kernel_has_the_public_module_the_step_uses():
    """liger-kernel's public LigerFusedLinearCrossEntropyLoss takes accum_dtype and (weight,
    hidden, targets); no step file reaches into liger_kernel.ops (a private signature)."""
    import inspect

    liger = pytest.importorskip(LIGER, exc_type=ImportError)
    cls = liger.LigerFusedLinearCrossEntropyLoss
    assert "accum_dtype" in inspect.signature(cls).parameters
    forward = list(inspect.signature(cls.forward).parameters)
    assert forward[1:4] == ["lin_weight", "_input", "target"]
    for f in [ROOT / "00_orig.py", *sorted((ROOT / "steps").glob("[0-9][0-9]_*.py"))]:
        assert "liger_kernel" not in f.read_text(), f.name  # through speed_ladder.fused_loss


# ---------------------------------------------------------------- step 11
@pytest.mark.parametrize(
    "backend,words", [("ncl", "not a torch.distributed backend; use one of gloo, nccl"),
                      ("mpi", "built without it")],
)  # fmt: skip
def test_a_bad_ddp_backend_is_one_clear_line(backend, words, monkeypatch):
    step11 = load_step("11_ddp")
    monkeypatch.setenv("DDP_BACKEND", backend)
    if backend == "mpi" and torch.distributed.is_mpi_available():
        pytest.skip("this torch has MPI")
    with pytest.raises(speed_ladder.UserError, match=words):
        step11.ddp_setup(torch.device("cpu"))
    assert not torch.distributed.is_initialized()


# ---------------------------------------------------------------- step 09
def test_generation_never_picks_a_padded_vocabulary_id():
    step09 = load_step("09_vocab_padding")

    def model(idx):  # a trained model that (wrongly) likes padded id 50300 best
        logits = torch.zeros(idx.shape[0], idx.shape[1], 50304)
        logits[..., 50300] = 10.0
        logits[..., 42] = 1.0
        return logits

    out = step09.generate_text_simple(model, torch.tensor([[1, 2]]), 3, context_size=8)
    assert out[0, 2:].tolist() == [42, 42, 42]
