"""What a GPU can compute, by the name torch.cuda.get_device_name() gives it: its vendor's dense
peak FLOP/s (the MFU denominator, with its source) and whether it has bf16 or fp16 tensor cores.
Pure functions of what torch.cuda.get_device_properties() reports, so every branch runs in the CPU
tests. The table's rules, and how to add a GPU: docs/measurement.md, "GPU peaks"."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    label: str
    pattern: str  # regex, searched case-insensitively in torch.cuda.get_device_name()
    tflops: float  # dense peak, TFLOP/s
    precision: str  # "bf16"; "fp16" where the GPU has no bf16 tensor cores
    sms: int  # SMs (CUs on AMD) of the whole product, as multi_processor_count reports them
    source: str  # URL and the figure's wording
    note: str = ""
    arch: str = ""  # AMD gcnArchName, to recognise a device ROCm names only "AMD Radeon Graphics"


@dataclass(frozen=True)
class Peak:
    flops: float | None  # FLOP/s; None for a MIG slice whose SM count is unknown
    precision: str
    label: str
    source: str
    note: str = ""


_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (H100 datasheet)"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 datasheet)"
_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_GA102 = (
    "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
)
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_RTX_BW = (
    "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
    "nvidia-rtx-blackwell-gpu-architecture.pdf"
)
_V100 = (
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_GEFORCE = "GeForce: fp32-accumulate rate, half the fp16-accumulate one"
_SP = "with sparsity -> dense half"

# More specific patterns are written to exclude the general ones ("A10" is not "A10G" or
# "A100", "L4" is not "L40"/"L40S", laptop and China-only "D" GeForce cards match nothing).
GPU_PEAKS: tuple[Row, ...] = (
    Row("H100 PCIe", r"\bH100\b.*PCIe", 756.5, "bf16", 114,
        f"{_H100}: BFLOAT16 Tensor Core 1,513 TFLOPS* ({_SP})"),
    Row("H100 NVL", r"\bH100\b.*\bNVL\b", 835.5, "bf16", 132,
        f"{_H100}: H100 NVL BFLOAT16 Tensor Core 1,671 TFLOPS* ({_SP})"),
    Row("H100 SXM", r"\bH100\b(?!.*(PCIe|\bNVL\b))", 989.5, "bf16", 132,
        f"{_H100}: H100 SXM BFLOAT16 Tensor Core 1,979 TFLOPS* ({_SP})",
        "'NVIDIA H100 80GB HBM3' is the SXM5 board; a name without PCIe/NVL is taken as SXM"),
    Row("H200 NVL", r"\bH200\b.*\bNVL\b", 835.5, "bf16", 132,
        f"{_H200}: H200 NVL BFLOAT16 Tensor Core 1,671 TFLOPS* ({_SP})"),
    Row("H200 SXM", r"\bH200\b(?!.*\bNVL\b)", 989.5, "bf16", 132,
        f"{_H200}: H200 SXM BFLOAT16 Tensor Core 1,979 TFLOPS* ({_SP})"),
    Row("H800 PCIe", r"\bH800\b.*PCIe", 756.5, "bf16", 114,
        "https://www.nvidia.cn/data-center/h800/ (H800 PCIe): BF16 Tensor Core 1,513 TFLOPS* "
        f"({_SP}), the H100 PCIe's rate",
        "H800 = export H100 (NVLink and FP64 cut, tensor rate kept)"),
    Row("H800 SXM", r"\bH800\b(?!.*PCIe)", 989.5, "bf16", 132,
        "https://www.nvidia.cn/data-center/h800/ (H800 SXM5): BF16 Tensor Core 1,979 TFLOPS* "
        f"({_SP}), the H100 SXM's rate",
        "H800 = export H100 (NVLink and FP64 cut, tensor rate kept)"),
    Row("A100 PCIe", r"\bA100\b.*PCIe", 312.0, "bf16", 108,
        f"{_A100}: BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS* (*with sparsity): 312 dense"),
    Row("A100 SXM", r"\bA100\b(?!.*PCIe)", 312.0, "bf16", 108,
        f"{_A100}: BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS* (*with sparsity): 312 dense"),
    Row("A800 PCIe", r"\bA800\b.*PCIe", 312.0, "bf16", 108,
        "https://www.nvidia.cn/data-center/a800/ (A800 datasheet): BFLOAT16 Tensor Core "
        "312 TFLOPS | 624 TFLOPS* (*with sparsity), the A100's rate",
        "A800 = export A100 (NVLink cut to 400 GB/s, tensor rate kept)"),
    Row("A800 SXM", r"\bA800\b(?!.*PCIe)", 312.0, "bf16", 108,
        "https://www.nvidia.cn/data-center/a800/ (A800 datasheet): BFLOAT16 Tensor Core "
        "312 TFLOPS | 624 TFLOPS* (*with sparsity), the A100's rate",
        "A800 = export A100 (NVLink cut to 400 GB/s, tensor rate kept)"),
    Row("L4", r"\bL4\b", 121.0, "bf16", 58,
        "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet: "
        f"BFLOAT16 Tensor Core 242 teraFLOPS* ({_SP})"),
    Row("L40S", r"\bL40S\b", 362.05, "bf16", 142,
        "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413: "
        "BF16 Tensor Core 362.05 | 733* TFLOPS (*with sparsity): 362.05 dense"),
    Row("L40", r"\bL40\b", 181.05, "bf16", 142,
        "https://www.nvidia.com/en-us/data-center/l40/ (L40 datasheet): "
        "BFLOAT16 Tensor Core 181.05 | 362.1* TFLOPS (*with sparsity): 181.05 dense"),
    Row("A10", r"\bA10\b", 125.0, "bf16", 72,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/"
        "a10-datasheet.pdf: BF16 Tensor Core 125 TF | 250 TF* (*with sparsity): 125 dense"),
    Row("A10G", r"\bA10G\b", 70.0, "bf16", 80,
        "no NVIDIA datasheet (AWS-only part, EC2 G5): 80 SMs x 1710 MHz boost x 512 FLOP/clk/SM "
        "(the GeForce-style fp32-accumulate rate) = 70 TFLOPS; https://www.baseten.co/blog/"
        "nvidia-a10-vs-a10g-for-ml-model-inference/ says the A10G trades the A10's tensor rate "
        "for CUDA-core rate; a PyTorch bf16 matmul reaches 69.5 TFLOPS on one (https://"
        "github.com/zzc0721/torch-performance-test-data/issues/126), so 125+ cannot be its peak",
        "A10G figure is derived, not from a vendor datasheet"),
    Row("GeForce RTX 3090 Ti", r"\bRTX 3090 Ti\b(?!.*Laptop)", 80.0, "bf16", 84,
        f"derived from {_GA102} (RTX 3090 row: 82 SMs x 1695 MHz -> 71.2) at the 3090 Ti's "
        "84 SMs x 1860 MHz boost: 84 x 1.86 GHz x 512 FLOP/clk/SM = 80.0 TFLOPS",
        f"{_GEFORCE}; figure derived, the whitepaper predates the 3090 Ti"),
    Row("GeForce RTX 3090", r"\bRTX 3090\b(?! Ti)(?!.*Laptop)", 71.2, "bf16", 82,
        f"{_GA102} (RTX 3090): Peak BF16 Tensor TFLOPS with FP32 Accumulate 71/142 "
        f"(dense/sparse); {_RTX_BW} Table 3 prints 71.2/142.4", _GEFORCE),
    Row("GeForce RTX 4090", r"\bRTX 4090\b(?!\s*D\b)(?!.*Laptop)", 165.2, "bf16", 128,
        f"{_ADA} Appendix A: Peak BF16 Tensor TFLOPS with FP32 Accumulate 165.2/330.4 "
        "(dense/sparse)", _GEFORCE),
    Row("GeForce RTX 5090", r"\bRTX 5090\b(?!\s*D\b)(?!.*Laptop)", 209.5, "bf16", 170,
        f"{_RTX_BW} Table 3: Peak BF16 Tensor TFLOPS with FP32 Accumulate 209.5/419 "
        "(dense/sparse)", f"{_GEFORCE}; boards often clock above the rated boost"),
    Row("RTX A6000", r"\bRTX A6000\b(?!.*Ada)", 154.8, "bf16", 84,
        f"{_GA102} Table 3: RTX A6000 Peak BF16 Tensor TFLOPS with FP32 Accumulate "
        "154.8/309.6 (dense/sparse); RTX A6000 datasheet: Tensor Performance 309.7 TFLOPS "
        "(sparse)", "workstation part: fp32 accumulate at full rate, unlike GeForce"),
    Row("RTX 6000 Ada", r"\bRTX 6000 Ada\b", 364.2, "bf16", 142,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/"
        "quadro-product-literature/NVIDIA-RTX-Blackwell-PRO-GPU-Architecture-v1.0.pdf Table 4: "
        "RTX 6000 Ada BF16 Tensor with FP32 Accumulate 364/728 TFLOPS (dense/sparse); "
        "= 142 SMs x 2505 MHz x 1024 FLOP/clk/SM = 364.2; datasheet: Tensor Performance "
        "1,457 TFLOPS (fp8, sparse), 4x that",
        "workstation part: fp32 accumulate at full rate, unlike GeForce"),
    Row("V100 SXM2", r"\bV100-SXM", 125.0, "fp16", 80,
        f"{_V100}: V100 SXM2 Tensor Performance 125 TFLOPS (fp16 in, fp32 accumulate; dense)",
        "Volta has no bf16 tensor cores: fp16 peak used"),
    Row("V100 PCIe", r"\bV100-PCIe", 112.0, "fp16", 80,
        f"{_V100}: V100 PCIe Tensor Performance 112 TFLOPS (fp16 in, fp32 accumulate; dense)",
        "Volta has no bf16 tensor cores: fp16 peak used"),
    Row("V100S PCIe", r"\bV100S\b", 130.0, "fp16", 80,
        f"{_V100}: V100S PCIe Tensor Performance 130 TFLOPS (fp16 in, fp32 accumulate; dense)",
        "Volta has no bf16 tensor cores: fp16 peak used"),
    Row("T4", r"\bT4\b", 65.0, "fp16", 40,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
        "t4-tensor-core-datasheet-951643.pdf: Mixed Precision (FP16/FP32) 65 TFLOPS (dense)",
        "Turing has no bf16 tensor cores: fp16 peak used"),
    Row("MI250X (one GCD)", r"\bMI250X\b", 191.5, "bf16", 110,
        "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html: Peak bfloat16 "
        "383.0 TFLOPs per module of 2 GCDs (220 CUs; AMD prints no sparse figure) -> 191.5 per GCD",
        "ROCm shows each GCD as a device; 'MI250X/MI250' with 104 CUs is an MI250 GCD",
        "gfx90a"),
    Row("MI250 (one GCD)", r"^(?!.*MI250X).*\bMI250\b", 181.05, "bf16", 104,
        "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html: Peak bfloat16 "
        "362.1 TFLOPs per module of 2 GCDs (208 CUs) -> 181.05 per GCD",
        "ROCm shows each GCD as a device", "gfx90a"),
    Row("MI300X", r"\bMI300X\b", 1307.4, "bf16", 304,
        "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
        "amd-instinct-mi300x-data-sheet.pdf: Peak bfloat16 1307.4 TFLOPs (2614.9 with "
        "structured sparsity)", "", "gfx942"),
)  # fmt: skip

UNKNOWN = (
    "no dense bf16 peak known for {name!r}: MFU left empty; add a row to GPU_PEAKS in "
    "speed_ladder/measure/gpu_specs.py with the vendor datasheet's dense bf16 figure (halve a "
    "'with sparsity' one), the SM count and the source"
)
_MIG = re.compile(r"\bMIG\b[\s-]*([\w.+]*)", re.I)


def _row(name: str, sm_count: int | None, arch: str | None) -> tuple[Row | None, str]:
    for row in GPU_PEAKS:
        if re.search(row.pattern, name, re.I):
            return row, ""
    base = (arch or "").split(":")[0].strip().lower()
    for row in GPU_PEAKS:  # ROCm without its marketing-name table says "AMD Radeon Graphics"
        if base and row.arch == base and sm_count == row.sms:
            return row, f"recognised by gcnArchName {base} and {sm_count} CUs ({name!r} is generic)"
    return None, ""


def lookup(name: str, sm_count: int | None = None, arch: str | None = None) -> Peak | None:
    """The dense peak of the GPU torch.cuda.get_device_name() calls `name`, None when unknown.
    A MIG slice or partition with `sm_count` SMs (multi_processor_count) below its product's
    gets that share of the peak (a MIG slice without it: flops None); `arch` (gcnArchName)
    recognises a generic ROCm name."""
    row, how = _row(name, sm_count, arch)
    if row is None:
        return None
    unit = "CUs" if row.arch else "SMs"
    mig = _MIG.search(name)
    label = f"MIG slice {mig.group(1)} of an {row.label}".replace("  ", " ") if mig else row.label
    notes = [n for n in (how, row.note) if n]
    flops = row.tflops * 1e12
    if sm_count is not None and sm_count > 0:
        if sm_count < row.sms:
            flops *= sm_count / row.sms
            what = "MIG slice" if mig else "partition or cut-down variant"
            notes.insert(0, f"{what}: {sm_count} of the {row.sms} {unit}, peak scaled to match")
        elif sm_count > row.sms:
            notes.append(f"the device has {sm_count} {unit}, the table {row.sms}: check the row")
    elif mig:
        why = f"a MIG slice's share of the whole GPU's {row.tflops:g} TFLOP/s needs its SM count"
        return Peak(None, row.precision, label, row.source, f"{why}: MFU left empty")
    return Peak(flops, row.precision, label, row.source, "; ".join(notes))


def peak_flops(
    name: str, sm_count: int | None = None, arch: str | None = None
) -> tuple[float | None, str]:
    """(peak FLOP/s or None, a description for the record's notes) of one GPU."""
    peak = lookup(name, sm_count, arch)
    if peak is None:
        return None, UNKNOWN.format(name=name)
    if peak.flops is None:
        return None, f"{name}: {peak.label}: {peak.note}"
    tflops = peak.flops / 1e12
    desc = f"{name}: {peak.label}: dense {peak.precision} peak {tflops:.1f} TFLOP/s [{peak.source}]"
    return peak.flops, desc + (f"; {peak.note}" if peak.note else "")


_ROCM_BF16 = (
    ("gfx908", "MI100 (CDNA1) has bf16 matrix cores, at half its fp16 rate"),
    ("gfx90a", "MI200 (CDNA2) has bf16 matrix cores"),
    ("gfx94", "MI300 (CDNA3) has bf16 matrix cores"),
    ("gfx95", "MI350 (CDNA4) has bf16 matrix cores"),
    ("gfx11", "RDNA3 has bf16 WMMA"),
    ("gfx12", "RDNA4 has bf16 WMMA"),
)
_ROCM_NO_EVIDENCE = "torch.cuda.is_bf16_supported() is True on every ROCm device: no evidence"


def has_native_bf16(
    major: int, minor: int, is_rocm: bool = False, arch: str | None = None
) -> tuple[bool, str]:
    """Whether bf16 matmuls run on matrix hardware here, and why: NVIDIA from compute capability
    8.0 (torch.cuda.is_bf16_supported() says True below it too, where bf16 is emulated); ROCm,
    whose major/minor are no compute capability, by the gcnArchName `arch` (_ROCM_BF16)."""
    if is_rocm:
        base = (arch or "").split(":")[0].strip().lower()
        if not base:
            return False, f"ROCm device without a gcnArchName: cannot tell ({_ROCM_NO_EVIDENCE})"
        for prefix, why in _ROCM_BF16:
            if base.startswith(prefix):
                return True, f"ROCm {base}: {why}"
        return False, f"ROCm {base}: no bf16 matrix cores known for this arch ({_ROCM_NO_EVIDENCE})"
    cc = f"compute capability {major}.{minor}"
    if (major, minor) >= (8, 0):
        return True, f"{cc} >= 8.0 (Ampere or newer): bf16 tensor cores"
    return False, (
        f"{cc} < 8.0: no bf16 tensor cores; torch.cuda.is_bf16_supported() still says True "
        "because bf16 runs emulated (slowly, without tensor cores), so it is not evidence; "
        "fp16 is this GPU's tensor-core half precision"
    )


def peak_for(props) -> tuple[float | None, str]:
    """peak_flops() from a torch.cuda.get_device_properties() result (or anything alike)."""
    arch = getattr(props, "gcnArchName", None) or None
    return peak_flops(props.name, getattr(props, "multi_processor_count", None), arch)


def bf16_for(props, is_rocm: bool) -> tuple[bool, str]:
    """has_native_bf16() from a torch.cuda.get_device_properties() result (or anything alike)."""
    arch = getattr(props, "gcnArchName", None) or None
    return has_native_bf16(props.major, props.minor, is_rocm, arch)


def fp16_tensor_cores(major: int, minor: int, is_rocm: bool = False) -> tuple[bool, str]:
    """Whether a GPU without native bf16 runs fp16 on tensor cores, and why: NVIDIA compute
    capability 7.x (Volta, Turing). Below 7.0 fp16 has no tensor cores (and most Pascal cards
    run it at a fraction of fp32's rate); AMD GPUs without bf16 matrix cores: no rule here."""
    if is_rocm:
        return False, "AMD GPU without bf16 matrix cores: no fp16 rule here, fp32 kept"
    cc = f"compute capability {major}.{minor}"
    if (major, minor) >= (7, 0):
        return True, f"{cc} has fp16 tensor cores: fp16 autocast with loss scaling"
    return False, f"{cc} < 7.0 has no fp16 tensor cores either: fp32 kept"


def autocast_for(props, is_rocm: bool) -> str:
    """Step 05's autocast on this GPU (speed_ladder.measure.precision): bf16 where it is
    native, else fp16 where it runs on tensor cores, else fp32."""
    if bf16_for(props, is_rocm)[0]:
        return "bf16"
    return "fp16" if fp16_tensor_cores(props.major, props.minor, is_rocm)[0] else "fp32"
