"""The time breakdown's categories (`--profile`): which category an op is, by its own name, a
device kernel's name or the module range it runs in; and those module ranges, hooks installed for
the profiled steps only. The whole table: docs/measurement.md, "The time breakdown"."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only the hooks below need torch: the report imports CATEGORIES without it
    import torch

LABELS = {
    "matmul": "matmul",
    "attention": "attention",
    "norm_act": "normalization and activations",
    "loss": "loss",
    "optimizer": "optimizer",
    "communication": "communication",
    "data_host": "data and host",
    "other": "other",
}
CATEGORIES = tuple(LABELS)
PREFIX = "speed-ladder/"  # our ranges: the module ranges below, the steps (breakdown.py)

# ---------------------------------------------------------------- which category an op is
_EXACT = {
    "matmul": (
        "mm addmm addmm_ linear mv addmv addmv_ dot _addmm_activation _int_mm _scaled_mm "
        "mkldnn_linear"
    ),
    "attention": (
        "bmm baddbmm softmax _softmax _softmax_backward_data masked_fill masked_fill_ triu tril "
        "scaled_dot_product_attention"
    ),
    "norm_act": (
        "layer_norm native_layer_norm native_layer_norm_backward rms_norm _fused_rms_norm "
        "_fused_rms_norm_backward group_norm native_group_norm native_group_norm_backward "
        "batch_norm gelu gelu_ gelu_backward silu silu_ silu_backward relu relu_ "
        "threshold_backward"
    ),
    "loss": (
        "cross_entropy_loss log_softmax _log_softmax _log_softmax_backward_data nll_loss "
        "nll_loss_nd nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward"
    ),
    "optimizer": "_fused_adamw_ _fused_adam_ _fused_sgd_",
}
EXACT = {f"aten::{op}": cat for cat, ops in _EXACT.items() for op in ops.split()}
_PREFIXES = {  # the start of an op's name (DDP's reducer: gradient scaling, bucket copies)
    "attention": "aten::_scaled_dot_product aten::_flash_attention aten::_efficient_attention "
    "aten::_cudnn_attention",
    "optimizer": "Optimizer.step# Optimizer.zero_grad#",
    "data_host": "enumerate(DataLoader)",
    "communication": "nccl: gloo: c10d:: c10d: record_param_comms FSDP:: "
    "torch::distributed::reducer torch.distributed.ddp.reducer",
}
PREFIXES = tuple((p, cat) for cat, ps in _PREFIXES.items() for p in ps.split())  # first match
# what a name that is a list of fused ops (a Triton or C++ kernel of torch.compile, a backward
# node, a kernel no op launched) says, by the words in it: first match wins
KEYWORDS = (
    ("loss", "liger cross_entropy crossentropy nll_loss nllloss log_softmax logsoftmax".split()),
    ("communication", "nccl gloo all_reduce allreduce all_gather allgather reduce_scatter".split()),
    ("attention", "flash attention fmha softmax bmm".split()),
    ("norm_act", "layer_norm layernorm rms_norm rmsnorm gelu tanh silu relu".split()),
    ("optimizer", "adam sgd".split()),
)
_MATMUL_WORD = re.compile(r"(gemm|cutlass|nvjet|(^|[_:])(mm|addmm|matmul)($|[_0-9]))", re.I)
FUSED = ("triton_", "cpp_fused", "liger")
# outside every category's op and module: the loop's own host work
HOST = {
    f"aten::{op}"
    for op in (
        "to _to_copy copy_ pin_memory _pin_memory is_pinned item _local_scalar_dense empty "
        "empty_strided stack"
    ).split()
}
HOST_KERNELS = ("Memcpy HtoD", "Memcpy DtoH")


def by_keywords(name: str) -> str | None:
    low = name.lower()
    for cat, words in KEYWORDS:
        if any(w in low for w in words):
            return cat
    return "matmul" if _MATMUL_WORD.search(low) else None


def named_category(name: str) -> str | None:
    """The category an op's own name gives it (it passes it on to its callees), or None."""
    cat = EXACT.get(name)
    if cat is not None:
        return cat
    for start, cat in PREFIXES:
        if name.startswith(start):
            return cat
    if name.startswith(PREFIX):  # a module range of ours: speed-ladder/<category>: <class>
        cat = name[len(PREFIX) :].split(":", 1)[0]
        return cat if cat in CATEGORIES else None
    if name.startswith(FUSED) or "liger" in name.lower():
        return by_keywords(name)
    if name.startswith(("c10d", "ProcessGroup")) or "all_reduce" in name or "allreduce" in name:
        return "communication"
    return None


def kernel_category(name: str) -> str | None:
    """A device kernel's own category, whatever op launched it: NCCL, Liger, host copies."""
    if name.startswith(HOST_KERNELS):
        return "data_host"
    low = name.lower()
    if "nccl" in low:
        return "communication"
    if "liger" in low:
        return "loss"
    return None


# ---------------------------------------------------------------- module ranges
def _module_category(module: torch.nn.Module) -> str | None:
    name = type(module).__name__
    low = name.lower()
    if "attention" in low:
        return "attention"
    if low.endswith("norm") or low in ("gelu", "newgelu", "relu", "silu", "swiglu", "tanh"):
        return "norm_act"
    return None


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether torch.compile compiled the model or a part of it (and compiling is on)."""
    try:
        import torch._dynamo as dynamo

        if dynamo.config.disable:  # TORCH_COMPILE_DISABLE=1: runs eagerly
            return False
        compiled = dynamo.eval_frame.OptimizedModule
    except (ImportError, AttributeError):
        return False
    return any(
        isinstance(m, compiled) or getattr(m, "_compiled_call_impl", None) is not None
        for m in model.modules()
    )


class ModuleRanges:
    """Forward pre/post hooks that wrap each norm, activation and attention module's forward in a
    `record_function` range named by its category; installed for the profiled steps only."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.handles = []
        self.open: dict[int, list] = defaultdict(list)  # id(module) -> its open ranges

    def install(self) -> int:
        from torch.autograd.profiler import record_function

        def pre(name):
            def hook(module, args):
                rf = record_function(name)
                rf.__enter__()
                self.open[id(module)].append(rf)

            return hook

        def post(module, args, output):
            stack = self.open[id(module)]
            if stack:
                stack.pop().__exit__(None, None, None)

        for m in self.model.modules():
            cat = _module_category(m)
            if cat is not None:
                name = f"{PREFIX}{cat}: {type(m).__name__}"
                self.handles.append(m.register_forward_pre_hook(pre(name)))
                self.handles.append(m.register_forward_hook(post, always_call=True))
        return len(self.handles) // 2

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for stack in self.open.values():  # a forward that raised: close what it opened
            while stack:
                stack.pop().__exit__(None, None, None)
