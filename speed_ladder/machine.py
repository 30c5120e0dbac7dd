"""This machine: the fingerprint every record carries, and the results tag that names it.

A fingerprint holds what changes the ladder's numbers (the CPU's model, ISA features and memory,
or each GPU's capability, memory, SMs and UUID; a hash of the host id; torch's version), so that
two machines that differ in any of it never share results (docs/measurement.md, "A fresh clone
measures its own machine"; a pool of machines, $SPEED_LADDER_HOST_ID: docs/gpu-machines.md).
`SPEED_LADDER_CPUINFO=FILE` reads the CPU from FILE instead of /proc/cpuinfo (the tests)."""

import hashlib
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

from speed_ladder.errors import UserError


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


CPUINFO_ENV = "SPEED_LADDER_CPUINFO"
# The ISA features that change the ladder's numbers: vector width (avx2, avx512f, Arm's asimd
# and sve) and native bf16 (avx512_bf16, AMX; Arm's bf16), which decides step 05 on a CPU.
LADDER_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "asimd", "sve", "bf16")
_IDS = {  # /proc/cpuinfo key -> fingerprint key (x86, then Arm)
    "vendor_id": "vendor",
    "cpu family": "family",
    "model": "model",
    "stepping": "stepping",
    "CPU implementer": "family",
    "CPU part": "model",
    "CPU variant": "variant",
    "CPU revision": "stepping",
}


def _cpuinfo() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (or $SPEED_LADDER_CPUINFO);
    {} where there is none (macOS, Windows)."""
    path = os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo"
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if not line.strip():
            if out.get("flags") or out.get("Features"):
                break  # the first processor's block is enough: they are alike
            continue
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo (Linux), sysctl (macOS), else what Python knows."""
    info = _cpuinfo()
    if info.get("model name"):
        return info["model name"]
    if sys.platform == "darwin":
        out = _sysctl("machdep.cpu.brand_string")
        if out:
            return out
    return platform.processor() or platform.machine() or "unknown CPU"


_MACOS_FLAGS = {  # sysctl's name of a LADDER_FLAGS feature
    "bf16": "hw.optional.arm.FEAT_BF16",
    "avx2": "hw.optional.avx2_0",
    "avx512f": "hw.optional.avx512f",
}


def cpu_id() -> dict:
    """{"vendor", "family", "model", "stepping" (Arm: "variant" too), "flags"}: what of the CPU
    changes the ladder's numbers beyond its name; keys the platform does not say are left out,
    and "flags" lists only LADDER_FLAGS the CPU has."""
    info = _cpuinfo()
    out = {k: info[c] for c, k in _IDS.items() if info.get(c)}
    if sys.platform == "darwin" and not info:
        for key, name in (("family", "machdep.cpu.family"), ("model", "machdep.cpu.model")):
            value = _sysctl(name)
            if value:
                out[key] = value
        have = [f for f, n in _MACOS_FLAGS.items() if _sysctl(n) == "1"]
    else:
        have = (info.get("flags") or info.get("Features") or "").split()
    out["flags"] = sorted(set(have) & set(LADDER_FLAGS))
    return out


def ram_bytes() -> int | None:
    """This machine's total memory in bytes (Linux: MemTotal), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def native_bf16(flags) -> str | None:
    """`amx` or `bf16` when the CPU computes bf16 natively (AMX tiles; AVX512_BF16 or Arm's
    BF16), else None: the tag's marker."""
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags or "bf16" in flags:
        return "bf16"
    return None


_NOISE = re.compile(r"\((?:R|TM|tm|r)\)|\bCPU\b|\bProcessor\b|@|\bwith .*$", re.IGNORECASE)


def cpu_slug(model: str) -> str:
    """`Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz` -> `intel-xeon-platinum-8375c-2-90ghz`."""
    return slug(_NOISE.sub(" ", model))[:48].strip("-") or "cpu"


HOST_ENV = "SPEED_LADDER_HOST_ID"
_POOL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def pool_name() -> str | None:
    """$SPEED_LADDER_HOST_ID, checked, or None when unset or empty."""
    name = os.environ.get(HOST_ENV, "").strip()
    if not name:
        return None
    if not _POOL.fullmatch(name):
        raise UserError(
            f"{HOST_ENV}={name!r}: use 1-64 letters, digits, '.', '_' and '-' (a name for "
            "machines you pool as one)"
        )
    return name


def host_id() -> str:
    """The fingerprint's host id: `pool:NAME` under $SPEED_LADDER_HOST_ID, else this host's own
    (real_host_id)."""
    name = pool_name()
    return f"pool:{name}" if name else real_host_id()


def real_host_id() -> str:
    """12 hex digits identifying this host: a hash of /etc/machine-id, else of the host name."""
    raw = None
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            raw = Path(path).read_text().strip() or None
        except OSError:
            continue
        if raw:
            break
    raw = raw or socket.gethostname() or platform.node() or "unknown"
    return hashlib.sha256(b"speed-ladder host:" + raw.encode()).hexdigest()[:12]


def torch_version() -> str:
    import torch

    return torch.__version__


def gpu_list(props: list) -> list[dict]:
    """Each GPU's identity for the fingerprint, from torch.cuda.get_device_properties objects
    (or dicts of theirs): compute capability, memory, SMs and UUID where torch gives one."""
    out = []
    for p in props:
        get = p.get if isinstance(p, dict) else lambda k, p=p: getattr(p, k, None)
        major, minor = get("major"), get("minor")
        memory, sms, uuid = get("total_memory"), get("multi_processor_count"), get("uuid")
        gpu = {"capability": f"{major}.{minor}" if major is not None else None}
        gpu["memory_gib"] = round(memory / 2**30, 1) if memory else None
        out.append({**gpu, "sms": sms, "uuid": str(uuid) if uuid else None})
    return out


def cuda_props() -> list[dict]:
    """The visible GPUs' properties as plain dicts (what gpu_list reads, the name, and an AMD
    GPU's arch for its native bf16: the sweep's RunSpec)."""
    import torch

    keys = ("name", "major", "minor", "total_memory", "multi_processor_count", "uuid")
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpu = {k: getattr(p, k, None) for k in (*keys, "gcnArchName")}
        out.append({**gpu, "uuid": None if gpu["uuid"] is None else str(gpu["uuid"])})
    return out


def fingerprint(
    device_type: str, gpu_name: str | None = None, gpus: int | None = None, props=None
) -> dict:
    """This machine's fingerprint for a device type (CUDA: the GPUs' name, visible count and
    `props`, each GPU's properties)."""
    pooled = pool_name() is not None
    if device_type == "cuda":
        fp = {"device_name": str(gpu_name), "device_count": int(gpus or 0)}
    else:
        fp = {"device_name": cpu_model(), "device_count": os.cpu_count() or 1}
    fp.update(host_id=host_id(), torch_version=torch_version())
    if device_type == "cuda":
        listed = gpu_list(props or [])
        if pooled:  # a pool's machines are interchangeable by claim: their GPUs' own ids differ
            listed = [{k: v for k, v in g.items() if k != "uuid"} for g in listed]
        fp["gpus"] = listed
    else:
        fp["cpu"] = cpu_id()
        ram = ram_bytes()
        fp["memory_gib"] = round(ram / 2**30) if ram else None
    return fp


def of_device(device) -> dict:
    """The fingerprint a step writes into its record (CUDA asked in this process)."""
    if device.type == "cuda":
        import torch

        name, count = torch.cuda.get_device_name(device), torch.cuda.device_count()
        return fingerprint("cuda", name, count, cuda_props())
    return fingerprint(device.type)


def short_id(fp: dict) -> str:
    """6 hex digits of the whole fingerprint: the suffix of a tag folder of this machine's own."""
    text = "|".join(f"{k}={fp.get(k)}" for k in sorted(fp))
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def cpu_tag_part(model: str, ident: dict) -> str:
    """`amd-epyc-f25-m17-bf16`: the CPU's name, its family and model numbers (Arm: implementer
    and part) and its native bf16 marker, so that two CPUs sold under one name get two tags."""
    parts = [cpu_slug(model)]
    if ident.get("family") is not None and ident.get("model") is not None:
        parts.append(f"f{slug(str(ident['family']))}-m{slug(str(ident['model']))}")
    marker = native_bf16(ident.get("flags") or [])
    if marker:
        parts.append(marker)
    return "-".join(parts)


def tag_base(device_type: str, gpu_name: str | None = None) -> str:
    """The hardware part of a tag: `nvidia-h200`, `cpu-amd-epyc-f25-m17-bf16-2c`, `mps-...`."""
    if device_type == "cuda":
        return slug(str(gpu_name))
    if device_type == "mps":
        return "mps-" + cpu_tag_part(cpu_model(), cpu_id())
    return f"cpu-{cpu_tag_part(cpu_model(), cpu_id())}-{os.cpu_count()}c"


def describe(fp: dict | None) -> str:
    """'AMD EPYC x2 (family 25 model 17; avx2 avx512_bf16 avx512f), host 3fa2c1..., torch
    2.13.0' (or 'no fingerprint')."""
    if not isinstance(fp, dict):
        return "no machine fingerprint (recorded before records had one)"
    detail = ""
    cpu = fp.get("cpu")
    if isinstance(cpu, dict):
        ident = " ".join(f"{k} {cpu[k]}" for k in ("family", "model") if k in cpu)
        detail = f" ({'; '.join(x for x in (ident, ' '.join(cpu.get('flags') or [])) if x)})"
    elif isinstance(fp.get("gpus"), list) and fp["gpus"]:
        g = fp["gpus"][0]
        detail = f" (compute capability {g.get('capability')}, {g.get('sms')} SMs)"
    return (
        f"{fp.get('device_name')} x{fp.get('device_count')}{detail}, host {fp.get('host_id')}, "
        f"torch {fp.get('torch_version')}"
    )
