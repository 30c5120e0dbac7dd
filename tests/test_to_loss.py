"""Time to a target loss (speed_ladder/measure/curve.py): a step file's --to-loss run on `tiny`
that reaches its target, one that spends its token budget first, bad values, and the same
validation tokens on every rung whatever its batch."""

import argparse
import statistics

import pytest
from conftest import VERDICT, py, records

from speed_ladder.measure.curve import LossCurve, val_batches
from speed_ladder.measure.run import Run
from speed_ladder.presets import TO_LOSS

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
    """Step 10 doubles the batch: it evaluates half as many batches, the same tokens."""
    monkeypatch.setenv("SPEED_LADDER_BF16", "0")
    args = argparse.Namespace(device="cpu", preset="tiny", epochs=None, max_steps=None,
                              warmup_steps=None, batch_size=None, accum_steps=None,
                              data=str(VERDICT), results=None, seed=123, to_loss=9.0,
                              token_budget=None, profile=None, trace=None)  # fmt: skip
    val = TO_LOSS["tiny"]["val_tokens"]
    batches = {step: Run(args, step, __file__).settings["eval_iters"] for step in ("09", "10")}
    assert batches == {"09": val // (4 * 32), "10": val // (8 * 32)}
    assert val_batches(val, 3, 32) == 3  # a part batch: one more


def test_the_curve_leaves_evaluation_out_of_the_training_clock(monkeypatch):
    now = iter([0.0, 2.0, 2.0, 5.0, 100.0, 101.0]).__next__
    monkeypatch.setattr("speed_ladder.measure.curve.time.perf_counter", now)
    c = LossCurve({"target": 1.0, "budget_tokens": 10, "eval_tokens": 4, "val_tokens": 8})
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
    assert {r["verdict"] for r in rows if not r["inactive"]} <= {
        None,
        "sooner",
        "later",
        "within noise",
        "one seed",
    }
    lines = [ln for ln in (ROOT / "LADDER.md").read_text().splitlines() if "*Time to" in ln]
    assert len(lines) == len(rows)
    for ln in lines:
        assert ln.startswith("*Time to validation loss ") and f"(preset {rows[0]['preset']}, " in ln
        assert " s apart" in ln and ("sooner" not in ln or "inactive" not in ln)
