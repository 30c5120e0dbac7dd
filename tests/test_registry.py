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
from speed_ladder.measure import memory_model as mm
from speed_ladder.presets import PRESETS

# Before the registry each of these was a step-number comparison somewhere (memory_model.py's
# step_kind and mode_of_step, spec.py, preflight's source grep, ladder.py's): the fold of the
# entries must give the same answer for every rung.
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
}

# memory_model.predict_run(gpt2-124m, step, world, its batch, bf16, device).total_bytes as the
# step-number comparisons computed it: world 1 then 4, each bf16 then fp32, each cuda then cpu;
# steps 11-13 in a world of one without DDP's buckets since step 11 wraps only 2 processes or more;
# 12-14 in fp32 with Liger's 4096-row chunk since step 12 runs Liger's chunk loop itself;
# 12 on hold the hidden states' gradient beside either chunk, the fallback's chunk has its fp32
# copy where the logits are bf16 since the fallback runs that loop too
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
    "12": [13741243392, 37900434432, 23620018176, 67106562048,
           14393570304, 38552761344, 24272345088, 67758888960],
    "13": [5537184768, 7550450688, 6557589504, 10181468160,
           6189511680, 8202777600, 7209916416, 10833795072],
    "14": [6246650880, 8259916800, 7267055616, 10890934272,
           4289670144, 6302936064, 5310074880, 8933953536],
    # 15's bf16 weights: no autocast copies and bf16 DDP buckets where bf16 is on; 12's otherwise
    "15": [13493919744, 37653110784, 23620018176, 67106562048,
           13820083200, 37979274240, 24272345088, 67758888960],
    # 16 without dropout: no masks, and a CPU's SDPA runs flash (no (B, H, T, T) scores) too
    "16": [12889939968, 12889939968, 23016038400, 23016038400,
           13216103424, 13216103424, 23668365312, 23668365312],
    # 17: cuDNN's fused attention keeps what flash keeps (on a CPU, step 07's kernel runs)
    "17": [12889939968, 12889939968, 23016038400, 23016038400,
           13216103424, 13216103424, 23668365312, 23668365312],
}
# fmt: on
FIT_TABLE_SHA = "fa40f03329ca5c477ede655bcafa49d4dedda482df71c220385db83152e5164b"
BREAKDOWN_SHA = "2441c5840c83b51b8dff05b3140b999fe9db994a19eeefc2a8e1543941286537"


def test_the_fold_gives_every_rung_what_it_was():
    got = {}
    for r in ladder.rungs():
        m = r.memory
        got[r.num] = (r.distributed, r.compiled, m.state, m.activations, m.bf16_autocast, m.flash,
                      m.padded_vocab, m.large_batch)  # fmt: skip
    assert got == FROZEN


def test_the_memory_model_predicts_what_it_did_from_step_numbers():
    p = PRESETS["gpt2-124m"]
    got = {}
    for r in ladder.rungs():
        runs = [(w, bf16, dev) for w in (1, 4) for bf16 in (True, False) for dev in ("cuda", "cpu")]
        b = r.batch(p)
        got[r.num] = [
            mm.predict_run(p, r.num, w, b, bf16, dev).total_bytes for w, bf16, dev in runs
        ]
    assert got == PREDICTED
    assert hashlib.sha256(mm.fit_table().encode()).hexdigest() == FIT_TABLE_SHA
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


def test_every_inactive_check_is_a_speed_ladder_name():
    import speed_ladder

    for r in ladder.rungs():
        if r.inactive:
            assert r.inactive.check in speed_ladder.__all__
            path = ROOT / "speed_ladder" / (r.inactive.module.replace(".", "/") + ".py")
            assert f"def {r.inactive.check}(" in path.read_text()


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
