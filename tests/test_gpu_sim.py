"""GPU conditions simulated on a CPU: fake device properties, names, memory sizes and counts.

What a GPU user meets first (the MFU denominator, the bf16 gate, more processes than GPUs, the
batch that fits, a bad DDP backend, Liger's failures) is decided in Python from what torch
reports; these tests monkeypatch what torch reports. tests/test_gpu.py runs the real thing.
"""

from types import SimpleNamespace

import pytest
import torch
from conftest import rung_reasons

from speed_ladder import autocast_env
from speed_ladder.errors import UserError
from speed_ladder.measure import device as dev
from speed_ladder.measure import gpu_specs, inactive, matmul_peak, precision, sdpa_dispatch

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
    flops, desc = matmul_peak.peak_flops(d)
    assert flops == pytest.approx(tflops * 1e12)
    for w in words:
        assert w in desc, desc


def test_an_unknown_gpu_gets_no_mfu_and_says_how_to_add_it(fake_gpu):
    d = fake_gpu(props("NVIDIA GeForce GTX 1080", 6, 1, 20))
    flops, desc = matmul_peak.peak_flops(d)
    assert flops is None
    assert "MFU left empty" in desc and "add a row to speed_ladder/data/gpu_peaks.csv" in desc


def test_a_mig_slice_without_its_sm_count_gets_no_whole_gpu_peak(fake_gpu):
    d = fake_gpu(props("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9, 0))
    flops, desc = matmul_peak.peak_flops(d)
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
    monkeypatch.setenv(autocast_env.BF16_ENV, "auto")  # the rule itself, whatever the suite forces
    ok, why = matmul_peak.bf16_is_fast(fake_gpu(p, rocm=rocm))
    assert ok is fast
    monkeypatch.setenv(
        autocast_env.BF16_ENV, "0"
    )  # SPEED_LADDER_BF16 forces it either way, and says so
    assert matmul_peak.bf16_is_fast(fake_gpu(p, rocm=rocm)) == (
        False,
        "forced off by SPEED_LADDER_BF16",
    )
    monkeypatch.setenv(autocast_env.BF16_ENV, "on")
    assert matmul_peak.bf16_is_fast(fake_gpu(p, rocm=rocm))[0] is True
    monkeypatch.setenv(autocast_env.BF16_ENV, "maybe")
    with pytest.raises(UserError, match="SPEED_LADDER_BF16='maybe'"):
        matmul_peak.bf16_is_fast(fake_gpu(p, rocm=rocm))
    assert p.name in why
    for w in words:
        assert w in why, why


def test_bf16_is_decided_once_and_the_record_reads_that_decision(fake_gpu, monkeypatch):

    monkeypatch.setattr(matmul_peak, "_BF16", {})
    monkeypatch.setattr(precision, "_DECIDED", {})
    monkeypatch.setenv(autocast_env.BF16_ENV, "auto")
    assert precision.decided("cuda") is None  # nothing asked yet
    gpu = fake_gpu(props("NVIDIA A100-SXM4-80GB", 8, 0))
    asked, rule = [], matmul_peak._bf16_rule
    monkeypatch.setattr(
        matmul_peak, "_bf16_rule", lambda d, forced: asked.append(forced) or rule(d, forced)
    )
    assert precision.mixed_precision(gpu).dtype == torch.bfloat16
    assert matmul_peak.bf16_is_fast(gpu)[0] is True and asked == [None]  # measured once
    assert precision.decided("cuda") == "bf16" and precision.regime(gpu).startswith("bf16")
    monkeypatch.setenv(autocast_env.BF16_ENV, "0")  # what it depends on changed: decided again
    assert precision.decided("cuda") is None  # the decision was under other variables
    assert precision.mixed_precision(gpu).kind == "fp32" and asked == [None, False]
    assert precision.decided("cuda") == "fp32" and precision.decided("cpu") is None
    # TF32 where step 02 asked for it, "-compiled" where an earlier test of this worker compiled
    assert precision.regime(gpu).removesuffix("-compiled") in ("fp32", "tf32")


# ---------------------------------------------------------------- step 05's autocast
@pytest.mark.parametrize(
    "p,rocm,kind,words",
    [
        (props("Tesla T4", 7, 5), False, "fp16", ["7.5 < 8.0", "7.5 has fp16 tensor cores"]),
        (props("Tesla V100-SXM2-16GB", 7, 0), False, "fp16", ["7.0 has fp16 tensor cores"]),
        (props("NVIDIA A100-SXM4-80GB", 8, 0), False, "bf16", ["8.0 >= 8.0"]),
        (props("NVIDIA H100 80GB HBM3", 9, 0), False, "bf16", ["9.0 >= 8.0"]),
        (props("Tesla P100-PCIE-16GB", 6, 0), False, "fp32", ["6.0 < 7.0 has no fp16 tensor"]),
        (props("NVIDIA GeForce GTX 1080", 6, 1), False, "fp32", ["6.1 < 7.0"]),
        (props("AMD Radeon Pro VII", 9, 0, arch="gfx906"), True, "fp32", ["no fp16 rule"]),
    ],
)  # fmt: skip
def test_step_05_computes_in_bf16_where_native_else_in_fp16_with_a_loss_scaler(
    p, rocm, kind, words, fake_gpu, monkeypatch
):
    """T4 and V100 (no bf16 tensor cores, fp16 ones): fp16 autocast (the step's GradScaler on);
    A100 and H100: bf16 (its scaler off); older GPUs: fp32. torch says bf16 is
    supported on all of them (emulated below 8.0): it must not decide."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setenv(autocast_env.BF16_ENV, "auto")
    monkeypatch.delenv(autocast_env.AMP_ENV, raising=False)
    gpu = fake_gpu(p, rocm=rocm)
    amp = precision.mixed_precision(gpu)
    assert (amp.kind, amp.dtype, amp.enabled) == (kind, precision.DTYPES[kind], kind != "fp32")
    for w in words:
        assert w in amp.why, amp.why
    assert precision.decided("cuda") == kind  # the record's regime
    assert gpu_specs.autocast_for(p, rocm) == kind  # what the sweep's RunSpec resolves (gpu_memory)
    monkeypatch.setenv(
        autocast_env.AMP_ENV, "fp16"
    )  # SPEED_LADDER_AMP forces any of them, and says so
    assert precision.mixed_precision(gpu).kind == "fp16"
    monkeypatch.setenv(autocast_env.AMP_ENV, "fp32")
    assert precision.choice(gpu) == ("fp32", "forced by SPEED_LADDER_AMP=fp32")
    monkeypatch.setenv(autocast_env.AMP_ENV, "bf16")
    assert precision.choice(gpu)[0] == "bf16" and matmul_peak.bf16_is_fast(gpu)[0] is True
    monkeypatch.setenv(autocast_env.AMP_ENV, "half")
    with pytest.raises(UserError, match="SPEED_LADDER_AMP='half': use bf16, fp16, fp32 or auto"):
        precision.choice(gpu)
    monkeypatch.delenv(autocast_env.AMP_ENV)
    monkeypatch.setenv(autocast_env.BF16_ENV, "0")  # the tests' fp32 regime: no fp16 either
    assert precision.choice(gpu) == ("fp32", "forced off by SPEED_LADDER_BF16")


def test_a_t4_runs_the_later_rungs_in_fp16_or_says_why_not(fake_gpu, monkeypatch):
    """On a GPU without native bf16, the fp16 choice holds in every later rung: the record's
    regime says fp16; step 05 is active; step 15 (bf16 weights) and step 12 (Liger, whose
    gradients are computed before GradScaler's scale) say why they do nothing; activations are
    2 bytes in the memory model; the attention checks probe fp16."""
    from speed_ladder.measure import memory_model

    monkeypatch.setenv(autocast_env.BF16_ENV, "auto")
    monkeypatch.delenv(autocast_env.AMP_ENV, raising=False)
    gpu = fake_gpu(props("Tesla T4", 7, 5, 40))
    precision.mixed_precision(gpu)
    assert precision.regime(gpu) == "fp16"  # no TF32 either: compute capability 7.5
    assert inactive.autocast_off(gpu) is None
    assert inactive.bf16_off(gpu).startswith("step 05 runs fp16 on this cuda: Tesla T4")
    liger = inactive.liger_unavailable(gpu, precision.mixed_precision(gpu).dtype)
    assert liger.endswith(f"({inactive.LIGER_FP16})")
    assert memory_model.act_bytes_of("05", None, "cuda") == 2
    seen = []

    def probe(device, cfg, dtype):  # what the checks ask torch about, in autocast's dtype
        seen.append(dtype)
        raise RuntimeError("no tensors on a simulated GPU")  # the check then says nothing

    monkeypatch.setattr(sdpa_dispatch, "attention_probe", probe)
    from speed_ladder.presets import PRESETS

    asked = rung_reasons("07", gpu, PRESETS["tiny"], kernel="math")
    (fact,) = [a for a in asked if a[0] == "07"]
    assert fact[1].startswith("math path ran") and seen == [torch.float16], (fact, seen)


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


# ---------------------------------------------------------------- the batch that fits
# total_memory as torch reports it on these cards (bytes)
RTX_4090, L4, T4, V100_16 = 25_386_352_640, 23_580_639_232, 15_828_320_256, 16_945_512_448
A100_40, A100_80 = 42_505_273_344, 85_051_572_224


@pytest.mark.parametrize(
    "memory,amp,batches",
    [
        (RTX_4090, "bf16", (4, 16)),  # 24 GB: step 00 (fp32, batch 8) would need ~26 GB
        (L4, "bf16", (4, 16)),
        (V100_16, "fp16", (2, 8)),  # 16 GB, no bf16: fp16 from step 05
        (V100_16, "fp32", (2, 8)),  # fp32 throughout (SPEED_LADDER_AMP=fp32)
        # 14.7 GiB: batch 2 (8) needs 12.1 at step 10 in fp16 (14.4 in fp32: 3 fp32 logit
        # tensors); 15.1 in fp32 while steps 11-13 kept DDP's gradient buckets in a world of one
        # (before step 11 wrapped only N > 1)
        (T4, "fp16", (2, 8)),
        (A100_40, "bf16", None),  # the preset fits: no rule
        (A100_80, "bf16", None),
    ],
)
def test_the_batch_rule_picks_a_batch_that_fits_and_keeps_step_10s_4x(memory, amp, batches):
    from speed_ladder.measure.settings import fit_batch
    from speed_ladder.presets import PRESETS

    rule = fit_batch("gpt2-124m", PRESETS["gpt2-124m"], memory, amp)
    if batches is None:
        assert rule is None
        return
    assert (rule.batch, rule.large_batch) == batches
    assert rule.large_batch == 4 * rule.batch
    assert (rule.preset_batch, rule.preset_large_batch) == (8, 32)
    assert "cannot hold gpt2-124m at batch 8" in rule.reason


def test_where_no_batch_fits_the_preset_is_kept_and_said():
    from speed_ladder.measure.settings import fit_batch
    from speed_ladder.presets import PRESETS

    rule = fit_batch("gpt2-xl", PRESETS["gpt2-xl"], RTX_4090, "bf16")  # 26 GB of state alone
    assert (rule.batch, rule.large_batch) == (1, 4)
    assert "nor at batch 1" in rule.reason


def _run_args(**kw):
    import argparse

    from conftest import VERDICT

    base = dict(device="cuda", preset=None, epochs=None, max_steps=None, warmup_steps=None,
                batch_size=None, data=str(VERDICT), results=None, seed=123)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("memory,batch", [(RTX_4090, 4), (V100_16, 2), (A100_80, 8)])
def test_every_step_makes_the_same_choice_prints_it_and_records_it(memory, batch, fake_gpu, capsys):
    from speed_ladder.measure.run import Run

    major = 7 if memory == V100_16 else 8
    fake_gpu(props("NVIDIA GeForce RTX 4090", major, 9, 128, memory=memory))
    runs = [Run(_run_args(), step, __file__) for step in ("00", "05", "10", "13")]
    assert {r.spec.batch_size for r in runs} == {batch}
    assert {r.spec.large_batch_size for r in runs} == {4 * batch}
    rec = runs[0]._base("ok")
    if batch == 8:
        assert rec["batch_rule"] is None
        return
    assert rec["batch_rule"]["batch"] == batch
    assert any(n.startswith("batch rule: ") for n in rec["notes"])
    assert "batch rule: this GPU's" in capsys.readouterr().out


def test_an_explicit_batch_size_turns_the_rule_off(fake_gpu):
    from speed_ladder.measure.run import Run

    fake_gpu(props("NVIDIA GeForce RTX 4090", 8, 9, 128, memory=RTX_4090))
    run = Run(_run_args(batch_size=8), "00", __file__)
    assert run.spec.batch_size == 8 and run.spec.batch_rule is None


@pytest.mark.parametrize("memory,major,batch", [(RTX_4090, 8, 4), (V100_16, 7, 2)])
def test_the_sweeps_prediction_is_of_the_run_the_step_does(memory, major, batch, fake_gpu,
                                                           monkeypatch, capsys):  # fmt: skip
    """One RunSpec (speed_ladder.spec): on a GPU too small for the preset's batch, the sweep's plan
    resolves the batch the step will run with, and the memory it predicts before the run is
    the prediction the step records; printed once (the step leaves it to the sweep)."""
    from dataclasses import asdict

    from speed_ladder.files import ROOT
    from speed_ladder.ladder import discover
    from speed_ladder.measure import rank_memory
    from speed_ladder.measure.run import Run
    from speed_ladder.sweep import driver as sweep
    from speed_ladder.sweep import preflight

    monkeypatch.setenv(
        autocast_env.BF16_ENV, "auto"
    )  # the GPU's own bf16, whatever the suite forces
    p = props("NVIDIA GeForce RTX 4090", major, 9, 128, memory=memory)
    fake_gpu(p)
    monkeypatch.setattr(sweep, "_CUDA_INFO", (1, p.name, memory, [vars(p)]))
    values = preflight.measuring_values(dict(vars(_run_args()), device="cuda"), "cuda")
    planned = sweep.run_spec(values, "cuda")  # what the sweep's plan holds
    assert (planned.batch("00"), planned.batch("10")) == (batch, 4 * batch)
    assert planned.amp == ("bf16" if major >= 8 else "fp16")
    ladder = {s.num: s for s in discover(ROOT)}
    monkeypatch.setenv(rank_memory.PREDICTED_ENV, "1")  # as the sweep launches a step
    for step in ("00", "05", "10"):
        run = Run(_run_args(max_steps=values["max_steps"], warmup_steps=values["warmup_steps"]),
                  step, __file__)  # fmt: skip
        assert run.spec == planned
        padded = ladder[step].memory.padded_vocab
        run.cfg = {"vocab_size": 50304 if padded else 50257}  # what set_model is given
        run.batch_size = ladder[step].batch(run.spec)
        recorded = rank_memory.announce(
            run.spec,
            step,
            run.cfg,
            run.batch_size,
            run.device,
            torch.nn.Linear(1, 1),
            False,
            run.recorder,
        )["memory_model"]
        assert asdict(preflight.predict(ladder[step], planned, 1)) == recorded
        assert recorded["batch"] == planned.batch(step)
    assert "predicted per rank" not in capsys.readouterr().out


# ---------------------------------------------------------------- is the step's idea active here?
@pytest.mark.parametrize(
    "p,rocm,env,expected",
    [
        (props("NVIDIA A100-SXM4-80GB", 8, 0), False, None, None),
        (props("Tesla V100-SXM2-16GB", 7, 0), False, None, "7.0 < 8.0 has no TF32"),
        (props("Tesla T4", 7, 5), False, None, "7.5 < 8.0 has no TF32"),
        (props("AMD Instinct MI250X", 9, 0, arch="gfx90a:sramecc+:xnack-"), True, None, "MI300"),
        (props("AMD Instinct MI300X", 9, 4, arch="gfx942:sramecc+:xnack-"), True, None,
         "HIPBLASLT_ALLOW_TF32=1"),
        (props("AMD Instinct MI300X", 9, 4, arch="gfx942:sramecc+:xnack-"), True, "1", None),
    ],
)  # fmt: skip
def test_tf32_is_inactive_where_the_gpu_has_none(p, rocm, env, expected, fake_gpu, monkeypatch):
    if env is None:
        monkeypatch.delenv("HIPBLASLT_ALLOW_TF32", raising=False)
    else:
        monkeypatch.setenv("HIPBLASLT_ALLOW_TF32", env)
    why = inactive.tf32_unavailable(fake_gpu(p, rocm=rocm))
    assert why is None if expected is None else expected in why, why
    assert "no effect on cpu" in inactive.tf32_unavailable(torch.device("cpu"))


def test_sdpa_on_a_cpu_with_dropout_runs_the_math_path():
    from speed_ladder.presets import PRESETS

    cpu = torch.device("cpu")
    why = inactive.sdpa_math_only(cpu, PRESETS["cpu"], torch.float32)  # dropout 0.1
    assert "math path" in why and "dropout 0.1" in why
    assert inactive.sdpa_math_only(cpu, PRESETS["tiny"], torch.float32) is None  # dropout 0: flash


def test_cudnn_attention_is_asked_of_torch_for_the_training_call(fake_gpu, monkeypatch):
    """Step 17's check: CUDA only; on a GPU, torch's own backend choice with only cuDNN on, for
    the training call's shape, dtype and dropout (the probe's tensors land on the CPU here)."""
    from torch.nn.attention import SDPBackend

    from speed_ladder.presets import PRESETS

    cfg = PRESETS["gpt2-124m"] | {"drop_rate": 0.0}
    assert "CUDA's" in inactive.cudnn_attention_unavailable(
        torch.device("cpu"), cfg, torch.bfloat16
    )
    gpu = fake_gpu(props("NVIDIA H100 80GB HBM3", 9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: zeros(*a, **k))
    asked = []

    def answer(backend):
        def choice(q, k, v, dropout_p, is_causal):
            asked.append((tuple(q.shape), q.dtype, q.requires_grad, dropout_p, is_causal,
                          torch.backends.cuda.flash_sdp_enabled()))  # fmt: skip
            return int(backend)

        monkeypatch.setattr(torch, "_fused_sdp_choice", choice)

    called = []

    def trial(q, k, v, dropout_p, is_causal, fail=False):  # the real call after the choice
        called.append((tuple(q.shape), tuple(q.stride()), torch.backends.cuda.flash_sdp_enabled()))
        if fail:
            raise RuntimeError("cuDNN Frontend error: No execution plans support the graph.\nmore")
        return q * 1

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", trial)
    answer(SDPBackend.CUDNN_ATTENTION)
    assert inactive.cudnn_attention_unavailable(gpu, cfg, torch.bfloat16) is None
    assert asked == [((1, 12, 1024, 64), torch.bfloat16, True, 0.0, True, False)]
    # (B, T, H, Q) transposed, as the model lays q, k, v out; with cuDNN alone
    assert called == [((1, 12, 1024, 64), (786432, 64, 768, 1), False)]
    assert torch.backends.cuda.flash_sdp_enabled()  # only inside the probe
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: trial(*a, **k, fail=True))  # fmt: skip
    why = inactive.cudnn_attention_unavailable(gpu, cfg, torch.bfloat16)
    assert why == ("cuDNN attention failed a trial call here (cuDNN Frontend error: No execution "
                   "plans support the graph.): step 07's kernel stays")  # fmt: skip
    answer(SDPBackend.ERROR)
    why = inactive.cudnn_attention_unavailable(gpu, cfg, torch.float32)
    assert why.startswith("cuDNN attention refuses the training call here (compute capability")
    assert "torch.float32" in why and "step 07's kernel stays" in why


def test_compile_disabled_is_inactive():
    import torch._dynamo.config

    with torch._dynamo.config.patch(disable=True):
        assert "TORCH_COMPILE_DISABLE=1" in inactive.compile_disabled()
    with torch._dynamo.config.patch(disable=False):
        assert inactive.compile_disabled() is None


def test_only_the_running_steps_own_number_sets_step_active(fake_gpu):
    import argparse

    from conftest import VERDICT

    from speed_ladder.measure.run import Run

    args = argparse.Namespace(device="cpu", preset="tiny", epochs=None, max_steps=None,
                              warmup_steps=None, batch_size=None, data=str(VERDICT),
                              results=None, seed=123)  # fmt: skip
    run = Run(args, "05", __file__)
    run.recorder.inactive("02", "TF32 is a CUDA tensor-core mode: no effect on cpu")
    assert run._base("ok")["step_active"] is True  # another step's no-op: a note only
    run.recorder.inactive("05", "bf16 autocast off on this cpu: slower")
    rec = run._base("ok")
    assert (
        rec["step_active"] is False
        and rec["inactive_reason"] == "bf16 autocast off on this cpu: slower"
    )
    assert rec["notes"] == ["step 02: TF32 is a CUDA tensor-core mode: no effect on cpu",
                            "step 05: bf16 autocast off on this cpu: slower"]  # fmt: skip
