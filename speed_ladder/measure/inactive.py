"""Is a rung's idea active here? Each check says why a rung's optimization does nothing on this
device, or None where it acts. measure/rung_checks.py says which rung asks which check; a step
asks some itself before it acts (liger_unavailable, cudnn_attention_unavailable,
batch_fit_unavailable). A reason is a note of the record, and the run's own rung's makes it say
`step_active: false`: never read as a gain or a loss."""

import os

import torch

from speed_ladder.measure import precision, sdpa_dispatch
from speed_ladder.measure.device import is_rocm
from speed_ladder.measure.settings import FIT_MARGIN
from speed_ladder.spec import RunSpec, micro_batches


def tf32_unavailable(device: torch.device) -> str | None:
    """Step 02: TF32 exists on NVIDIA compute capability >= 8.0 (Ampere on) and, on ROCm, on MI300
    (gfx94x) only with HIPBLASLT_ALLOW_TF32=1 (PyTorch's own ROCm tests set it for TF32)."""
    if device.type != "cuda":
        return f"TF32 is a CUDA tensor-core mode: no effect on {device.type}"
    p = torch.cuda.get_device_properties(device)
    if is_rocm():
        arch = (getattr(p, "gcnArchName", "") or "").split(":")[0]
        if not arch.startswith("gfx94"):
            where = arch or "arch unknown"
            return f"{p.name} ({where}): on AMD GPUs TF32 exists on MI300 (gfx94x) only"
        if os.environ.get("HIPBLASLT_ALLOW_TF32") != "1":
            return f"{p.name}: ROCm uses TF32 on MI300 only with HIPBLASLT_ALLOW_TF32=1 set"
        return None
    if (p.major, p.minor) < (8, 0):
        return (
            f"{p.name}: compute capability {p.major}.{p.minor} < 8.0 has no TF32 tensor cores: "
            "fp32 matmuls stay IEEE fp32"
        )
    return None


def pinned_memory_useless(device: torch.device) -> str | None:
    """Step 04: pinned (page-locked) host memory speeds host-to-GPU copies only; elsewhere the
    batch is already where the math runs."""
    if device.type == "cuda":
        return None
    return f"pinned memory speeds host-to-GPU copies: no effect on {device.type}"


def _math_why(device: torch.device, cfg: dict, dtype: torch.dtype) -> str:
    """Why torch has no fused attention kernel for the training call here, in a few words."""
    _, dtype, head, drop = sdpa_dispatch.attention_probe(device, cfg, dtype)
    if drop > 0:
        return f"dropout {drop:g} > 0 has no fused kernel on {device.type}"
    return f"no fused kernel for {dtype} and head size {head} here"


def sdpa_math_only(device: torch.device, cfg: dict, dtype: torch.dtype) -> str | None:
    """Why torch's dispatcher gives scaled_dot_product_attention's training call PyTorch's
    math path here (the same (B, H, T, T) work as hand-written attention), or None where it
    gives it a fused kernel. Asked of torch itself (torch._fused_sdp_choice) for the training
    call's shape, dtype and dropout. On a CPU, a dropout above 0 is the usual cause: the CPU
    flash kernel's checks refuse it ("Both fused kernels do not support non-zero dropout", aten
    sdp_utils_cpp.h). What the dispatcher would choose; step 07's check is what ran."""
    choice = sdpa_dispatch.dispatcher_choice(device, cfg, dtype)  # None: MPS, or torch can't say
    if choice != "math":
        return None
    why = _math_why(device, cfg, dtype)
    return f"scaled_dot_product_attention runs the math path ({why}): no flash attention"


def sdpa_math_ran(
    device: torch.device, cfg: dict, dtype: torch.dtype, attention_kernel: str
) -> str | None:
    """Step 07: why scaled_dot_product_attention gave nothing over hand-written attention in
    this run, judged on the kernel its training call ran (measure/attention_kernel.py), or None
    where a fused kernel ran (flash, efficient, cuDNN; MPS's own)."""
    if attention_kernel in sdpa_dispatch.FUSED:
        return None
    if attention_kernel != "math":
        return f"the attention kernel that ran is {attention_kernel}: no fused kernel seen"
    why = (
        _math_why(device, cfg, dtype)
        if sdpa_math_only(device, cfg, dtype)
        else ("torch's dispatcher chose a fused kernel for the call, but math ran")
    )
    return f"math path ran ({why}): the (B, H, T, T) scores of step 06, no flash attention"


def compile_disabled() -> str | None:
    """Step 08: why torch.compile returns the model unchanged here, or None where it compiles.
    (A torch.compile that cannot compile fails the run with one line naming the fix, which is
    TORCH_COMPILE_DISABLE=1; a run made that way is this case.)"""
    import torch._dynamo

    if torch._dynamo.config.disable:
        return "TORCH_COMPILE_DISABLE=1: torch.compile returns the model unchanged (eager)"
    return None


def autocast_off(device: torch.device) -> str | None:
    """Step 05: why autocast stays off here (neither bf16 nor fp16 is native, or bf16 measured
    no faster on a CPU or MPS), or None where step 05 turns it on, in bf16 or in fp16 with loss
    scaling (`precision.choice`, the step's rule)."""
    kind, why = precision.choice(device)
    return None if kind != "fp32" else f"mixed precision off on this {device.type}: {why}"


def bf16_off(device: torch.device) -> str | None:
    """Step 15: why step 05 does not compute in bf16 here (fp32, or fp16 with loss scaling where
    bf16 is not native), or None where it does."""
    kind, why = precision.choice(device)
    return None if kind == "bf16" else f"step 05 runs {kind} on this {device.type}: {why}"


def world_of_one() -> str | None:
    """Steps 11 (DDP) and 14 (FSDP2): "a world of one" in a process group of one process (plain
    python, or torchrun with one), or None where other ranks take part; each rung says what
    that means for it (rung_checks.py)."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return "a world of one" if world == 1 else None


def triton_interpreted() -> bool:
    """TRITON_INTERPRET=1: Triton runs @triton.jit kernels on CPU tensors through NumPy (its
    interpreter). Read by Triton when it is first imported, so it is set in the environment."""
    return os.environ.get("TRITON_INTERPRET") == "1"


LIGER_INTERPRETED = (
    "step 12: Liger's kernel ran through Triton's interpreter (TRITON_INTERPRET=1): numerics "
    "only, its speed and memory are not a measurement"
)


LIGER_FALLBACK = "PyTorch linear + cross-entropy ran (step 11's loss), not Liger's"
LIGER_FP16 = (
    "step 05 computes in fp16 here: Liger computes the loss's gradient in its forward pass, in "
    "fp16, before GradScaler's scale reaches it, and most of it would flush to zero"
)


def liger_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Step 12: why Liger's fused linear cross-entropy cannot run here, or None where it can (the
    step then builds LigerFusedLinearCrossEntropyLoss). It needs a CUDA GPU (or a CPU through
    Triton's interpreter, TRITON_INTERPRET=1: numerics only, the record says `interpreted`),
    step 05 not in fp16 (Liger computes the loss's gradient in forward, in fp16, before
    GradScaler's scale reaches it: the gradients of a mean over B*T targets flush to zero), and
    liger-kernel importable. Elsewhere the step computes step 11's loss, and is inactive."""
    why = None
    if not (device.type == "cuda" or (device.type == "cpu" and triton_interpreted())):
        why = f"Liger runs Triton GPU kernels: no CUDA device ({device.type})"
    elif dtype == torch.float16:
        why = LIGER_FP16
    else:
        try:  # liger_kernel.transformers imports the transformers package only where installed
            import liger_kernel.transformers  # noqa: F401
        except ImportError as e:  # not installed (macOS, Windows), or no Triton
            why = f"liger-kernel unavailable: {type(e).__name__}: {e}"
    return None if why is None else f"{LIGER_FALLBACK} ({why})"


def dropout_already_off(drop_rate) -> str | None:
    """Step 16: why taking dropout out changes nothing here (the preset has none, as `tiny`), or
    None where the preset's dropout is above 0."""
    if drop_rate:
        return None
    return "the preset has no dropout to take out (drop_rate 0): the same model as step 15"


def cudnn_attention_unavailable(device: torch.device, cfg: dict, dtype: torch.dtype) -> str | None:
    """Step 17: why cuDNN's fused attention cannot take the training call here, or None where it
    can. Asked of torch itself (torch._fused_sdp_choice with only cuDNN's backend on) for the
    training call's shape, dtype and dropout, as step 07's check, then one real call of that
    shape, forward and backward: it needs a CUDA GPU whose cuDNN has the kernel, a 16-bit dtype
    (step 05 on) and no dropout (step 16); `sdpa_kernel`'s order (`set_priority`) is torch's
    from 2.6, and pyproject.toml asks for 2.7 on."""
    if device.type != "cuda":
        return f"cuDNN attention is CUDA's: on {device.type} step 07's attention kernel stays"
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        q, dtype, head, drop = sdpa_dispatch.attention_probe(device, cfg, dtype)
        with warnings.catch_warnings(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            warnings.simplefilter("ignore")  # the refusal's reasons, printed as warnings
            choice = torch._fused_sdp_choice(q, q, q, dropout_p=drop, is_causal=True)
    except Exception as e:  # noqa: BLE001 - a torch without the probe, or one that raises
        return f"torch cannot say whether cuDNN attention runs here ({type(e).__name__}): not used"
    if choice != int(SDPBackend.CUDNN_ATTENTION):
        cc = ".".join(map(str, torch.cuda.get_device_capability(device)))
        return (
            f"cuDNN attention refuses the training call here (compute capability {cc}, {dtype}, "
            f"head size {head}, dropout {drop:g}): step 07's kernel stays"
        )
    # The choice checks constraints only; a cuDNN that accepts the call may still find no plan
    # for it. One real call of the same q, k and v, forward and backward: its failure is a
    # reason, never a failed run.
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            y = torch.nn.functional.scaled_dot_product_attention(
                q, q, q, dropout_p=drop, is_causal=True
            )
        y.float().sum().backward()
    except RuntimeError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return f"cuDNN attention failed a trial call here ({first}): step 07's kernel stays"
    return None


def cudnn_attention_no_change(
    attention_kernel: str, device: torch.device, cfg: dict, dtype: torch.dtype
) -> str | None:
    """Step 17: why the training call's attention is not cuDNN's in place of the kernel step 16
    runs, judged on the kernel that ran (measure/attention_kernel.py), or None where cuDNN ran
    and torch's own order would have given the call another kernel. Asked after the warm-up,
    between steps, where the step's `sdpa_kernel` order is not in force: the dispatcher then
    answers with torch's own order. Where that is cuDNN already (recent PyTorch on Hopper with a
    new enough cuDNN), step 16 ran cuDNN too."""
    if attention_kernel != "cudnn":
        why = cudnn_attention_unavailable(device, cfg, dtype)
        why = f" ({why})" if why else ": SDPA did not take cuDNN, though it came first"
        return f"{attention_kernel} attention ran, not cuDNN's{why}"
    if sdpa_dispatch.dispatcher_choice(device, cfg, dtype) == "cudnn":
        return (
            "cuDNN attention was already torch's choice for the training call (its own order "
            "puts cuDNN first here): step 16 ran it too"
        )
    return None


def batch_not_split(batch: int, accum_steps: int) -> str | None:
    """Step 18: why the batch is not split into micro-batches here (accum_steps 1, or a batch
    that accum_steps does not split into equal parts: spec.micro_batches), or None where it
    is."""
    if micro_batches(batch, accum_steps) > 1:
        return None
    if accum_steps <= 1:
        return f"accum_steps {accum_steps}: one micro-batch per batch, no accumulation"
    return (
        f"batch {batch} does not split into {accum_steps} equal micro-batches: it stays whole, "
        "one forward and backward per step (step 17's run)"
    )


def batch_fit_unavailable(device: torch.device, spec: RunSpec) -> str | None:
    """Step 20: why the batch is not fitted to this device's memory (not a CUDA GPU: a CPU's RAM
    would hold batches far past where a larger one helps; a batch set by hand, --batch-size,
    stays), or None where the step fits it."""
    if device.type != "cuda":
        return f"the batch is fitted to a GPU's memory: on {device.type} it stays as it was"
    if spec.batch_override is not None:
        return f"--batch-size {spec.batch_override} set by hand: kept"
    return None


def batch_not_grown(device: torch.device, spec: RunSpec, batch: int, start: int) -> str | None:
    """Step 20, on what ran: why the run's batch is the one it started from, `start` (the
    reasons above, or no larger power of two fits this GPU), or None where it grew."""
    why = batch_fit_unavailable(device, spec)
    if why is not None or batch > start:
        return why
    return (
        f"no batch twice {batch} fits this GPU by the memory model (x{FIT_MARGIN} and the CUDA "
        "context), or the text's training windows: the batch stays as it was"
    )


def offload_moves_nothing(device: torch.device) -> str | None:
    """Step 21: CPU offload moves the state from an accelerator's memory to the host's; on a CPU
    the state is in host memory already (the step runs FSDP2's offload path, unpinned)."""
    if device.type != "cpu":
        return None
    return "CPU offload moves the state off a GPU into host memory: on a CPU it is there already"


LIGER_RAN = "step 12: Liger fused linear cross-entropy kernel ran"  # the step's note, each run


def interpreted(notes: list[str]) -> bool:
    """Whether a run's Triton kernels (step 12's Liger, in the steps from 12) ran through Triton's
    interpreter: its record then says `interpreted: true` (its notes hold LIGER_INTERPRETED,
    which Run.note adds beside LIGER_RAN), and the summary, gains and `python -m speed_ladder check`
    never take its speed or memory for a measurement."""
    return triton_interpreted() and any(n.startswith(LIGER_RAN) for n in notes)
