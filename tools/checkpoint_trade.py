"""Measure step 13's trade: activation memory saved against extra compute, on a config where
activations dominate (8 layers, 256 wide, context 256, batch 16, a 256-token vocabulary, so no
large logits). Prints one JSON line per step file: peak-RSS growth of a training step (the
harness's CPU memory measure) and its median time.

    python tools/checkpoint_trade.py steps/12_liger_fused_ce.py steps/13_gradient_checkpointing.py
"""

import ctypes
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CFG = dict(vocab_size=256, context_length=256, emb_dim=256, n_heads=4, n_layers=8,
           drop_rate=0.0, qkv_bias=False)  # fmt: skip


def measure(step_file: str) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from harness import device as dev

    spec = importlib.util.spec_from_file_location("step", step_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.GPTModel(CFG).train()
    x = torch.randint(0, CFG["vocab_size"], (16, CFG["context_length"]))

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
    for _ in range(5):
        t0 = time.perf_counter()
        train_step()
        times.append(time.perf_counter() - t0)
    return {"step_file": step_file, "peak_rss_growth_bytes": delta,
            "step_ms": round(statistics.median(times) * 1000, 1)}  # fmt: skip


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2])))
        return
    for f in sys.argv[1:]:  # each in a fresh process: peak RSS is per process
        subprocess.run([sys.executable, __file__, "--one", f], check=True)


if __name__ == "__main__":
    main()
