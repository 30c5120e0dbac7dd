"""Step 15: bf16 working weights, fp32 master weights for AdamW (`MasterWeights`).

In-process, on the step's own class: the model computes in bf16 while AdamW updates fp32
copies, so an update too small for bf16 still accumulates; where bf16 is off the step is step
12's run (the optimizer gets the model's own parameters). The whole step trains in both
numeric regimes in tests/test_ladder.py (fp32 in the fast suite; compiled bf16 in the slow one).
"""

import pytest
import torch
from conftest import load_step

STEP = "15_bf16_weights"
# step 05's scaler where it computes in bf16 or fp32: scale() and update() do nothing, step()
# is optimizer.step() (speed_ladder.measure.precision)
NO_SCALING = torch.amp.GradScaler("cpu", enabled=False)


@pytest.fixture(scope="module")
def step15():
    return load_step(STEP)


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def train(model, weights, opt, steps=3):
    torch.manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(5, 8, dtype=next(model.parameters()).dtype)
        model(x).float().square().mean().backward()
        weights.step(opt, NO_SCALING)


def test_bf16_model_fp32_masters(step15):
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    weights = step15.MasterWeights(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in weights.master)
    assert all(torch.equal(m, b) for m, b in zip(weights.master, before, strict=True))
    # the optimizer's parameters are the masters, not the model's
    opt = torch.optim.AdamW(weights.master, lr=1e-2)
    train(model, weights, opt)
    for m, w, b in zip(weights.master, model.parameters(), before, strict=True):
        assert not torch.equal(m, b)  # AdamW moved the masters
        assert torch.equal(w, m.to(torch.bfloat16))  # the working weights are them, rounded
        assert m.grad.dtype == torch.float32 and w.grad is None  # bf16 gradients freed
    state = opt.state[weights.master[0]]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32


def test_the_fp32_gradients_live_in_buffers_made_once(step15):
    """The update copies the bf16 gradients into fp32 buffers made once (a new fp32 copy per
    gradient and step costs a CPU its page faults: step 16 gained 6% on the cpu preset), and
    steps exactly as AdamW on fresh `.float()` copies of them would."""
    model, ref = tiny_model(), tiny_model()
    weights = step15.MasterWeights(model, torch.bfloat16)
    masters = [torch.nn.Parameter(p.detach().clone()) for p in ref.parameters()]  # fp32
    ref.to(torch.bfloat16)
    opt = torch.optim.AdamW(weights.master, lr=1e-2)
    opt_ref = torch.optim.AdamW(masters, lr=1e-2)
    buffers = [g.data_ptr() for g in weights.grads]
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.randn(5, 8, dtype=torch.bfloat16)
        for m, o, w in ((model, opt, None), (ref, opt_ref, masters)):
            o.zero_grad()
            m(x).float().square().mean().backward()
            if w is None:
                weights.step(o, NO_SCALING)
                continue
            for mw, p in zip(w, m.parameters(), strict=True):  # the copy the buffers replace
                mw.grad, p.grad = p.grad.float(), None
            o.step()
            with torch.no_grad():
                torch._foreach_copy_(list(m.parameters()), w)
        assert [m.grad.data_ptr() for m in weights.master] == buffers  # the same buffers
    assert all(torch.equal(a, b) for a, b in zip(weights.master, masters, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))


def test_updates_too_small_for_bf16_accumulate_in_the_master(step15):
    """A weight of 1.0 and updates of 2^-10: each would round away in bf16 (its step at 1.0 is
    2^-7), and 200 of them move the master by ~0.2 and the bf16 weight with it."""
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    weights = step15.MasterWeights(model, torch.bfloat16)
    opt = torch.optim.SGD(weights.master, lr=2**-10)
    for _ in range(200):
        opt.zero_grad()
        model(torch.ones(1, 1, dtype=torch.bfloat16)).float().sum().backward()  # grad 1.0
        weights.step(opt, NO_SCALING)
    assert weights.master[0].item() == pytest.approx(1 - 200 * 2**-10, abs=1e-6)
    assert model.weight.item() == pytest.approx(0.8047, abs=2**-7)  # bf16 of the master
    # the same updates on a bf16 weight itself are lost: 1.0 - 2^-10 rounds back to 1.0
    w = torch.ones(1, dtype=torch.bfloat16)
    for _ in range(200):
        w -= 2**-10
    assert w.item() == 1.0


def test_bf16_off_is_step_12(step15):
    """dtype None (bf16 off here, step 05): the model stays fp32, the optimizer gets its own
    parameters, and a step is optimizer.step() on them: the same floats as without the class."""
    a, b = tiny_model(), tiny_model()
    weights = step15.MasterWeights(a, None)
    assert weights.master is weights.working
    assert all(p.dtype == torch.float32 for p in a.parameters())
    opt_a = torch.optim.AdamW(weights.master, lr=1e-2)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)

    class Plain:
        def step(self, opt, scaler):
            opt.step()

    train(a, weights, opt_a)
    train(b, Plain(), opt_b)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_the_update_never_waits_for_the_device(step15, monkeypatch):
    """MasterWeights.step reads no number back (no `.item()`, `.tolist()` or synchronize): on a
    GPU it queues its copies and AdamW's kernels behind backward without draining the GPU
    (the whole step 15 is counted so in tests/test_clock.py, slow: emulated bf16)."""
    model = tiny_model()
    weights = step15.MasterWeights(model, torch.bfloat16)
    opt = torch.optim.AdamW(weights.master, lr=1e-2, fused=True)
    calls = []

    def counting(name, real):
        def wrapper(*a, **k):
            calls.append(name)
            return real(*a, **k)

        return wrapper

    x = torch.randn(5, 8, dtype=torch.bfloat16)
    model(x).float().square().mean().backward()
    monkeypatch.setattr(torch.Tensor, "item", counting("item", torch.Tensor.item))
    monkeypatch.setattr(torch.Tensor, "tolist", counting("tolist", torch.Tensor.tolist))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("sync", torch.cuda.synchronize))
    weights.step(opt, NO_SCALING)
    assert calls == []
    assert all(
        torch.equal(w, m.to(torch.bfloat16))
        for w, m in zip(model.parameters(), weights.master, strict=True)
    )


def test_in_fp16_the_weights_stay_fp32_and_step_05s_scaler_steps_them(step15):
    """fp16 (step 05 on a GPU without native bf16): no bf16 weights (dtype None), and the step
    is the scaler's: gradients unscaled, a step with an inf gradient skipped."""
    model = tiny_model()
    weights = step15.MasterWeights(model, None)
    opt = torch.optim.AdamW(weights.master, lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(5, 8)
    for poison, moves in ((False, True), (True, False)):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().square().mean() * (float("inf") if poison else 1.0)
        scaler.scale(loss).backward()
        before = [p.detach().clone() for p in model.parameters()]
        weights.step(opt, scaler)
        scaler.update()
        moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
        assert moved is moves
    assert scaler.get_scale() == 2.0**15
