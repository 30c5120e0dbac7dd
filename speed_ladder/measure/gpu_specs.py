"""What a GPU can compute, by the name torch.cuda.get_device_name() gives it: its vendor's dense
peak FLOP/s (the MFU denominator, with its source) and whether it has bf16 or fp16 tensor cores.
Pure functions of what torch.cuda.get_device_properties() reports, so every branch runs in the CPU
tests. The table's rules, and how to add a GPU: docs/measurement.md, "GPU peaks"."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path


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


PEAKS_CSV = Path(__file__).resolve().parent.parent / "data" / "gpu_peaks.csv"


def read_peaks(path: Path = PEAKS_CSV) -> tuple[Row, ...]:
    """The table of GPU peaks: a regex per product, more specific ones written to exclude the
    general ones ("A10" is not "A10G" or "A100"); laptop and "D" GeForce cards match nothing."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return tuple(Row(**{**r, "tflops": float(r["tflops"]), "sms": int(r["sms"])}) for r in rows)


GPU_PEAKS = read_peaks()

UNKNOWN = (
    "no dense bf16 peak known for {name!r}: MFU left empty; add a row to "
    "speed_ladder/data/gpu_peaks.csv with the vendor datasheet's dense bf16 figure (halve a "
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
    capability 7.x (Volta, Turing); AMD GPUs without bf16 matrix cores: no rule here."""
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
