"""The CPU offload rung (FSDP2's CPUOffloadPolicy, after step 14) on a CPU with gloo: two
processes on `tiny` run the step through FSDP2's offload path (unpinned: pinning needs a CUDA
device), hold what step 14 holds and compute its losses exactly, and record the rung inactive
with its reason (on a CPU the state is in host memory already). A model whose shards sit in host
memory reads as offloaded where the run's device is a GPU (simulated here: the device is only
compared). Its record's HFU counts the forward that checkpointing runs twice."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import ROOT, VERDICT
from test_fsdp2 import STEP14, measured_state, torchrun

from speed_ladder import ladder
from speed_ladder.measure import memory_model as mm
from speed_ladder.measure.inactive import offload_moves_nothing
from speed_ladder.measure.rank_memory import detect_mode
from speed_ladder.measure.run_record import hfu_of
from speed_ladder.presets import PRESETS

OFFLOAD = ladder.first(lambda r: r.memory.state == "fsdp2-offload")
SCRIPT = str(ROOT / OFFLOAD.rel)


def test_two_processes_run_the_offload_path_and_match_step14(tmp_path):
    tiny = [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--max-steps",
        4,
        "--warmup-steps",
        1,
        "--data",
        VERDICT,
        "--batch-size",
        4,
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        f14 = pool.submit(torchrun, tmp_path, STEP14, tiny, "s14")
        off = pool.submit(torchrun, tmp_path, SCRIPT, tiny, "off")
        r14, rec = f14.result(), off.result()
    assert OFFLOAD.after == r14["step"] and rec["step"] == OFFLOAD.num
    assert rec["status"] == "ok" and rec["world_size"] == 2
    assert rec["losses"] == r14["losses"]  # its parity rule: exact on a CPU
    assert rec["step_active"] is False
    assert rec["inactive_reason"] == offload_moves_nothing(torch.device("cpu"))
    assert rec["memory_model"]["mode"] == "fsdp2" and rec["memory_model"]["host_bytes"] == 0
    state = mm.state_bytes(PRESETS["tiny"], 2, "fsdp2")["total"]
    assert measured_state(rec) == rec["predicted_state_bytes_per_rank"] == state
    assert offload_moves_nothing(torch.device("cuda")) is None
    for r in (r14, rec):  # both checkpoint their blocks: HFU counts the forward run twice
        assert r["mfu"] is None or r["hfu"] == pytest.approx(r["mfu"] * recompute_ratio(), abs=2e-5)


def recompute_ratio(cfg=PRESETS["tiny"], vocab=mm.VOCAB) -> float:
    """(6N + 12LHQT + 2 N_blocks + 4LHQT) / (6N + 12LHQT) for the ladder's model of `cfg`: its
    matmul parameters N (embeddings left out), N_blocks of them in the blocks."""
    c = {**cfg, "vocab_size": vocab}
    pc = mm.param_counts(c, vocab)
    n = pc["total"] - (vocab + c["context_length"]) * c["emb_dim"]
    attn = c["n_layers"] * c["context_length"] * c["emb_dim"]  # L*H*Q*T
    model = 6 * n + 12 * attn
    return (model + 2 * c["n_layers"] * pc["block"] + 4 * attn) / model


def test_hfu_is_left_out_where_nothing_is_recomputed():
    cfg = {**PRESETS["tiny"], "vocab_size": mm.VOCAB}
    pc = mm.param_counts(cfg)
    flops = 6 * (pc["total"] - (mm.VOCAB + cfg["context_length"]) * cfg["emb_dim"])
    flops += 12 * cfg["n_layers"] * cfg["context_length"] * cfg["emb_dim"]
    assert hfu_of(0.3, OFFLOAD.num, cfg, flops) == pytest.approx(0.3 * recompute_ratio())
    assert hfu_of(None, OFFLOAD.num, cfg, flops) is None
    fused = ladder.first(lambda r: r.memory.loss == "fused").num  # no checkpointing yet
    assert hfu_of(0.3, fused, cfg, flops) is None
    assert hfu_of(0.3, "not a rung", cfg, flops) is None


def test_shards_in_host_memory_read_as_offloaded_on_a_gpu():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        assert detect_mode(model, torch.device("cuda")) == "fsdp2-offload"
        assert detect_mode(model, torch.device("cpu")) == "fsdp2"
        assert detect_mode(torch.nn.Linear(4, 4), torch.device("cuda")) == "single"
    finally:
        dist.destroy_process_group()
