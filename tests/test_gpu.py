"""The GPU suite: `pytest -m gpu` on a machine with a CUDA GPU (skipped, not failed, without).

tools/gpu_session.sh runs the fast part, `pytest -m "gpu and not slow"` (about 70 s estimated),
after the sweep: a GPU sweep already runs every step on
CUDA and judges each step's loss against the previous step's (summary.csv `parity`, each rung's
CUDA rule in ladder.json), so the fast part checks only what a sweep cannot, most informative
first, and reads the sweep's records where it has just run what a test needs
(tests/session_records.py, SPEED_LADDER_SESSION_RESULTS):
- the MFU peak table resolves this GPU, and the batch rule leaves the preset to a big one;
- which attention kernel steps 07 and 17 ran on tiny (their records' `attention_kernel`, against
  torch's own choice) and whether step 17 changed it;
- step 12's Liger loss and gradients against plain cross-entropy, and the numerics cases of
  tests/liger_cases.py (the CPU suite runs them through Triton's interpreter);
- the peak memory of steps 12 and 13 below step 10's where activations dominate, and that Liger
  (not the fallback) ran in step 12: the sweep's gpt2-124m records, else three eager runs;
- DDP with nccl as a world of one, under plain python and under torchrun (the sweep's step-11
  record, else a run).
The slow part (`-m gpu`) runs every script on `tiny` on CUDA (08-14 compiled): an ok record,
loss parity under speed_ladder/data/ladder.json's "cuda" tolerances, and only what this GPU lacks
recorded inactive.

Every test has a time limit (@pytest.mark.timeout, pytest-timeout): one that hangs fails and
the processes it started are killed (run_script).
"""

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import ROOT, VERDICT, records, run_script
from session_records import session_record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

sys.path.insert(0, str(ROOT / "tools"))
import ladder  # noqa: E402

from speed_ladder import parity  # noqa: E402
from speed_ladder.ladder import rung  # noqa: E402
from speed_ladder.measure import device as dev  # noqa: E402
from speed_ladder.measure import inactive, matmul_peak, precision  # noqa: E402
from speed_ladder.presets import PRESETS  # noqa: E402

STEPS = [p.relative_to(ROOT).as_posix() for p in ladder.ladder()]
SUMMARIES = list(ladder.SUMMARIES)
MAX_STEPS, WARMUP = 4, 1  # as the CPU ladder test: its tolerances are for 4 steps
GPU = torch.device("cuda", 0)
# what a test checks here is not the compiled graph (the sweep measures that): eager runs start
# in seconds instead of a compile's 30-60 s
EAGER = {"TORCHDYNAMO_DISABLE": "1"}
LIGER = "liger-kernel missing: tools/gpu_session.sh --wheels"


def run_on_cuda(script, out, *extra, launcher=(sys.executable,), data=VERDICT, env=None):
    """(CompletedProcess, [records]) of one run of a script on CUDA."""
    res = out / (Path(script).stem + ".jsonl")
    res.unlink(missing_ok=True)
    proc = run_script(
        [*launcher, str(ROOT / script), "--device", "cuda", "--data", data, "--results", res,
         *extra],
        timeout=900, env=env,
    )  # fmt: skip
    return proc, records(res) if res.exists() else []


def middlemarch() -> Path:
    """The default text (gpt2-124m needs more windows than the test text has): data/, the
    offline mirror (SPEED_LADDER_SHARED, as tools/gpu_session.sh sets it) or Gutenberg."""
    from speed_ladder.measure.data import read_text

    return read_text(None)[1]


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _ok(proc, recs):
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert len(recs) == 1, recs
    rec = recs[0]
    assert rec["status"] == "ok" and rec["device"] == "cuda", rec
    return rec


def liger_installed() -> bool:
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.timeout(30)
def test_the_peak_table_resolves_this_gpu():
    props = torch.cuda.get_device_properties(GPU)
    flops, desc = matmul_peak.peak_flops(GPU)
    assert flops is not None, f"{props.name}: {desc}"
    assert 10e12 < flops < 5000e12, desc
    fast, why = matmul_peak.bf16_is_fast(GPU)
    assert fast == (props.major >= 8) or torch.version.hip, why


@pytest.mark.timeout(30)
def test_the_batch_rule_on_this_gpu_is_what_the_presets_say():
    from speed_ladder.measure.settings import fit_batch

    total, amp = dev.gpu_memory(GPU)
    rule = fit_batch("gpt2-124m", PRESETS["gpt2-124m"], total, amp)
    if total >= 40e9:
        assert rule is None, rule
    else:
        assert rule.batch < 8 and rule.large_batch == 4 * rule.batch, rule


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["fp32", "bf16", "accum", "accum-bf16-control"])
def test_liger_cases_shared_with_the_cpu_interpreter_tests(case):
    """tests/liger_cases.py, the cases tests/test_liger.py runs through Triton's interpreter,
    here compiled on CUDA (the tolerances per dtype are that module's)."""
    pytest.importorskip("liger_kernel", reason=LIGER)
    import liger_cases

    res = liger_cases.run_case(case, GPU)
    bad = liger_cases.check(res)
    if case.endswith("-control"):  # bf16 accumulation must be caught
        assert any("contributions were lost" in b for b in bad), res
    else:
        assert not bad, (bad, res)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bf16", [False, True])
def test_liger_loss_and_gradients_match_plain_cross_entropy(bf16):
    """Step 12's loss as it builds and calls it (Liger's public module, fp32 accumulation;
    under the step's autocast, the fp32 weight the leaf) at a GPT-2 width of vocabulary, against
    plain cross-entropy of fp32 logits from the same (rounded) inputs."""
    pytest.importorskip("liger_kernel", reason=LIGER)
    from liger_cases import step12_loss

    fused = step12_loss("cuda")

    torch.manual_seed(0)
    n, c, v = 2048, 256, 50304  # more rows than one chunk; the padded GPT-2 vocabulary
    weight = (torch.randn(v, c, device=GPU) * 0.02).requires_grad_()
    hidden = torch.randn(n, c, device=GPU).requires_grad_()
    targets = torch.randint(0, 50257, (n,), device=GPU)

    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = fused(weight, hidden, targets)
    loss.backward()
    g_w, g_h = weight.grad.clone(), hidden.grad.clone()
    assert g_w.dtype == torch.float32  # the fp32 leaf's, summed in fp32
    weight.grad = hidden.grad = None
    # the reference: fp32 logits from the same (rounded) inputs, plain cross-entropy
    dtype = torch.bfloat16 if bf16 else torch.float32
    ref = torch.nn.functional.cross_entropy(
        (hidden.to(dtype).float() @ weight.to(dtype).float().T), targets
    )
    ref.backward()
    # Triton's fp32 dot runs in TF32 on Ampere and newer (2^-11 per input); bf16 inputs round
    # to 2^-8 and the gradients are bf16 matmuls (Liger accumulates the weight's in fp32)
    tol = 3e-2 if bf16 else 5e-3
    assert rel_err(loss, ref) < tol, (loss.item(), ref.item())
    assert rel_err(g_w, weight.grad) < tol
    assert rel_err(g_h, hidden.grad) < tol


@pytest.mark.timeout(40)  # a few attention calls; cuDNN builds its plans at the first
def test_step17s_cudnn_attention_takes_the_training_call_on_hopper_and_matches_flash():
    """Step 17 puts cuDNN first in SDPA's order where its check says cuDNN takes the training
    call. On Hopper with bf16 the check must say so (else the rung silently measures nothing);
    then, at gpt2-124m's shapes (batch 4 of 12 heads x 1024 x 64, causal, as the model lays q, k,
    v out), cuDNN's output and gradients are flash's within bf16 rounding, and SDPA under step
    17's order (cuDNN, flash, efficient, math) really runs cuDNN (the aten op the profiler
    sees)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    cfg = PRESETS["gpt2-124m"] | {"drop_rate": 0.0}  # step 16's model
    bf16 = matmul_peak.bf16_is_fast(GPU)[0]
    why = inactive.cudnn_attention_unavailable(GPU, cfg, torch.bfloat16 if bf16 else torch.float32)
    if torch.cuda.get_device_capability(GPU) >= (9, 0) and bf16:
        assert why is None, why
    if why:
        pytest.skip(why)
    torch.manual_seed(0)
    b, h, t, d = 4, cfg["n_heads"], cfg["context_length"], cfg["emb_dim"] // cfg["n_heads"]
    q, k, v = (torch.randn(b, t, h, d, device=GPU, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))  # fmt: skip
    grad_out = torch.randn(b, h, t, d, device=GPU, dtype=torch.bfloat16)

    def attend(backends):
        with sdpa_kernel(backends, set_priority=True):
            out = sdpa(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
        return out, torch.autograd.grad(out, (q, k, v), grad_out)

    flash, flash_grads = attend([SDPBackend.FLASH_ATTENTION])
    step17 = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # fmt: skip
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        cudnn, cudnn_grads = attend(step17)
        torch.cuda.synchronize()
    ops = {e.name for e in prof.events()}
    assert "aten::_scaled_dot_product_cudnn_attention" in ops, sorted(ops)
    assert not any("flash" in op or "efficient" in op for op in ops), sorted(ops)
    assert rel_err(cudnn, flash) < 1e-2
    for got, want in zip(cudnn_grads, flash_grads, strict=True):
        assert rel_err(got, want) < 2e-2


@pytest.mark.timeout(180)
def test_records_say_which_attention_kernel_steps_07_and_17_ran(tmp_path):
    """Each record's `attention_kernel` is what its last warm-up step ran: step 07's is the fused
    kernel torch's own order chooses for tiny's training call (flash, or cuDNN where this torch
    puts cuDNN first on this GPU: then the record says cudnn, not flash), and step 17's is cuDNN
    where cuDNN takes the call; step 17 is active only where step 07's kernel was not cuDNN
    already."""
    from speed_ladder.measure.sdpa_dispatch import dispatcher_choice

    bf16 = matmul_peak.bf16_is_fast(GPU)[0]
    tiny = ["--preset", "tiny", "--max-steps", 3, "--warmup-steps", 1]
    rec07 = _ok(*run_on_cuda("steps/07_flash_attention_sdpa.py", tmp_path, *tiny, env=EAGER))
    rec17 = _ok(*run_on_cuda("steps/17_cudnn_attention.py", tmp_path, *tiny, env=EAGER))
    default = dispatcher_choice(GPU, PRESETS["tiny"], bf16)  # torch's own order, this process
    assert rec07["attention_kernel"] == default, rec07["notes"]
    assert rec07["attention_kernel"] in ("flash", "efficient", "cudnn")
    assert rec07["step_active"] is True, rec07["inactive_reason"]
    why = inactive.cudnn_attention_unavailable(GPU, PRESETS["tiny"], bf16)
    if torch.cuda.get_device_capability(GPU) >= (9, 0) and bf16:
        assert why is None, why
    if why is not None:
        assert rec17["attention_kernel"] == default and rec17["step_active"] is False
        return
    assert rec17["attention_kernel"] == "cudnn", rec17["notes"]
    assert rec17["step_active"] is (default != "cudnn"), rec17["inactive_reason"]
    if default == "cudnn":
        assert "already torch's choice" in rec17["inactive_reason"]


@pytest.mark.timeout(240)
def test_steps_12_and_13_peak_below_step_10_where_activations_dominate(tmp_path):
    """gpt2-124m: step 10 holds the (B*1024, 50304) logits and every block's activations; step 12
    drops the logits, step 13 the blocks' insides too. Where liger-kernel is installed, step 12
    ran its kernel, not the chunked fallback. Under tools/gpu_session.sh the sweep has just run
    the three at batch 32, compiled, on this GPU: their records are read
    (tests/session_records.py); otherwise three eager runs at batch 16 (4 below 40 GB)."""
    name = torch.cuda.get_device_name(GPU)
    recs = {s: session_record(s, name) for s in ("10", "12", "13")}
    if any(r is None for r in recs.values()):
        batch = 16 if dev.gpu_memory(GPU)[0] >= 40e9 else 4
        for script in ["steps/10_larger_batch.py", "steps/12_liger_fused_ce.py",
                       "steps/13_gradient_checkpointing.py"]:  # fmt: skip
            flags = ["--preset", "gpt2-124m", "--batch-size", batch, "--max-steps", 4,
                     "--warmup-steps", 2]  # fmt: skip
            rec = _ok(*run_on_cuda(script, tmp_path, *flags, data=middlemarch(), env=EAGER))
            recs[rec["step"]] = rec
    assert len({r["batch_size"] for r in recs.values()}) == 1, recs  # the same batch: comparable
    peaks = {s: r["peak_mem_reserved_bytes"] for s, r in recs.items()}
    if liger_installed():
        assert recs["12"]["step_active"] is True, recs["12"]["inactive_reason"]
        assert any("Liger fused linear cross-entropy kernel ran" in n for n in recs["12"]["notes"])
    assert peaks["12"] < peaks["10"], peaks
    assert peaks["13"] < peaks["12"], peaks


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_ddp_with_nccl_as_a_world_of_one(launcher, tmp_path):
    """Step 11 as a world of one under plain python and under torchrun (nccl, CUDA's default
    backend). Under tools/gpu_session.sh the sweep has just launched step 11 through torchrun on
    this GPU: its record stands for the torchrun case (tests/session_records.py)."""
    rec = session_record("11", torch.cuda.get_device_name(GPU))
    if launcher == "torchrun" and rec is not None and rec.get("world_size") == 1:
        assert rec["step_active"] is False, rec  # nothing to share with
        return
    argv = [sys.executable]
    if launcher == "torchrun":
        argv += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    proc, recs = run_on_cuda("steps/11_ddp.py", tmp_path, "--preset", "tiny", "--max-steps", 4,
                             "--warmup-steps", 2, launcher=argv,
                             env={"DDP_BACKEND": "nccl", **EAGER})  # fmt: skip
    rec = _ok(proc, recs)
    assert rec["world_size"] == 1 and rec["step_active"] is False  # nothing to share with


@pytest.fixture(scope="module")
def cuda_runs(tmp_path_factory):
    """Every script once on tiny, two at a time (the compiles are CPU-bound)."""
    out = tmp_path_factory.mktemp("cuda-ladder")
    tiny = ["--preset", "tiny", "--max-steps", MAX_STEPS, "--warmup-steps", WARMUP]

    def one(script):
        return script, run_on_cuda(script, out, *tiny)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, STEPS + SUMMARIES))


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the first bears cuda_runs: 17 runs
@pytest.mark.parametrize("script", STEPS + SUMMARIES)
def test_every_script_writes_an_ok_record_on_cuda(cuda_runs, script):
    rec = _ok(*cuda_runs[script])
    assert rec["tokens_per_sec"] > 0 and rec["peak_mem_reserved_bytes"] > 0
    assert rec["peak_mem_allocated_bytes"] > 0 and rec["cuda_version"]
    assert rec["mfu"] is None or 0 < rec["mfu"] <= 1
    assert rec["batch_rule"] is None  # tiny fits every GPU
    assert rec["timed_steps"] == MAX_STEPS - WARMUP


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the first bears cuda_runs: 17 runs
@pytest.mark.parametrize("script", STEPS[1:])
def test_loss_matches_previous_step_on_cuda(cuda_runs, script):
    base = rung(ladder.step_of(ROOT / script)).after  # the rung it builds on (15: 12)
    prev, cur = _ok(*cuda_runs[rung(base).rel]), _ok(*cuda_runs[script])
    # speed_ladder/data/ladder.json's CUDA tolerance for tiny's 4 steps (parity.judge); none is
    # measured for fp16 (a GPU without native bf16): not comparable there, and said so
    state, _, how = parity.judge(ladder.step_of(ROOT / script), prev, cur)
    if state == parity.NOT_COMPARABLE and "fp16" in how:
        pytest.skip(how)
    assert state == parity.OK, f"{how} ({cur['losses']} vs {prev['losses']})"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the first bears cuda_runs: 17 runs
def test_only_what_this_gpu_lacks_is_recorded_inactive(cuda_runs):
    amp = precision.choice(GPU)[0]  # step 05's: bf16, fp16 (V100, T4) or fp32
    dtype = precision.DTYPES[amp]
    expected = {"11", "14", "16"}  # a world of one under plain python; tiny has no dropout
    if inactive.tf32_unavailable(GPU):
        expected.add("02")
    if amp == "fp32":
        expected.add("05")
    if amp != "bf16":
        expected.add("15")  # 15's bf16 weights follow step 05's answer
    if amp == "fp16":
        expected.add("12")  # Liger's in-forward gradients cannot take GradScaler's scale
    if inactive.sdpa_math_only(GPU, PRESETS["tiny"], dtype):
        expected.add("07")
    if inactive.cudnn_attention_unavailable(GPU, PRESETS["tiny"], dtype):
        expected.add("17")  # fp32 where bf16 is slow, or a cuDNN without the kernel
    if _ok(*cuda_runs[rung("16").rel])["attention_kernel"] == "cudnn":
        expected.add("17")  # torch's own order put cuDNN first already: 16 ran it too
    recorded = {}
    for script in STEPS:
        rec = _ok(*cuda_runs[script])
        if not rec["step_active"]:
            recorded[rec["step"]] = rec["inactive_reason"]
    assert set(recorded) == expected, recorded
