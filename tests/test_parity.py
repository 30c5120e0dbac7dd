"""The summary's loss parity (speed_ladder/parity.py): each step's losses against the previous
step's, round with round, under the rung's rule (speed_ladder/data/ladder.json) and the regimes,
and `not comparable` where the rule does not hold on the preset. Synthetic records: milliseconds."""

from speed_ladder import parity

BASE = [11.0, 10.4, 10.0, 9.6]


def rec(step, shift=0.0, regime="fp32", preset="tiny", rnd=1, losses=BASE, device="cpu"):
    r = {"step": step, "status": "ok", "device": device, "preset": preset,
         "losses": [x + shift for x in losses], "sweep": {"round": rnd}}  # fmt: skip
    if regime is not None:
        r["regime"] = regime
    return r


def columns(used: dict) -> dict:
    rows = [{"step": s, "status": "ok"} for s in used]
    parity.add_columns(rows, used)
    return {r["step"]: (r.get("parity"), r.get("parity_detail")) for r in rows}


def test_a_synthetic_tag_with_one_step_off_its_regimes_tolerance():
    """04 fp32, then bf16 from 05: 05 may move 2e-2 (bf16 on), 06 and 07 2e-3 (bf16 regime);
    06 moves 3e-3 and is off, the others ok; the first step has no previous one."""
    used = {
        "04": [rec("04", 0, "fp32", rnd=1), rec("04", 0, "fp32", rnd=2)],
        "05": [rec("05", 5e-3, "bf16", rnd=1), rec("05", 5e-3, "bf16", rnd=2)],
        "06": [rec("06", 8e-3, "bf16", rnd=1), rec("06", 8e-3, "bf16", rnd=2)],
        "07": [rec("07", 8.5e-3, "bf16", rnd=1), rec("07", 8.5e-3, "bf16", rnd=2)],
    }
    got = columns(used)
    assert got["04"] == (None, None)
    assert got["05"][0] == "ok" and "<= 0.02" in got["05"][1]
    assert got["06"][0] == "off"
    assert got["06"][1].startswith("max |loss difference| 3.00e-03 > 0.002 (native LayerNorm")
    assert "(bf16 regime)" in got["06"][1] and got["06"][1].endswith("; off in all 2 rounds")
    assert got["07"][0] == "ok" and got["07"][1].startswith("max |loss difference| 5.00e-04 <=")


def test_rounds_pair_with_their_round_and_the_worst_counts():
    """A round-1 previous run that drew other numbers (say, another random stream) makes the
    step off in round 1 only; the detail says which round."""
    used = {
        "00": [rec("00", 1e-2, rnd=1), rec("00", 0, rnd=2), rec("00", 0, rnd=3)],
        "01": [rec("01", 0, rnd=1), rec("01", 0, rnd=2), rec("01", 0, rnd=3)],
    }
    state, detail = columns(used)["01"]
    assert state == "off" and detail.startswith("max |loss difference| 1.00e-02 not exact")
    assert detail.endswith("; off in round 1 of 3")
    # no round in common: the last run against the last run
    used = {"00": [rec("00", rnd=1)], "01": [rec("01", rnd=2)]}
    assert columns(used)["01"][0] == "ok"


def test_a_record_without_a_regime_is_held_to_fp32():
    """Records without `regime` (the committed 2c tags: a CPU without native bf16, so fp32)
    get the fp32 tolerance; a step's own larger one still holds."""
    used = {"05": [rec("05", 0, None)], "06": [rec("06", 5e-4, None)]}
    assert columns(used)["06"][0] == "off"  # 5e-4 > fp32's 1e-4
    used = {"04": [rec("04", 0, None)], "05": [rec("05", 5e-3, None)]}
    assert columns(used)["05"][0] == "ok"  # step 05's own 2e-2


def test_the_rules_hold_where_they_were_measured_and_say_so_elsewhere():
    """tiny (dropout 0): 08 against 07 within fp32 rounding, 10 within its 0.15. The cpu preset
    (dropout 0.1): compiled 08 and per-block 14 draw other dropout masks, and step 10's larger
    batch parts the losses by what the preset makes of it: `not comparable`, with why."""
    tiny = {"07": [rec("07")], "08": [rec("08", 1e-2, "fp32-compiled")]}
    assert columns(tiny)["08"][0] == "off"
    cpu = {s: [dict(r, preset="cpu") for r in rs] for s, rs in tiny.items()}
    state, detail = columns(cpu)["08"]
    assert state == "not comparable" and "not comparable with dropout 0.1: inductor" in detail
    state, detail = columns({"13": [rec("13", 0, preset="cpu")],
                             "14": [rec("14", 2e-2, preset="cpu")]})["14"]  # fmt: skip
    assert state == "not comparable" and "with dropout 0.1" in detail
    assert columns({"09": [rec("09")], "10": [rec("10", 0.1)]})["10"][0] == "ok"
    state, detail = columns({"09": [rec("09", preset="cpu")],
                             "10": [rec("10", 0.45, preset="cpu")]})["10"]  # fmt: skip
    assert state == "not comparable" and "not comparable on preset cpu" in detail
    # a step with no such exception is held to its rule on the cpu preset too
    cpu = {"02": [rec("02", preset="cpu")], "03": [rec("03", 1e-3, preset="cpu")]}
    assert columns(cpu)["03"][0] == "off"


def test_no_losses_no_parity():
    used = {"00": [rec("00")], "01": [dict(rec("01"), losses=[])]}
    assert columns(used)["01"] == (None, None)
    assert parity.judge("01", rec("00"), dict(rec("01"), losses=[]))[0] == "off"  # NaN: off


def test_a_pair_across_a_step_missing_from_the_tag_is_not_comparable():
    """The committed H200 tag has no step 11 (run by hand, outside the sweep): judged against
    step 10, step 12 would read `off` (0.233), though 12 keeps 11's losses and 11 differs from 10
    by DDP's data order. A rule compares a step with the step before it in the ladder;
    without that step's runs the pair is `not comparable`, saying which step is missing."""
    used = {"10": [rec("10", 0)], "12": [rec("12", 0.233)], "13": [rec("13", 0.233)]}
    rows = [{"step": "10", "status": "ok"}, {"step": "11", "status": "not run"},
            {"step": "12", "status": "ok"}, {"step": "13", "status": "ok"}]  # fmt: skip
    parity.add_columns(rows, used)
    got = {r["step"]: (r.get("parity"), r.get("parity_detail")) for r in rows}
    assert got["11"] == (None, None)
    assert got["12"][0] == "not comparable"
    assert got["12"][1].startswith("not comparable without step 11: it was not run in this tag")
    assert got["13"][0] == "ok"  # 13 against 12, both here
    # a previous step that failed: not comparable either, with its status
    rows = [{"step": "10", "status": "ok"}, {"step": "11", "status": "oom"},
            {"step": "12", "status": "ok"}]  # fmt: skip
    parity.add_columns(rows, used)
    assert rows[2]["parity_detail"].startswith(
        "not comparable without step 11: it has no ok run (oom)"
    )


def test_a_tolerance_holds_for_the_preset_and_run_length_it_was_measured_on():
    """Rounding differences grow with the run: step 07's 0.02 was set for tiny's 4 steps and
    the H200 sweep measured 0.021 and 0.024 over gpt2-124m's 63. Each CUDA tolerance names its
    preset and length; a run past it, or on a preset without one, is not comparable. The CPU's
    rules hold on tiny (4 steps) and the cpu preset (13), except exact ones, at any length."""
    long = [11.0 - 0.08 * i for i in range(63)]
    cuda = dict(device="cuda", regime="bf16", preset="gpt2-124m", losses=long)
    prev, cur = rec("06", **cuda), rec("07", 0.024, **cuda)
    state, _, detail = parity.judge("07", prev, cur)
    assert state == "ok" and "<= 0.05" in detail
    assert parity.judge("07", prev, rec("07", 0.06, **cuda))[0] == "off"
    state, _, detail = parity.judge("07", dict(prev, preset="tiny"), dict(cur, preset="tiny"))
    assert state == "not comparable"
    assert "63 steps of tiny: the CUDA tolerance holds for up to 4" in detail
    state, _, detail = parity.judge("07", dict(prev, preset="gpt2-xl"), dict(cur, preset="gpt2-xl"))
    assert state == "not comparable" and "on preset gpt2-xl: no CUDA tolerance there" in detail
    short = dict(device="cuda", regime="bf16", preset="tiny")
    assert parity.judge("07", rec("06", **short), rec("07", 0.01, **short))[0] == "ok"
    # the CPU: 4 steps of tiny hold, 20 do not (a close rule); an exact rule holds at any length
    twenty = [11.0 - 0.1 * i for i in range(20)]
    state, _, detail = parity.judge("06", rec("05", losses=twenty), rec("06", 1e-5, losses=twenty))
    assert (
        state == "not comparable" and "20 steps of tiny: the CPU rule holds for up to 4" in detail
    )
    assert parity.judge("01", rec("00", losses=twenty), rec("01", losses=twenty))[0] == "ok"
    assert parity.judge("06", rec("05"), rec("06", 1e-5))[0] == "ok"


def test_the_h200_tags_parity_reads_what_the_steps_did():
    """The committed H200 sweep (results/nvidia-h200-x1, one round, 63 steps of gpt2-124m):
    step 07 (0.024) within gpt2-124m's measured tolerance, 12 not comparable (11 was run by
    hand, outside the sweep), 10 not comparable (a larger batch), none off."""
    from speed_ladder.files import ROOT
    from speed_ladder.records import read_jsonl

    runs = {}
    for r in read_jsonl(ROOT / "results" / "nvidia-h200-x1" / "runs.jsonl"):
        if r.get("status") == "ok" and not (r.get("sweep") or {}).get("control"):
            runs.setdefault(r["step"], []).append(r)
    rows = [{"step": f"{i:02d}", "status": "ok" if f"{i:02d}" in runs else "not run"}
            for i in range(15)]  # fmt: skip
    parity.add_columns(rows, runs)
    got = {r["step"]: r.get("parity") for r in rows}
    assert got["07"] == "ok" and got["12"] == "not comparable" and got["10"] == "not comparable"
    assert "off" not in got.values(), got


def test_the_dropout_reason_is_left_out_where_a_rung_and_its_base_train_without_dropout(
    monkeypatch,
):
    """`dropout` (another model or other masks with the preset's dropout) names the preset's
    drop_rate; from step 16 on there is none, so a later rung with such a rule still compares
    with 16 on the cpu preset, while 16 against 15 (dropout 0.1 there) and 14 do not."""
    import dataclasses

    from speed_ladder import ladder

    r16 = ladder.rung("16")
    rule = {"cpu": {"rule": "close", "why": "a later rung", "dropout": "other masks"}}
    r17 = dataclasses.replace(r16, num="17", after="16", parity={**r16.parity, **rule})
    real = ladder.rungs()
    monkeypatch.setattr(ladder, "rungs", lambda: (*real, r17))
    cpu = {"preset": "cpu"}
    assert parity.not_comparable("17", cpu, cpu) is None
    assert parity.not_comparable("16", cpu, cpu).startswith("not comparable with dropout 0.1: ")
    assert parity.not_comparable("14", cpu, cpu).startswith("not comparable with dropout 0.1: ")


def test_fp16_is_held_to_its_own_regime_on_a_cpu_and_not_judged_on_cuda():
    """fp16 autocast with loss scaling (step 05 on a GPU without native bf16; forced on a CPU
    by SPEED_LADDER_AMP=fp16): on a CPU its regime's tolerance (5e-4, finer than bf16's 2e-3);
    on CUDA every tolerance was measured with TF32 and bf16, so an fp16 pair is `not
    comparable`, with the reason, never `ok` or `off` (step 05 against step 04's fp32 too)."""
    assert parity.regime_atol("fp16") == parity.regime_atol("fp16-compiled") == 5e-4
    assert parity.judge("05", rec("04"), rec("05", 1e-3, "fp16"))[0] == "ok"  # step 05's 0.02
    state, _, detail = parity.judge("06", rec("05", 0, "fp16"), rec("06", 3e-4, "fp16"))
    assert state == "ok" and "<= 0.0005" in detail and "(fp16 regime)" in detail
    assert parity.judge("06", rec("05", 0, "fp16"), rec("06", 1e-3, "fp16"))[0] == "off"
    cuda = dict(device="cuda", preset="tiny")
    pairs = [
        (rec("04", **cuda), rec("05", 1e-3, "fp16", **cuda)),
        (rec("05", 0, "fp16", **cuda), rec("06", 0.5, "fp16", **cuda)),
        (rec("07", 0, "fp16", **cuda), rec("08", 0, "fp16-compiled", **cuda)),
    ]
    for prev, cur in pairs:
        state, _, detail = parity.judge(cur["step"], prev, cur)
        assert state == "not comparable" and "not comparable in fp16 on CUDA" in detail, detail
    bf16 = dict(device="cuda", preset="tiny", regime="bf16")
    assert parity.judge("06", rec("05", **bf16), rec("06", 1e-3, **bf16))[0] == "ok"


def test_a_steps_own_bound_can_hold_for_one_regime_only():
    """Step 15's bf16 working weights part from step 12 by more than autocast's rounding where
    bf16 is on (2.7e-3 over the cpu preset's 10 steps on a CPU with native bf16), so its rule
    widens the bf16 regimes' bound; where bf16 is off the step runs step 12's floats and keeps
    the fp32 bound."""
    from speed_ladder import parity

    for regime in ("bf16", "bf16-compiled"):
        assert parity.rule("15", regime, regime)["atol"] == 0.01
    for regime in ("fp32", "fp32-compiled"):
        assert parity.rule("15", regime, regime)["atol"] == 1e-4
    assert parity.rule("16", "bf16", "bf16")["atol"] is None  # exact: no own bound


def test_validation_loss_is_compared_where_one_commit_evaluated_both():
    """Training losses within the rule and final validation losses too: ok. Validation losses
    apart: not comparable where other commits evaluated the two runs (their evaluation may
    differ); where one clean commit did, the training losses' verdict, the gap in the detail."""
    sha, other = "a" * 40, "b" * 40
    prev, cur = dict(rec("06"), val_loss=7.6, git_sha=sha), dict(rec("07", 1e-5), val_loss=7.6)
    assert parity.judge("07", prev, dict(cur, git_sha=sha))[0] == "ok"
    state, _, detail = parity.judge("07", prev, dict(cur, val_loss=8.1, git_sha=sha))
    assert state == "ok" and "validation loss 7.6000 against 8.1000, one commit" in detail
    for later in (other, None):
        state, _, detail = parity.judge("07", prev, dict(cur, val_loss=8.1, git_sha=later))
        assert state == "not comparable" and "across commits (aaaaaaaa, " in detail, later
    assert parity.judge("07", prev, dict(cur, val_loss=None, git_sha=other))[0] == "ok"
