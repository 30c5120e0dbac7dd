"""How every step loads its batches and evaluates, on a CPU taking the paths CUDA takes.

Training loads with --workers worker processes (default: Raschka's 4 on CUDA, 0 elsewhere), kept
alive across epochs; the record says how many. Evaluation reads loaders of its own, in order, in
batches of the preset's batch_size whatever the rung's training batch, and averages its loss per
token. So the training order depends neither on the workers nor on evaluation: a run with
workers and one without, evaluating every few steps, train on the same batches."""

import sys

import pytest
import torch
from conftest import ROOT, VERDICT, load_script, py, records

import speed_ladder
from speed_ladder.ladder import rungs
from speed_ladder.measure.data import train_windows
from speed_ladder.measure.settings import resolve_spec

SCRIPTS = [r.rel for r in rungs()]
EAGER = {"TORCH_COMPILE_DISABLE": "1", "SPEED_LADDER_BF16": "0"}


@pytest.fixture
def world_of_one():
    """A process group of one (11 on build a DistributedSampler), gone after the test."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)  # fmt: skip
    yield
    torch.distributed.destroy_process_group()


def loader(m, ids, workers, batch=4, **kw):
    pin = {"pin_memory": False} if "pin_memory" in m.create_dataloader.__code__.co_varnames else {}
    return m.create_dataloader(ids, batch, 8, seed=1, workers=workers, **kw, **pin)


@pytest.mark.parametrize("script", [SCRIPTS[0], SCRIPTS[4], SCRIPTS[11], SCRIPTS[-1]])
def test_workers_are_a_flag_kept_alive_across_epochs_and_load_the_same_batches(
    script, world_of_one
):
    """The same batches in every epoch with workers as without: 00-10's loop reseeds the
    sampler's generator, 11 on DistributedSampler's set_epoch (a world of one here)."""
    m = load_script(script)
    ids = torch.arange(4 * 8 * 4 + 1)
    inline = loader(m, ids, 0, shuffle=True, drop_last=True)
    pool = loader(m, ids, 2, shuffle=True, drop_last=True)
    assert inline.num_workers == 0 and not inline.persistent_workers
    assert pool.num_workers == 2 and pool.persistent_workers  # as CUDA loads by default
    for epoch in range(2):
        for dl in (inline, pool):
            if hasattr(dl.sampler, "set_epoch"):
                dl.sampler.set_epoch(epoch)
            else:
                dl.sampler.generator.manual_seed(1 + epoch)
        for (a, _), (b, _) in zip(inline, pool, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("script", [SCRIPTS[0], SCRIPTS[-1]])
def test_loading_never_draws_from_the_random_stream_dropout_draws_from(script, world_of_one):
    """Each iterator's seed comes from the loader's own generator: torch's global one, which
    dropout's masks come from on a CPU, is the same after loading with or without workers."""
    m = load_script(script)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for shuffle in (True, False):
        dl = loader(m, torch.arange(4 * 8 * 4 + 1), 0, shuffle=shuffle, drop_last=False)
        if shuffle and hasattr(dl.sampler, "set_epoch"):
            continue  # DistributedSampler: its own seed + epoch, never the global stream
        for _ in range(2):  # a new iterator each time, as evaluation makes
            list(dl)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_workers_default_to_4_on_cuda_and_none_elsewhere():
    assert resolve_spec({"preset": "tiny"}, "cuda").workers == 4
    assert resolve_spec({"preset": "tiny"}, "cpu").workers == 0
    assert resolve_spec({"preset": "tiny", "workers": 3}, "cpu").workers == 3
    assert resolve_spec({"preset": "tiny", "workers": 0}, "cuda").workers == 0


def test_every_step_file_loads_the_same_way():
    """tools/ladder.py propagated the loader's lines from 00 into every step."""
    for line in ("        num_workers=workers,\n", "        persistent_workers=workers > 0,\n",
                 "        generator=torch.Generator().manual_seed(seed),\n",
                 "    train_eval_loader = create_dataloader(\n"):  # fmt: skip
        assert all(line in (ROOT / s).read_text() for s in SCRIPTS), line


def test_the_loss_of_an_evaluation_is_its_mean_per_token():
    """A shorter last batch weighs by its tokens, not as much as a full batch."""
    m = load_script(SCRIPTS[0])
    cfg = {"vocab_size": 64, "context_length": 8, "emb_dim": 16, "n_heads": 2, "n_layers": 1,
           "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    torch.manual_seed(0)
    model = m.GPTModel(cfg).eval()
    ids = torch.randint(0, 64, (5 * 8 + 1,))  # 5 windows: batches of 2, 2 and 1
    batches = list(loader(m, ids, 0, batch=2, shuffle=False, drop_last=False))
    assert [len(x) for x, _ in batches] == [2, 2, 1]
    with torch.no_grad():
        x = torch.cat([x for x, _ in batches])
        y = torch.cat([y for _, y in batches])
        per_token = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        loader_mean = m.calc_loss_loader(batches, model, "cpu", num_batches=3)
        per_batch = [m.calc_loss_batch(x, y, model).item() for x, y in batches]
    assert loader_mean == pytest.approx(per_token, rel=1e-6)
    assert abs(sum(per_batch) / 3 - per_token) > 1e-4  # what a mean of batch means gives


@pytest.mark.parametrize("script", [SCRIPTS[0], SCRIPTS[10], SCRIPTS[-1]])
def test_evaluation_reads_its_own_loaders_in_the_presets_batches(script, monkeypatch, tmp_path):
    """The training loader at the rung's batch with --workers; the two evaluation loaders in
    order, at the preset's batch_size (tiny: 4) on every rung, loaded in the process."""
    m = load_script(script)
    made, real = [], m.create_dataloader

    def create_dataloader(token_ids, batch_size, *a, **kw):
        made.append((batch_size, kw["shuffle"], kw["workers"]))
        return real(token_ids, batch_size, *a, **kw)

    monkeypatch.setattr(m, "create_dataloader", create_dataloader)
    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(sys, "argv", [script, "--device", "cpu", "--preset", "tiny", "--data",
                        str(VERDICT), "--max-steps", "3", "--warmup-steps", "1", "--workers",
                        "1", "--results", str(out)])  # fmt: skip
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    try:
        with torch._dynamo.config.patch(disable=True):
            speed_ladder.main(m.main)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    (rec,) = records(out)
    assert made == [(rec["batch_size"], True, 1), (4, False, 0), (4, False, 0)]
    assert rec["workers"] == rec["spec"]["workers"] == 1


@pytest.mark.parametrize("script", [SCRIPTS[0], SCRIPTS[-1]])
def test_workers_and_evaluation_leave_the_training_order_as_it_is(script, tmp_path):
    """Evaluating every 512 tokens over more than an epoch (a --to-loss run whose target it
    never reaches), a run with 2 persistent workers trains on the same batches as one without:
    the same loss at every step, and the same evaluations."""
    recs = []
    for workers in (0, 2):
        out = tmp_path / f"w{workers}.jsonl"
        proc = py(script, "--device", "cpu", "--preset", "tiny", "--data", VERDICT,
                  "--warmup-steps", 2, "--to-loss", 1.0, "--token-budget", 5120, "--workers",
                  workers, "--results", out, env=EAGER, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        (rec,) = records(out)
        recs.append(rec)
    no_workers, workers = recs
    assert (no_workers["workers"], workers["workers"]) == (0, 2)
    windows = train_windows(str(VERDICT), 32)  # an epoch's windows of The Verdict on tiny
    assert len(workers["losses"]) * workers["batch_size"] > windows  # past the first epoch
    assert len(workers["curve"]) > 5  # evaluated every few steps
    assert workers["losses"] == no_workers["losses"]
    assert workers["curve"][-1][2] == no_workers["curve"][-1][2]
