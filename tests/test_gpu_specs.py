"""speed_ladder.measure.gpu_specs: every GPU of REQUIRED resolves to its datasheet figure, and no
other.

The names are torch.cuda.get_device_name() strings as public code and reports print them:
llm.c's llmc/mfu.h (V100, A100, RTX A6000, RTX 3090/3090 Ti/4090, H100 PCIe, "NVIDIA H100 80GB
HBM3"), nanoGPT PR #464 (H100 80GB HBM3), llm.c PR #621 (A10), RunPod's GPU type ids, which are
device names (L4, L40S, H200, RTX 4090/5090, RTX 6000 Ada), zzc0721/torch-performance-test-data
issues (A10G #126, RTX 5090 D #167, RTX 5090 Laptop GPU #116), pytorch/ao PR #2853 (MI300X,
gcnArchName 'gfx942:sramecc+:xnack-', 304 CUs), rocminfo's marketing name in ROCm/aiter #179
("AMD Instinct MI250X/MI250"), and MIG slices from HPC notes and bug reports. L40, V100S, H800
SXM and a few MIG profiles follow the same naming where no printed one was found.
"""

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from speed_ladder.measure import gpu_specs


def _samples() -> list[tuple]:
    """tests/gpu_samples.csv, a row per sample: (name, multi_processor_count (empty: not passed),
    expected dense TFLOP/s, precision, the label of the one GPU_PEAKS row it matches)."""
    with open(Path(__file__).with_name("gpu_samples.csv"), newline="") as f:
        return [
            (r["name"], int(r["sms"]) if r["sms"] else None, float(r["tflops"]), r["precision"],
             r["label"])
            for r in csv.DictReader(f)
        ]  # fmt: skip


SAMPLES = _samples()

# The GPUs the table must cover, by the label of the row that covers each.
REQUIRED = {
    "A100 SXM", "A100 PCIe", "H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "H200 NVL",
    "H800 SXM", "A800 SXM", "L4", "L40S", "A10", "A10G", "GeForce RTX 3090", "GeForce RTX 4090",
    "GeForce RTX 5090", "RTX A6000", "RTX 6000 Ada", "V100 SXM2", "V100 PCIe", "T4",
    "MI250X (one GCD)", "MI300X",
}  # fmt: skip


@pytest.mark.parametrize("name,sms,tflops,precision,label", SAMPLES)
def test_each_gpu_resolves_to_its_figure_through_exactly_one_row(
    name, sms, tflops, precision, label
):
    rows = [
        r.label for r in gpu_specs.GPU_PEAKS if gpu_specs.re.search(r.pattern, name, gpu_specs.re.I)
    ]
    assert rows == [label]  # specificity does not hang on the table's order
    peak = gpu_specs.lookup(name, sms)
    assert (peak.flops, peak.precision, peak.label) == (
        pytest.approx(tflops * 1e12),
        precision,
        label,
    )
    flops, desc = gpu_specs.peak_flops(name, sms)
    assert flops == pytest.approx(tflops * 1e12)
    assert name in desc and label in desc and f"{tflops:.1f} TFLOP/s" in desc
    assert f"dense {precision}" in desc and "http" in desc


def test_every_required_gpu_has_a_row_and_a_sample():
    assert REQUIRED <= {r.label for r in gpu_specs.GPU_PEAKS}
    assert REQUIRED <= {s[4] for s in SAMPLES}


def test_every_row_is_complete_and_sourced():
    assert {r.label for r in gpu_specs.GPU_PEAKS} == {
        s[4] for s in SAMPLES
    }  # a sample for each row
    for row in gpu_specs.GPU_PEAKS:
        assert row.source.strip() and "http" in row.source, row.label
        assert row.precision in ("bf16", "fp16") and row.tflops > 0 and row.sms > 0, row.label
        assert len(row.label) > 1 and gpu_specs.re.compile(row.pattern)


@pytest.mark.parametrize(
    "name,label",
    [
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
        ("NVIDIA H100", "H100 SXM"),  # no form factor in the name: the SXM figure, said so
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("GeForce RTX 3090", "GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 3090 Ti", "GeForce RTX 3090 Ti"),
    ],
)
def test_similar_names_are_told_apart(name, label):
    assert gpu_specs.lookup(name).label == label


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce RTX 4090 Laptop GPU",  # AD103, 76 SMs: not the desktop 4090
        "NVIDIA GeForce RTX 5090 Laptop GPU",
        "NVIDIA GeForce RTX 4090 D",  # China-only, 114 SMs
        "NVIDIA GeForce RTX 5090 D",
        "Quadro RTX 6000",  # Turing, not the RTX 6000 Ada
        "NVIDIA GH200 480GB",  # not an H200
        "NVIDIA A100X",
        "NVIDIA GeForce GTX 1080 Ti",
        "AMD Radeon Graphics",
        "",
    ],
)
def test_an_unknown_gpu_gets_no_peak_and_a_note_on_how_to_add_it(name):
    assert gpu_specs.lookup(name) is None
    flops, note = gpu_specs.peak_flops(name, 100)
    assert flops is None
    assert repr(name) in note and "MFU left empty" in note
    assert "add a row to speed_ladder/data/gpu_peaks.csv" in note and "sparsity" in note


def test_the_h100_sxm_is_the_datasheets_sparse_figure_halved():
    assert gpu_specs.lookup("NVIDIA H100 80GB HBM3").flops == 1979e12 / 2
    assert "with sparsity" in gpu_specs.lookup("NVIDIA H100 80GB HBM3").source
    assert "taken as SXM" in gpu_specs.peak_flops("NVIDIA H100")[1]


@pytest.mark.parametrize("name", ["Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB", "Tesla T4"])
def test_v100_and_t4_use_their_fp16_peak_and_say_so(name):
    peak = gpu_specs.lookup(name)
    assert peak.precision == "fp16" and "no bf16 tensor cores" in peak.note
    _, desc = gpu_specs.peak_flops(name)
    assert "dense fp16" in desc and "no bf16 tensor cores" in desc


@pytest.mark.parametrize(
    "name,sms,full,full_sms",
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 14, 312.0, 108),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", 42, 312.0, 108),
        ("NVIDIA A100 80GB PCIe MIG 3g.40gb", 42, 312.0, 108),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 989.5, 132),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60, 989.5, 132),
        ("NVIDIA A100 80GB PCIe MIG-1g.10gb", 14, 312.0, 108),
    ],
)
def test_a_mig_slice_gets_its_share_of_the_peak_and_is_named_a_slice(name, sms, full, full_sms):
    flops, desc = gpu_specs.peak_flops(name, sms)
    assert flops == pytest.approx(full * 1e12 * sms / full_sms)
    assert flops < full * 1e12
    profile = name.split("MIG")[1].strip(" -")
    assert f"MIG slice {profile} of an" in desc and f"{sms} of the {full_sms} SMs" in desc


def test_a_mig_slice_without_its_sm_count_gets_no_peak():
    for sms in (None, 0):
        peak = gpu_specs.lookup("NVIDIA A100-SXM4-40GB MIG 1g.5gb", sms)
        assert peak.flops is None and peak.label == "MIG slice 1g.5gb of an A100 SXM"
        flops, note = gpu_specs.peak_flops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", sms)
        assert flops is None and "MIG slice" in note and "SM count" in note
        assert "MFU left empty" in note


def test_amd_partitions_and_shared_names_scale_by_compute_units():
    # ROCm names both products "MI250X/MI250"; an MI250 GCD has 104 CUs, and AMD's MI250 figure
    # (362.1 per module) halves to exactly the scaled value
    flops, desc = gpu_specs.peak_flops("AMD Instinct MI250X/MI250", 104)
    assert flops == pytest.approx(181.05e12, rel=1e-4) and "104 of the 110 CUs" in desc
    # an MI300X in CPX mode shows up as 8 devices of 38 CUs
    assert gpu_specs.peak_flops("AMD Instinct MI300X", 38)[0] == pytest.approx(1307.4e12 / 8)


def test_a_device_with_more_sms_than_its_row_keeps_the_datasheet_peak_and_says_so():
    flops, desc = gpu_specs.peak_flops("NVIDIA A10", 80)
    assert flops == 125e12 and "check the row" in desc


def test_a_generic_rocm_name_is_recognised_by_arch_and_cu_count():
    flops, desc = gpu_specs.peak_flops("AMD Radeon Graphics", 304, "gfx942:sramecc+:xnack-")
    assert flops == pytest.approx(1307.4e12) and "MI300X" in desc and "gfx942" in desc
    assert gpu_specs.peak_flops("AMD Radeon Graphics", 228, "gfx942")[0] is None  # MI300A: unknown
    assert gpu_specs.peak_flops("AMD Radeon Graphics", 110, "gfx90a")[0] == pytest.approx(191.5e12)


@pytest.mark.parametrize(
    "cc,native",
    [((7, 0), False), ((7, 5), False), ((8, 0), True), ((8, 6), True), ((8, 9), True),
     ((9, 0), True), ((10, 0), True), ((12, 0), True)],
)  # fmt: skip
def test_native_bf16_is_compute_capability_8_or_newer(cc, native):
    ok, why = gpu_specs.has_native_bf16(*cc)
    assert ok is native and f"{cc[0]}.{cc[1]}" in why
    if not native:
        assert "emulated" in why and "is_bf16_supported" in why


@pytest.mark.parametrize(
    "arch,native",
    [("gfx90a:sramecc+:xnack-", True), ("gfx942:sramecc+:xnack-", True), ("gfx950", True),
     ("gfx908", True), ("gfx1100", True), ("gfx906:sramecc+:xnack-", False), (None, False)],
)  # fmt: skip
def test_rocm_decides_bf16_from_the_arch_not_torch_major_minor(arch, native):
    ok, why = gpu_specs.has_native_bf16(9, 4, is_rocm=True, arch=arch)  # torch says 9.x for gfx9
    assert ok is native and "ROCm" in why
    if not native:
        assert "is_bf16_supported" in why


def test_wiring_helpers_take_device_properties():
    mig = SimpleNamespace(
        name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", multi_processor_count=16, major=9, minor=0
    )
    assert gpu_specs.peak_for(mig)[0] == pytest.approx(989.5e12 * 16 / 132)
    assert gpu_specs.bf16_for(mig, is_rocm=False)[0] is True
    t4 = SimpleNamespace(name="Tesla T4", multi_processor_count=40, major=7, minor=5)
    assert gpu_specs.peak_for(t4)[0] == 65e12 and gpu_specs.bf16_for(t4, is_rocm=False)[0] is False
    mi = SimpleNamespace(
        name="AMD Radeon Graphics", multi_processor_count=304, major=9, minor=4,
        gcnArchName="gfx942:sramecc+:xnack-",
    )  # fmt: skip
    assert gpu_specs.peak_for(mi)[0] == pytest.approx(1307.4e12)
    assert gpu_specs.bf16_for(mi, is_rocm=True)[0] is True
