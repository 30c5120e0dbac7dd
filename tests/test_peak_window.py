"""The recorded peak memory is the training steps', never evaluation's or sampling's.

In-process: a `Run` on CPU whose paused block (an evaluation, or the final evaluation after the
loop) allocates far more than a training step; and the same window on a simulated CUDA and MPS
allocator (monkeypatched counters), where the real ones cannot run.
"""

import argparse

import pytest
import torch
from conftest import VERDICT

from speed_ladder.measure import device as dev
from speed_ladder.measure import matmul_peak
from speed_ladder.measure.run import Run
from speed_ladder.presets import PRESETS

GIB = 2**30


def _args(**kw):
    base = dict(device="cpu", preset="tiny", epochs=None, max_steps=None, warmup_steps=1,
                batch_size=None, data=str(VERDICT), results=None, seed=123)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def _touch(nbytes):
    """A tensor whose pages are really resident (ones, not an untouched empty)."""
    return torch.ones(nbytes // 4, dtype=torch.float32)


def _train(monkeypatch, where):
    """A tiny run of 4 steps; `where` says when 1.5 GiB is allocated: during an evaluation in
    the window, in the final evaluation, or (the control) inside a training step."""
    monkeypatch.setattr(matmul_peak, "peak_flops", lambda d: (1e12, "fake peak"))
    run = Run(_args(), "00", __file__)
    cfg = {**PRESETS["tiny"], "vocab_size": 50257}
    model = torch.nn.Linear(8, 8)
    run.set_model(model, cfg, 4)
    for i in range(4):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        if where == "step" and i == 2:
            big = _touch(3 * GIB // 2)
            del big
        run.step_done(loss, tokens=4 * 32)
        if where == "eval" and i == 2:
            with run.paused():
                big = _touch(3 * GIB // 2)
                del big
    if where == "final":
        with run.paused():
            big = _touch(3 * GIB // 2)
            del big
    return run.finish(1.0, 1.0)


@pytest.mark.skipif(dev._vm_hwm() is None, reason="needs Linux's VmHWM")
@pytest.mark.parametrize("where", ["eval", "final"])
def test_an_evaluation_larger_than_a_step_leaves_the_recorded_peak_unchanged(where, monkeypatch):
    if dev.reset_peak_memory(torch.device("cpu")) is not None:
        pytest.skip("/proc/self/clear_refs is not writable here")
    before = dev._vm_hwm()
    rec = _train(monkeypatch, where)
    assert rec["peak_mem_reserved_bytes"] < before + GIB // 2, (before, rec)


@pytest.mark.skipif(dev._vm_hwm() is None, reason="needs Linux's VmHWM")
def test_the_same_allocation_inside_a_step_is_counted(monkeypatch):
    """The control: the measurement does see 1.5 GiB when a training step holds it."""
    if dev.reset_peak_memory(torch.device("cpu")) is not None:
        pytest.skip("/proc/self/clear_refs is not writable here")
    before = dev._vm_hwm()
    rec = _train(monkeypatch, "step")
    assert rec["peak_mem_reserved_bytes"] > 1.4 * GIB, (before, rec)


class FakeAllocator:
    """A caching allocator's counters: in use, cached (reserved) and their peaks."""

    def __init__(self):
        self.used = self.reserved = 100
        self.peak_used = self.peak_reserved = 100
        self.calls = []

    def alloc(self, n):
        self.used += n
        self.reserved = max(self.reserved, self.used)
        self.peak_used = max(self.peak_used, self.used)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n):
        self.used -= n  # stays cached (reserved) until empty_cache

    def empty_cache(self):
        self.calls.append("empty_cache")
        self.reserved = self.used

    def reset(self, *a):
        self.calls.append("reset")
        self.peak_used, self.peak_reserved = self.used, self.reserved


def _window_on(device_type, monkeypatch):
    fake = FakeAllocator()
    if device_type == "cuda":
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: fake.peak_reserved)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: fake.peak_used)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset)
        monkeypatch.setattr(torch.cuda, "empty_cache", fake.empty_cache)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: fake.reserved)
    else:  # MPS: no peak counter, only what the driver holds now
        monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: fake.reserved)
        monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: fake.used)
        monkeypatch.setattr(torch.mps, "empty_cache", fake.empty_cache)
    return fake, dev.PeakWindow(torch.device(device_type))


@pytest.mark.parametrize("device_type", ["cuda", "mps"])
def test_simulated_gpu_peak_excludes_evaluation_and_its_cache(device_type, monkeypatch):
    fake, window = _window_on(device_type, monkeypatch)
    assert window.start() is None

    def step():
        fake.alloc(50)  # activations
        fake.free(50)
        window.step_end()

    step()
    window.pause()
    fake.alloc(1000)  # evaluation's full logits: 20x a training step
    fake.free(1000)
    window.resume()
    step()
    window.pause()  # the final evaluation
    fake.alloc(1000)
    fake.free(1000)
    window.resume()
    reserved, allocated = window.peak()
    assert reserved == 150, reserved  # the step's 50 on top of the 100 held, never the 1000
    # MPS samples at step ends, when the step's tensors are freed (the driver keeps them cached)
    assert allocated == (150 if device_type == "cuda" else 100), allocated
    assert "empty_cache" in fake.calls  # evaluation's cached blocks are not left reserved


def test_a_pause_before_the_window_opens_changes_nothing(monkeypatch):
    fake, window = _window_on("cuda", monkeypatch)
    window.pause()
    window.resume()
    assert fake.calls == []  # warm-up: nothing to fold, nothing to reset yet


def test_an_evaluation_within_trainings_pool_leaves_the_cuda_allocator_warm(monkeypatch):
    """Training's cached blocks hold the evaluation: nothing to hand back, no empty_cache (the
    next step would allocate them again), and the peak is still the training steps'."""
    fake, window = _window_on("cuda", monkeypatch)
    window.start()
    fake.alloc(500)  # a step's activations, freed but cached: the pool is 600
    fake.free(500)
    window.pause()
    fake.alloc(300)  # an evaluation smaller than the pool
    fake.free(300)
    window.resume()
    assert "empty_cache" not in fake.calls and fake.reserved == 600
    fake.alloc(500)
    fake.free(500)
    assert window.peak() == (600, 600)
