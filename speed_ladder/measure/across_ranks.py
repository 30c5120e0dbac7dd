"""A run's numbers from its timed window (`Measured`), and the job's from every rank's
(`across_ranks`), which Run.finish reduces before it writes the record."""

from dataclasses import dataclass, field, replace

import torch


def process_group():
    """torch.distributed where a process group is up (step 11 on, under torchrun), else None."""
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


@dataclass
class Measured:
    """A run's numbers from its timed window: one process's, or after `across_ranks` the job's."""

    tokens: int  # per step
    step_time: float  # median, seconds
    reserved: int | None  # peak bytes
    allocated: int | None
    losses: list[float]
    train_loss: float | None
    val_loss: float | None
    reserved_per_rank: list[int | None] = field(default_factory=list)


def across_ranks(m: Measured, device: torch.device) -> Measured:
    """The job's numbers from every rank's: global tokens, the slowest rank's step time, each
    rank's peak memory (the max is the job's), the mean losses. One process: its own."""
    d = process_group()
    if d is None:
        return replace(m, reserved_per_rank=[m.reserved])
    on = device if device.type == "cuda" else torch.device("cpu")
    s = torch.tensor([float(m.tokens)], dtype=torch.float64, device=on)
    d.all_reduce(s)
    per_rank = torch.zeros(d.get_world_size(), dtype=torch.float64, device=on)
    per_rank[d.get_rank()] = m.reserved or 0
    d.all_reduce(per_rank)  # each rank's own peak, gathered
    reserved_per_rank = [int(v) for v in per_rank.tolist()]
    mx = torch.tensor([m.step_time, m.allocated or -1], dtype=torch.float64, device=on)
    d.all_reduce(mx, op=d.ReduceOp.MAX)
    lt = torch.tensor(
        m.losses + [m.train_loss or 0.0, m.val_loss or 0.0], dtype=torch.float64, device=on
    )
    d.all_reduce(lt)
    lt = (lt / d.get_world_size()).tolist()
    return Measured(
        tokens=int(s.item()),
        step_time=mx[0].item(),
        reserved=max(reserved_per_rank) if m.reserved is not None else None,
        allocated=int(mx[1].item()) if m.allocated is not None else None,
        losses=lt[:-2],
        train_loss=lt[-2] if m.train_loss is not None else None,
        val_loss=lt[-1] if m.val_loss is not None else None,
        reserved_per_rank=reserved_per_rank,
    )
