"""What every timer asks of a torch device: its name, and a wait for its queued work. device.py
(whose `synchronize` the harness's clock calls) and matmul_peak.py (which device.py reads for a
CPU's or an Apple GPU's peak) both take them from here."""

import platform

import torch

from speed_ladder import machine


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a host clock read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple MPS ({platform.machine()})"
    return machine.cpu_model()
