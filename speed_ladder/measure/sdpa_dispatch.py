"""What torch's scaled_dot_product_attention dispatcher chooses for a model's training call:
the call's q (= k = v) for one sequence as the model lays it out (`attention_probe`), and the
backend torch's dispatcher picks for it under the settings in force (`dispatcher_choice`). Asked
by the rungs' checks (measure/inactive.py: steps 07 and 17) and by the attention watch
(measure/attention_kernel.py) where no warm-up step showed the kernel that ran."""

import torch

FUSED = ("flash", "efficient", "cudnn", "mps", "overrideable")  # no (B, H, T, T) scores
# torch.nn.attention.SDPBackend's names, as the dispatcher answers
BACKENDS = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "CUDNN_ATTENTION": "cudnn",
    "MATH": "math",
    "OVERRIDEABLE": "overrideable",
}


def attention_probe(device: torch.device, cfg: dict, dtype: torch.dtype):
    """What a check asks torch about: the training call's q (= k = v) for one sequence, laid out
    as the model lays it out ((B, T, H, Q) transposed to (B, H, T, Q)) and requiring grad, in
    autocast's `dtype`; that dtype, the head size and the dropout."""
    heads, head = cfg["n_heads"], cfg["emb_dim"] // cfg["n_heads"]
    x = torch.zeros(1, cfg["context_length"], heads, head, device=device, dtype=dtype)
    x.requires_grad_(True)
    return x.transpose(1, 2), dtype, head, float(cfg.get("drop_rate") or 0.0)


def dispatcher_choice(device: torch.device, cfg: dict, dtype: torch.dtype) -> str | None:
    """The kernel torch's dispatcher chooses for the training call (its shape, dtype, dropout
    and layout: attention_probe) under the settings in force now, or None where
    torch cannot say (torch._fused_sdp_choice missing, or MPS)."""
    if device.type not in ("cpu", "cuda"):
        return None
    try:
        from torch.nn.attention import SDPBackend

        q, _, _, drop = attention_probe(device, cfg, dtype)
        choice = torch._fused_sdp_choice(q, q, q, dropout_p=drop, is_causal=True)
        return BACKENDS.get(SDPBackend(choice).name)
    except Exception:  # noqa: BLE001 - an older or newer torch without this probe
        return None
