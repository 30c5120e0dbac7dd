"""Gradient accumulation (the last rung, steps/18_gradient_accumulation.py): each batch in
micro-batches, one optimizer step, DDP's all-reduce in the last micro-batch's backward only.

The step file itself runs (tiny, eager: TORCH_COMPILE_DISABLE=1, as tests/test_ladder.py's fast
runs) under a wrapper that records, through torch's global hooks and no edit of the step, what
the model saw in training forwards, how often the optimizer stepped and the gradients it stepped
with first, and under DDP when the gradients were all-reduced. Its rung and the rung it builds on
run in both regimes; the memory model's prediction is checked without a run."""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import ROOT, VERDICT, py, records, run_script
from test_ladder import MAX_STEPS, REGIME, WARMUP, epoch_text

from speed_ladder import ladder, parity
from speed_ladder.measure import memory_model as mm
from speed_ladder.measure.inactive import batch_not_split
from speed_ladder.measure.settings import resolve_spec
from speed_ladder.presets import PRESETS
from speed_ladder.spec import micro_batches

ACCUM = ladder.first(lambda r: r.memory.accumulation)
BASE = ladder.rung(ACCUM.after)
TINY = PRESETS["tiny"]
K = TINY["accum_steps"]
BATCH = ACCUM.batch(resolve_spec({"preset": "tiny"}, "cpu"))  # 8 sequences, in K micro-batches
EAGER = {"TORCH_COMPILE_DISABLE": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# Run as the step's __main__: records what the model saw (training forwards only), the optimizer's
# steps and its first step's gradients, DDP's no_sync() calls and, at each all-reduce of a
# gradient bucket, how many training forwards had run.
WRAPPER = r"""
import atexit, json, os, runpy, sys
sys.path.insert(0, ROOT)
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_pre_hook

rank = os.environ.get("RANK", "0")
log = {"forwards": [], "steps": 0, "no_sync": 0, "allreduce_after": []}

def forward(module, args):
    if type(module).__name__ == "GPTModel" and torch.is_grad_enabled():
        log["forwards"].append(list(args[0].shape))

def step(opt, args, kwargs):
    if log["steps"] == 0:
        grads = [p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]
        torch.save(grads, OUT + f".grads{rank}.pt")
    log["steps"] += 1

torch.nn.modules.module.register_module_forward_pre_hook(forward)
register_optimizer_step_pre_hook(step)
no_sync, init = DDP.no_sync, DDP.__init__

def counted_no_sync(self):
    log["no_sync"] += 1
    return no_sync(self)

def init_with_hook(self, *a, **k):
    init(self, *a, **k)
    def hook(group, bucket):
        log["allreduce_after"].append(len(log["forwards"]))
        return allreduce_hook(group, bucket)
    self.register_comm_hook(None, hook)

DDP.no_sync, DDP.__init__ = counted_no_sync, init_with_hook
atexit.register(lambda: open(OUT + f".log{rank}.json", "w").write(json.dumps(log)))
sys.argv[0] = SCRIPT
runpy.run_path(SCRIPT, run_name="__main__")
"""


def wrapper(folder, rung, name):
    out = folder / name
    path = folder / f"{name}.py"
    path.write_text(WRAPPER.replace("ROOT", repr(str(ROOT))).replace("SCRIPT", repr(str(rung.path)))
                    .replace("OUT", repr(str(out))))  # fmt: skip
    return path, out


def observed(out, rank=0):
    """(the record, the wrapper's log, the first step's gradients) of a wrapped run."""
    log = json.loads(out.with_name(out.name + f".log{rank}.json").read_text())
    grads = torch.load(out.with_name(out.name + f".grads{rank}.pt"))
    recs = records(out.with_name(out.name + ".jsonl")) if rank == 0 else [None]
    return recs[0], log, grads


RUNS = {  # name: (rung, regime, extra flags)
    "base-fp32": (BASE, "fp32", []),
    "accum-fp32": (ACCUM, "fp32", []),
    "unsplit-fp32": (ACCUM, "fp32", ["--accum-steps", 1]),
    "base-bf16": (BASE, "bf16", []),
    "accum-bf16": (ACCUM, "bf16", []),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (record, log, gradients)} of each of RUNS: tiny, 4 steps across epochs, eager."""
    folder = tmp_path_factory.mktemp("accumulation")
    text = epoch_text(folder)

    def one(name):
        rung, regime, extra = RUNS[name]
        script, out = wrapper(folder, rung, name)
        proc = run_script(
            [sys.executable, script, "--preset", "tiny", "--device", "cpu", "--max-steps",
             MAX_STEPS, "--warmup-steps", WARMUP, "--data", text, "--epochs", 9,
             "--results", f"{out}.jsonl", *extra],
            env={**EAGER, **REGIME[regime]}, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        return name, observed(out)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, RUNS))


def test_one_optimizer_step_per_batch_of_k_micro_batches(runs):
    base, accum = runs["base-fp32"], runs["accum-fp32"]
    assert base[1]["steps"] == accum[1]["steps"] == MAX_STEPS
    assert base[1]["forwards"] == [[BATCH, TINY["context_length"]]] * MAX_STEPS
    assert accum[1]["forwards"] == [[BATCH // K, TINY["context_length"]]] * (K * MAX_STEPS)
    rec = accum[0]
    assert rec["step_active"] and rec["spec"]["accum_steps"] == K
    assert any(n.startswith(f"step {ACCUM.num}: gradient accumulation") for n in rec["notes"])
    # the whole batch's tokens, once per optimizer step, as the rung before counts them
    assert rec["tokens_per_step"] == base[0]["tokens_per_step"] == BATCH * TINY["context_length"]
    assert rec["batch_size"] == base[0]["batch_size"] == BATCH
    assert rec["memory_model"]["micro_batches"] == K


def test_the_summed_micro_batch_gradients_are_the_batchs(runs):
    """Each micro-batch's loss divided by k: the first step's gradients (the same weights and
    batch) are the whole batch's up to fp32's summation order; without the division they
    would be k times as large. The reported loss is the batch's mean, as the rung before's."""
    (base, _, g0), (accum, _, g1) = runs["base-fp32"], runs["accum-fp32"]
    assert len(g0) == len(g1)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert base["losses"][0] == pytest.approx(accum["losses"][0], abs=1e-5)


@pytest.mark.parametrize("regime", ["fp32", "bf16"])
def test_the_loss_keeps_the_rung_before(runs, regime):
    """The registry's parity rule against the rung it builds on, in both regimes (bf16 forced
    on: step 15's bf16 weights sum the micro-batches' gradients in bf16)."""
    base, accum = runs[f"base-{regime}"][0], runs[f"accum-{regime}"][0]
    assert base["regime"] == accum["regime"] == regime
    ok, how = parity.check(ACCUM.num, base, accum)
    assert ok, how


def test_a_batch_it_cannot_split_stays_whole_and_says_so(runs):
    """accum_steps 1 (--accum-steps 1; a batch that k does not divide goes the same way): one
    forward per batch, the rung before's floats, and the record says the step did nothing."""
    (base, _, g0), (unsplit, log, g1) = runs["base-fp32"], runs["unsplit-fp32"]
    assert log["forwards"] == [[BATCH, TINY["context_length"]]] * MAX_STEPS
    assert unsplit["losses"] == base["losses"]
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    assert unsplit["step_active"] is False and "accum_steps 1" in unsplit["inactive_reason"]
    assert unsplit["spec"]["accum_steps"] == 1 and unsplit["memory_model"]["micro_batches"] == 1


def test_the_split_rule_and_its_check():
    assert [micro_batches(b, 2) for b in (1, 2, 3, 8)] == [1, 2, 1, 2]
    assert micro_batches(8, 4) == 4 and micro_batches(8, 1) == 1 and micro_batches(6, 4) == 1
    assert batch_not_split(8, 2) is None
    assert "batch 1 does not split into 2" in batch_not_split(1, 2)
    assert "batch 7 does not split into 2" in batch_not_split(7, 2)
    assert "accum_steps 1" in batch_not_split(8, 1)
    assert resolve_spec({"accum_steps": 4}, "cpu").accum_steps == 4
    assert resolve_spec({}, "cpu").accum_steps == PRESETS["cpu"]["accum_steps"]


def test_the_memory_model_keeps_one_micro_batchs_activations():
    """At the same batch the rung predicts less than the rung before: one micro-batch's
    activations (logits or Liger's chunk included), the same state and buffers."""
    for name in mm.GPT2_FAMILY:
        for world in (1, 4):
            base = mm.predict(name, world, BASE.num)
            accum = mm.predict(name, world, ACCUM.num)
            k = PRESETS[name]["accum_steps"]
            assert accum.batch == base.batch and accum.micro_batches == k
            assert (accum.state_bytes, accum.buffer_bytes) == (base.state_bytes, base.buffer_bytes)
            assert accum.total_bytes < base.total_bytes, (name, world)
            half = mm.predict(name, world, BASE.num, batch=base.batch // k)
            assert accum.activation_bytes == half.activation_bytes
            assert f"batch {base.batch} in {k} micro-batches" in accum.line()
    for dev in ("cuda", "cpu"):  # what a run predicts: Liger's chunk on CUDA, full logits on CPU
        base = mm.predict_run(PRESETS["gpt2-124m"], BASE.num, 1, 32, True, dev)
        accum = mm.predict_run(PRESETS["gpt2-124m"], ACCUM.num, 1, 32, True, dev)
        assert accum.total_bytes < base.total_bytes
    odd = mm.predict("gpt2-xl", 1, ACCUM.num, batch=3)  # no split: the rung before's memory
    assert odd.micro_batches == 1
    assert odd.total_bytes == mm.predict("gpt2-xl", 1, BASE.num, batch=3).total_bytes


def test_ddp_all_reduces_once_per_batch_in_the_last_micro_batch(tmp_path):
    """2 gloo processes: no_sync() around every micro-batch but the last, so each gradient
    bucket is all-reduced during the last micro-batch's backward only, once per batch."""
    script, out = wrapper(tmp_path, ACCUM, "ddp")
    proc = run_script([*TORCHRUN, "--standalone", "--nproc_per_node=2", script, "--preset",
                       "tiny", "--device", "cpu", "--max-steps", MAX_STEPS, "--warmup-steps",
                       WARMUP, "--data", VERDICT, "--results", f"{out}.jsonl"],
                      env=EAGER, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        log = observed(out, rank)[1]
        assert log["steps"] == MAX_STEPS and len(log["forwards"]) == K * MAX_STEPS
        assert log["no_sync"] == (K - 1) * MAX_STEPS
        after = log["allreduce_after"]  # training forwards run at each bucket's all-reduce
        assert after and all(n % K == 0 for n in after), after
        assert sorted(set(after)) == [K * s for s in range(1, MAX_STEPS + 1)], after
    rec = observed(out)[0]  # rank 0 writes the record
    assert rec["world_size"] == 2 and rec["step_active"]
    assert rec["tokens_per_step"] == 2 * BATCH * TINY["context_length"]


@pytest.mark.parametrize("k,words", [(3, "use one of 2, 4, 8"), (16, "use one of 2, 4, 8")])
def test_an_accum_steps_set_by_hand_that_cannot_split_the_batch_is_one_line(k, words):
    """--accum-steps 3 on a batch of 8 would train unsplit: refused with one line and a
    non-zero exit, before the run; the preset's own accum_steps stays a note (above)."""
    proc = py(ACCUM.rel, "--device", "cpu", "--preset", "tiny", "--batch-size", 8,
              "--accum-steps", k, "--max-steps", 3, "--data", VERDICT, timeout=120)  # fmt: skip
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--accum-steps {k} does not split" in lines[0], proc.stderr
    assert words in lines[0]


def test_an_accum_steps_on_a_rung_that_does_not_accumulate_is_refused_in_one_line():
    """A setting the rung does not use is refused, never ignored: step 20's lineage (... 17, 19)
    has no accumulation, so --accum-steps there is one line and exit 2, before the run."""
    top = ladder.first(lambda r: r.memory.batch == "fits")  # step 20, the batch that fits
    assert not any(r.memory.accumulation for r in ladder.lineage(top.num))
    for step in (top, ladder.rung(ladder.first(lambda r: r.memory.large_batch).num)):
        proc = py(step.rel, "--device", "cpu", "--preset", "tiny", "--batch-size", 3,
                  "--accum-steps", 2, "--max-steps", 3, "--data", VERDICT, timeout=120)  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0] == (
            f"error: --accum-steps 2: step {step.num} does not accumulate gradients "
            f"(step {ACCUM.num} does); leave it out"
        )
