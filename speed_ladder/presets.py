"""Presets: the model, optimizer and run-length settings every step shares (docs/memory.md,
Presets): `gpt2-124m`, the published ladder's; the rest of the GPT-2 family, for FSDP2 and the
memory model; `cpu` and `cpu-small` for 2 cores; `tiny` for the tests. Time to a target loss per
preset (TO_LOSS) and the sweep's measuring length (SWEEP_LENGTH), each with its reasons."""

from speed_ladder.errors import UserError


def _gpt2_family(emb_dim: int, n_heads: int, n_layers: int, lr: float, batch: int) -> dict:
    """gpt2-medium, -large and -xl: the shape (width, heads, layers), the GPT-3 paper's learning
    rate for that size and `batch` sequences per process, 4x from step 10 on; the rest shared:
    context 1024, dropout 0.1, a 30-step measuring run (10 warm-up), no evaluation until the end."""
    return {
        "context_length": 1024,
        "emb_dim": emb_dim,
        "n_heads": n_heads,
        "n_layers": n_layers,
        "drop_rate": 0.1,
        "qkv_bias": False,
        "batch_size": batch,
        "large_batch_size": 4 * batch,  # used from step 10 (larger batch) on
        "accum_steps": 2,  # step 18: micro-batches per batch
        "lr": lr,
        "weight_decay": 0.1,
        "epochs": 1,
        "max_steps": 30,
        "warmup_steps": 10,
        "eval_freq": 0,
        "eval_iters": 5,
        "sample_tokens": 50,
    }


PRESETS = {
    "gpt2-124m": {
        "context_length": 1024,
        "emb_dim": 768,
        "n_heads": 12,
        "n_layers": 12,
        "drop_rate": 0.1,
        "qkv_bias": False,
        "batch_size": 8,
        "large_batch_size": 32,  # used from step 10 (larger batch) on
        "accum_steps": 2,  # step 18: micro-batches per batch
        "lr": 5e-4,
        "weight_decay": 0.1,
        "epochs": 15,
        "max_steps": None,
        "warmup_steps": 10,
        "eval_freq": 50,
        "eval_iters": 5,
        "sample_tokens": 50,
    },
    # GPT-2 345M (355M as counted by HF), 762M (774M), 1542M (1.5B); lr: GPT-3 Medium, Large, XL
    "gpt2-medium": _gpt2_family(1024, 16, 24, lr=3e-4, batch=4),
    "gpt2-large": _gpt2_family(1280, 20, 36, lr=2.5e-4, batch=2),
    "gpt2-xl": _gpt2_family(1600, 25, 48, lr=2e-4, batch=1),
    "cpu": {
        "context_length": 256,
        "emb_dim": 384,
        "n_heads": 6,
        "n_layers": 12,
        "drop_rate": 0.1,
        "qkv_bias": False,
        "batch_size": 2,
        "large_batch_size": 4,  # 2x, not 4x: keeps step 10's run near 30 s on 2 cores
        "accum_steps": 2,
        "lr": 5e-4,
        "weight_decay": 0.1,
        "epochs": 1,
        "max_steps": 10,
        "warmup_steps": 2,
        "eval_freq": 0,  # evaluate at the end only
        "eval_iters": 2,
        "sample_tokens": 20,
    },
    # time to a target loss on a CPU (--to-loss): the whole ladder on 2 cores within 20 minutes
    # (TO_LOSS's reasons); 6 layers of 256 on 128-token windows, a tenth of cpu's FLOPs per token
    "cpu-small": {
        "context_length": 128,
        "emb_dim": 256,
        "n_heads": 4,
        "n_layers": 6,
        "drop_rate": 0.1,
        "qkv_bias": False,
        "batch_size": 4,
        "large_batch_size": 8,
        "accum_steps": 2,
        "lr": 1e-3,  # a small model's rate (nanoGPT's for its small configs), cpu's 5e-4 x 2
        "weight_decay": 0.1,
        "epochs": 1,
        "max_steps": 10,
        "warmup_steps": 2,
        "eval_freq": 0,
        "eval_iters": 2,
        "sample_tokens": 20,
    },
    "tiny": {
        "context_length": 32,
        "emb_dim": 64,
        "n_heads": 4,
        "n_layers": 2,
        "drop_rate": 0.0,
        "qkv_bias": False,
        "batch_size": 4,
        "large_batch_size": 8,
        "accum_steps": 2,
        "lr": 5e-4,
        "weight_decay": 0.1,
        "epochs": 1,
        "max_steps": 20,
        "warmup_steps": 2,
        "eval_freq": 0,
        "eval_iters": 1,
        "sample_tokens": 5,
    },
}

# --to-loss per preset (measure/curve.py, speed_ladder/measure/settings.py): the target validation
# loss a bare --to-loss trains to, the token budget after which a run stops "not reached", how
# often it evaluates and on how many validation tokens, each with its reason. A preset not named
# here has none: --to-loss names a preset that has. Every budget leaves timed steps at any batch:
# a run trains its warm-up and measure/curve.py's MIN_TIMED_STEPS steps at least, and a budget
# smaller than that at the rung's batch grows to it (step 20 on a large GPU: gpt2-124m's budget is
# 8 steps of its batch 256, fewer than its 10 warm-up steps).
TO_LOSS = {
    "cpu-small": {
        "target": 6.5,
        "budget_tokens": 65536,
        "eval_tokens": 2048,
        "val_tokens": 1024,
        "why": "Middlemarch, step 00 alone on an AMD EPYC (Zen 4, 2 cores): its validation loss "
        "crossed 7.0 at about 8K tokens (the unigram plateau, reached by step count more than by "
        "data) and 6.5 at 22K tokens in 32 s, still falling (5.9 at 41K, a tenth of an epoch: "
        "far from overfitting); step 16 (batch 8) crossed 6.5 at 27K tokens. The budget is "
        "about 3x that; evaluating every 2048 tokens on 1024 validation tokens costs about a "
        "second each at step 00.",
    },
    "gpt2-124m": {
        "target": 6.0,
        "budget_tokens": 2_097_152,
        "eval_tokens": 65536,
        "val_tokens": 65536,
        "why": "not yet measured as a curve: the H200 run (results/nvidia-h200-x1) evaluated "
        "once, at its end: step 00 reached 5.30 after 516K tokens (63 steps of 8 x 1024) and "
        "step 10 5.49 after 2.06M (63 steps of 32 x 1024, train loss 5.02: the text starts to "
        "be learned by heart), so 6.0 lies well above both, and the budget is step 10's run.",
    },
    "tiny": {
        "target": 9.0,
        "budget_tokens": 8192,
        "eval_tokens": 512,
        "val_tokens": 256,
        "why": "the tests' text (The Verdict): step 00 crosses 9.0 at about 6.6K tokens, in "
        "seconds",
    },
}

GPT2_VOCAB = 50257

# How long `python -m speed_ladder run` runs each step, per preset: warm-up steps, then timed steps
# (a step run by hand keeps its preset's own length: 15 epochs of gpt2-124m). PROVISIONAL: 10
# warm-up steps cover the allocator, cuDNN/cuBLAS plans and torch.compile's first graphs, and 50
# timed steps give the median 50 samples (a few tens of seconds per step on one GPU); to be
# confirmed by a GPU sweep that the median is stable. A preset not named here (cpu, tiny) is
# measured over its own max_steps / warmup_steps; --max-steps / --warmup-steps override both.
SWEEP_LENGTH = {
    "gpt2-124m": {"warmup_steps": 10, "timed_steps": 50},
    "gpt2-medium": {"warmup_steps": 10, "timed_steps": 50},
    "gpt2-large": {"warmup_steps": 10, "timed_steps": 50},
    "gpt2-xl": {"warmup_steps": 10, "timed_steps": 50},
}


def flop_split(p: dict, vocab: int = GPT2_VOCAB) -> float:
    """Share of the output layer in the matmul parameters (GPT-2 124M: 0.31)."""
    body = 12 * p["emb_dim"] ** 2 * p["n_layers"]
    head = p["emb_dim"] * vocab
    return head / (body + head)


def check_name(name: str | None) -> None:
    """An unknown --preset is a UserError naming the presets (None: the device's default)."""
    if name is not None and name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
