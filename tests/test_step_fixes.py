"""What steps 09, 11 and 12 do on a GPU, shown on a CPU by simulating the GPU's side.

Step 12 builds Liger's public module itself, with fp32 accumulation, where the harness says
Liger can run (here: Triton's interpreter flag and a stand-in liger_kernel in torch), and runs
step 11's loss elsewhere, the record saying which; a CUDA out-of-memory or a Triton error inside
Liger is the run's result, never a fallback. Step 11: a bad DDP_BACKEND is one line. Step 09:
generation never picks a padded id.
"""

import sys

import pytest
import torch
from conftest import LIGER, VERDICT, fake_liger, load_script, load_step, records

import speed_ladder
from speed_ladder import ladder
from speed_ladder.measure import inactive
from speed_ladder.measure.data import train_windows
from speed_ladder.presets import PRESETS

CUDA = torch.device("cuda", 0)  # only a name here: nothing is allocated on it
TINY = ["--device", "cpu", "--preset", "tiny", "--max-steps", 3, "--warmup-steps", 1,
        "--batch-size", 2, "--data", VERDICT]  # fmt: skip
RAN = "step 12: Liger fused linear cross-entropy kernel ran (fp32 accumulation)"


def step_here(script, tmp_path, monkeypatch, interpret=True, data=VERDICT, extra=()):
    """`python SCRIPT` on tiny, eager, in this process under speed_ladder.main, with bf16 off;
    `interpret`: TRITON_INTERPRET=1, so that the harness lets Liger run on this CPU. Returns
    (exit code, its record: the run's, or its failure's)."""
    out = tmp_path / "r.jsonl"
    argv = [script, *map(str, TINY), "--data", str(data), *extra, "--results", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    code = 0
    try:
        with torch._dynamo.config.patch(disable=True):
            speed_ladder.main(load_script(script).main)
    except SystemExit as e:
        code = e.code
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    (rec,) = records(out)
    return code, rec


ON_12 = [ladder.rung("12"), *ladder.descendants("12")]


@pytest.mark.parametrize("script", [r.rel for r in ON_12])
def test_where_liger_can_run_the_step_builds_its_public_module_with_fp32_sums(
    script, tmp_path, monkeypatch
):
    """Every rung from 12 on: Liger's LigerFusedLinearCrossEntropyLoss, built once with
    accum_dtype=torch.float32 (the weight gradient summed in fp32), called each step with
    out_head's (V, C) weight, the (B*T, C) hidden states and the (B*T,) targets; the record says
    Liger ran, and step 12 is active."""
    built = fake_liger(monkeypatch)
    code, rec = step_here(script, tmp_path, monkeypatch)
    assert code == 0 and rec["status"] == "ok"
    ((liger,),) = [built]
    assert liger.made == {"accum_dtype": torch.float32}
    c, t = PRESETS["tiny"]["emb_dim"], rec["context_length"]
    rows = t * (1 if script.startswith("steps/18") else 2)  # step 18: 2 micro-batches of 1
    assert set(liger.calls) == {((50304, c), (rows, c), (rows,))}  # step 09's padded vocabulary
    assert len(liger.calls) >= 3  # each training step; evaluation takes the logits
    assert RAN in rec["notes"] and not any(
        n.startswith("step 12: Liger runs") for n in rec["notes"]
    )
    if script.startswith("steps/12"):
        assert rec["step_active"] is True
    assert rec["interpreted"] is True  # no measurement: Triton's interpreter flag was on


def test_where_liger_cannot_run_step_12_trains_step_11s_loss_and_says_why(tmp_path, monkeypatch):
    """No CUDA and no interpreter: Liger is never built; the step computes step 11's loss, the
    same floats (its record's losses equal step 11's), and its record says why it is inactive."""
    built = fake_liger(monkeypatch)
    code, rec12 = step_here("steps/12_liger_fused_ce.py", tmp_path, monkeypatch, False)
    assert code == 0 and built == []
    assert rec12["step_active"] is False and "no CUDA device" in rec12["inactive_reason"]
    (tmp_path / "11").mkdir()
    code, rec11 = step_here("steps/11_ddp.py", tmp_path / "11", monkeypatch, False)
    assert code == 0 and rec12["losses"] == rec11["losses"]


def test_a_cuda_oom_inside_liger_is_recorded_oom_not_a_fallback(tmp_path, monkeypatch):
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0)")

    built = fake_liger(monkeypatch, oom)
    code, rec = step_here("steps/12_liger_fused_ce.py", tmp_path, monkeypatch)
    assert code == 3 and len(built) == 1  # no second loss built after it
    assert rec["status"] == "oom"
    assert rec["reason"] == "CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0)"


def test_a_triton_error_inside_liger_is_recorded_error_with_its_reason(tmp_path, monkeypatch):
    CompilationError = type("CompilationError", (Exception,), {"__module__": "triton.compiler"})

    def fail():
        raise CompilationError("at 12:4: out of resources: shared memory")

    fake_liger(monkeypatch, fail)
    code, rec = step_here("steps/12_liger_fused_ce.py", tmp_path, monkeypatch)
    assert code == 1 and rec["status"] == "error"
    assert "CompilationError" in rec["reason"] and "shared memory" in rec["reason"]


def test_the_harness_says_where_liger_cannot_run(monkeypatch):
    """On a CUDA GPU (a name only here): Liger runs in bf16 and fp32; not under fp16, and not
    where liger-kernel does not import; never on a CPU without Triton's interpreter."""
    fake_liger(monkeypatch)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert inactive.liger_unavailable(CUDA, torch.bfloat16) is None
    assert inactive.liger_unavailable(CUDA, torch.float32) is None
    fallback = inactive.LIGER_FALLBACK
    fp16 = inactive.liger_unavailable(CUDA, torch.float16)
    assert fp16 == f"{fallback} ({inactive.LIGER_FP16})"
    cpu = inactive.liger_unavailable(torch.device("cpu"), torch.bfloat16)
    assert cpu == f"{fallback} (Liger runs Triton GPU kernels: no CUDA device (cpu))"
    monkeypatch.setitem(sys.modules, LIGER, None)  # import raises ModuleNotFoundError
    why = inactive.liger_unavailable(CUDA, torch.bfloat16)
    assert why.startswith(f"{fallback} (liger-kernel unavailable: ModuleNotFoundError")


def test_the_installed_liger_kernel_has_the_public_module_the_step_uses():
    """liger-kernel's public LigerFusedLinearCrossEntropyLoss takes accum_dtype and (weight,
    hidden, targets), as every step from 12 on builds and calls it."""
    import inspect

    liger = pytest.importorskip(LIGER, exc_type=ImportError)
    cls = liger.LigerFusedLinearCrossEntropyLoss
    assert "accum_dtype" in inspect.signature(cls).parameters
    forward = list(inspect.signature(cls.forward).parameters)
    assert forward[1:4] == ["lin_weight", "_input", "target"]
    for r in ladder.rungs():
        text = r.path.read_text()
        uses = "LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)" in text
        assert uses == (r in ON_12), r.rel
        assert "liger_kernel.ops" not in text, r.rel  # a private signature


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


# ---------------------------------------------------------------- steps 19 and 20
def test_step_19s_fused_qkv_layer_holds_the_three_layers_weights():
    """Built from the same seed, step 19's (3C, C) qkv weight is step 17's query, key and value
    weights stacked in that order, every other weight is the same, and the logits are equal:
    the same model, computed in one matmul."""
    from speed_ladder.presets import PRESETS

    cfg = {"vocab_size": 512, **{k: PRESETS["tiny"][k] for k in ["context_length", "emb_dim",
           "n_heads", "n_layers", "drop_rate", "qkv_bias"]}}  # fmt: skip
    s17, s19 = load_step("17_cudnn_attention"), load_step("19_fused_qkv")
    torch.manual_seed(0)
    m17 = s17.GPTModel(cfg)
    torch.manual_seed(0)
    m19 = s19.GPTModel(cfg)
    for a, b in zip(m17.trf_blocks, m19.trf_blocks, strict=True):
        w = torch.cat([a.att.W_query.weight, a.att.W_key.weight, a.att.W_value.weight])
        assert torch.equal(w, b.att.qkv.weight)
    p17, p19 = dict(m17.named_parameters()), dict(m19.named_parameters())
    assert all(torch.equal(p17[k], p) for k, p in p19.items() if "qkv" not in k)
    x = torch.randint(0, 512, (2, cfg["context_length"]))
    torch.testing.assert_close(m19(x), m17(x))


def test_step_20_grows_the_batch_to_the_largest_power_of_two_that_fits(tmp_path, monkeypatch):
    """Where the harness lets it (a GPU, simulated: the check says yes and mem_get_info gives a
    capacity), step 20 doubles the batch while the memory model's prediction, x1.15 and the CUDA
    context, fits; its record says it acted. On a CPU the batch stays (test_ladder's runs)."""
    from speed_ladder.measure import inactive, rank_memory
    from speed_ladder.measure.memory_model import CUDA_OVERHEAD, GIB

    capacity = CUDA_OVERHEAD + 2 * GIB
    seen, real = [], rank_memory.batch_fits

    def fits(run, cfg, batch, total):
        seen.append(batch)
        return real(run, cfg, batch, total)

    monkeypatch.setattr(inactive, "batch_fit_unavailable", lambda device, settings: None)
    monkeypatch.setattr(rank_memory, "batch_fits", fits)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (capacity, capacity))
    monkeypatch.setattr(inactive, "batch_not_grown", lambda device, batch, settings, step: None)
    code, rec = step_here("steps/20_batch_that_fits.py", tmp_path, monkeypatch, interpret=False)
    # from step_here's batch of 2, doubled (the check that would keep a --batch-size is patched)
    assert code == 0 and seen == [2 * 2**k for k in range(1, len(seen) + 1)]
    assert rec["batch_size"] == seen[-1] // 2 > 2  # the last doubling that fit
    assert "step 20: the batch grew to the largest power of two" in " ".join(rec["notes"])


def short_text(tmp_path):
    """The Verdict's first 3,000 characters: 16 to 31 training windows of tiny's 32 tokens."""
    text = tmp_path / "short.txt"
    text.write_text(VERDICT.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    assert 16 <= train_windows(str(text), 32) < 32
    return text


@pytest.mark.parametrize("liger", [True, False])
def test_step_20_fits_the_loss_that_will_run_and_no_more_than_the_texts_windows(
    liger, tmp_path, monkeypatch
):
    """A GPU of 1200 MiB, simulated. Where Liger runs, its loss keeps no logits: memory would
    hold batch 32, but the text has fewer windows, and the batch stops at 16 (not "text too
    short"). Where liger-kernel is missing (its import fails), step 12 falls back to the full
    logits, and the fit predicts them: the batch stays at 2."""
    from speed_ladder.measure import inactive
    from speed_ladder.measure.memory_model import GIB

    text = short_text(tmp_path)
    if liger:
        fake_liger(monkeypatch)
    else:
        monkeypatch.setitem(sys.modules, LIGER, None)  # `import liger_kernel.transformers` fails
    monkeypatch.setattr(inactive, "batch_fit_unavailable", lambda device, settings: None)
    monkeypatch.setattr(inactive, "batch_not_grown", lambda device, batch, settings, step: None)
    capacity = 1200 * GIB // 1024
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (capacity, capacity))
    code, rec = step_here(
        "steps/20_batch_that_fits.py", tmp_path, monkeypatch, data=text, extra=["--epochs", "3"]
    )  # one step an epoch at batch 16
    assert code == 0 and rec["batch_size"] == (16 if liger else 2), rec.get("reason")
    ran = "step 12: Liger fused linear cross-entropy kernel ran" in " ".join(rec["notes"])
    assert ran is liger


@pytest.mark.parametrize("liger", [True, False])
def test_the_sweeps_preview_predicts_step_20_at_the_batch_it_will_pick(liger, monkeypatch):
    """The memory line before step 20's run: at the batch step 20's loop reaches on this GPU
    (the sweep's RunSpec, the loss that can run, the text's windows), not step 19's."""
    from speed_ladder.measure import memory_model
    from speed_ladder.measure.memory_model import GIB
    from speed_ladder.measure.settings import resolve_spec
    from speed_ladder.sweep import preflight

    monkeypatch.setattr(memory_model, "liger_runs_on", lambda device_type: liger)
    spec = resolve_spec({"preset": "tiny"}, "cuda", (1536 * GIB // 1024, "fp32"))
    assert spec.batch_rule is None and spec.batch("20") == 8
    pred = preflight.predict(ladder.rung("20"), spec, 1, str(VERDICT))
    assert pred.batch == (128 if liger else 16) and pred.loss == ("fused" if liger else "logits")
    assert preflight.predict(ladder.rung("19"), spec, 1, str(VERDICT)).batch == 8


def test_step_20_says_why_the_batch_stayed():
    from speed_ladder.measure import inactive
    from speed_ladder.measure.settings import resolve_spec

    cpu = torch.device("cpu")
    tiny = resolve_spec({"preset": "tiny"}, "cpu")
    start = tiny.batch("20")  # the batch step 20 grows from: 8
    why = inactive.batch_not_grown(cpu, tiny, 8, start)
    assert why == "the batch is fitted to a GPU's memory: on cpu it stays as it was"
    by_hand = resolve_spec({"preset": "tiny", "batch_size": 6}, "cuda")
    assert inactive.batch_fit_unavailable(CUDA, by_hand) == "--batch-size 6 set by hand: kept"
    assert inactive.batch_not_grown(CUDA, tiny, 32, start) is None  # grew from 8
    assert inactive.batch_not_grown(CUDA, tiny, 8, start).startswith("no batch twice 8 fits")
