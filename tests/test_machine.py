"""The machine fingerprint and tag: two machines that differ in what changes the ladder's numbers
never share results, even where they share /etc/machine-id, a CPU name and a core count (virtual
machines cloned from one image: a Zen 3 without native bf16 and a Zen 4 with it are both a
2-core "AMD EPYC"). CPUs are simulated with SPEED_LADDER_CPUINFO; GPUs with their properties.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clone import fresh_clone, git_status
from conftest import ROOT

from speed_ladder import machine
from speed_ladder.report.summary import rebuild
from speed_ladder.selection import foreign
from speed_ladder.sweep import driver as sweep

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def cpuinfo(model: int, flags: str, name: str = "AMD EPYC", family: int = 25) -> str:
    block = (
        f"processor\t: {{n}}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\n"
        f"model\t\t: {model}\nmodel name\t: {name}\nstepping\t: 1\n"
        f"flags\t\t: fpu sse sse2 avx {flags}\n\n"
    )
    return block.format(n=0) + block.format(n=1)


ZEN3 = cpuinfo(1, "avx2 fma")  # AMD EPYC (Zen 3): no AVX-512, no native bf16
ZEN4 = cpuinfo(17, "avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni")  # native bf16
GRAVITON3 = (  # Arm: implementer/part instead of family/model
    "processor\t: 0\nBogoMIPS\t: 2100.00\n"
    "Features\t: fp asimd evtstrm aes sha1 sha2 crc32 atomics sve bf16 i8mm\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n"
    "CPU revision\t: 1\n\n"
)


@pytest.fixture
def cpu_as(monkeypatch, tmp_path):
    """cpu_as(text): this process reads the CPU from `text` (as /proc/cpuinfo would say it)."""

    def install(text: str) -> Path:
        path = tmp_path / f"cpuinfo-{abs(hash(text))}"
        path.write_text(text)
        monkeypatch.setenv(machine.CPUINFO_ENV, str(path))
        return path

    return install


def test_the_same_name_cores_and_host_with_other_cpu_flags_are_two_machines(cpu_as):
    cpu_as(ZEN3)
    zen3, tag3 = machine.fingerprint("cpu"), machine.tag_base("cpu")
    cpu_as(ZEN4)
    zen4, tag4 = machine.fingerprint("cpu"), machine.tag_base("cpu")
    same = ("device_name", "device_count", "host_id", "torch_version")
    assert [zen3[k] for k in same] == [zen4[k] for k in same]  # what the old rule compared
    assert zen3 != zen4
    assert zen3["cpu"]["flags"] == ["avx2"] and "avx512_bf16" in zen4["cpu"]["flags"]
    cores = os.cpu_count()
    assert tag3 == f"cpu-amd-epyc-f25-m1-{cores}c"
    assert tag4 == f"cpu-amd-epyc-f25-m17-bf16-{cores}c"
    # only the flags differ (same family and model): the fingerprints still differ
    cpu_as(cpuinfo(17, "avx2 fma avx512f"))
    assert machine.fingerprint("cpu") != zen4
    assert machine.tag_base("cpu") == f"cpu-amd-epyc-f25-m17-{cores}c"


def test_the_tag_rule_is_the_same_for_every_vendor(cpu_as):
    cpu_as(cpuinfo(143, "avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "Intel(R) Xeon(R) "
                   "Platinum 8480+", family=6))  # fmt: skip
    assert machine.tag_base("cpu") == f"cpu-intel-xeon-platinum-8480-f6-m143-amx-{os.cpu_count()}c"
    cpu_as(GRAVITON3)
    fp = machine.fingerprint("cpu")
    assert fp["cpu"]["family"] == "0x41" and fp["cpu"]["model"] == "0xd40"
    assert fp["cpu"]["flags"] == ["asimd", "bf16", "sve"]
    assert machine.tag_base("cpu").endswith(f"-f0x41-m0xd40-bf16-{os.cpu_count()}c")
    assert "0x41" in machine.describe(fp) and "sve" in machine.describe(fp)


def test_no_cpuinfo_still_fingerprints(cpu_as, tmp_path, monkeypatch):
    monkeypatch.setenv(machine.CPUINFO_ENV, str(tmp_path / "missing"))
    fp = machine.fingerprint("cpu")
    assert fp["cpu"]["flags"] == [] and fp["device_count"] == os.cpu_count()
    assert machine.tag_base("cpu").startswith("cpu-")


def props(uuid, memory=80 * 2**30, sms=132):
    return {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "total_memory": memory,
            "multi_processor_count": sms, "uuid": uuid}  # fmt: skip


def test_two_gpus_that_differ_only_in_uuid_are_two_machines(monkeypatch):
    monkeypatch.delenv(machine.HOST_ENV, raising=False)
    monkeypatch.setattr(machine, "real_host_id", lambda: "aaaaaaaaaaaa")  # a cloned image
    a = machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1, [props("GPU-1111")])
    b = machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1, [props("GPU-2222")])
    assert a != b
    assert a["gpus"] == [{"capability": "9.0", "memory_gib": 80.0, "sms": 132,
                          "uuid": "GPU-1111"}]  # fmt: skip
    # a MIG slice or a smaller card under the same name is another machine too
    c = machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1, [props("GPU-1111", sms=66)])
    assert c != a
    # a pool claims its machines interchangeable: the UUIDs leave the fingerprint, the rest stays
    monkeypatch.setenv(machine.HOST_ENV, "h100-pool")
    pa = machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1, [props("GPU-1111")])
    pb = machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1, [props("GPU-2222")])
    assert pa == pb and "uuid" not in pa["gpus"][0]
    assert machine.fingerprint("cuda", "NVIDIA H100 80GB HBM3", 1, [props("X", sms=66)]) != pa


def test_the_sweep_asks_a_child_for_every_gpus_properties(monkeypatch):
    monkeypatch.setattr(sweep, "_CUDA_INFO", (1, "NVIDIA H100 80GB HBM3", 80 * 2**30,
                                              [props("GPU-1111")]))  # fmt: skip
    fp = sweep.this_machine("cuda")
    assert fp["gpus"][0]["uuid"] == "GPU-1111" and fp["device_count"] == 1


def test_records_from_before_the_new_fingerprint_keep_the_old_rule(cpu_as):
    """The committed records have four-key fingerprints: they still summarize among themselves
    (their tag reads as before), and they are never this machine's."""
    tag = ROOT / "results" / "cpu-amd-epyc-2c-x1"
    recs = [json.loads(line) for line in (tag / "runs.jsonl").read_text().splitlines()]
    olds = {json.dumps(r["sweep"]["machine"], sort_keys=True) for r in recs}
    assert len(olds) == 1 and set(json.loads(olds.pop())) == {
        "device_name", "device_count", "host_id", "torch_version"}  # fmt: skip
    from speed_ladder.ladder import discover

    df, _ = rebuild(tag, discover(ROOT))
    new = ~df["step"].isin({r["step"] for r in recs})  # rungs added after these records
    assert (df[~new]["status"] == "ok").all() and (df[~new]["runs"] == 3).all()
    assert new.sum() >= 3 and (df[new]["status"] == "not run").all()  # 15 on
    cpu_as(ZEN3)
    assert len(foreign(recs, machine.fingerprint("cpu"))) == len(recs)


def test_a_fresh_clone_on_the_committed_zen4_writes_its_own_folder_and_no_tracked_file(
    tmp_path,
):
    """A fresh clone on a simulated Zen 4 (the CPU of the committed `...-m17-bf16-2c-x1` records,
    and this host's /etc/machine-id): the sweep writes results/local/<tag>-x1/, which git
    ignores, and nothing else: `git status` stays clean and the committed folder of its kind
    keeps every byte, also where the committed tag is this machine's. Its closing table sets its
    tok/s beside that committed tag's, named as the same hardware."""
    clone = fresh_clone(tmp_path / "clone")
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN4)
    base = f"cpu-amd-epyc-f25-m17-bf16-{os.cpu_count()}c"
    committed = clone / "results" / f"{base}-x1"
    before = {p: p.read_bytes() for p in (clone / "results").rglob("*") if p.is_file()}
    env = {**os.environ, machine.CPUINFO_ENV: str(info), "SPEED_LADDER_CHECK_S": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "speed_ladder", "run", "--ladder-dir", FIXTURES / "ladder_ok",
         "--device", "cpu", "--steps", "00,01"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert git_status(clone) == ""
    after = {p: p.read_bytes() for p in (clone / "results").rglob("*") if p.is_file()}
    mine = clone / "results" / "local" / f"{base}-x1"
    assert {p for p in after if p not in before} == {p for p in after if mine in p.parents}
    assert all(after[p] == b for p, b in before.items())  # not one committed byte changed
    recs = [json.loads(line) for line in (mine / "runs.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == ["00", "01"]
    assert {r["sweep"]["tag"] for r in recs} == {f"{base}-x1"}
    if committed.is_dir():  # a 2-core machine: the committed tag of this very hardware
        assert f"this machine against results/{base}-x1 (the same hardware" in proc.stdout
    else:
        assert "this machine against results/" in proc.stdout
    assert (mine / "vs_committed.csv").is_file()
