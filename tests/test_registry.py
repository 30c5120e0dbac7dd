"""The registry (speed_ladder/data/ladder.json, loaded by speed_ladder/ladder.py) says what each
rung is; these tests hold it to what the ladder was before it said so, and to what its readers
need. No torch is imported."""

import hashlib
import json
import shutil

import pytest

from speed_ladder import ladder
from speed_ladder.errors import UserError
from speed_ladder.files import ROOT
from speed_ladder.measure import fit
from speed_ladder.measure import memory_model as mm
from speed_ladder.measure.settings import resolve_spec
from speed_ladder.presets import PRESETS

# What each rung is, written down a second time on purpose (docs/developing.md, "Add a rung"):
# the fold of the registry's entries must give these answers for every rung, so that an edit of
# an entry never changes a rung silently.
#        num: (distributed, compiled, state, activations, bf16 autocast, flash, padded, large batch)
FROZEN = {
    "00": (False, False, "single", "logits", False, False, False, False),
    "01": (False, False, "single", "logits", False, False, False, False),
    "02": (False, False, "single", "logits", False, False, False, False),
    "03": (False, False, "single", "logits", False, False, False, False),
    "04": (False, False, "single", "logits", False, False, False, False),
    "05": (False, False, "single", "logits", True, False, False, False),
    "06": (False, False, "single", "logits", True, False, False, False),
    "07": (False, False, "single", "logits", True, True, False, False),
    "08": (False, True, "single", "logits", True, True, False, False),
    "09": (False, True, "single", "logits", True, True, True, False),
    "10": (False, True, "single", "logits", True, True, True, True),
    "11": (True, True, "ddp", "logits", True, True, True, True),
    "12": (True, True, "ddp", "fused", True, True, True, True),
    "13": (True, True, "ddp", "checkpointed", True, True, True, True),
    "14": (True, True, "fsdp2", "checkpointed", True, True, True, True),
    "15": (True, True, "ddp", "fused", True, True, True, True),  # after 12: no checkpointing
    "16": (True, True, "ddp", "fused", True, True, True, True),
    "17": (True, True, "ddp", "fused", True, True, True, True),  # cuDNN's attention: flash's memory
    "18": (True, True, "ddp", "fused", True, True, True, True),  # micro-batches: the same terms
    "19": (True, True, "ddp", "fused", True, True, True, True),  # after 17: one QKV layer, the same
    "20": (True, True, "ddp", "fused", True, True, True, True),  # its batch is found at run time
    "21": (True, True, "fsdp2-offload", "checkpointed", True, True, True, True),  # after 14
}

# memory_model.predict_run(gpt2-124m, step, world, its batch, bf16, device).total_bytes, written
# down a second time on purpose: world 1 then 4, each bf16 then fp32, each cuda then cpu;
# steps 11-13 in a world of one without DDP's buckets since step 11 wraps only 2 processes or more;
# 12 on, Liger's default chunk (512 rows) beside the hidden states' gradient on cuda, and step 11's
# full logits on a cpu, where step 12 runs its fallback, step 11's loss
# fmt: off
PREDICTED = {
    "00": [23403085824, 23403085824, 23403085824, 23403085824,
           23403085824, 23403085824, 23403085824, 23403085824],
    "01": [23403085824, 23403085824, 23403085824, 23403085824,
           23403085824, 23403085824, 23403085824, 23403085824],
    "02": [23403085824, 23403085824, 23403085824, 23403085824,
           23403085824, 23403085824, 23403085824, 23403085824],
    "03": [23403085824, 23403085824, 23403085824, 23403085824,
           23403085824, 23403085824, 23403085824, 23403085824],
    "04": [23403085824, 23403085824, 23403085824, 23403085824,
           23403085824, 23403085824, 23403085824, 23403085824],
    "05": [16402579968, 16402579968, 23403085824, 23403085824,
           16402579968, 16402579968, 23403085824, 23403085824],
    "06": [16402579968, 16402579968, 23403085824, 23403085824,
           16402579968, 16402579968, 23403085824, 23403085824],
    "07": [10362782208, 16402579968, 12531449856, 23403085824,
           10362782208, 16402579968, 12531449856, 23403085824],
    "08": [10362782208, 16402579968, 12531449856, 23403085824,
           10362782208, 16402579968, 12531449856, 23403085824],
    "09": [10368629760, 16408427520, 12537225216, 23408861184,
           10368629760, 16408427520, 12537225216, 23408861184],
    "10": [32904625152, 57063816192, 42320977920, 85807521792,
           32904625152, 57063816192, 42320977920, 85807521792],
    "11": [32904625152, 57063816192, 42320977920, 85807521792,
           33556952064, 57716143104, 42973304832, 86459848704],
    "12": [13380664320, 57063816192, 22898860032, 85807521792,
           14032991232, 57716143104, 23551186944, 86459848704],
    "13": [5176605696, 26713832448, 5836431360, 28882427904,
           5828932608, 27366159360, 6488758272, 29534754816],
    "14": [5886071808, 27423298560, 6545897472, 29591894016,
           3929091072, 25466317824, 4588916736, 27634913280],
    # 15's bf16 weights: no autocast copies, bf16 DDP buckets and fp32 gradient buffers (4 B a
    # parameter) where bf16 is on; 12's otherwise
    "15": [13785667584, 57468819456, 22898860032, 85807521792,
           14111831040, 57794982912, 23551186944, 86459848704],
    # 16 without dropout: no masks, and a CPU's SDPA runs flash (no (B, H, T, T) scores) too
    "16": [13181687808, 32705648640, 22294880256, 41716998144,
           13507851264, 33031812096, 22947207168, 42369325056],
    # 17: cuDNN's fused attention keeps what flash keeps (on a CPU, step 07's kernel runs)
    "17": [13181687808, 32705648640, 22294880256, 41716998144,
           13507851264, 33031812096, 22947207168, 42369325056],
    # 18: the batch of 32 in 2 micro-batches of 16: activations (and Liger's chunk) of 16
    "18": [8298928128, 17983641600, 12529360896, 22163152896,
           8625091584, 18309805056, 13181687808, 22815479808],
    # 19: after 17, one (3C, C) layer for three (C, C): the same parameters and activations
    "19": [13181687808, 32705648640, 22294880256, 41716998144,
           13507851264, 33031812096, 22947207168, 42369325056],
    # 20: its batch grows at run time on a GPU; before the run, step 19's batch
    "20": [13181687808, 32705648640, 22294880256, 41716998144,
           13507851264, 33031812096, 22947207168, 42369325056],
    # 21: 14's shards, gradients and AdamW state in host memory on a GPU; on a CPU, 14's
    "21": [3276764160, 27423298560, 3936589824, 29591894016,
           3276764160, 25466317824, 3936589824, 27634913280],
}
# fmt: on
FIT_TABLE_SHA = "b802080da34f69062974498206c454e13108f3eb134b526bab186f992843e174"
BREAKDOWN_SHA = "65b007f4563b8ec6eb8b4c9128ae2fb852c1706f323846655e8f35c89c436918"


def test_the_fold_gives_every_rung_its_frozen_answer():
    got = {}
    for r in ladder.rungs():
        m = r.memory
        got[r.num] = (r.distributed, r.compiled, m.state, m.activations, m.bf16_autocast, m.flash,
                      m.padded_vocab, m.large_batch)  # fmt: skip
    assert got == FROZEN


def test_the_memory_model_predicts_the_written_down_bytes(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU runs step 12's fallback
    p = PRESETS["gpt2-124m"]
    spec = resolve_spec({"preset": "gpt2-124m"}, "cuda")  # the preset's batches
    got = {}
    for r in ladder.rungs():
        runs = [(w, bf16, dev) for w in (1, 4) for bf16 in (True, False) for dev in ("cuda", "cpu")]
        b = r.batch(spec)
        got[r.num] = [
            mm.predict_run(p, r.num, w, b, bf16, dev).total_bytes for w, bf16, dev in runs
        ]
    assert got == PREDICTED
    assert hashlib.sha256(fit.fit_table().encode()).hexdigest() == FIT_TABLE_SHA
    assert hashlib.sha256(mm.breakdown_table().encode()).hexdigest() == BREAKDOWN_SHA


def test_every_step_file_has_one_entry_and_every_rung_a_parity_rule():
    files = ["00_orig.py", *sorted(p.relative_to(ROOT).as_posix()
                                    for p in (ROOT / "steps").glob("[0-9][0-9]_*.py"))]  # fmt: skip
    assert [r.rel for r in ladder.rungs()] == files
    for r in ladder.rungs()[1:]:
        assert r.parity["cpu"]["rule"] in ("exact", "close") and r.parity["cpu"]["why"]
        assert r.parity["cuda"]["why"] and r.parity["cuda"]["holds"]
        assert r.summary, r.num
    assert ladder.BASELINE == ladder.rungs()[0].num


def test_the_summary_files_copy_their_rung():
    for r in ladder.rungs():
        if r.summary_file:
            assert (ROOT / r.summary_file).read_bytes() == r.path.read_bytes()


def test_every_rungs_check_is_code_and_names_a_rung():
    """The registry's behaviour is Python (measure/rung_checks.py: a function of the run's facts
    per rung); its data (ladder.json) names no check, module or settings key."""
    import json

    from speed_ladder.measure.rung_checks import CHECKS

    nums = {r.num for r in ladder.rungs()}
    assert set(CHECKS) <= nums and all(callable(c.ask) for c in CHECKS.values())
    entries = json.loads(ladder.REGISTRY.read_text())["rungs"]
    assert not any("inactive" in e for e in entries)
    assert all(isinstance(v, bool) for v in ladder.TERMS["accumulation"])


def _copy(tmp_path):
    root = tmp_path / "ladder"
    (root / "steps").mkdir(parents=True)
    for r in ladder.rungs()[:3]:
        shutil.copy(r.path, root / r.rel)
    reg = json.loads(ladder.REGISTRY.read_text())
    reg["rungs"] = reg["rungs"][:3]
    return root, reg


def test_a_step_file_without_an_entry_or_a_bad_entry_is_one_error(tmp_path):
    root, reg = _copy(tmp_path)
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps(reg))
    assert [s.num for s in ladder.discover(root, path)] == ["00", "01", "02"]
    shutil.copy(root / "steps" / "02_tensor_cores_tf32.py", root / "steps" / "03_x.py")
    with pytest.raises(UserError, match=r"steps/03_x.py has no entry in .*Add a rung"):
        ladder.discover(root, path)
    bad = {"precision": "fp8"}
    reg["rungs"].append({"num": "03", "file": "steps/03_x.py", "summary": "x", "changes": bad,
                         "parity": reg["rungs"][1]["parity"]})  # fmt: skip
    path.write_text(json.dumps(reg))
    with pytest.raises(UserError, match="precision='fp8' is not a term the harness models"):
        ladder.discover(root, path)
    reg["rungs"][-1]["changes"] = {}
    del reg["rungs"][-1]["parity"]
    path.write_text(json.dumps(reg))
    with pytest.raises(UserError, match="rung 03: parity.cpu needs a rule"):
        ladder.discover(root, path)
    (root / "steps" / "03_x.py").unlink()
    with pytest.raises(UserError, match="rung 03 has no step file"):
        ladder.discover(root, path)


def test_every_rung_is_hashable_as_the_sweep_keys_its_jobs():
    """The sweep keys its jobs by step (sweep/rounds.py): a rung's dict fields (its parity rule)
    stay out of the hash, or `python -m speed_ladder run` would raise TypeError there."""
    from speed_ladder.sweep.plan import Job

    steps = ladder.rungs()
    assert any(s.parity for s in steps)
    assert len({Job(0, s): s.num for s in steps}) == len(steps)
