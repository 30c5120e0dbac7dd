"""speed_ladder/measure/memory_model.py: the prediction against a direct count of the ladder's
model, the GPT-2 family's sizes and CPU offload's terms (tests/test_fit.py: what fits); and
rank_memory.py's announcement of it before a run."""

import functools
import sys

import pytest
import torch
from conftest import run_script

from speed_ladder import ladder
from speed_ladder.measure import matmul_peak, rank_memory
from speed_ladder.measure import memory_model as mm
from speed_ladder.presets import PRESETS


@functools.cache
def ladder_step():
    from conftest import load_step

    return load_step("13_gradient_checkpointing")  # the same GPTModel as steps 09-14


def direct(preset, world):
    """(all params, rank 0's FSDP2 shards) counted on the ladder's model, built on meta."""
    p = PRESETS[preset]
    cfg = {"vocab_size": mm.VOCAB, **{k: p[k] for k in ["context_length", "emb_dim", "n_heads",
           "n_layers", "drop_rate", "qkv_bias"]}}  # fmt: skip
    with torch.device("meta"):
        model = ladder_step().GPTModel(cfg)
    full = sum(q.numel() for q in model.parameters())
    shard = sum(q.chunk(world, dim=0)[0].numel() for q in model.parameters())
    return full, shard


@pytest.mark.parametrize("preset", list(PRESETS))
def test_prediction_matches_a_direct_count(preset):
    cfg = PRESETS[preset]
    full, _ = direct(preset, 1)
    assert mm.param_counts(cfg)["total"] == full
    assert mm.state_bytes(cfg, 1, "ddp")["total"] == 16 * full  # params x (4 + 4 + 8) bytes
    for world in (2, 3, 4, 8):
        _, shard = direct(preset, world)
        assert mm.state_bytes(cfg, world, "fsdp2")["total"] == 16 * shard
        assert mm.state_bytes(cfg, world, "ddp")["total"] == 16 * full


def test_gpt2_family_sizes():
    """GPT-2 paper Table 2 sizes, plus this ladder's untied out_head (50304 x C)."""
    sizes = {"gpt2-124m": 124e6, "gpt2-medium": 355e6, "gpt2-large": 774e6, "gpt2-xl": 1558e6}
    for name, paper in sizes.items():
        cfg = PRESETS[name]
        tied = mm.param_counts(cfg, vocab=50257)["total"] - 50257 * cfg["emb_dim"]
        assert abs(tied - paper) / paper < 0.03, (name, tied)
        assert cfg["context_length"] == 1024 and cfg["emb_dim"] // cfg["n_heads"] == 64


def test_memory_model_command_prints_the_table():
    proc = run_script([sys.executable, "-m", "speed_ladder.measure.memory_model"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "step 14 x4" in proc.stdout and "python -m speed_ladder fit" in proc.stdout
    assert proc.stdout.count("predicted per rank") == 4


def test_activation_estimate_matches_the_published_reference_peaks():
    """The reference ladder's A100 peaks (results/reference, gpt2-124m, bf16 weights, grads and
    AdamW state: 8 B/param; no autocast, so its loss is bf16 too): its step 09 (batch 8) and step
    10 (batch 32), within 10%."""
    cfg = PRESETS["gpt2-124m"]
    state = 8 * mm.param_counts(cfg)["total"]
    for batch, published in [(8, 5.8906e9), (32, 22.5078e9)]:
        predicted = state + mm.activation_bytes(
            cfg, batch, "logits", act_bytes=2, flash=True, loss_bytes=2
        )  # bf16 logits, bf16 loss
        assert abs(predicted - published) / published < 0.10, (batch, predicted)


def test_announce_prints_records_and_warns_when_it_cannot_fit(monkeypatch):
    """What Run.set_model gets: the prediction printed, its record fields, a note past capacity."""
    from types import SimpleNamespace

    from speed_ladder.measure.settings import resolve_spec

    printed, notes = [], []
    cfg = {"vocab_size": mm.VOCAB, **{k: PRESETS["tiny"][k] for k in ["context_length",
           "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias"]}}  # fmt: skip
    recorder = SimpleNamespace(say=printed.append, note=notes.append)
    spec = resolve_spec({"preset": "tiny"}, "cpu")
    monkeypatch.setattr(matmul_peak, "bf16_is_fast", lambda device: (False, "test"))
    model = ladder_step().GPTModel(cfg)
    cpu = torch.device("cpu")
    announce = lambda: rank_memory.announce(spec, "13", cfg, 8, cpu, model, False, recorder)
    fields = announce()
    assert fields["memory_model"]["mode"] == "single" and fields["memory_model"]["act_bytes"] == 4
    assert fields["predicted_state_bytes_per_rank"] == mm.state_bytes(cfg, 1, "single")["total"]
    assert len(printed) == 1 and "predicted per rank (tiny, single" in printed[0] and not notes
    monkeypatch.setattr(rank_memory, "capacity_bytes", lambda device: 1)
    monkeypatch.setenv(rank_memory.PREDICTED_ENV, "1")  # under the sweep, which printed it first
    assert announce() == fields and len(printed) == 1
    assert len(notes) == 1 and "expect out-of-memory" in notes[0]


def test_the_output_layers_term_is_its_measured_peak():
    """Steps <= 11's output layer, measured in this process (peak RSS, Linux): forward and
    backward of a 1024 x 50257 fp32 cross-entropy peak at the three (B*T, V) fp32 tensors the
    model counts (the saved log-softmax, nll's gradient, log-softmax's gradient), within 10%."""
    from speed_ladder.measure import device

    cpu = torch.device("cpu")
    if device.reset_peak_memory(cpu) is not None:
        pytest.skip("no resettable peak RSS here (Linux's clear_refs)")
    rows, width, vocab = 1024, 384, 50257
    cfg = {"context_length": rows, "emb_dim": width, "n_heads": 6, "n_layers": 0, "drop_rate": 0}
    predicted = mm.activation_bytes(cfg, 1, "logits", act_bytes=4, vocab=vocab)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=gen, requires_grad=True)
    head = torch.nn.Linear(width, vocab, bias=False)
    y = torch.randint(0, vocab, (rows,), generator=gen)
    head.weight.grad = torch.zeros_like(head.weight)  # the gradient's memory is state, not this

    def loss():  # as the steps compute it: the logits are not held past the loss
        return torch.nn.functional.cross_entropy(head(x), y)

    loss().backward()  # once to warm up the allocator
    device.reset_peak_memory(cpu)
    base = device.peak_memory(cpu)[0]
    loss().backward()
    measured = device.peak_memory(cpu)[0] - base
    assert abs(measured - predicted) < 0.1 * predicted, (measured / 2**20, predicted / 2**20)


def test_step_12_predicts_the_loss_that_runs(monkeypatch):
    """Before a run the prediction takes Liger where the device can run it (CUDA, or a CPU
    through Triton's interpreter), step 11's full logits elsewhere (step 12's fallback is step
    11's loss); a run says which ran (Run.fused_loss), and a rung after 12 follows it too."""
    from speed_ladder.measure.inactive import liger_unavailable

    p = PRESETS["gpt2-124m"]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for dev in ("cuda", "cpu", "mps"):
        why = liger_unavailable(torch.device(dev), torch.bfloat16)  # liger-kernel installed
        assert mm.liger_runs_on(dev) == (why is None), (dev, why)
    assert mm.liger_runs_on("cuda") and not mm.liger_runs_on("cpu")
    total = lambda step, dev, **k: mm.predict_run(p, step, 1, 32, True, dev, **k).total_bytes
    assert total("12", "cpu") == total("11", "cpu")  # the fallback: step 11's computation
    assert total("12", "cuda") < total("11", "cuda") - 5 * 2**30  # no (B*T, V) logits
    assert total("12", "cuda", fused=False) == total("11", "cuda")
    assert mm.predict_run(p, "12", 1, 32, True, "cpu").kind == "logits"
    ckpt = mm.predict_run(p, "13", 1, 32, True, "cpu")
    assert ckpt.kind == "checkpointed" and ckpt.loss == "logits" and "full logits" in ckpt.line()
    logits = total("12", "cpu") - total("12", "cpu", fused=True)  # what Liger saves
    assert total("13", "cpu") - total("13", "cpu", fused=True) == logits > 5 * 2**30
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mm.liger_runs_on("cpu") and total("12", "cpu") == total("12", "cpu", fused=True)


def test_announce_predicts_the_loss_the_step_computes(monkeypatch):
    from types import SimpleNamespace

    from speed_ladder.measure.settings import resolve_spec

    cfg = {"vocab_size": mm.VOCAB, **{k: PRESETS["tiny"][k] for k in ["context_length",
           "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias"]}}  # fmt: skip
    monkeypatch.setattr(matmul_peak, "bf16_is_fast", lambda device: (False, "test"))
    model = ladder_step().GPTModel(cfg)
    kinds = {}
    spec = resolve_spec({"preset": "tiny"}, "cpu")
    quiet = SimpleNamespace(say=lambda *a: None, note=lambda *a: None)
    for ran, fused in (("liger", True), ("fallback", False)):
        fields = rank_memory.announce(spec, "12", cfg, 8, torch.device("cpu"), model, fused, quiet)
        kinds[ran] = fields["memory_model"]
    assert kinds["liger"]["kind"] == "fused" and kinds["liger"]["loss"] == "fused"
    assert kinds["fallback"]["kind"] == "logits" and kinds["fallback"]["loss"] == "logits"
    assert kinds["fallback"]["activation_bytes"] > kinds["liger"]["activation_bytes"]


def test_cpu_offload_keeps_the_state_in_host_memory():
    """The offload rung (state fsdp2-offload) on a GPU: FSDP2's shards of the rung it builds on
    in host memory, the GPU keeping its gathered copies and activations; on a CPU, where the
    state is in host memory already, the same prediction as that rung's."""
    off = ladder.first(lambda r: r.memory.state == "fsdp2-offload")
    cfg = PRESETS["gpt2-xl"]
    for world in (1, 2, 4):
        fsdp, host = (mm.predict_run(cfg, s, world, 4, True, "cuda") for s in (off.after, off.num))
        assert host.host_bytes == fsdp.state_bytes == mm.state_bytes(cfg, world, "fsdp2")["total"]
        assert host.state_bytes == 0 and host.state_bytes_per_param == 16
        assert (host.buffer_bytes, host.activation_bytes) == (
            fsdp.buffer_bytes,
            fsdp.activation_bytes,
        )
        assert "in host memory" in host.line() and "in host memory" not in fsdp.line()
        cpu = [mm.predict_run(cfg, s, world, 4, True, "cpu") for s in (off.after, off.num)]
        assert cpu[0].total_bytes == cpu[1].total_bytes and cpu[1].host_bytes == 0
