"""speed_ladder.gains: each step's effect over the previous one, its interval, verdict and the noise
floor; the summary's columns from old and new records. In-process, milliseconds."""

import pytest

from speed_ladder import gains, selection
from speed_ladder.ladder import Step
from speed_ladder.report import summary
from speed_ladder.report.rows import busy_text, effect_text, inactive


def test_effect_verdicts():
    before = {1: 100.0, 2: 100.0, 3: 100.0}
    faster = gains.effect(before, {1: 110.0, 2: 112.0, 3: 109.0}, 0.02, "faster", "slower")
    assert faster.verdict == "faster" and faster.ratio == pytest.approx(1.10)
    assert (faster.lo, faster.hi, faster.rounds) == (pytest.approx(1.09), pytest.approx(1.12), 3)
    slower = gains.effect(before, {1: 90.0, 2: 95.0, 3: 91.0}, 0.02, "faster", "slower")
    assert slower.verdict == "slower"
    # the interval holds 1.0: no change, whatever the median says
    straddle = gains.effect(before, {1: 90.0, 2: 125.0, 3: 101.0}, 0.0, "faster", "slower")
    assert straddle.verdict == "no change" and straddle.ratio == pytest.approx(1.01)
    # outside 1.0 but under the noise floor: no change
    small = gains.effect(before, {1: 101.0, 2: 101.5, 3: 101.2}, 0.02, "faster", "slower")
    assert small.verdict == "no change"
    tiny = gains.effect(before, {1: 100.5, 2: 100.6, 3: 100.5}, 0.0, "faster", "slower")
    assert tiny.verdict == "no change"  # under MIN_EFFECT, 1%
    one = gains.effect({1: 100.0}, {1: 150.0}, 0.0, "faster", "slower")
    assert one.verdict == "one round: no interval" and one.lo is None and one.ratio == 1.5
    # rounds pair by number: round 4 of one step and round 1 of the other do not pair
    assert gains.effect({4: 1.0}, {1: 2.0}, None, "a", "b").verdict == ""


def _rec(step, rnd, tps, mem=2**30, control=False, **extra):
    sweep = {"run_id": f"{step}{rnd}{control}", "config": {}, "script_sha256": "x", "round": rnd}
    if control:
        sweep["control"] = True
    return {"step": step, "status": "ok", "tokens_per_sec": tps, "peak_mem_reserved_bytes": mem,
            "sweep": sweep, **extra}  # fmt: skip


def _summary(recs, nums=("00", "01", "02")):
    steps = [Step(n, __import__("pathlib").Path(f"{n}.py"), f"step {n}", False) for n in nums]
    configs, shas = {n: {} for n in nums}, {n: "x" for n in nums}
    df = summary.summarize(steps, recs, configs, shas, 3)
    return {r["step"]: r for r in df.to_dict("records")}


def test_the_noise_floor_from_the_aa_control_and_from_the_spread():
    recs = []
    for rnd, (a, ctl, b, c) in enumerate([(100, 102, 130, 131), (100, 99, 128, 133),
                                           (104, 103, 131, 129)], 1):  # fmt: skip
        recs += [_rec("00", rnd, a), _rec("00", rnd, ctl, control=True), _rec("01", rnd, b),
                 _rec("02", rnd, c, mem=2**30 * 1.001)]  # fmt: skip
    rows = _summary(recs)
    assert rows["00"]["runs"] == 3 and rows["00"]["tokens_per_sec_median"] == 100
    floor = rows["01"]["noise_floor"]
    assert floor == pytest.approx(0.02, abs=1e-4)  # the largest |A/A - 1|: 102/100
    assert rows["01"]["noise_source"].startswith("A/A control: step 00 run twice per round")
    assert rows["01"]["verdict"] == "faster" and rows["01"]["prev_step"] == "00"
    assert rows["02"]["verdict"] == "no change"  # 0.98-1.04 holds 1.0
    # exact to the byte, 0.1% more: under the 1% that a verdict needs
    assert rows["02"]["mem_verdict"] == "no change" and rows["02"]["mem_vs_prev"] == 1.001
    assert rows["00"]["gain_vs_prev"] != rows["00"]["gain_vs_prev"]  # NaN: no previous step
    # without the control: the median over steps of max/min - 1
    rows = _summary([r for r in recs if not r["sweep"].get("control")])
    assert rows["01"]["noise_source"].startswith("spread: median over 3 step(s)")
    # spreads 104/100, 131/128 and 133/129: the median is step 02's
    assert rows["01"]["noise_floor"] == pytest.approx(133 / 129 - 1, abs=1e-4)


def test_inactive_busy_and_one_round_rows_say_so():
    recs = [_rec("00", 1, 100.0), _rec("01", 1, 101.0, step_active=False,
            inactive_reason="TF32 is CUDA-only"), _rec("02", 1, 150.0, other_load=1.3)]  # fmt: skip
    rows = _summary(recs)
    assert rows["01"]["verdict"] == "inactive" and rows["01"]["step_active"] == False  # noqa: E712
    assert inactive(rows["01"]) == "inactive here: TF32 is CUDA-only"
    assert rows["02"]["verdict"] == "one round: no interval"
    assert effect_text(rows["02"]) == "1.49x (one round: no interval)"
    assert rows["02"]["busy_runs"] == 1 and rows["02"]["other_load_max"] == 1.3
    assert busy_text(rows["02"]).startswith("busy: 1/1 run(s), up to 1.30 cores")
    assert rows["00"]["noise_source"] == "no repeated runs: no noise floor"


def test_records_without_the_new_fields_still_summarize():
    """Older records: no round (their repeat pairs them), no machine, no other_load."""
    recs = []
    for n, tps in (("00", [100, 110, 105]), ("01", [120, 118, 125])):
        for i, t in enumerate(tps, 1):
            r = _rec(n, i, float(t))
            r["sweep"]["repeat"] = r["sweep"].pop("round")
            recs.append(r)
    rows = _summary(recs, ("00", "01"))
    assert rows["01"]["gain_vs_prev"] == pytest.approx(1.19, abs=0.01)
    assert rows["01"]["verdict"] == "faster" and rows["01"]["busy_runs"] == 0
    active = rows["01"]["step_active"]
    assert active is None or active != active  # unknown
    assert effect_text(rows["01"]).startswith("1.19x [1.07-1.20] faster")


def test_rebuild_a_summary_from_old_records(tmp_path):
    """plot_results.py --rebuild: the columns from runs.jsonl alone, records of before rounds
    and fingerprints (3 runs of a step, then 3 of the next), a -x2 tag's scaling efficiency."""
    import json
    from pathlib import Path

    from speed_ladder.ladder import discover

    root = Path(__file__).resolve().parent / "fixtures" / "ladder_ok"
    steps = discover(root)
    files = {s.num: s.rel for s in steps}  # the step files of the ladder rebuilt here
    one, two = tmp_path / "old-cpu-x1", tmp_path / "old-cpu-x2"
    for tag, nums, scale, w in ((one, ("00", "01", "02", "03"), 1, 1), (two, ("02",), 1.6, 2)):
        tag.mkdir()
        lines = []
        for n in nums:
            for rep, tps in enumerate((100.0, 104.0, 98.0), 1):
                sweep = {"run_id": f"{n}{rep}", "config": {"nproc": 1}, "repeat": rep,
                         "script_sha256": "x"}  # fmt: skip
                rate = tps * (int(n) + 1) * scale
                # the fields every ok record has had (report/checks/validity.py's REQUIRED)
                rec = {"step": n, "status": "ok", "tokens_per_sec": rate,
                       "step_time_ms": 100 * w / rate * 1000, "world_size": w, "batch_size": 1,
                       "context_length": 100, "device": "cpu", "device_name": "AMD EPYC",
                       "preset": "tiny", "losses": [10.0], "script": files[n],
                       "peak_mem_reserved_bytes": 2**30, "sweep": sweep}  # fmt: skip
                lines.append(json.dumps(rec) + "\n")
        (tag / "runs.jsonl").write_text("".join(lines))
    df, used = summary.rebuild(one, steps)
    rows = {r["step"]: r for r in df.to_dict("records")}
    assert rows["01"]["gain_vs_prev"] == pytest.approx(2.0) and rows["01"]["verdict"] == "faster"
    assert rows["03"]["runs"] == 3 and set(used) == {"00", "01", "02", "03"}
    df2, _ = summary.rebuild(two, [s for s in steps if s.distributed], used, 2)
    assert df2.to_dict("records")[0]["scaling_efficiency"] == pytest.approx(0.8)


def test_an_interpreted_run_is_no_measurement():
    """Triton's interpreter ran step 12's Liger on a CPU: its tok/s and memory are left out,
    no gain is claimed, and the next step claims none either: its own effect is over the step
    before it, which has no measurement (a ratio over an earlier step would hold both steps'
    effects)."""
    recs = [_rec("00", r, 100.0) for r in (1, 2)] + [
        _rec("01", r, 5.0, interpreted=True) for r in (1, 2)
    ] + [_rec("02", r, 120.0) for r in (1, 2)]  # fmt: skip
    rows = _summary(recs)
    assert rows["01"]["status"] == "interpreted" and "interpreter" in rows["01"]["reason"]
    assert (
        rows["01"]["tokens_per_sec_median"] is None
        or rows["01"]["tokens_per_sec_median"] != (rows["01"]["tokens_per_sec_median"])
    )  # empty (NaN once read back)
    assert rows["01"]["verdict"] in (None, "") or rows["01"]["verdict"] != rows["01"]["verdict"]
    assert rows["02"]["status"] == "ok" and rows["02"]["speedup_vs_00"] == pytest.approx(1.2)
    g = rows["02"]["gain_vs_prev"]
    assert g is None or g != g  # no effect over an unmeasured step


def _at(minutes: int) -> dict:
    """A record's start time, `minutes` after 09:00 UTC."""
    from datetime import datetime, timedelta, timezone

    t = datetime(2026, 11, 27, 9, tzinfo=timezone.utc) + timedelta(minutes=minutes)
    return {"started_at": t.isoformat(timespec="seconds")}


def _later(recs: list[dict], name: str) -> list[dict]:
    for r in recs:
        r["sweep"]["run_id"] += name
    return recs


def test_a_later_sweep_of_one_step_does_not_pair_with_its_predecessors_old_runs():
    """Rounds are numbered from 1 in every sweep: step 01 run again hours after 00 and 01 were
    swept together pairs with nothing (no effect, not 01's new run over 00's old one); runs
    minutes apart still pair, and records without a start time pair by round."""
    first = []
    for rnd in (1, 2, 3):  # 00 then 01, 3 minutes apart, in each round
        first += [_rec("00", rnd, 100, **_at(10 * rnd)), _rec("01", rnd, 110, **_at(10 * rnd + 3))]
    assert _summary(first, ("00", "01"))["01"]["gain_vs_prev"] == pytest.approx(1.10)
    later = _later([_rec("01", rnd, 150, **_at(180 + 10 * rnd)) for rnd in (1, 2, 3)], "-later")
    row = _summary(first + later, ("00", "01"))["01"]
    assert row["tokens_per_sec_median"] == 150  # the later runs are 01's runs
    assert row["gain_vs_prev"] != row["gain_vs_prev"] and row["verdict"] != "faster", row  # NaN
    assert gains.paired(first, later, gains.TPS) == ({}, {})
    # a resumed sweep, 40 minutes after the first: the same session, the rounds pair
    soon = _later([_rec("01", rnd, 120, **_at(40 + 10 * rnd)) for rnd in (1, 2, 3)], "-soon")
    assert _summary(first + soon, ("00", "01"))["01"]["gain_vs_prev"] == pytest.approx(1.20)
    # no start times: by round alone
    bare = [{k: v for k, v in r.items() if k != "started_at"} for r in first + later]
    assert _summary(bare, ("00", "01"))["01"]["gain_vs_prev"] == pytest.approx(1.50)


def test_the_noise_floor_is_the_noisiest_sweeps_control():
    """A tag swept twice has two A/A controls (each sweep's first step): the floor is the larger,
    not the first step's, so a noisy later sweep is judged by its own noise."""
    recs = []
    for rnd in (1, 2, 3):  # sweep 1: 00 (control) and 01; sweep 2 reran 01 (control) and 02
        recs += [_rec("00", rnd, 100, **_at(10 * rnd)),
                 _rec("00", rnd, 101, control=True, **_at(10 * rnd + 1)),
                 _rec("01", rnd, 120, **_at(10 * rnd + 2))]  # fmt: skip
    later = []
    for rnd in (1, 2, 3):
        later += [_rec("01", rnd, 130, **_at(300 + 10 * rnd)),
                  _rec("01", rnd, 130 if rnd != 2 else 169, control=True, **_at(301 + 10 * rnd)),
                  _rec("02", rnd, 140, **_at(302 + 10 * rnd))]  # fmt: skip
    rows = _summary(recs + _later(later, "-2"))
    assert rows["02"]["noise_floor"] == pytest.approx(0.3)  # 01's A/A in round 2: 169 vs 130
    assert rows["02"]["noise_source"].startswith("A/A control: steps 00, 01 run twice per round")
    assert rows["02"]["verdict"] == "no change"  # 140/130 = 1.077, under the 30% floor
    only_first = _summary(recs)
    assert only_first["01"]["noise_floor"] == pytest.approx(0.01)


def test_a_sweep_of_some_steps_summarizes_the_others_as_a_rebuild_does():
    """`run --steps 01` after 00's file changed: the sweep's own shas say 00 has no run, but its
    last records stand (as `rebuild`, `check` and `publish` take them), so the sweep's summary
    and the rebuilt one agree."""
    steps = [
        Step(n, __import__("pathlib").Path(f"{n}.py"), f"step {n}", False) for n in ("00", "01")
    ]
    recs = []
    for rnd in (1, 2, 3):
        old, new = _rec("00", rnd, 100, **_at(10 * rnd)), _rec("01", rnd, 110, **_at(10 * rnd + 2))
        old["sweep"]["script_sha256"], new["sweep"]["script_sha256"] = "old00", "new01"
        recs += [old, new]
    configs, shas = selection.settled(
        recs, steps, {"00": {}, "01": {}}, {"00": "cur00", "01": "new01"}
    )
    assert shas == {"00": "old00", "01": "new01"} and configs == {"00": {}, "01": {}}
    rows = {
        r["step"]: r for r in summary.summarize(steps, recs, configs, shas, 3).to_dict("records")
    }
    assert rows["00"]["status"] == "ok" and rows["01"]["gain_vs_prev"] == pytest.approx(1.10)
    strict = summary.summarize(steps, recs, {"00": {}, "01": {}}, {"00": "cur00", "01": "new01"}, 3)
    assert list(strict["status"]) == ["not run", "ok"]  # the sweep's own shas alone
