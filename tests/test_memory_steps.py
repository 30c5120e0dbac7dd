"""Steps 12 and 13 on CPU: the chunked fallback of the fused loss, and checkpointing's memory."""

import json
import sys
import warnings

import pytest
import torch
from conftest import ROOT, RSS_FOLLOWS_TENSORS, fused_loss_fallback, run_script

from speed_ladder.measure.run import Run


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_fallback_matches_plain_cross_entropy(step12, dtype):
    torch.manual_seed(0)
    n, c, v = 300, 32, 1000
    weight = torch.randn(v, c, requires_grad=True)
    hidden = torch.randn(n, c, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    targets[[3, 64, 299]] = -100  # ignored rows, in the first chunk, at a chunk's start, last

    logits = (hidden.to(dtype) @ weight.to(dtype).T).float()  # as autocast: bf16 product
    ref = torch.nn.functional.cross_entropy(logits, targets)
    ref.backward()
    g_w, g_h = weight.grad.clone(), hidden.grad.clone()
    weight.grad = hidden.grad = None

    fused = fused_loss_fallback(step12, 64)
    fused.dtype = dtype
    loss = fused(weight, hidden, targets)  # 5 chunks: 4 of 64 rows, one of 44
    loss.backward()
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 2e-3}
    torch.testing.assert_close(loss, ref, **tol)
    torch.testing.assert_close(weight.grad, g_w, **tol)
    torch.testing.assert_close(hidden.grad, g_h, **tol)
    assert weight.grad[:, 0].ne(0).all() and hidden.grad[[3, 299]].eq(0).all()  # ignored: 0


def test_chunked_fallback_never_saves_the_full_logits_nor_recomputes_them(step12):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith(("mm", "addmm")):
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    n, c, v, chunk = 512, 16, 2000, 128
    weight = torch.randn(v, c, requires_grad=True)
    hidden = torch.randn(n, c, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel()) or t, lambda t: t
    ):
        loss = fused_loss_fallback(step12, chunk)(weight, hidden, targets)
    with Matmuls() as backward:
        loss.backward()
    assert max(saved) < n * v / 2  # plain CE would save (n, v) logits and their softmax
    assert backward.shapes == []  # the gradients came from forward: no logits recomputed


class _Run:
    """speed_ladder.Run's notes and step_active mark alone (its own methods): what step 12's loop
    line reports the fused loss to."""

    step = "12"
    note, inactive = Run.note, Run.inactive

    def __init__(self):
        self.notes, self.inactive_reason = [], None

    def print(self, *a, **k):
        pass


def report(run, fused):
    """Step 12's loop line, after each loss: Liger's kernel ran, or why the fallback did."""
    run.inactive("12", fused.fallback_reason, acted=fused.KERNEL)


def test_fused_loss_falls_back_once_with_a_note_on_cpu(step12):
    run = _Run()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = step12.FusedLinearCrossEntropy(torch.float32, torch.device("cpu"))
        w, h, t = torch.randn(50, 8), torch.randn(20, 8), torch.randint(0, 50, (20,))
        first, second = fused(w, h, t), fused(w, h, t)
    report(run, fused)
    report(run, fused)  # the loop asks after every step: noted once
    assert len([w for w in caught if "step 12" in str(w.message)]) == 1  # warned once
    assert fused.liger is None and "no CUDA device" in fused.fallback_reason
    assert len(run.notes) == 1 and "chunked PyTorch" in run.notes[0]
    assert "no CUDA device" in run.inactive_reason  # the record: step_active false, and why
    ref = torch.nn.functional.cross_entropy(h @ w.T, t)
    torch.testing.assert_close(first, ref)
    torch.testing.assert_close(second, ref)


@pytest.mark.slow  # two full-size steps of a 650 MB-activation config: 35 s on 2 cores
def test_checkpointing_lowers_measured_peak_memory():
    """tools/checkpoint_trade.py: an activation-heavy config (no big logits), peak RSS growth of
    one training step of step 12's model (no checkpointing) against step 13's."""
    growth = {}
    for step in ["12_liger_fused_ce", "13_gradient_checkpointing"]:
        proc = run_script([sys.executable, ROOT / "tools" / "checkpoint_trade.py", "--one",
                           ROOT / "steps" / f"{step}.py"], timeout=300,
                          env=RSS_FOLLOWS_TENSORS)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        growth[step] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_growth_bytes"]
    plain, ckpt = growth["12_liger_fused_ce"], growth["13_gradient_checkpointing"]
    # 8 blocks x ~(16*256*256*4 B) x ~20 saved tensors ~ 650 MB of activations without
    # checkpointing; with it, the 8 block inputs plus one block's recompute
    assert plain > 400e6, growth
    assert ckpt < 0.5 * plain, growth


def test_the_memory_model_sizes_liger_chunks_as_step_12_does(step12):
    from speed_ladder.measure import memory_model as mm

    assert mm.LIGER_CHUNK_MEM_CONST == step12.FusedLinearCrossEntropy.CHUNK_MEM_CONST
    for rows, dim, vocab in [(32768, 768, 50304), (16384, 1024, 50304), (1024, 384, 50304),
                             (20, 8, 50), (64, 32, 512)]:  # fmt: skip
        const = mm.LIGER_CHUNK_MEM_CONST
        assert mm.liger_chunk_rows(rows, dim, vocab) == step12.liger_chunk_rows(
            rows, dim, vocab, const
        )
