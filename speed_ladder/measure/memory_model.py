"""Predict a rank's memory before a run: model state, communication buffers, activations.

State is 16 B per parameter (fp32 weight, gradient and AdamW's two moments; 20 with step 15's
bf16 weights), split over the ranks by FSDP2; activations follow Korthikanti et al. 2022, eq. 1,
plus the output layer's logits (or Liger's chunk of them). The sum is an upper bound of the
peak. How each term is counted and how close it comes: docs/memory.md. `python -m
speed_ladder.measure.memory_model` prints the prediction per preset."""

import argparse
import importlib.util
import math
import os
import sys
from dataclasses import dataclass

from speed_ladder import ladder
from speed_ladder.ladder import Memory
from speed_ladder.presets import GPT2_VOCAB, PRESETS

PREDICTED_ENV = "SPEED_LADDER_PREDICTED"  # set by the sweep, which printed the prediction itself
VOCAB = 50304  # step 09 on: GPT-2's 50257 padded to a multiple of 64
FP32 = 4
# Liger's default, which its public module (step 12's) uses: _CHUNK_MEM_CONST of its
# ops/fused_linear_cross_entropy.py (a test checks it against the installed liger-kernel)
LIGER_CHUNK_MEM_CONST = 1
GIB = 2**30
GPT2_FAMILY = ["gpt2-124m", "gpt2-medium", "gpt2-large", "gpt2-xl"]
SHARDED = ("fsdp2", "fsdp2-offload")  # the states FSDP2 splits over the world
CUDA_OVERHEAD = GIB  # CUDA context, cuBLAS/cuDNN workspaces: outside the allocator's peak
HEADROOM = 0.10  # allocator fragmentation: reserved exceeds allocated by some percent


# ---------------------------------------------------------------- parameters
def param_counts(cfg: dict, vocab: int = VOCAB) -> dict:
    """Parameters of the ladder's GPTModel, per group: root (embeddings, final norm, out_head;
    out_head is not tied to the token embedding) and one transformer block."""
    C, T = cfg["emb_dim"], cfg["context_length"]
    qkv = 3 * (C * C + (C if cfg.get("qkv_bias") else 0))
    attn = qkv + C * C + C  # W_query/W_key/W_value, out_proj (with bias)
    ff = C * 4 * C + 4 * C + 4 * C * C + C
    block = attn + ff + 2 * 2 * C  # + norm1, norm2 (scale and shift)
    root = vocab * C + T * C + 2 * C + vocab * C
    return {"root": root, "block": block, "total": root + cfg["n_layers"] * block}


def _shapes(cfg: dict, vocab: int = VOCAB) -> list[tuple[int, int]]:
    """(rows, numel) of every parameter: FSDP2 shards each on dim 0."""
    C, T = cfg["emb_dim"], cfg["context_length"]
    block = [(C, C * C)] * 3 + [(C, C)] * (3 if cfg.get("qkv_bias") else 0)
    block += [(C, C * C), (C, C), (4 * C, 4 * C * C), (4 * C, 4 * C), (C, 4 * C * C), (C, C)]
    block += [(C, C)] * 4
    root = [(vocab, vocab * C), (T, T * C), (C, C), (C, C), (vocab, vocab * C)]
    return root + block * cfg["n_layers"]


def shard_numel(cfg: dict, world: int, vocab: int = VOCAB) -> int:
    """Elements of rank 0's FSDP2 shards (the largest): ceil(rows / world) rows per parameter."""
    return sum(math.ceil(rows / world) * (numel // rows) for rows, numel in _shapes(cfg, vocab))


# ---------------------------------------------------------------- state
def state_bytes(cfg: dict, world: int, mode: str, vocab: int = VOCAB) -> dict:
    """Per-rank bytes of params, grads and AdamW moments (fp32), for a mode of ladder.TERMS'
    `state` (single, ddp, fsdp2, fsdp2-offload: wherever they are kept)."""
    if mode not in ("single", "ddp", *SHARDED):
        raise ValueError(f"mode {mode!r}: single, ddp, {' or '.join(SHARDED)}")
    n = shard_numel(cfg, world, vocab) if mode in SHARDED else param_counts(cfg, vocab)["total"]
    out = {"params": FP32 * n, "grads": FP32 * n, "optimizer": 2 * FP32 * n}
    out["total"] = sum(out.values())
    return out


def buffer_bytes(cfg: dict, world: int, mode: str, vocab: int = VOCAB, grad_bytes=FP32) -> int:
    """Communication buffers and gathered copies on top of the state; grad_bytes: a gradient's
    (2 with step 15's bf16 weights)."""
    pc = param_counts(cfg, vocab)
    if mode == "ddp":  # gradient buckets; a world of one is not wrapped in DDP (step 11)
        return grad_bytes * pc["total"] if world > 1 else 0
    if mode in SHARDED:
        root = 2 * FP32 * pc["root"]  # gathered root params + their full grads
        blocks = (2 + 1) * FP32 * pc["block"] if cfg["n_layers"] else 0
        return root + blocks
    return 0


# ---------------------------------------------------------------- activations
def liger_chunk_rows(rows: int, dim: int, vocab: int, chunk_mem_const: int = LIGER_CHUNK_MEM_CONST):
    """Step 12's rows per Liger chunk: Liger's rule (ops/fused_linear_cross_entropy.py): a
    chunk's logits hold about chunk_mem_const x rows x dim numbers, its rows a power of 2."""
    inc_factor = -(-vocab // (chunk_mem_const * dim))
    return min(1 << (-(-rows // inc_factor) - 1).bit_length(), rows)


ACTIVATION_KINDS = ("logits", "fused", "checkpointed")


def liger_runs_on(device_type: str) -> bool:
    """Whether step 12's Liger can run on this device type, torch-free (inactive.py's rule: a
    test checks that they agree): CUDA, or a CPU under Triton's interpreter, both installed."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    where = device_type == "cuda" or (device_type == "cpu" and interpreted)
    found = lambda m: m in sys.modules or importlib.util.find_spec(m) is not None
    return where and found("liger_kernel") and found("triton")


def activation_bytes(
    cfg: dict,
    batch: int,
    kind: str,
    act_bytes: int = 2,
    flash: bool = True,
    vocab: int = VOCAB,
    loss_bytes: int = FP32,
    fused: bool | None = None,
) -> int:
    """Korthikanti et al. 2022 eq. 1 per layer at act_bytes per element, plus the output
    layer's: its full logits in loss_bytes (`kind` logits, or `fused` False) or Liger's chunk."""
    if kind not in ACTIVATION_KINDS:
        raise ValueError(f"kind {kind!r}: one of {ACTIVATION_KINDS}")
    s, b, h, a, L = cfg["context_length"], batch, cfg["emb_dim"], cfg["n_heads"], cfg["n_layers"]
    mask = 1 if cfg.get("drop_rate", 0) > 0 else 0
    layer = s * b * h * (16 * act_bytes + 2 * mask)
    if not flash:  # scores, softmax, dropout mask and output, per head: (B, H, T, T)
        layer += a * s * s * b * (2 * act_bytes + mask)
    rows = b * s
    if kind == "logits" or fused is False:
        out = rows * vocab * 3 * loss_bytes  # backward: saved log-softmax, 2 gradients
    else:  # Liger's chunk of logits, and the gradients it holds from forward to backward
        liger = liger_chunk_rows(rows, h, vocab) * vocab * act_bytes
        out = liger + vocab * h * FP32 + rows * h * act_bytes
    if kind == "checkpointed":
        return L * s * b * h * FP32 + layer + out  # block inputs (fp32) + one recomputed block
    return L * layer + out


# ---------------------------------------------------------------- one prediction
@dataclass
class Prediction:
    preset: str
    world: int
    mode: str
    kind: str  # Memory.activations: logits, fused, checkpointed (logits: Liger's fallback ran)
    batch: int
    act_bytes: int
    params: int
    state_bytes: int
    buffer_bytes: int
    activation_bytes: int
    loss: str = "logits"  # the output layer: "fused" (Liger's chunks) or "logits" (full)
    micro_batches: int = 1  # step 18: the batch in this many parts, activations for one
    host_bytes: int = 0  # step 21: the state FSDP2 offloads to host memory (per rank)

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.buffer_bytes + self.activation_bytes

    @property
    def state_bytes_per_param(self) -> int:
        """16, or 20 with step 15's fp32 gradient buffers (FSDP2: per parameter of the model,
        before the split over the world)."""
        shards = self.world if self.mode in SHARDED else 1
        held = self.state_bytes + self.host_bytes
        return round(held * shards / self.params) if self.params else 16

    def line(self) -> str:
        g = lambda x: f"{x / GIB:.2f} GiB"
        return (
            f"predicted per rank ({self.preset}, {self.mode}, {self.world} process"
            f"{'es' if self.world > 1 else ''}, batch {self.batch}"
            f"{f' in {self.micro_batches} micro-batches' if self.micro_batches > 1 else ''}): "
            f"state {g(self.state_bytes)}"
            f" (params, grads, AdamW: {self.state_bytes_per_param} B x "
            f"{self.params / 1e6:.0f}M params{f' / {self.world}' if self.mode in SHARDED else ''}"
            f"{', in host memory' if self.host_bytes else ''}), buffers "
            f"{g(self.buffer_bytes)}, activations {g(self.activation_bytes)} ({self.kind}"
            f"{', full logits' if self.kind == 'checkpointed' and self.loss == 'logits' else ''}), "
            f"total {g(self.total_bytes)}"
        )


def predict(
    preset: str | dict,
    world: int = 1,
    step: str | None = None,
    batch: int | None = None,
    act_bytes: int = 2,
    flash: bool = True,
    mode: str | None = None,
    vocab: int = VOCAB,
    fused: bool | None = None,
    memory: Memory | None = None,
) -> Prediction:
    """The prediction for one ladder step (default: the last) on one preset (name or dict) and
    world size; `fused` False: step 12's fallback (the full logits) in place of Liger's;
    `memory`: terms of the ladder's rungs combined (measure/fit.py) in place of the step's."""
    m = memory or ladder.rung(step or ladder.rungs()[-1].num).memory
    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    name = preset if isinstance(preset, str) else "custom"
    mode = mode or m.state
    kind = "logits" if m.activations == "fused" and fused is False else m.activations
    fused = m.loss == "fused" and fused is not False
    if batch is None:
        batch = cfg[m.batch]
    k = m.micro_batches(cfg.get("accum_steps", 1), batch)  # step 18: one micro-batch's activations
    cfg = {**cfg, "drop_rate": m.drop_rate(cfg)}  # step 16 on: no masks
    # bf16 weights (where bf16 is on): no autocast copies, bf16 gradients in DDP's buckets
    bf16_weights = act_bytes == 2 and m.bf16_weights
    params = param_counts(cfg, vocab)["total"]
    state = state_bytes(cfg, world, mode, vocab)["total"] + (FP32 * params if bf16_weights else 0)
    host = state if mode == "fsdp2-offload" else 0  # step 21: the state in host memory
    return Prediction(
        preset=name,
        world=world,
        mode=mode,
        kind=kind,
        batch=batch,
        act_bytes=act_bytes,
        params=params,
        state_bytes=state - host,  # + step 15's fp32 gradient buffers
        buffer_bytes=buffer_bytes(cfg, world, mode, vocab, 2 if bf16_weights else FP32),
        activation_bytes=activation_bytes(
            cfg, batch // k, kind, act_bytes, flash, vocab, fused=fused
        )
        + (autocast_copy_bytes(cfg, vocab) if act_bytes == 2 and not bf16_weights else 0),
        loss="fused" if fused else "logits",
        micro_batches=k,
        host_bytes=host,
    )


def autocast_copy_bytes(cfg: dict, vocab: int = VOCAB) -> int:
    """The bf16 copies autocast makes of the weights it casts (all but the embeddings)."""
    return 2 * (
        param_counts(cfg, vocab)["total"] - (vocab + cfg["context_length"]) * cfg["emb_dim"]
    )


def fits(pred: Prediction, gpu_bytes: float) -> bool:
    """A GPU of gpu_bytes holds the prediction with the CUDA context and 10% headroom."""
    return pred.total_bytes * (1 + HEADROOM) + CUDA_OVERHEAD <= gpu_bytes


def breakdown_table(steps=None, gpus=(1, 4)) -> str:
    """Markdown: predicted GiB per rank, state + buffers + activations, per GPT-2 preset; by
    default for the last rung that shards its state (FSDP2) and the rung it builds on."""
    if steps is None:
        sharding = [r for r in ladder.rungs() if r.memory.state == "fsdp2"]
        last = (sharding or list(ladder.rungs()))[-1]
        steps = [last.after, last.num] if last.after else [last.num]
    head = " | ".join(f"step {s} x{n}" for s in steps for n in gpus)
    rows = [
        f"| preset | params | batch | {head} |",
        "|---|--:|--:|" + "--:|" * (len(steps) * len(gpus)),
    ]
    for name in GPT2_FAMILY:
        cells = []
        for s in steps:
            for n in gpus:
                p = predict(name, n, s)
                cells.append(
                    f"{p.state_bytes / GIB:.1f} + {p.buffer_bytes / GIB:.1f} + "
                    f"{p.activation_bytes / GIB:.1f} = **{p.total_bytes / GIB:.1f}**"
                )
        p = predict(name, 1, steps[0])
        rows.append(f"| {name} | {p.params / 1e6:.0f}M | {p.batch} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# ---------------------------------------------------------------- for the harness
def act_bytes_of(step: str, half: bool | None, device_type: str) -> int:
    """Bytes per activation element in ladder step `step`: 2 under step 05's autocast, else 4;
    `half` None (a CPU or MPS): step 05's rule decides it here."""
    if not ladder.rung(step).memory.bf16_autocast:
        return 4
    if half is None:
        import torch

        # imported here: precision imports torch, and spec.py (so the report) imports this module
        from speed_ladder.measure.precision import choice

        half = choice(torch.device(device_type))[0] != "fp32"
    return 2 if half else 4


def predict_run(
    shape: dict,
    step: str,
    world: int,
    batch: int,
    half: bool | None,
    device_type: str,
    mode: str | None = None,
    vocab: int | None = None,
    name: str = "custom",
    fused: bool | None = None,
) -> Prediction:
    """The prediction for one run of ladder step `step` (the sweep's before it, the step's own),
    with what the device runs: 16-bit activations as step 05 decides, flash attention (a CPU's
    only without dropout), Liger's loss where it ran (`fused`) or, before the run, can."""
    act = act_bytes_of(step, half, device_type)
    m = ladder.rung(step).memory
    flash = m.flash and (device_type == "cuda" or not m.drop_rate(shape))  # CPU + dropout: math
    if vocab is None:
        vocab = VOCAB if m.padded_vocab else GPT2_VOCAB
    if fused is None:
        fused = liger_runs_on(device_type)
    if mode is None and m.state == "fsdp2-offload" and device_type == "cpu":
        mode = "fsdp2"  # step 21 on a CPU: the state is in host memory already
    p = predict(shape, world, step, batch, act, flash, mode, vocab, fused)
    p.preset = name
    return p


# ---------------------------------------------------------------- command line
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m speed_ladder.measure.memory_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", help="one preset (default: the GPT-2 family)")
    ap.add_argument("--world", type=int, default=1, help="processes (default 1)")
    ap.add_argument("--step", help="ladder step (default: the last)")
    ap.add_argument("--fp32", action="store_true", help="fp32 activations (no bf16 autocast)")
    a = ap.parse_args(argv)
    step = a.step.zfill(2) if a.step else ladder.rungs()[-1].num
    for name in [a.preset] if a.preset else GPT2_FAMILY:
        print(predict(name, a.world, step, act_bytes=4 if a.fp32 else 2).line())
    print()
    print("Predicted GiB per rank, state + buffers + activations (bf16 autocast):")
    print(breakdown_table())
    print()
    print("The largest model that fits a GPU's memory: python -m speed_ladder fit")
    return 0


if __name__ == "__main__":
    from speed_ladder.errors import pipe_safe

    raise SystemExit(pipe_safe(main))
