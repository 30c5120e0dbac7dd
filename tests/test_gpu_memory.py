"""The memory ladder on a CUDA GPU (`pytest -m gpu`; skipped without one): the offload rung keeps
its state in host memory and `--memory-snapshot` writes the timeline pytorch.org/memory_viz
draws; slow: the largest batch `fit` says fits trains, and twice that batch either trains too or
ends in one out-of-memory line, the finished record kept."""

import pickle
import sys

import pytest
import torch
from conftest import ROOT, records, run_script

from speed_ladder import ladder
from speed_ladder.measure import fit
from speed_ladder.measure import memory_model as mm
from speed_ladder.presets import PRESETS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
EAGER = {"TORCHDYNAMO_DISABLE": "1"}
OFFLOAD = ladder.first(lambda r: r.memory.state == "fsdp2-offload")
CKPT = ladder.first(lambda r: r.memory.checkpointing)


def _run(script, res, *flags):
    return run_script(
        [
            sys.executable,
            ROOT / script,
            "--device",
            "cuda",
            "--results",
            res,
            "--max-steps",
            4,
            "--warmup-steps",
            2,
            *flags,
        ],
        timeout=900,
        env=EAGER,
    )


@pytest.mark.timeout(300)
def test_offload_keeps_the_state_in_host_memory_and_a_snapshot_is_written(tmp_path):
    snap = tmp_path / "s.pickle"
    proc = _run(OFFLOAD.rel, tmp_path / "r.jsonl", "--preset", "tiny", "--memory-snapshot", snap)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = records(tmp_path / "r.jsonl")
    assert rec["step_active"] is True, rec["inactive_reason"]  # a world of one on a GPU: active
    assert (
        rec["memory_model"]["mode"] == "fsdp2-offload" and rec["memory_model"]["state_bytes"] == 0
    )
    assert rec["memory_model"]["host_bytes"] == mm.state_bytes(PRESETS["tiny"], 1, "fsdp2")["total"]
    with open(snap, "rb") as f:
        data = pickle.load(f)
    assert data["segments"] and data["device_traces"][0], list(data)
    assert any("memory snapshot: " in n for n in rec["notes"])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_batch_fit_says_fits_trains_and_twice_it_fails_in_one_line(tmp_path):
    gpu = torch.cuda.get_device_properties(0).total_memory
    rung = next(r for r in fit.rungs() if r.step == CKPT.num)
    batch = fit.fit_row(rung, gpu).batches["gpt2-large"]
    assert batch > 0, "no batch of gpt2-large fits this GPU by the memory model"
    res = tmp_path / "r.jsonl"
    from speed_ladder.measure.data import read_text

    flags = ["--preset", "gpt2-large", "--data", read_text(None)[1]]  # Middlemarch: enough windows
    ok = _run(CKPT.rel, res, *flags, "--batch-size", batch)
    assert ok.returncode == 0, ok.stderr[-3000:]
    (rec,) = records(res)
    print(
        f"fit's batch {batch}: peak {rec['peak_mem_reserved_bytes'] / 2**30:.2f} GiB of "
        f"{gpu / 2**30:.2f}, predicted {rec['predicted_peak_bytes_per_rank'] / 2**30:.2f}"
    )
    big = _run(CKPT.rel, res, *flags, "--batch-size", 2 * batch)
    recs = records(res)
    assert recs[0] == rec  # the finished record kept
    if big.returncode != 0:
        assert big.returncode == 3 and recs[-1]["status"] == "oom", big.stderr[-3000:]
        assert big.stderr.strip().splitlines()[-1].startswith("error: out of memory")
        assert "Traceback" not in big.stderr
