"""This machine: the fingerprint every record carries, and the results tag that names it.

A fingerprint is `{"device_name", "device_count", "host_id", "torch_version"}`: the CPU model
(or the GPU's name), the cores (or visible GPUs), a host id and the torch version. The host id is
a hash of /etc/machine-id (else the host name), never the id itself. A step writes its own
(`machine` in its record); the sweep computes this machine's the same way, without initializing
CUDA (it asks a child process), keeps it in each record's `sweep.machine`, and counts or
summarizes only records whose fingerprint is this machine's: a committed record from another
machine (or one written before records had fingerprints) is never "up to date" here and never
mixes into this machine's summary.

**A pool of interchangeable machines** (one cloud instance type where every job gets a fresh
instance, a lease of one GPU kind whose every call starts a new machine): set
`SPEED_LADDER_HOST_ID=NAME` (letters, digits, '.', '_', '-') on each, and the fingerprint's host
id is `pool:NAME` instead of the machine's own, so a sweep resumes across them in one tag. It is
a claim you make, so it is kept in sight: each sweep record keeps the real host's id in
`sweep.host`, the summary lists the hosts a row's runs came from (`hosts`), and the README says
when a tag's numbers pool more than one machine.

The tag names the hardware and the processes of the distributed steps: `nvidia-h200-x1`,
`nvidia-h200-x8`, `cpu-intel-xeon-2-50ghz-2c-x1` (CPU model, cores). Every tag ends in `-xN`.
"""

import hashlib
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo (Linux), sysctl (macOS), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


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
        from .errors import UserError

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


def fingerprint(device_type: str, gpu_name: str | None = None, gpus: int | None = None) -> dict:
    """This machine's fingerprint for a device type (CUDA: the GPU's name and visible count)."""
    if device_type == "cuda":
        name, count = str(gpu_name), int(gpus or 0)
    else:
        name, count = cpu_model(), os.cpu_count() or 1
    return {
        "device_name": name,
        "device_count": count,
        "host_id": host_id(),
        "torch_version": torch_version(),
    }


def of_device(device) -> dict:
    """The fingerprint a step writes into its record (CUDA asked in this process)."""
    if device.type == "cuda":
        import torch

        return fingerprint("cuda", torch.cuda.get_device_name(device), torch.cuda.device_count())
    return fingerprint(device.type)


def short_id(fp: dict) -> str:
    """6 hex digits of the whole fingerprint: the suffix of a tag folder of this machine's own."""
    text = "|".join(f"{k}={fp.get(k)}" for k in sorted(fp))
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def tag_base(device_type: str, gpu_name: str | None = None) -> str:
    """The hardware part of a tag: `nvidia-h200`, `cpu-amd-epyc-7763-64-core-16c`, `mps-...`."""
    if device_type == "cuda":
        return slug(str(gpu_name))
    if device_type == "mps":
        return "mps-" + cpu_slug(cpu_model())
    return f"cpu-{cpu_slug(cpu_model())}-{os.cpu_count()}c"


def describe(fp: dict | None) -> str:
    """'Intel Xeon ..., 2 cores, host 3fa2c1..., torch 2.13.0' (or 'no fingerprint')."""
    if not isinstance(fp, dict):
        return "no machine fingerprint (recorded before records had one)"
    return (
        f"{fp.get('device_name')} x{fp.get('device_count')}, host {fp.get('host_id')}, "
        f"torch {fp.get('torch_version')}"
    )
