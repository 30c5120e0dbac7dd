"""The time breakdown's categories (`--profile`, speed_ladder.measure.profile): which category an op
is, by its own name, a device kernel's name or the module range it runs in; and the module ranges.
speed_ladder.measure.breakdown counts the profiled steps' time by them.

The categories, by the op's name (`aten::...`, as in `prof.key_averages()`); an op with a name
below gives its category to everything it calls, except a callee with a name of its own:

- matmul: aten::mm, addmm, linear, mv: the linear layers' GEMMs, the output head's included
  (`nn.Linear` on (B, T, C) is aten::linear -> matmul -> mm).
- attention: aten::bmm and baddbmm (here only attention multiplies batches of matrices: the
  4-D `q @ k.T` is aten::matmul -> bmm), softmax, masked_fill, triu/tril (the causal mask),
  scaled_dot_product_attention and its flash/efficient/cudnn/math kernels
  (aten::_scaled_dot_product_flash_attention_for_cpu); and every op inside a module whose
  class name has "Attention" (its views, transposes, `.contiguous()`, the scaling divide).
- norm_act (normalization and activations): aten::layer_norm, native_layer_norm(_backward),
  rms_norm, gelu(_backward), silu, relu; and every op inside a module whose class name ends in
  "Norm" or is an activation's (GELU): the hand-written LayerNorm's mean, var, sub, div, sqrt,
  mul, add and GELU's pow, tanh, mul, add in steps 00-05.
- loss: aten::cross_entropy_loss, log_softmax, nll_loss and their backward (the zeroing of
  nll_loss's (N, V) gradient included); Liger's kernels and what runs inside step 12's Liger
  Function (LigerFusedLinearCrossEntropyFunction), except its matmuls: the logits' and the
  hidden states' gradient's aten::mm and the weight gradient's aten::addmm(_) are matmul (an
  in-place addmm_ counted as loss was a third of the output layer's matmuls).
- optimizer: the Optimizer.step#AdamW.step and Optimizer.zero_grad#... ranges (every
  _foreach_, lerp_, addcdiv_ or _fused_adamw_ op inside them), aten::_fused_adamw_.
- communication: nccl:*, gloo:*, c10d::* (c10d::allreduce_), record_param_comms, DDP's reducer
  ranges (its bucket copies and gradient scaling), the FSDP::* ranges (all-gather,
  reduce-scatter and their copies), NCCL kernels.
- data_host (data and host): the enumerate(DataLoader)#... range (fetch and collate), the loop's
  own copies and `.item()` (aten::to, copy_, _local_scalar_dense outside every category),
  host-device memcpy; and the steps' time that no op covers (Python, the loop).
- other: the rest: embeddings, residual adds, dropout, views outside the modules above,
  AccumulateGrad, torch.compile's fused kernels where their names do not say (below).

Module hooks. At the profile's start (never during the timed steps) forward pre/post hooks open
a `record_function` range `speed-ladder/<category>: <class>` around each norm, activation and
attention module, removed again when profiling ends. They only name the ops inside: a range's
own time (the Python between its ops, and the hook's) is data and host, like all Python. A
model that torch.compile compiled gets none (adding hooks would make it recompile); there the
native ops' names are enough (steps 06 on), except that on a CPU Inductor's fused C++ kernels
record no event of their own: their time is the compiled graph's own (`## Call
CompiledFxGraph ...`), in other. On CUDA Inductor names each Triton kernel
(`triton_per_fused_native_layer_norm_0`): the names it fuses decide its category (loss before
communication, attention, norm_act, optimizer, matmul), unnamed fusions are other.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only the hooks below need torch: the report imports CATEGORIES without it
    import torch

CATEGORIES = (
    "matmul",
    "attention",
    "norm_act",
    "loss",
    "optimizer",
    "communication",
    "data_host",
    "other",
)
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
PREFIX = "speed-ladder/"  # our ranges: the module ranges below, the steps
# (speed_ladder.measure.breakdown)

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
PREFIXES = (  # (start of the name, category), first match wins
    ("aten::_scaled_dot_product", "attention"),
    ("aten::_flash_attention", "attention"),
    ("aten::_efficient_attention", "attention"),
    ("aten::_cudnn_attention", "attention"),
    ("Optimizer.step#", "optimizer"),
    ("Optimizer.zero_grad#", "optimizer"),
    ("enumerate(DataLoader)", "data_host"),
    ("nccl:", "communication"),
    ("gloo:", "communication"),
    ("c10d::", "communication"),
    ("c10d:", "communication"),
    ("record_param_comms", "communication"),
    ("FSDP::", "communication"),
    ("torch::distributed::reducer", "communication"),  # DDP's reducer: gradient scaling,
    ("torch.distributed.ddp.reducer", "communication"),  # bucket copies
)
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
        self.open: dict[int, list] = {}

    def install(self) -> int:
        from torch.autograd.profiler import record_function

        def pre(name):
            def hook(module, args):
                rf = record_function(name)
                rf.__enter__()
                self.open.setdefault(id(module), []).append(rf)

            return hook

        def post(module, args, output):
            stack = self.open.get(id(module))
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
