"""Evidence for step 14: FSDP2 against DDP, and its mixed-precision choice, measured.

Trains step 14's model (steps/14_fsdp2.py: its GPTModel and fused loss, eager) for N steps on
the same batches in each set-up, each in fresh processes under torchrun (gloo on CPU, nccl on
CUDA), and prints one JSON line per set-up (rank 0's view, per-rank lists where they differ):
- ddp: step 13's DistributedDataParallel;
- fsdp2: step 14 as written (autocast as step 05 chooses, fp32 all-gather and reduce-scatter);
- fsdp2-mp: FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torchtitan's
  default (bf16 compute and all-gather; the autocast context is kept).
It reports the per-step losses and the largest |loss - ddp's|, the median step time, each rank's
peak memory over the steps after the first (CUDA: max allocated; CPU: peak RSS), the measured bytes
of state a rank holds (local params, grads and AdamW moments) against
speed_ladder.measure.memory_model's prediction, and the bytes each rank puts into collectives per
step (all-reduce for DDP, all-gather and reduce-scatter for FSDP2).

    python tools/fsdp2_evidence.py --nproc 2 --device cpu          # tiny, 8 steps
    python tools/fsdp2_evidence.py --nproc 2 --device cpu --bf16   # autocast on anyway
    python tools/fsdp2_evidence.py --nproc 2 --preset cpu --steps 3 --variants ddp fsdp2
"""

import argparse
import datetime
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ["ddp", "fsdp2", "fsdp2-mp"]


def load_step14():
    spec = importlib.util.spec_from_file_location("step14", ROOT / "steps" / "14_fsdp2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def one(a) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(ROOT))
    from speed_ladder.measure import device as dev
    from speed_ladder.measure import matmul_peak, rank_memory
    from speed_ladder.measure import memory_model as mm
    from speed_ladder.measure.data import load_split
    from speed_ladder.measure.inactive import liger_unavailable
    from speed_ladder.presets import PRESETS

    s14 = load_step14()
    device = dev.resolve(a.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(minutes=10)
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    world, rank = dist.get_world_size(), dist.get_rank()

    P = PRESETS[a.preset]
    cfg = {"vocab_size": mm.VOCAB, **{k: P[k] for k in ["context_length", "emb_dim", "n_heads",
           "n_layers", "drop_rate", "qkv_bias"]}}  # fmt: skip
    batch = P["large_batch_size"]
    train, _ = load_split(a.data, cfg["context_length"], batch, world)
    loader = s14.create_dataloader(
        train, batch, cfg["context_length"], True, True, 123, workers=0, pin_memory=False
    )

    sent = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0}

    def nbytes(t):
        return t.numel() * t.element_size()

    # Count what FSDP2 calls, by wrapping exactly that name: *_single where torch has it (2.13,
    # whose deprecated *_into_tensor / reduce_scatter_tensor call *_single, so wrapping both would
    # count twice), else the older names (2.11), which take the same (output, input): the
    # gathered whole out of an all-gather, the unscattered whole into a reduce-scatter.
    new = hasattr(dist, "all_gather_single")
    ag_name = "all_gather_single" if new else "all_gather_into_tensor"
    rs_name = "reduce_scatter_single" if new else "reduce_scatter_tensor"
    ag, rs = getattr(dist, ag_name), getattr(dist, rs_name)

    def all_gather(output, input, *args, **kw):
        sent["all_gather"] += nbytes(output)
        return ag(output, input, *args, **kw)

    def reduce_scatter(output, input, *args, **kw):
        sent["reduce_scatter"] += nbytes(input)
        return rs(output, input, *args, **kw)

    setattr(dist, ag_name, all_gather)
    setattr(dist, rs_name, reduce_scatter)

    def allreduce_hook(state, bucket):
        sent["all_reduce"] += nbytes(bucket.buffer())
        return default_hooks.allreduce_hook(state, bucket)

    torch.manual_seed(123)
    model = s14.GPTModel(cfg).to(device)
    out_head = model.out_head
    if a.variant == "ddp":
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        model.register_comm_hook(None, allreduce_hook)
    else:
        mp = MixedPrecisionPolicy()
        if a.variant == "fsdp2-mp":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = init_device_mesh(device.type, (world,))
        for block in model.trf_blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=P["lr"], weight_decay=P["weight_decay"],
                            fused=True)  # fmt: skip
    use_bf16 = a.bf16 or matmul_peak.bf16_is_fast(device)[0]
    # step 12's loss (Liger's, or step 11's where Liger cannot run), under autocast as the step
    # calls it (the mixed-precision variant's bf16 logits too: its loss in fp32); eager
    loss_autocast = use_bf16 or a.variant == "fsdp2-mp"
    dtype = torch.bfloat16 if loss_autocast else torch.float32
    if liger_unavailable(device, dtype) is None:  # as step 14 builds it
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        fused_ce = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)
    else:  # step 11's: out_head, then the cross-entropy of the full logits
        F = torch.nn.functional
        fused_ce = lambda weight, hidden, y: F.cross_entropy(F.linear(hidden, weight), y)

    losses, times, state = [], [], None
    t_last = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        if i == a.steps:
            break
        if i == 1:  # the harness's window: after the first (warm-up) step
            sent = dict.fromkeys(sent, 0)
            dev.synchronize(device)
            dev.reset_peak_memory(device)
            t_last = time.perf_counter()
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            hidden = model(x, return_hidden=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=loss_autocast):
            with torch.compiler.set_stance("force_eager"):
                loss = fused_ce(out_head.weight, hidden.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        state = rank_memory.local_state_bytes(model, opt)  # grads still set: the full state
        lt = torch.tensor([loss.item()], dtype=torch.float64, device=device)
        dist.all_reduce(lt)
        losses.append(lt.item() / world)
        dev.synchronize(device)
        now = time.perf_counter()
        if i >= 1:
            times.append(now - t_last)
        t_last = now
    peak = dev.peak_memory(device)
    peak = peak[1] if device.type == "cuda" else peak[0]
    mode = "ddp" if a.variant == "ddp" else "fsdp2"
    per_rank = torch.tensor([[peak, state, *sent.values()]], dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(per_rank) for _ in range(world)]
    dist.all_gather(gathered, per_rank)
    rows = [[int(v) for v in g[0].tolist()] for g in gathered]
    steps_timed = max(1, a.steps - 1)
    out = {
        "variant": a.variant,
        "preset": a.preset,
        "world_size": world,
        "device": device.type,
        "autocast_bf16": use_bf16,
        "losses": losses,
        "step_ms_median": round(statistics.median(times) * 1000, 1) if times else None,
        "peak_bytes_per_rank": [r[0] for r in rows],
        "state_bytes_per_rank": [r[1] for r in rows],
        "predicted_state_bytes_per_rank": mm.state_bytes(cfg, world, mode)["total"],
        "collective_bytes_per_step_per_rank": {
            k: round(rows[0][2 + j] / steps_timed) for j, k in enumerate(sent)
        },
    }
    # Drop DDP's reducer while the process group is alive: destroyed last, it would join gloo's
    # worker thread while holding the GIL that thread needs to free a finished work's tensors.
    del model, opt, fused_ce
    gc.collect()
    dist.destroy_process_group()
    return out if rank == 0 else {}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--one", dest="variant", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    ap.add_argument("--nproc", type=int, default=2, help="processes per set-up (default 2)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--bf16", action="store_true", help="autocast bf16 even where it is slow")
    ap.add_argument(
        "--data", metavar="PATH", help="training text (default: the steps' data/middlemarch.txt)"
    )
    a = ap.parse_args()
    if a.variant:
        rec = one(a)
        if rec:
            print(json.dumps(rec), flush=True)
        return
    flags = ["--device", a.device, "--preset", a.preset, "--steps", str(a.steps)]
    flags += ["--data", a.data] if a.data else []
    flags += ["--bf16"] if a.bf16 else []
    ddp_losses = None
    for v in a.variants:  # fresh processes per set-up: peak RSS is per process
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={a.nproc}", __file__, "--one", v, *flags]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"{v} failed:\n{proc.stderr[-3000:]}")
        rec = json.loads(proc.stdout.strip().splitlines()[-1])
        if v == "ddp":
            ddp_losses = rec["losses"]
        if ddp_losses is not None:
            rec["max_abs_loss_diff_vs_ddp"] = max(
                abs(p - q) for p, q in zip(rec["losses"], ddp_losses, strict=True)
            )
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
