"""Which check says whether each rung's idea acts here: the registry's behaviour, in Python beside
its data (speed_ladder/data/ladder.json). The harness asks it for a run's rung and every rung it
builds on (`reasons`), each check a function of what the run knows (`Facts`)."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from speed_ladder import ladder
from speed_ladder.errors import UserError
from speed_ladder.measure import inactive, precision
from speed_ladder.spec import RunSpec


@dataclass(frozen=True)
class Facts:
    """What a run knows when it asks: its rung, device, the step's GPT_CONFIG, its settings, its
    sequences per step and process, and, after the warm-up, the attention kernel that ran."""

    step: str
    device: torch.device
    cfg: dict
    spec: RunSpec
    batch: int
    attention_kernel: str | None = None

    @cached_property
    def dtype(self) -> torch.dtype:
        """Step 05's autocast dtype here (fp32 where it is off: precision.choice)."""
        return precision.DTYPES[precision.choice(self.device)[0]]


@dataclass(frozen=True)
class Check:
    """A rung's check: why its idea does nothing here, or None where it acts."""

    ask: Callable[[Facts], str | None]
    on_test_cpu: bool = False  # inactive in the tests' CPU runs (tiny, dropout 0, bf16 off)
    why: str | None = None  # a fixed reason, in place of the check's words
    acted: str | None = None  # where it acts, what ran: a note of its own (`step NN: acted`)
    after_warmup: bool = False  # asked once the attention kernel is known


WORLD_OF_ONE = "a world of one: "
CHECKS = {
    "02": Check(lambda f: inactive.tf32_unavailable(f.device), on_test_cpu=True),
    "04": Check(lambda f: inactive.pinned_memory_useless(f.device), on_test_cpu=True),
    "05": Check(lambda f: inactive.autocast_off(f.device), on_test_cpu=True),
    "07": Check(
        lambda f: inactive.sdpa_math_ran(f.device, f.cfg, f.dtype, f.attention_kernel),
        after_warmup=True,
    ),
    "08": Check(lambda f: inactive.compile_disabled()),
    "11": Check(
        lambda f: inactive.world_of_one(),
        on_test_cpu=True,
        why=WORLD_OF_ONE + "no other process shares the batch, so DDP does not wrap the model "
        "(step 10's run, in a process group); run it with torchrun",
    ),
    "12": Check(
        lambda f: inactive.liger_unavailable(f.device, f.dtype),
        on_test_cpu=True,
        acted="Liger fused linear cross-entropy kernel ran (fp32 accumulation)",
    ),
    "14": Check(
        lambda f: inactive.world_of_one(),
        on_test_cpu=True,
        why=WORLD_OF_ONE + "nothing to shard (a rank's shard is the whole tensor), so this run "
        "measures FSDP2's hooks, not its saving",
    ),
    "15": Check(
        lambda f: inactive.bf16_off(f.device),
        on_test_cpu=True,
        why="step 05 does not compute in bf16 here (fp32, or fp16 with loss scaling on a GPU "
        "without native bf16): the weights stay fp32",
    ),
    "16": Check(lambda f: inactive.dropout_already_off(f.spec.drop_rate), on_test_cpu=True),
    "17": Check(
        lambda f: inactive.cudnn_attention_no_change(f.attention_kernel, f.device, f.cfg, f.dtype),
        on_test_cpu=True,
        acted="cuDNN attention ran (SDPA tries it first, then flash, efficient and math)",
        after_warmup=True,
    ),
    "18": Check(
        lambda f: inactive.batch_not_split(f.batch, f.spec.accum_steps),
        acted="gradient accumulation (each batch in accum_steps micro-batches, one optimizer step)",
    ),
    "20": Check(
        lambda f: inactive.batch_not_grown(f.device, f.spec, f.batch, f.spec.batch(f.step)),
        on_test_cpu=True,
        acted="the batch grew to the largest power of two the memory model fits in this GPU's "
        "memory (x1.15 and the CUDA context)",
    ),
    "21": Check(lambda f: inactive.offload_moves_nothing(f.device), on_test_cpu=True),
}


def reasons(facts: Facts, only_after_warmup: bool = False) -> list[tuple]:
    """[(rung, why its idea does nothing here or None, what ran where it acts)] for the run's
    rung and every rung it builds on, the first first: every check whose facts the run has (the
    attention kernel is known after the warm-up), or only those that judge by the kernel. [] where
    the run's step is no rung of the ladder."""
    try:
        chain = ladder.lineage(facts.step)
    except UserError:  # a test's script
        return []
    out = []
    for r in chain:
        check = CHECKS.get(r.num)
        if check is None or (check.after_warmup and facts.attention_kernel is None):
            continue
        if only_after_warmup and not check.after_warmup:
            continue
        reason = check.ask(facts)
        out.append((r.num, reason and (check.why or reason), check.acted))
    return out
