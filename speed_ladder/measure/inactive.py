"""Is a step's idea active here? Each function returns why a step's optimization does nothing on
this device, or None where it acts; the step passes it to `run.inactive()` in one line (None
records nothing), and where there is a reason its record says `step_active: false` (the
summary, README table and charts then show the step as inactive here, never as a gain or a
loss). bf16 (step 05) is `device.bf16_is_fast`, which the memory model needs too."""

import os

import torch

from speed_ladder import ladder
from speed_ladder.measure.device import is_rocm


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


def _attention_probe(device: torch.device, cfg: dict, bf16: bool):
    """What a check asks torch about: the training call's q (= k = v) for one sequence, laid out
    as the model lays it out ((B, T, H, Q) transposed to (B, H, T, Q)) and requiring grad; its
    dtype, head size and dropout."""
    heads, head = cfg["n_heads"], cfg["emb_dim"] // cfg["n_heads"]
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.zeros(1, cfg["context_length"], heads, head, device=device, dtype=dtype)
    x.requires_grad_(True)
    return x.transpose(1, 2), dtype, head, float(cfg.get("drop_rate") or 0.0)


def sdpa_math_only(device: torch.device, cfg: dict, bf16: bool) -> str | None:
    """Step 07: why scaled_dot_product_attention runs PyTorch's math path here (the same
    (B, H, T, T) work as hand-written attention), or None where a fused kernel runs. Asked of
    torch itself (torch._fused_sdp_choice) for the training call's shape, dtype and dropout.
    On a CPU, a dropout above 0 is the usual cause: the CPU flash kernel's checks refuse it
    ("Both fused kernels do not support non-zero dropout", aten sdp_utils_cpp.h)."""
    if device.type not in ("cpu", "cuda"):
        return None  # MPS has its own attention kernel; torch offers no way to ask
    try:
        from torch.nn.attention import SDPBackend

        q, dtype, head, drop = _attention_probe(device, cfg, bf16)
        choice = torch._fused_sdp_choice(q, q, q, dropout_p=drop, is_causal=True)
    except Exception:  # an older or newer torch without this probe: say nothing
        return None
    if choice != int(SDPBackend.MATH):
        return None
    why = f"dropout {drop:g} > 0 has no fused kernel on {device.type}" if drop > 0 else (
        f"no fused kernel for {dtype} and head size {head} here"
    )  # fmt: skip
    return f"scaled_dot_product_attention runs the math path ({why}): no flash attention"


def compile_disabled() -> str | None:
    """Step 08: why torch.compile returns the model unchanged here, or None where it compiles.
    (A torch.compile that cannot compile fails the run with one line naming the fix, which is
    TORCH_COMPILE_DISABLE=1; a run made that way is this case.)"""
    import torch._dynamo

    if torch._dynamo.config.disable:
        return "TORCH_COMPILE_DISABLE=1: torch.compile returns the model unchanged (eager)"
    return None


def world_of_one(step: str) -> str | None:
    """Steps 11 (DDP) and 14 (FSDP2): why the step does nothing in a process group of one
    process (plain python, or torchrun with one), or None where other ranks take part. The
    reason is the rung's own (its `inactive.why` in speed_ladder/data/ladder.json)."""
    import torch.distributed as dist

    return ladder.rung(step).inactive.why if dist.get_world_size() == 1 else None


def triton_interpreted() -> bool:
    """TRITON_INTERPRET=1: Triton runs @triton.jit kernels on CPU tensors through NumPy (its
    interpreter). Read by Triton when it is first imported, so it is set in the environment."""
    return os.environ.get("TRITON_INTERPRET") == "1"


LIGER_INTERPRETED = (
    "step 12: Liger's kernel ran through Triton's interpreter (TRITON_INTERPRET=1): numerics "
    "only, its speed and memory are not a measurement"
)


def liger_unavailable(device: torch.device) -> str | None:
    """Step 12: why Liger's fused linear cross-entropy cannot run on this device, or None where
    it can: a CUDA GPU, or a CPU with Triton's interpreter on (TRITON_INTERPRET=1, for checking
    the kernel's numerics and the step's call path: the record then says `interpreted: true`
    and is no measurement). Whether liger-kernel imports is the step's to find out."""
    if device.type == "cuda" or (device.type == "cpu" and triton_interpreted()):
        return None
    return f"Liger runs Triton GPU kernels: no CUDA device ({device.type})"


def dropout_already_off(drop_rate) -> str | None:
    """Step 16: why taking dropout out changes nothing here (the preset has none, as `tiny`), or
    None where the preset's dropout is above 0."""
    if drop_rate:
        return None
    return "the preset has no dropout to take out (drop_rate 0): the same model as step 15"


def cudnn_attention_unavailable(device: torch.device, cfg: dict, bf16: bool) -> str | None:
    """Step 17: why cuDNN's fused attention cannot take the training call here, or None where it
    can. Asked of torch itself (torch._fused_sdp_choice with only cuDNN's backend on) for the
    training call's shape, dtype and dropout, as step 07's check, then one real call of that
    shape, forward and backward: it needs a CUDA GPU whose cuDNN has the kernel, bf16 (step 05
    on) and no dropout (step 16)."""
    if device.type != "cuda":
        return f"cuDNN attention is CUDA's: on {device.type} step 07's attention kernel stays"
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        q, dtype, head, drop = _attention_probe(device, cfg, bf16)
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


LIGER_RAN = "step 12: Liger fused linear cross-entropy kernel ran"  # the step's note, each run


def interpreted(notes: list[str]) -> bool:
    """Whether a run's Triton kernels (step 12's Liger, in the steps from 12) ran through Triton's
    interpreter: its record then says `interpreted: true` (its notes hold LIGER_INTERPRETED,
    which Run.note adds beside LIGER_RAN), and the summary, gains and `python -m speed_ladder check`
    never take its speed or memory for a measurement."""
    return triton_interpreted() and any(n.startswith(LIGER_RAN) for n in notes)
