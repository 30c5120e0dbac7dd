"""GPU conditions simulated on a CPU: fake device properties, names, memory sizes and counts.

What a GPU user meets first (the MFU denominator, the bf16 gate, more processes than GPUs, the
batch that fits, a bad DDP backend, Liger's failures) is decided in Python from what torch
reports; these tests monkeypatch what torch reports. tests/test_gpu.py runs the real thing.
"""

from types import SimpleNamespace

import pytest
import torch

from harness import device as dev
from harness.errors import UserError

GB = 10**9


def props(name, major=8, minor=0, sms=None, memory=80 * GB, arch=None):
    """What torch.cuda.get_device_properties() returns, as far as the harness reads it."""
    p = SimpleNamespace(name=name, major=major, minor=minor, total_memory=memory)
    if sms is not None:
        p.multi_processor_count = sms
    if arch is not None:
        p.gcnArchName = arch
    return p


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(props, count=1, rocm=False): torch.cuda reports that GPU, `count` times."""

    def install(p, count=1, rocm=False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: p)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: p.name)
        monkeypatch.setattr(torch.version, "hip", "6.2" if rocm else None)
        return torch.device("cuda", 0)

    return install


# ---------------------------------------------------------------- MFU's peak
@pytest.mark.parametrize(
    "p,tflops,words",
    [
        (props("NVIDIA H100 80GB HBM3", 9, 0, 132), 989.5, ["H100 SXM", "dense bf16"]),
        (props("NVIDIA A10G", 8, 6, 80), 70.0, ["A10G", "derived"]),
        (props("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 8, 0, 42), 312.0 * 42 / 108,
         ["MIG slice 3g.40gb of an A100 SXM", "42 of the 108 SMs"]),
        (props("Tesla T4", 7, 5, 40), 65.0, ["T4", "fp16 peak used"]),
        (props("AMD Instinct MI300X", 9, 4, 304, arch="gfx942:sramecc+:xnack-"), 1307.4,
         ["MI300X"]),
    ],
)  # fmt: skip
def test_mfu_peak_comes_from_the_gpu_table(p, tflops, words, fake_gpu):
    d = fake_gpu(p, rocm=p.name.startswith("AMD"))
    flops, desc = dev.peak_flops(d)
    assert flops == pytest.approx(tflops * 1e12)
    for w in words:
        assert w in desc, desc


def test_an_unknown_gpu_gets_no_mfu_and_says_how_to_add_it(fake_gpu):
    d = fake_gpu(props("NVIDIA GeForce GTX 1080", 6, 1, 20))
    flops, desc = dev.peak_flops(d)
    assert flops is None
    assert "MFU left empty" in desc and "add a row to GPU_PEAKS in harness/gpus.py" in desc


def test_a_mig_slice_without_its_sm_count_gets_no_whole_gpu_peak(fake_gpu):
    d = fake_gpu(props("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9, 0))
    flops, desc = dev.peak_flops(d)
    assert flops is None and "MIG slice" in desc


# ---------------------------------------------------------------- the bf16 gate
@pytest.mark.parametrize(
    "p,rocm,fast,words",
    [
        (props("NVIDIA A100-SXM4-80GB", 8, 0), False, True, ["8.0 >= 8.0"]),
        (props("NVIDIA GeForce RTX 4090", 8, 9), False, True, ["8.9"]),
        (props("Tesla V100-SXM2-16GB", 7, 0), False, False, ["7.0 < 8.0", "emulated"]),
        (props("Tesla T4", 7, 5), False, False, ["7.5 < 8.0", "is_bf16_supported"]),
        (props("AMD Instinct MI300X", 9, 4, arch="gfx942:sramecc+:xnack-"), True, True,
         ["gfx942"]),
        (props("AMD Radeon Pro VII", 9, 0, arch="gfx906"), True, False, ["gfx906"]),
    ],
)  # fmt: skip
def test_bf16_only_where_the_gpu_has_it_natively(p, rocm, fast, words, fake_gpu, monkeypatch):
    # torch says True on every one of them (V100/T4: emulated): it must not be what decides
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    ok, why = dev.bf16_is_fast(fake_gpu(p, rocm=rocm))
    assert ok is fast
    assert p.name in why
    for w in words:
        assert w in why, why


# ---------------------------------------------------------------- more processes than GPUs
def test_more_processes_than_gpus_is_one_clear_line_before_any_name_is_asked(fake_gpu, monkeypatch):
    fake_gpu(props("NVIDIA A10G", 8, 6, 80), count=2)

    def assert_first(d=None):
        raise AssertionError("get_device_name asserts on a missing device")

    monkeypatch.setattr(torch.cuda, "get_device_name", assert_first)
    monkeypatch.setattr(torch.cuda, "get_device_properties", assert_first)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(UserError, match=r"4 processes on this node but 2 GPUs visible.*at most 2"):
        dev.resolve("cuda")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dev.resolve("cuda") == torch.device("cuda", 1)
