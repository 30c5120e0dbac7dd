"""Every step loads its batches as Raschka's scripts do where CUDA is: 4 worker processes (his
num_workers=4, from his 00 on), kept alive across epochs; on a CPU in the training process, so
that the CPU ladder's cores all train. The same batches either way (the sampler runs in the
training process and is reseeded each epoch)."""

import pytest
import torch
from conftest import ROOT, load_script

from speed_ladder.ladder import rungs

SCRIPTS = [r.rel for r in rungs()]


@pytest.mark.parametrize("script", [SCRIPTS[0], SCRIPTS[4], SCRIPTS[10]])  # 00, 04, 10
def test_workers_where_cuda_is_and_none_on_a_cpu(script, monkeypatch):
    m = load_script(script)
    ids = torch.arange(4 * 8 * 4 + 1)
    kw = {"pin_memory": False} if "pin_memory" in m.create_dataloader.__code__.co_varnames else {}
    cpu = m.create_dataloader(ids, 4, 8, shuffle=True, drop_last=True, seed=1, **kw)
    assert cpu.num_workers == 0 and not cpu.persistent_workers
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = m.create_dataloader(ids, 4, 8, shuffle=True, drop_last=True, seed=1, **kw)
    assert gpu.num_workers == 4 and gpu.persistent_workers
    monkeypatch.undo()
    # the same batches in every epoch with workers as without (CPU tensors: forked workers work)
    for epoch in range(2):
        cpu.sampler.generator.manual_seed(1 + epoch)
        gpu.sampler.generator.manual_seed(1 + epoch)
        for (a, _), (b, _) in zip(cpu, gpu, strict=True):
            assert torch.equal(a, b)


def test_every_step_file_loads_the_same_way():
    """The distributed steps (11-14: DistributedSampler, a process group) load with the same
    line: tools/ladder.py propagated it from 00 into every step."""
    text = (ROOT / SCRIPTS[0]).read_text()
    line = "        num_workers=4 if torch.cuda.is_available() else 0,\n"
    assert line in text
    assert all(line in (ROOT / s).read_text() for s in SCRIPTS)
