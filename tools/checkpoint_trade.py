"""Measure step 13's trade: activation memory saved against extra compute, on a config where
activations dominate (8 layers, 256 wide, context 256, batch 16, a 256-token vocabulary, so no
large logits). Prints one JSON line per step file: peak-RSS growth of a training step (the
harness's CPU memory measure) and its median time.

    python tools/checkpoint_trade.py steps/12_liger_fused_ce.py steps/13_gradient_checkpointing.py
    python tools/checkpoint_trade.py --quick steps/12_liger_fused_ce.py   # seconds: a smoke test
"""

import argparse
import ctypes
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
CFG = dict(vocab_size=256, context_length=256, emb_dim=256, n_heads=4, n_layers=8,
           drop_rate=0.0, qkv_bias=False)  # fmt: skip
BATCH, TIMED = 16, 5
QUICK = dict(CFG, context_length=32, emb_dim=64, n_layers=2), 2, 1  # config, batch, timed steps


def measure(step_file: str, quick: bool = False) -> dict:
    import torch

    from speed_ladder.measure import device as dev

    cfg, batch, timed = QUICK if quick else (CFG, BATCH, TIMED)
    spec = importlib.util.spec_from_file_location("step", step_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.GPTModel(cfg).train()
    x = torch.randint(0, cfg["vocab_size"], (batch, cfg["context_length"]))

    def train_step():
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
        model.zero_grad(set_to_none=False)

    cpu = torch.device("cpu")
    train_step()  # first-call set-up (thread pools, kernel workspaces) stays out of the window
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed activations back: RSS starts low
    dev.reset_peak_memory(cpu)
    base = dev.peak_memory(cpu)[0]
    train_step()
    delta = dev.peak_memory(cpu)[0] - base
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        train_step()
        times.append(time.perf_counter() - t0)
    return {"step_file": step_file, "peak_rss_growth_bytes": delta,
            "step_ms": round(statistics.median(times) * 1000, 1)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("step_files", nargs="+", metavar="STEP_FILE")
    p.add_argument(
        "--quick", action="store_true", help="a tiny config and one timed step: checks, no numbers"
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # measure in here
    a = p.parse_args()
    if a.one:
        for f in a.step_files:
            print(json.dumps(measure(f, a.quick)))
        return
    for f in a.step_files:  # each in a fresh process: peak RSS is per process
        one = [sys.executable, __file__, "--one", *(["--quick"] if a.quick else []), f]
        subprocess.run(one, check=True)


if __name__ == "__main__":
    main()
