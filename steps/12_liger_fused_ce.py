"""Step 12 (after step 11): Liger fused linear cross-entropy.

Change: in training, Liger's LigerFusedLinearCrossEntropyLoss replaces out_head + cross_entropy.
Why: it computes the logits chunk by chunk, so the (B*T, V) logits, their fp32 copies and their
gradient, training's memory peak, never exist whole; the weight gradient is summed in fp32.
Cost: a dependency (liger-kernel, with Triton). Where Liger cannot run, the plain out_head and
cross_entropy run (step 11's computation) and the step is inactive.
Source: Hsu et al. 2024, "Liger Kernel"; Liger's docs.
More: docs/steps.md (how it works, sources, caveats); LADDER.md (its diff, its measured effect).

Run (every file of the ladder the same way; --help lists the flags and shows this file's path):
    python <this file>  # CUDA: the gpt2-124m preset; otherwise the cpu preset
    python <this file> --device cpu  # on the CPU, even where there is a GPU
    python <this file> --preset tiny --max-steps 5 --results r.jsonl
    torchrun --nproc_per_node=4 <this file>  # steps 11 and 14: 4 GPUs (README, "Several GPUs")
"""

import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist  # step 11
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP  # step 11
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler  # step 11

# The shared harness lives at the repository root; find it from wherever this file sits.
REPO = next(p for p in Path(__file__).resolve().parents if (p / "speed_ladder").is_dir())
sys.path.insert(0, str(REPO))
import speed_ladder  # noqa: E402

STEP = "12"


# ---------------------------------------------------------------- model
class MultiHeadAttention(nn.Module):
    """Causal self-attention through scaled_dot_product_attention (step 07): one fused kernel."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, num_tokens, d_in = x.shape  # (B, T, C)
        keys = self.W_key(x)  # (B, T, C)
        queries = self.W_query(x)
        values = self.W_value(x)

        # split the channels into heads: (B, T, C) -> (B, H, T, Q), Q = C / H
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

        # step 07: one fused (flash) kernel for scores, causal mask, softmax, dropout and the
        # weighted sum; the (B, H, T, T) scores are never materialized
        context_vec = torch.nn.functional.scaled_dot_product_attention(
            queries,
            keys,
            values,
            dropout_p=self.dropout.p if self.training else 0.0,
            is_causal=True,
        ).transpose(1, 2)  # (B, H, T, Q) -> (B, T, H, Q)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # (B, T, C)
        return self.out_proj(context_vec)


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]),  # (B, T, C) -> (B, T, 4C)
            nn.GELU(approximate="tanh"),  # step 06: native fused GELU (GPT-2's tanh form)
            nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]),  # (B, T, 4C) -> (B, T, C)
        )

    def forward(self, x):
        return self.layers(x)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(norm(x)), then x + ff(norm(x)) (GPT-2)."""

    def __init__(self, cfg):
        super().__init__()
        self.att = MultiHeadAttention(
            d_in=cfg["emb_dim"],
            d_out=cfg["emb_dim"],
            context_length=cfg["context_length"],
            num_heads=cfg["n_heads"],
            dropout=cfg["drop_rate"],
            qkv_bias=cfg["qkv_bias"],
        )
        self.ff = FeedForward(cfg)
        self.norm1 = nn.LayerNorm(cfg["emb_dim"])  # step 06: native fused LayerNorm
        self.norm2 = nn.LayerNorm(cfg["emb_dim"])  # step 06
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        x = x + self.drop_shortcut(self.att(self.norm1(x)))
        x = x + self.drop_shortcut(self.ff(self.norm2(x)))
        return x


class GPTModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = nn.LayerNorm(cfg["emb_dim"])  # step 06
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx, return_hidden=False):
        batch_size, seq_len = in_idx.shape  # (B, T) token ids
        tok_embeds = self.tok_emb(in_idx)  # (B, T, C)
        pos_embeds = self.pos_emb(torch.arange(seq_len, device=in_idx.device))  # (T, C)
        x = self.drop_emb(tok_embeds + pos_embeds)
        for block in self.trf_blocks:
            x = block(x)
        x = self.final_norm(x)
        if return_hidden:  # step 12: the fused loss applies out_head itself, chunk by chunk
            return x  # (B, T, C)
        return self.out_head(x)  # (B, T, V) logits


# ---------------------------------------------------------------- data
class GPTDataset(Dataset):
    """Windows of context_length tokens; the target is the input shifted by one token."""

    def __init__(self, token_ids, context_length, stride):
        self.token_ids = token_ids  # (N,) int64
        self.starts = range(0, len(token_ids) - context_length, stride)
        self.context_length = context_length

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, idx):
        i = self.starts[idx]
        chunk = self.token_ids[i : i + self.context_length + 1]
        return chunk[:-1], chunk[1:]  # (T,), (T,)


def create_dataloader(
    token_ids, batch_size, context_length, shuffle, drop_last, seed, workers, pin_memory
):
    dataset = GPTDataset(token_ids, context_length, stride=context_length)
    # step 11: each rank takes every world_size-th index of one seeded permutation per epoch,
    # randperm(seed + epoch): steps 00-10's order, so a world of one sees the same batches
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler if shuffle else None,
        drop_last=drop_last,
        # Worker processes prefetch the next batches while the GPU trains, as Raschka's scripts
        # load (num_workers=4, from his 00 on), kept alive across epochs (an epoch of Middlemarch
        # is 13 steps at batch 32: new workers every epoch would stall the timed steps); --workers,
        # by default 4 on CUDA and 0 elsewhere, where workers would take cores from training.
        num_workers=workers,
        persistent_workers=workers > 0,
        # iterators seeded by the loader's own generator, not the global one dropout draws from
        generator=torch.Generator().manual_seed(seed),
        pin_memory=pin_memory,  # step 04: batches in page-locked memory for async H2D copies
    )


# ---------------------------------------------------------------- loss, evaluation, sampling
# step 08: the loss compiled too, as a graph of its own: inductor fuses the logits' fp32 upcast
# (autocast runs cross-entropy in fp32), log-softmax and nll, forward and backward, instead of
# writing (B*T, V) fp32 copies of the logits (6.6 GB each at batch 32 on gpt2-124m)
@torch.compile  # step 08
def cross_entropy(logits, targets):  # (N, V), (N,) -> mean loss
    return torch.nn.functional.cross_entropy(logits, targets)


def calc_loss_batch(input_batch, target_batch, model):
    logits = model(input_batch)  # (B, T, V)
    return cross_entropy(logits.flatten(0, 1), target_batch.flatten())  # step 08


def calc_loss_loader(data_loader, model, device, num_batches):
    total, tokens = 0.0, 0
    for i, (input_batch, target_batch) in enumerate(data_loader):
        if i >= num_batches:
            break
        input_batch, target_batch = input_batch.to(device), target_batch.to(device)
        # each batch's mean weighed by its tokens: the mean per token (a short batch counts less)
        total += calc_loss_batch(input_batch, target_batch, model).item() * target_batch.numel()
        tokens += target_batch.numel()
    return total / max(tokens, 1)


# step 08: evaluation is never timed, so compiling it would only cost compile time
# (a new graph under no_grad, another for the last, shorter batch): run it eager
@torch.compiler.set_stance("force_eager")  # step 08
def evaluate_model(model, train_eval_loader, val_loader, device, eval_iter):
    model.eval()
    with torch.no_grad():
        train_loss = calc_loss_loader(train_eval_loader, model, device, num_batches=eval_iter)
        val_loss = calc_loss_loader(val_loader, model, device, num_batches=eval_iter)
    model.train()
    return train_loss, val_loss


def generate_text_simple(model, idx, max_new_tokens, context_size):
    """Greedy decoding: append the most likely next token, max_new_tokens times."""
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]  # (1, <=T)
        with torch.no_grad():
            logits = model(idx_cond)[:, -1, :]  # (1, V): the last position only
        logits[:, speed_ladder.GPT2_VOCAB :] = -torch.inf  # step 09: a padded id is never picked
        idx_next = torch.argmax(logits, dim=-1, keepdim=True)  # (1, 1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


@torch.compiler.set_stance("force_eager")  # step 08: sampling too (untimed)
def generate_and_print_sample(model, run, device, start_context, num_tokens):
    model.eval()
    tokenizer = run.tokenizer()
    encoded = torch.tensor(tokenizer.encode(start_context), device=device).unsqueeze(0)
    context_size = run.spec.context_length
    out = generate_text_simple(model, encoded, num_tokens, context_size)[0].tolist()
    run.print(tokenizer.decode([t for t in out if t < tokenizer.n_vocab]).replace("\n", " "))
    model.train()


# ---------------------------------------------------------------- distributed set-up
def ddp_setup(device):  # step 11
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT; LOCAL_RANK
    picks this process's GPU); under plain python, a world of one."""
    backend = speed_ladder.ddp_backend(device)  # nccl on CUDA, else gloo; $DDP_BACKEND, checked
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # A lost peer makes collectives fail after this long instead of hanging forever.
    timeout = datetime.timedelta(minutes=10)
    if "RANK" in os.environ:  # torchrun: env:// rendezvous (MASTER_ADDR/PORT set by torchrun)
        dist.init_process_group(backend, timeout=timeout)
    else:  # plain python: a world of one in an in-memory store, no address or port needed
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return device


# ---------------------------------------------------------------- training
def main():
    args = speed_ladder.parse_args(__doc__)
    run = speed_ladder.Run(args, STEP, __file__)
    P = run.spec

    # GPT-2 124M (Radford et al. 2019; Raschka ch. 4), the same keys in the same order in every
    # step; --preset (speed_ladder/presets.py: cpu, tiny, gpt2-xl, ...) sets the sizes it names
    GPT_CONFIG = {
        "vocab_size": 50304,  # step 09: GPT-2's 50257 padded to a multiple of 64
        "context_length": 1024,  # longest input, in tokens
        "emb_dim": 768,  # embedding width
        "n_heads": 12,  # attention heads
        "n_layers": 12,  # transformer blocks
        "drop_rate": 0.1,  # dropout
        "qkv_bias": False,  # no bias in the query, key and value projections
    } | run.model_overrides()
    SETTINGS = {
        "learning_rate": P.lr,
        "num_epochs": P.epochs,
        "batch_size": P.large_batch_size,  # step 10: 4x the batch (8 -> 32 on gpt2-124m)
        "weight_decay": P.weight_decay,
        "eval_iter": P.eval_iters,
        "sample_tokens": P.sample_tokens,
    }

    torch.manual_seed(args.seed)
    device = ddp_setup(run.device)  # step 11: this rank's device (cuda:LOCAL_RANK)
    torch.set_float32_matmul_precision("high")  # step 02: TF32 tensor cores for fp32 matmuls
    train_ids, val_ids = run.load_tokens(GPT_CONFIG["context_length"], SETTINGS["batch_size"])
    pin_memory = device.type == "cuda"  # step 04: pinning only helps host-to-GPU copies
    train_loader = create_dataloader(
        train_ids, SETTINGS["batch_size"], GPT_CONFIG["context_length"],
        shuffle=True, drop_last=True, seed=args.seed, workers=P.workers, pin_memory=pin_memory,
    )  # fmt: skip
    # Evaluation reads loaders of its own, in order, in batches of the preset's batch_size
    # whatever the training batch: the same windows on every step; the training loader's
    # iterator (a persistent worker pool's) is never reset mid-epoch. Untimed: no workers.
    train_eval_loader = create_dataloader(
        train_ids, P.batch_size, GPT_CONFIG["context_length"],
        shuffle=False, drop_last=False, seed=args.seed, workers=0, pin_memory=pin_memory,
    )  # fmt: skip
    val_loader = create_dataloader(
        val_ids, P.batch_size, GPT_CONFIG["context_length"],
        shuffle=False, drop_last=False, seed=args.seed, workers=0, pin_memory=pin_memory,
    )  # fmt: skip

    # step 05: bf16 where it is native; fp16 with loss scaling on GPUs without it (V100, T4)
    amp = speed_ladder.mixed_precision(device)
    # step 05: fp16 only: the loss scaled up before backward, so that small gradients do not
    # flush to zero; bf16 and fp32 need none (disabled, its scale, step and update pass through)
    scaler = torch.amp.GradScaler(device.type, enabled=amp.dtype == torch.float16)
    model = GPTModel(GPT_CONFIG).to(device)
    out_head = model.out_head  # step 12: its weight goes to the fused loss, outside compile
    model = torch.compile(model)  # step 08: fuse ops into generated kernels (TorchInductor)
    # step 11: replicas stay in sync: gradients are all-reduced (averaged) during backward; a
    # world of one has no replica, and the wrapper would only add its hooks' time to each step
    if dist.get_world_size() > 1:  # step 11
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    # step 11: every rank built the same weights from --seed; from here each rank draws its own
    # dropout masks (rank 0 goes on with one process's stream: a world of one is step 10's run)
    if dist.get_rank() > 0:  # step 11
        torch.manual_seed(args.seed + dist.get_rank())
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=SETTINGS["learning_rate"],
        weight_decay=SETTINGS["weight_decay"],
        fused=True,  # step 03: one fused update kernel instead of a chain of foreach ops
    )

    # step 12: Liger's fused linear + cross-entropy where it can run here (a CUDA GPU, step 05
    # not in fp16, liger-kernel installed); elsewhere step 11's loss, and the record says why
    liger_ce = None
    if speed_ladder.liger_unavailable(device, amp.dtype) is None:  # step 12
        # imported where it runs: on a CPU, importing Triton would only cost seconds
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        # accum_dtype: out_head's weight gradient summed over all rows in fp32 (a bf16 running
        # sum of 32K rows' contributions would round the small ones away)
        liger_ce = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)  # step 12

    run.set_model(model, GPT_CONFIG, SETTINGS["batch_size"], fused_loss=liger_ce)  # step 12
    for epoch in range(SETTINGS["num_epochs"]):
        # Each epoch's order is randperm(seed + epoch), as DistributedSampler draws it (step 11):
        # every step of the ladder trains on the same batches in every epoch, not just the first.
        train_loader.sampler.set_epoch(epoch)  # step 11: that reseed, the same on all ranks
        model.train()
        for input_batch, target_batch in train_loader:
            input_batch = input_batch.to(device, non_blocking=True)  # (B, T); step 04
            target_batch = target_batch.to(device, non_blocking=True)  # (B, T); step 04
            optimizer.zero_grad()
            # step 05: bf16 (or fp16) matmuls/attention, fp32 weights, grads and optimizer state
            with torch.autocast(device.type, dtype=amp.dtype, enabled=amp.enabled):
                if liger_ce is not None:  # step 12: out_head and the loss in one op, chunk by chunk
                    hidden = model(input_batch, return_hidden=True)  # (B, T, C): no logits
                    loss = liger_ce(out_head.weight, hidden.flatten(0, 1), target_batch.flatten())
                else:  # step 12: where Liger cannot run, step 11's loss
                    loss = calc_loss_batch(input_batch, target_batch, model)
            scaler.scale(loss).backward()  # step 05: fp16: loss scaled up, no grad underflow
            scaler.step(optimizer)  # step 05: grads unscaled; a step with an inf/NaN skipped
            scaler.update()  # step 05: the scale adapts; bf16/fp32: the scaler does nothing
            run.step_done(loss, tokens=input_batch.numel())

            if run.eval_due():
                with run.paused():
                    train_loss, val_loss = evaluate_model(
                        model, train_eval_loader, val_loader, device, SETTINGS["eval_iter"]
                    )
                    run.evaluated(epoch, train_loss, val_loss)  # printed; the loss curve
            if run.finished:
                break
        if run.sample_due():  # a short greedy sample at the end of each epoch
            with run.paused():
                generate_and_print_sample(
                    model, run, device, "Every effort moves you", SETTINGS["sample_tokens"]
                )
        if run.finished:
            break

    with run.paused():
        train_loss, val_loss = evaluate_model(
            model, train_eval_loader, val_loader, device, SETTINGS["eval_iter"]
        )
    run.finish(train_loss, val_loss)
    dist.destroy_process_group()  # step 11


if __name__ == "__main__":
    speed_ladder.main(main)
