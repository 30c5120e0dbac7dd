"""Time to a target loss (speed_ladder/measure/curve.py): a step file's --to-loss run on `tiny`
that reaches its target, one that spends its token budget first, bad values, and the same
validation tokens on every rung whatever its batch."""

import argparse
import statistics

import pytest
from conftest import VERDICT, load_script, py, records

from speed_ladder.measure.curve import MIN_TIMED_STEPS, LossCurve, val_batches
from speed_ladder.measure.run import Run
from speed_ladder.presets import TO_LOSS
from speed_ladder.spec import ToLoss

TINY = ["--device", "cpu", "--preset", "tiny", "--data", VERDICT, "--warmup-steps", 2]
EAGER = {"TORCH_COMPILE_DISABLE": "1", "SPEED_LADDER_BF16": "0"}


def to_loss_run(tmp_path, *flags, script="00_orig.py"):
    out = tmp_path / "r.jsonl"
    proc = py(script, *TINY, "--results", out, *flags, env=EAGER, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = records(out)
    return rec, proc.stdout


def test_a_run_stops_at_the_first_evaluation_at_or_below_its_target(tmp_path):
    """Bare --to-loss takes the preset's target; the run evaluates every eval_tokens tokens on
    the training clock, stops at the first evaluation at or below the target, and records the
    tokens and time it took, compiling and warm-up on their own."""
    rec, out = to_loss_run(tmp_path, "--to-loss")
    preset = TO_LOSS["tiny"]
    t = rec["to_loss"]
    assert t["target"] == preset["target"] and t["budget_tokens"] == preset["budget_tokens"]
    assert t["reached"] is True and t["tokens"] < t["budget_tokens"]
    curve = rec["curve"]
    tokens, train_s, losses = zip(*curve, strict=True)
    step_tokens = 4 * 32  # tiny's batch x context
    assert [n % preset["eval_tokens"] < step_tokens for n in tokens] == [True] * len(curve)
    assert list(tokens) == sorted(set(tokens)) and list(train_s) == sorted(train_s)
    assert losses[-1] <= t["target"] < min(losses[:-1])  # stopped at the first one below
    # the crossing, linear between the last evaluation above the target and the first below
    frac = (losses[-2] - t["target"]) / (losses[-2] - losses[-1])
    assert t["tokens"] == round(tokens[-2] + frac * (tokens[-1] - tokens[-2]))
    assert t["train_s"] == pytest.approx(train_s[-2] + frac * (train_s[-1] - train_s[-2]), 1e-3)
    assert 0 < rec["warmup_s"] < t["train_s"]
    median_s = rec["step_time_ms"] / 1000
    assert t["time_s"] == pytest.approx(t["train_s"] - rec["warmup_s"] + 2 * median_s, abs=2e-3)
    assert rec["tokens_per_sec"] > 0 and rec["timed_steps"] == len(rec["losses"]) - 2
    assert f"{tokens[0]:,} tokens): train loss" in out  # each evaluation printed


def test_a_run_that_spends_its_budget_says_not_reached(tmp_path):
    rec, _ = to_loss_run(tmp_path, "--to-loss", "2.5", "--token-budget", "1024")
    t = rec["to_loss"]
    assert t["reached"] is False and t["tokens"] is None and t["time_s"] is None
    assert t["target"] == 2.5 and t["budget_tokens"] == 1024
    assert rec["curve"][-1][0] == 1024 and rec["curve"][-1][2] > 2.5  # its last evaluation
    assert len(rec["losses"]) == 1024 // (4 * 32)  # stopped at the budget


def test_a_run_without_to_loss_records_its_final_evaluation_on_the_curve(tmp_path):
    rec, _ = to_loss_run(tmp_path, "--max-steps", "4")
    assert rec["to_loss"] is None
    ((tokens, train_s, val_loss),) = rec["curve"]
    assert tokens == 4 * 4 * 32 and val_loss == rec["val_loss"] and train_s > 0


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--to-loss", "abc"], "argument --to-loss: expected a loss such as 6.5, got 'abc'"),
        (["--to-loss", "-1"], "argument --to-loss: must be a loss above 0 (nats), got -1"),
        (["--to-loss", "nan"], "argument --to-loss: must be a loss above 0 (nats), got nan"),
        (["--token-budget", "100"], "--token-budget is for a --to-loss run; add --to-loss L"),
        (["--to-loss", "5", "--token-budget", "0"], "argument --token-budget: must be at least 1"),
    ],
)
def test_a_bad_to_loss_is_one_line_and_a_nonzero_exit(flags, words):
    proc = py("00_orig.py", *TINY, *flags, env=EAGER, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_a_preset_without_measured_settings_says_so():
    proc = py("00_orig.py", "--device", "cpu", "--preset", "gpt2-xl", "--to-loss", "5",
              env=EAGER, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "has no measured time-to-loss settings" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_every_rung_evaluates_on_the_same_validation_tokens(monkeypatch):
    """Step 10 doubles the training batch; every rung evaluates in batches of the preset's
    batch_size: the same batches, the same tokens."""
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    args = argparse.Namespace(device="cpu", preset="tiny", epochs=None, max_steps=None,
                              warmup_steps=None, batch_size=None, accum_steps=None,
                              data=str(VERDICT), results=None, seed=123, to_loss=9.0,
                              token_budget=None, profile=None, trace=None)  # fmt: skip
    val = TO_LOSS["tiny"]["val_tokens"]
    batches = {step: Run(args, step, __file__).spec.eval_iters for step in ("09", "10")}
    assert batches == {"09": val // (4 * 32), "10": val // (4 * 32)}
    assert val_batches(val, 3, 32) == 3  # a part batch: one more


def test_the_curve_leaves_evaluation_out_of_the_training_clock(monkeypatch):
    now = iter([0.0, 2.0, 2.0, 5.0, 100.0, 101.0]).__next__
    monkeypatch.setattr("speed_ladder.measure.curve.time.perf_counter", now)
    c = LossCurve(ToLoss(target=1.0, budget_tokens=10, eval_tokens=4, val_tokens=8))
    c.start()  # 0
    c.step(4)
    c.warmed_up()  # 2: the warm-up's 2 s
    assert c.eval_due()
    c.pause()  # 2
    c.add(3.0)
    assert not c.eval_due() and not c.done()
    c.start()  # 5: the 3 s of evaluation left out
    c.step(4)
    c.pause()  # 100
    c.add(0.5)  # 95 s of training in all
    assert c.done() and c.points == [[4, 2.0, 3.0], [8, 97.0, 0.5]]
    fields = c.fields(median_step_s=1.0, warmup_steps=1)
    # loss 1.0 is crossed 80% of the way from the first evaluation to the second
    assert (fields["to_loss"]["tokens"], fields["to_loss"]["train_s"]) == (round(7.2), 78.0)
    assert fields["to_loss"]["time_s"] == 78.0 - 2.0 + 1.0 and fields["warmup_s"] == 2.0


def test_the_sweep_measures_time_to_target_and_the_spread_of_two_seeds(
    tmp_path, capsys, monkeypatch
):
    """`python -m speed_ladder run --to-loss` on tiny, steps 00 and 01: its own tag folder
    (<hardware>-to-loss-x1), step 00 run again with the next seed (the A/A control, on by
    default here), to_loss.csv with each rung against its base beside the seeds' spread, the
    two charts, and a rerun that finds everything done."""
    from conftest import sweep_here

    from speed_ladder.report import to_loss

    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    args = ["--to-loss", "--preset", "tiny", "--device", "cpu", "--steps", "00,01",
            "--data", VERDICT, "--warmup-steps", 2, "--results-dir", tmp_path]  # fmt: skip
    code, out, err = sweep_here(capsys, *args)
    assert code == 0, err
    (tag_dir,) = tmp_path.iterdir()
    assert tag_dir.name.endswith("-to-loss-x1")
    recs = records(tag_dir / "runs.jsonl")
    seeds = [(r["step"], r["spec"]["seed"], bool(r["sweep"].get("control"))) for r in recs]
    assert seeds == [("00", 123, False), ("00", 124, True), ("01", 123, False)]
    assert all(r["to_loss"]["reached"] for r in recs)
    rows = {r["step"]: r for r in to_loss.read(tag_dir)}
    assert set(rows) == {"00", "01"} and rows["01"]["after"] == "00"
    times = [r["to_loss"]["time_s"] for r in recs if r["step"] == "00"]
    spread = (max(times) - min(times)) / statistics.median(times)
    assert rows["00"]["noise"] == pytest.approx(spread, abs=1e-4)
    assert rows["00"]["seeds"] == 2 and rows["01"]["verdict"] in ("sooner", "later",
                                                                    "within noise")  # fmt: skip
    assert rows["01"]["tokens_ratio"] == 1.0  # step 01 computes step 00's losses exactly
    assert "time to loss 9 (" in out and "noise: the seeds' spread of step 00" in out
    assert (tag_dir / "loss_curves.png").is_file() and (tag_dir / "time_to_target.png").is_file()
    code, out, _ = sweep_here(capsys, *args)
    assert code == 0 and len(records(tag_dir / "runs.jsonl")) == 3  # up to date: nothing ran


def test_an_inactive_rung_gets_no_verdict_and_each_line_says_what_it_times():
    """The committed time-to-loss tag, rebuilt from its records: a rung whose idea did nothing
    there has no sooner/later; LADDER.md's line names validation loss, the preset and the
    warm-up (compiling) beside the time."""
    from conftest import ROOT

    from speed_ladder.ladder import discover, expected_steps
    from speed_ladder.report import to_loss
    from speed_ladder.store import load_runs

    (tag,) = (ROOT / "results").glob("*-to-loss-x1")
    rows = to_loss.table(expected_steps(discover(ROOT), tag.name), load_runs(tag))
    inactive = [r for r in rows if r["inactive"]]
    assert inactive and all(r["verdict"] == "inactive here" for r in inactive)
    verdicts = {None, "sooner", "later", "within noise", "one seed"}
    assert {r["verdict"] for r in rows if not r["inactive"]} <= verdicts
    lines = [ln for ln in (ROOT / "LADDER.md").read_text().splitlines() if "*Time to" in ln]
    assert len(lines) == len(rows)
    for ln in lines:
        assert ln.startswith("*Time to validation loss ") and f"(preset {rows[0]['preset']}, " in ln
        assert " s apart" in ln and ("sooner" not in ln or "inactive" not in ln)


def test_a_budget_smaller_than_the_warm_up_at_the_rungs_batch_grows_to_leave_timed_steps(
    tmp_path, monkeypatch
):
    """A preset's budget that is all warm-up at the rung's batch (step 20 on a large GPU, on
    gpt2-124m: 8 steps of batch 256 against 10 warm-up steps; here tiny's, made 2 steps of 4)
    grows to the warm-up and MIN_TIMED_STEPS steps, and the record says so."""
    import sys

    import torch

    import speed_ladder
    from speed_ladder.measure import settings

    monkeypatch.setitem(settings.TO_LOSS["tiny"], "budget_tokens", 2 * 4 * 32)
    out = tmp_path / "r.jsonl"
    argv = ["00_orig.py", *map(str, TINY), "--to-loss", "1.0", "--results", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    with torch._dynamo.config.patch(disable=True):
        speed_ladder.main(load_script("00_orig.py").main)
    (rec,) = records(out)
    assert rec["to_loss"]["budget_tokens"] == (2 + MIN_TIMED_STEPS) * 4 * 32
    assert rec["timed_steps"] == MIN_TIMED_STEPS and rec["to_loss"]["reached"] is False
    assert any(n.startswith("token budget raised to") for n in rec["notes"])


def test_a_token_budget_that_leaves_no_timed_step_is_refused_before_training():
    proc = py("00_orig.py", *TINY, "--to-loss", "5", "--token-budget", "256", env=EAGER,
              timeout=120)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--token-budget 256 leaves no timed step: 2 warm-up steps of 128 tokens" in lines[0]
    assert "step     1/" not in proc.stdout  # refused before the first step


def test_a_target_reached_in_the_warm_up_trains_on_to_timed_steps():
    """The run goes on past its target until it has MIN_TIMED_STEPS timed steps; its time to
    target counts the steps to the crossing at the median step time."""
    c = LossCurve(ToLoss(target=5.0, budget_tokens=10_000, eval_tokens=100, val_tokens=8))
    assert c.size(100, warmup_steps=3, budget_given=False) is None  # the budget leaves them
    c.start()
    c.step(100)
    c.add(6.0)
    c.step(100)
    c.add(4.0)  # crossed at 150 tokens, inside the 3 warm-up steps
    assert not c.done()
    for _ in range(3 + MIN_TIMED_STEPS - 2):
        c.step(100)
    assert c.done() and c.tokens == (3 + MIN_TIMED_STEPS) * 100
    c.warmup_s = 10.0  # the compile: far more than the steps before the crossing took
    fields = c.fields(median_step_s=0.5, warmup_steps=3)["to_loss"]
    assert fields["tokens"] == 150 and fields["time_s"] == 1.5 * 0.5


def test_the_sweep_never_cuts_a_to_loss_run_at_its_measuring_length():
    from speed_ladder.sweep.preflight import measuring_values

    speed = measuring_values({"preset": "gpt2-124m"}, "cuda")
    assert speed["max_steps"] == speed["warmup_steps"] + 50
    to_loss = measuring_values({"preset": "gpt2-124m", "to_loss": "preset"}, "cuda")
    assert to_loss.get("max_steps") is None and to_loss["warmup_steps"] == 10
