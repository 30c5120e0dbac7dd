"""What steps 09, 11 and 12 do on a GPU, shown on a CPU by simulating the GPU's side.

Step 12: Liger's kernel runs on CUDA (a stand-in for it here, in torch), chunk by chunk, the
weight gradient summed in fp32; the chunks at gpt2-124m's shape; it falls back to the chunked loss
only where it cannot run; a CUDA out-of-memory or a Triton error inside it is the run's result.
Step 11: a bad DDP_BACKEND is one line. Step 09: generation never picks a padded id.
"""

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


class FakeKernel:
    """Liger's liger_cross_entropy_kernel as step 12 launches it, `kernel[grid](**kwargs)`, in
    torch: each row's loss, and in place its gradient over the logits (reduction "sum"), or
    `launch(kwargs)` where given (one that raises). Every launch's grid and kwargs in `calls`."""

    def __init__(self, launch=None):
        self.calls, self.launch = [], launch or self.cross_entropy

    def __getitem__(self, grid):
        def launch(**kwargs):
            self.calls.append((grid, kwargs))
            return self.launch(kwargs)

        return launch

    @staticmethod
    def cross_entropy(k):
        x, y, loss = k["X_ptr"], k["Y_ptr"], k["loss_ptr"]
        assert k["reduction"] == "sum" and k["HAS_GRADIENTS"] and x.shape[0] == y.shape[0]
        keep, y0 = y != k["ignore_index"], y.clamp(min=0)
        xf = x.float()
        loss.copy_(torch.where(keep, xf.logsumexp(-1) - xf.gather(1, y0[:, None])[:, 0], 0.0))
        grad = xf.softmax(-1)
        grad[torch.arange(len(y)), y0] -= 1
        x.copy_(grad * keep[:, None])


def fake_liger(monkeypatch, launch=None):
    """liger_kernel.ops.fused_linear_cross_entropy with a FakeKernel(launch); returns it."""
    kernel = FakeKernel(launch)
    mod = types.ModuleType(LIGER_OPS)
    mod.liger_cross_entropy_kernel, mod.MAX_FUSED_SIZE = kernel, 65536 // 2
    monkeypatch.setitem(sys.modules, LIGER_OPS, mod)
    return kernel


def plain_ce(hidden, weight, targets):
    return torch.nn.functional.cross_entropy(hidden @ weight.T, targets)


def data():
    torch.manual_seed(0)
    return torch.randn(50, 8), torch.randn(20, 8), torch.randint(0, 50, (20,))


CUDA = torch.device("cuda", 0)  # only a name here: nothing is allocated on it


def test_liger_runs_on_cuda_chunk_by_chunk_with_fp32_accumulation(step12, monkeypatch):
    kernel = fake_liger(monkeypatch)
    sums = []  # the weight gradient's in-place sums, one per chunk
    add = step12.add_weight_grad
    counted = lambda gw, *a: (sums.append(gw.dtype), add(gw, *a))
    monkeypatch.setattr(step12, "add_weight_grad", counted)
    run = _Run()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        fused = step12.FusedLinearCrossEntropy(torch.bfloat16, CUDA)
        fused.chunk_mem_const = 1  # Liger's default: 20 rows of C 8, V 50 in 5 chunks of 4
        w, h, t = data()
        t[[2, 11]] = -100  # ignored: the mean is over the 18 others, as F.cross_entropy's
        w, h = w.requires_grad_(True), h.requires_grad_(True)
        loss = fused(w, h, t)
        loss.backward()
    report(run, fused)
    assert [grid for grid, _ in kernel.calls] == [(4,)] * 5 and sums == [torch.float32] * 5
    for _, k in kernel.calls:
        assert k["X_ptr"].dtype == torch.bfloat16 and k["X_ptr"].shape == (4, 50)
        assert k["reduction"] == "sum" and k["ignore_index"] == -100
    hq, wq = (h.detach().to(torch.bfloat16).float().requires_grad_(True),
              w.detach().to(torch.bfloat16).float().requires_grad_(True))  # fmt: skip
    ref = torch.nn.functional.cross_entropy(hq @ wq.T, t)
    ref.backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 1e-2
    assert w.grad.dtype == torch.float32  # the fp32 sum, never rounded to bf16
    torch.testing.assert_close(w.grad, wq.grad, atol=2**-7 * wq.grad.abs().max(), rtol=0)
    torch.testing.assert_close(h.grad, hq.grad, atol=2**-7 * hq.grad.abs().max(), rtol=0)
    assert (h.grad[[2, 11]] == 0).all()
    assert fused.fallback_reason is None and run.inactive_reason is None  # step_active: true
    assert any("Liger fused linear cross-entropy kernel ran" in n for n in run.notes)


def test_step12_cuts_gpt2_124m_into_8_chunks_of_4096_rows_not_liger_defaults_64(step12):
    """batch 32 x 1024 rows of 768, the padded vocabulary: Liger's default chunk_mem_const 1 gave
    64 chunks of 512 (an H200 profile of step 12 showed them); the step's 8 gives 8 chunks of
    4096, whose bf16 logits are 0.4 GB."""
    rows, dim, vocab = 32 * 1024, 768, 50304
    const = step12.FusedLinearCrossEntropy.CHUNK_MEM_CONST
    assert step12.FusedLinearCrossEntropy(torch.float32, CUDA).chunk_mem_const == const == 8
    assert step12.liger_chunk_rows(rows, dim, vocab, const) == 4096  # 8 chunks
    assert step12.liger_chunk_rows(rows, dim, vocab, 1) == 512  # 64 chunks
    assert 4096 * vocab * 2 / 1e9 < 0.42
    assert step12.liger_chunk_rows(20, 8, 50, 8) == 20  # never more rows than there are


def _raise(e):
    def launch(kwargs):
        raise e

    return launch


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
    torch.testing.assert_close(fused(w, h, t), plain_ce(h, w, t))
    assert "no CUDA device" in fused.fallback_reason


def test_the_installed_liger_kernel_takes_the_arguments_the_step_passes(step12, monkeypatch):
    """The step launches Liger's kernel itself, by keyword: every argument the installed
    kernel has, none it lacks (pyproject's floor, liger-kernel 0.8.5, has these)."""
    ops = pytest.importorskip(LIGER_OPS, exc_type=ImportError)
    names = ops.liger_cross_entropy_kernel.arg_names
    kernel = fake_liger(monkeypatch)
    step12.FusedLinearCrossEntropy(torch.float32, CUDA)(*data())
    passed = set(kernel.calls[0][1]) - {"num_warps"}  # a launch option, not an argument
    assert passed == set(names), passed ^ set(names)
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
