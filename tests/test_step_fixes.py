"""What steps 09, 11 and 12 do on a GPU, shown on a CPU by simulating the GPU's side.

Step 12: Liger runs (with fp32 accumulation) on CUDA; it falls back to the chunked loss only
where it cannot run; a CUDA out-of-memory or a Triton error inside it is the run's result.
Step 11: a bad DDP_BACKEND is one line. Step 09: generation never picks a padded id.
"""

import inspect
import sys
import types
import warnings

import pytest
import torch
from conftest import load_step
from test_memory_steps import _Run, report

import speed_ladder
from speed_ladder import errors

LIGER_OPS = "liger_kernel.ops.fused_linear_cross_entropy"


def fake_liger(monkeypatch, apply):
    """liger_kernel.ops.fused_linear_cross_entropy with a Function whose apply is `apply`."""
    calls = []

    class Function:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return apply(*args)

    mod = types.ModuleType(LIGER_OPS)
    mod.LigerFusedLinearCrossEntropyFunction = Function
    monkeypatch.setitem(sys.modules, LIGER_OPS, mod)
    return calls


def plain_ce(hidden, weight, targets, *rest):
    return torch.nn.functional.cross_entropy(hidden @ weight.T, targets), None


def data():
    torch.manual_seed(0)
    return torch.randn(50, 8), torch.randn(20, 8), torch.randint(0, 50, (20,))


CUDA = torch.device("cuda", 0)  # only a name here: nothing is allocated on it


def test_liger_runs_on_cuda_with_fp32_accumulation(step12, monkeypatch):
    calls = fake_liger(monkeypatch, plain_ce)
    run = _Run()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        fused = step12.FusedLinearCrossEntropy(torch.bfloat16, CUDA)
        w, h, t = data()
        loss = fused(w, h, t)
    report(run, fused)
    (args,) = calls
    assert args[0].dtype == args[1].dtype == torch.bfloat16  # hidden and weight as autocast
    assert args[8] == "mean" and args[11] is torch.float32  # accum_dtype: fp32 gradient sums
    assert loss.dtype == torch.bfloat16
    assert fused.fallback_reason is None and run.inactive_reason is None  # step_active: true
    assert any("Liger fused linear cross-entropy kernel ran" in n for n in run.notes)


def _raise(e):
    def apply(*args):
        raise e

    return apply


def _fails_inside_liger(step12, monkeypatch, error):
    """Liger's kernel raises `error` in a step run under the flags' main wrapper: (exit code,
    the failure records it wrote as [(status, reason)], the step's fused loss)."""
    fake_liger(monkeypatch, _raise(error))
    fused = step12.FusedLinearCrossEntropy(torch.float32, CUDA)
    recorded = []
    monkeypatch.setattr(errors.on_failure, "_write", lambda s, r: recorded.append((s, r)))
    with pytest.raises(SystemExit) as e:
        errors.main(lambda: fused(*data()))
    return e.value.code, recorded, fused


def test_a_cuda_oom_inside_liger_is_recorded_oom_not_a_fallback(step12, monkeypatch, capsys):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0)")
    code, recorded, fused = _fails_inside_liger(step12, monkeypatch, oom)
    assert code == 3
    assert recorded == [("oom", "CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0)")]
    assert fused.fallback_reason is None and fused.liger is not None  # no silent fallback


def test_a_triton_error_inside_liger_is_recorded_error_with_its_reason(step12, monkeypatch):
    CompilationError = type("CompilationError", (Exception,), {"__module__": "triton.compiler"})
    error = CompilationError("at 12:4: out of resources: shared memory")
    code, recorded, _ = _fails_inside_liger(step12, monkeypatch, error)
    assert code == 1
    ((status, reason),) = recorded
    assert status == "error" and "CompilationError" in reason and "shared memory" in reason


def test_liger_not_installed_falls_back_and_says_so(step12, monkeypatch):
    monkeypatch.setitem(sys.modules, LIGER_OPS, None)  # import raises ModuleNotFoundError
    with pytest.warns(UserWarning, match="step 12"):
        fused = step12.FusedLinearCrossEntropy(torch.float32, CUDA)
    assert fused.liger is None
    assert "liger-kernel unavailable" in fused.fallback_reason


def test_without_cuda_liger_is_never_called(step12, monkeypatch):
    fake_liger(monkeypatch, _raise(AssertionError("Liger called on a CPU")))
    with pytest.warns(UserWarning, match="step 12"):
        fused = step12.FusedLinearCrossEntropy(torch.float32, torch.device("cpu"))
    w, h, t = data()
    torch.testing.assert_close(fused(w, h, t), plain_ce(h, w, t)[0])
    assert "no CUDA device" in fused.fallback_reason


def test_the_installed_liger_takes_accum_dtype_where_the_step_passes_it():
    ops = pytest.importorskip(LIGER_OPS, exc_type=ImportError)
    params = list(inspect.signature(ops.LigerFusedLinearCrossEntropyFunction.forward).parameters)
    # apply(hidden, weight, targets, bias, ce_weight, ignore_index, lse_square_scale,
    #       label_smoothing, reduction, softcap, return_z_loss, accum_dtype): ctx is params[0]
    assert params[1:13] == ["_input", "weight", "target", "bias", "ce_weight", "ignore_index",
                            "lse_square_scale", "label_smoothing", "reduction", "softcap",
                            "return_z_loss", "accum_dtype"]  # fmt: skip
    assert "transformers" not in sys.modules  # the ops path does not import it


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
