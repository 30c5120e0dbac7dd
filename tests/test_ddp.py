"""Step 11 under stock torchrun on CPU (gloo): 2 processes (equal weights, per-rank dropout
seeds), a simulated 2-node job, a failing rank.

The runs use TORCH_COMPILE_DISABLE=1 to stay within the suite's time budget (a cold compile costs
about a minute per process on 2 cores); the slow ladder tests cover DDP with compile.
"""

import json
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT, VERDICT, records, run_script

from speed_ladder import parity

DDP = str(ROOT / "steps" / "11_ddp.py")
EAGER = {"TORCH_COMPILE_DISABLE": "1"}
TINY = ["--preset", "tiny", "--device", "cpu", "--max-steps", 4, "--warmup-steps", 1,
        "--data", VERDICT]  # fmt: skip
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_logger(tmp_path):
    """Step 11 with Run.set_model (called right before the training loop) noting each rank's
    seed and a checksum of its weights."""
    wrapper = tmp_path / "seeds.py"
    wrapper.write_text(
        "import json, os, runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import torch, speed_ladder.measure.run\n"
        "original = speed_ladder.measure.run.Run.set_model\n"
        "def set_model(self, model, *a, **k):\n"
        "    total = sum(p.detach().double().sum().item() for p in model.parameters())\n"
        "    line = dict(rank=int(os.environ.get('RANK', 0)), seed=torch.initial_seed(),\n"
        "                weights=total)\n"
        f"    with open({str(tmp_path / 'seeds.jsonl')!r}, 'a') as f:\n"
        "        f.write(json.dumps(line) + '\\n')\n"
        "    return original(self, model, *a, **k)\n"
        "speed_ladder.measure.run.Run.set_model = set_model\n"
        f"sys.argv[0] = {DDP!r}\n"
        f"runpy.run_path({DDP!r}, run_name='__main__')\n"
    )
    return wrapper


def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    # tiny's step-11 batch is 8 per process: 2 processes x 4 = 1 process x 8, the same windows
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    p1 = run_script([sys.executable, DDP, *TINY, "--batch-size", 8, "--results", one], env=EAGER)
    assert p1.returncode == 0, p1.stderr[-2000:]
    p2 = run_script([*TORCHRUN, "--standalone", "--nproc_per_node=2", seed_logger(tmp_path),
                     *TINY, "--batch-size", 4, "--results", two],
                    env=EAGER, timeout=600)  # fmt: skip
    assert p2.returncode == 0, p2.stderr[-3000:]
    # the same weights on both ranks (the common seed), then each its own dropout stream
    seeds = sorted(records(tmp_path / "seeds.jsonl"), key=lambda r: r["rank"])
    assert [r["seed"] for r in seeds] == [123, 124]
    assert seeds[0]["weights"] == seeds[1]["weights"]
    (r1,), (r2,) = records(one), records(two)  # rank 0 alone writes the record
    assert r2["status"] == "ok" and r2["world_size"] == 2 and r1["world_size"] == 1
    assert r2["tokens_per_step"] == 2 * 4 * 32 == r1["tokens_per_step"]  # global tokens
    assert r2["tokens_per_sec"] == pytest.approx(
        r2["tokens_per_step"] / r2["step_time_ms"] * 1e3, rel=1e-3
    )
    # mean of rank means == the global mean, up to the order of the sums: the regime's tolerance
    # (bf16 where this CPU has it natively: step 05's rule)
    atol = parity.regime_atol(r1["regime"], r2["regime"])
    worst = max(abs(a - b) for a, b in zip(r1["losses"], r2["losses"], strict=True))
    assert worst <= atol, (r1["regime"], r1["losses"], r2["losses"])
    assert len(r2["peak_mem_reserved_per_rank"]) == 2
    assert r2["peak_mem_reserved_bytes"] == max(r2["peak_mem_reserved_per_rank"])


@pytest.mark.slow  # two torchrun agents and a c10d rendezvous: 12 s
def test_simulated_two_node_job_with_c10d_rendezvous(tmp_path):
    res = tmp_path / "r.jsonl"
    port = free_port()
    node = [*TORCHRUN, "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=ladder-test", "--max-restarts=0",
            DDP, *TINY, "--batch-size", 4, "--results", res]  # fmt: skip
    node = [str(a) for a in node]
    env = {**__import__("os").environ, **EAGER}
    procs = [subprocess.Popen(node, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]  # fmt: skip
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    (rec,) = records(res)
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["tokens_per_step"] == 256


def test_a_failing_rank_ends_the_job_promptly(tmp_path):
    # rank 1 raises once the model is built; rank 0 would wait for it in the first all-reduce
    wrapper = tmp_path / "fail_rank1.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import speed_ladder.measure.run\n"
        "if os.environ.get('RANK') == '1':\n"
        "    def boom(self, *a, **k):\n"
        "        raise RuntimeError('injected failure on rank 1')\n"
        "    speed_ladder.measure.run.Run.set_model = boom\n"
        f"sys.argv[0] = {DDP!r}\n"
        f"runpy.run_path({DDP!r}, run_name='__main__')\n"
    )
    t0 = time.monotonic()
    proc = run_script([*TORCHRUN, "--standalone", "--nproc_per_node=2", wrapper, *TINY,
                       "--batch-size", 4], env=EAGER, timeout=300)  # fmt: skip
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr + proc.stdout
    assert elapsed < 120, f"took {elapsed:.0f} s"


def test_rank_0_measures_the_matmul_peak_for_every_rank(tmp_path):
    """Two gloo ranks ask for the CPU matmul rates (step 05's bf16 rule, the MFU peak): rank 0
    alone measures, and both take its rates, whatever the other would have measured; the second
    ask is no collective. The matmuls are stand-ins that give each rank its own rate."""
    script = tmp_path / "rates.py"
    script.write_text(
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import torch, torch.distributed as dist\n"
        "from speed_ladder.measure import cpu_load, matmul_peak\n"
        "rank = int(os.environ['RANK'])\n"
        "def rate(device, dtype):\n"
        f"    with open({str(tmp_path / 'measured')!r}, 'a') as f:\n"
        "        f.write(f'{rank}\\n')\n"
        "    return (7e10 if dtype == torch.float32 else 2e9) * (1 + rank)\n"
        "matmul_peak._matmul_rate = rate\n"
        "cpu_load.is_busy = lambda others: False  # another test's load: still cached here\n"
        "dist.init_process_group('gloo')\n"
        "cpu = torch.device('cpu')\n"
        "got = [matmul_peak.measured_matmul_rates(cpu) for _ in range(2)]\n"
        f"open({str(tmp_path)!r} + f'/rank{{rank}}.json', 'w').write(json.dumps(got))\n"
        "dist.destroy_process_group()\n"
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = run_script([*TORCHRUN, "--standalone", "--nproc_per_node=2", script],
                      env={"SPEED_LADDER_CACHE": str(cache), "SPEED_LADDER_PEAK_FLOPS": None},
                      timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "measured").read_text().split() == ["0", "0"]  # fp32 and bf16, rank 0
    rank0 = {"fp32": 7e10, "bf16": 2e9}
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [rank0, rank0]
    assert list(json.loads((cache / "matmul_peak.json").read_text()).values()) == [rank0]


def test_a_world_of_one_is_not_wrapped_in_ddp(eager, monkeypatch, tmp_path):
    """Under plain python (one process) step 11 does not wrap the model: no replica to average
    with, and DDP's hooks cost about 2 ms a step on an H200 (step 12's sweep record).
    The record says why the step is inactive; two processes wrap it (the test above: their
    losses match one process only because gradients are all-reduced)."""
    import torch.nn.parallel
    from conftest import load_script

    def refuse(*a, **k):
        raise AssertionError("DDP wrapped a world of one")

    monkeypatch.setattr(torch.nn.parallel.DistributedDataParallel, "__init__", refuse)
    out = tmp_path / "r.jsonl"
    argv = ["11", *map(str, TINY), "--max-steps", "2", "--results", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    load_script("steps/11_ddp.py").main()
    rec = records(out)[0]
    assert rec["status"] == "ok" and rec["world_size"] == 1
    assert "DDP does not wrap the model" in rec["inactive_reason"]
