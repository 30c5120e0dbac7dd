"""Step 17's attention order: scaled_dot_product_attention tries cuDNN's fused attention first,
then flash, memory-efficient and math, for the rest of the run (`cudnn_attention_first`), where
cuDNN takes the training call (measure/inactive.py's `cudnn_attention_unavailable`: asked of
torch for the call's shape, dtype and dropout, then tried once).

PyTorch takes the first backend in its priority order that accepts a call, and its default
order (torch 2.13 on a CPU: flash, efficient, math, cudnn) puts math before cuDNN: switching
flash and efficient off would hand the training call to the math path, not to cuDNN. The public
`torch.nn.attention.sdpa_kernel(backends, set_priority=True)` (torch 2.6 on; the project needs
2.7) sets the order instead: entered here and kept open for the process (the context manager's
exit would restore the old order). Recent PyTorch puts cuDNN first by itself on Hopper and
Blackwell with a new enough cuDNN; there step 16 already ran cuDNN, so before it changes the
order this asks torch which kernel the call gets (`kernel_before`), and rung 17's check
(`cudnn_attention_no_change`) says that the step changed nothing there. The record's
`attention_kernel` says which kernel ran (measure/attention_kernel.py)."""

import torch

from speed_ladder.measure.attention_kernel import dispatcher_choice
from speed_ladder.measure.inactive import cudnn_attention_unavailable

_STATE: dict = {"why": "cuDNN was not put first in this run", "before": None, "order": None}


def cudnn_attention_first(device: torch.device, cfg: dict, dtype: torch.dtype) -> str | None:
    """Put cuDNN's attention first in SDPA's order for this process, where cuDNN takes the
    training call of a model of config `cfg` (in step 05's autocast `dtype`); returns why not
    (nothing changed: step 07's kernel stays), or None."""
    why = _STATE["why"] = cudnn_attention_unavailable(device, cfg, dtype)
    if why is not None:
        return why
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _STATE["before"] = dispatcher_choice(device, cfg, dtype)  # step 16's kernel
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # fmt: skip
    kept = sdpa_kernel(order, set_priority=True)
    kept.__enter__()
    _STATE["order"] = kept  # held: a collected context manager would restore the old order
    return None


def kernel_before() -> str | None:
    """The kernel torch chose for the training call before cudnn_attention_first changed the
    order (flash, efficient, cudnn, math), or None where it did not change it."""
    return _STATE["before"]


def why_not_first() -> str | None:
    """Why cudnn_attention_first left the order as it was (None where it put cuDNN first)."""
    return _STATE["why"]
