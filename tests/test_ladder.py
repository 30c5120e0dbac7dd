"""Every ladder script trains on `tiny`, writes a valid record, and keeps the previous step's loss.

All steps run once per session (two at a time, for 2 cores) with the same seed and steps; the
loss-parity rules live in speed_ladder/data/ladder.json (parity.py applies them). A cold
torch.compile costs about a minute per script on 2 cores, so the fast suite compiles step 08
only and runs 09-14 with TORCH_COMPILE_DISABLE=1 (their own change, eager); the `slow` tests run
08-14 compiled. The summary files are byte-identical to steps 10/11, so they are checked by
identity and --help.

Both numeric regimes on any CPU: step 05's bf16 rule decides by the CPU (native bf16 or not),
so a machine without it would never see what one with it computes. The ladder runs with
SPEED_LADDER_BF16=0 (fp32 throughout, on every CPU) and steps 05-07 again with
SPEED_LADDER_BF16=1 (bf16 autocast from 05 on: native or emulated, `tiny` is small), each step
compared with the previous under its regime's tolerance. The fast suite compiles step 08 once,
in fp32; the slow tests run 08-14 compiled in bf16 (08's compiled bf16 graphs, their parity,
their one compile and their record's regime included): emulated bf16 makes a tiny run ~25 s of
CPU here, and a compiled one adds a second cold compile.
"""

import ast
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, VERDICT, load_script, records, run_script

sys.path.insert(0, str(ROOT / "tools"))
import ladder  # noqa: E402

from speed_ladder import parity  # noqa: E402
from speed_ladder.ladder import lineage, rung, rungs  # noqa: E402
from speed_ladder.measure.inactive import LIGER_RAN  # noqa: E402
from speed_ladder.measure.rung_checks import CHECKS  # noqa: E402
from speed_ladder.records import FIELDS  # noqa: E402

STEPS = [p.relative_to(ROOT).as_posix() for p in ladder.ladder()]
SUMMARIES = list(ladder.SUMMARIES)
SCRIPTS = STEPS + SUMMARIES
COMPILED = [r.rel for r in rungs() if r.compiled]
BF16 = [r.rel for r in rungs() if r.memory.bf16_autocast]
# the rest, compiled: slow (compiled_bf16_runs)
BF16_FAST = [s for s in BF16 if not rung(ladder.step_of(ROOT / s)).compiled]
MAX_STEPS, WARMUP = 4, 1
# The ladder trains on the first 330 tokens of the test text: 9 training windows of tiny's 32
# tokens, so an epoch is 2 steps at batch 4 and 1 at step 10's 8, and every run crosses an epoch
# boundary within its 4 steps. A pair of neighbours that must see the same batches shows it in
# every epoch, not only the first (steps 00-10 drew a new order from one generator each epoch,
# 11-14 DistributedSampler's randperm(seed + epoch): the same first epoch only).
EPOCH_TOKENS = 330


def epoch_text(folder: Path) -> Path:
    """The test text cut to EPOCH_TOKENS tokens (written once per folder)."""
    from speed_ladder.measure.data import gpt2_tokenizer

    path = folder / "epochs.txt"
    if not path.exists():
        tok = gpt2_tokenizer()
        path.write_text(tok.decode(tok.encode(VERDICT.read_text())[:EPOCH_TOKENS]))
    return path


REGIME = {"fp32": {"SPEED_LADDER_BF16": "0"}, "bf16": {"SPEED_LADDER_BF16": "1"}}


def run_ladder(out, scripts, eager=(), env=None):
    """{script: (CompletedProcess, [records])} for one tiny run of each script."""
    text = epoch_text(out)

    def one(script):
        res = out / (Path(script).stem + ".jsonl")
        proc = run_script(
            [sys.executable, str(ROOT / script), "--preset", "tiny", "--device", "cpu",
             "--max-steps", MAX_STEPS, "--warmup-steps", WARMUP, "--data", text, "--epochs", 9,
             "--results", res],
            timeout=900,
            env={**(env or {}), **({"TORCH_COMPILE_DISABLE": "1"} if script in eager else {})},
        )  # fmt: skip
        return script, (proc, records(res) if res.exists() else [])

    # the compiled steps are the slow ones: first, so that both threads stay busy to the end
    order = sorted(scripts, key=lambda s: s not in COMPILED or s in eager)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, order))


def runs_over(base, tmp_path_factory, name, scripts, regime, eager=()):
    """`base`'s runs, with `scripts` run again in `regime` (fp32 or bf16) over them."""
    runs = dict(base)
    out = tmp_path_factory.mktemp(name)
    runs.update(run_ladder(out, scripts, eager=eager, env=REGIME[regime]))
    return runs


@pytest.fixture(scope="session")
def ladder_runs(tmp_path_factory):
    """Every step in fp32 (bf16 forced off: the same on every CPU)."""
    return runs_over({}, tmp_path_factory, "ladder", STEPS, "fp32", eager=COMPILED[1:])


@pytest.fixture(scope="session")
def bf16_runs(tmp_path_factory, ladder_runs):
    """Steps 05-07 with bf16 autocast forced on; the others are the fp32 runs."""
    return runs_over(ladder_runs, tmp_path_factory, "bf16", BF16_FAST, "bf16")


@pytest.fixture(scope="session")
def compiled_runs(tmp_path_factory, ladder_runs):
    """Steps 08-14 compiled in fp32 (slow); earlier steps reuse the fast runs."""
    return runs_over(ladder_runs, tmp_path_factory, "compiled", COMPILED, "fp32")


@pytest.fixture(scope="session")
def compiled_bf16_runs(tmp_path_factory, bf16_runs):
    """Steps 08-14 compiled with bf16 autocast (slow; 05-07 are the fast bf16 runs)."""
    return runs_over(bf16_runs, tmp_path_factory, "compiled-bf16", COMPILED, "bf16")


def base_script(script):
    """The step file `script`'s rung builds on (its `after`: 15 on 12)."""
    return rung(rung(ladder.step_of(ROOT / script)).after).rel


def check_parity(runs, script):
    prev, cur = runs[base_script(script)][1][0], runs[script][1][0]
    ok, how = parity.check(ladder.step_of(ROOT / script), prev, cur)
    assert ok, f"{script} ({prev['regime']} -> {cur['regime']}): {how}"


@pytest.mark.parametrize("script", STEPS)
def test_script_writes_ok_record(ladder_runs, script):
    check_record(*ladder_runs[script], script)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first bears its fixture's cold compiles
@pytest.mark.parametrize("script", COMPILED[1:])
def test_compiled_script_writes_ok_record(compiled_runs, script):
    check_record(*compiled_runs[script], script)


def check_record(proc, recs, script):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(recs) == 1
    rec = recs[0]
    assert set(FIELDS) <= set(rec), set(FIELDS) - set(rec)
    assert rec["status"] == "ok"
    assert rec["script"] == script
    assert rec["preset"] == "tiny" and rec["device"] == "cpu" and rec["world_size"] == 1
    assert rec["tokens_per_sec"] > 0 and rec["step_time_ms"] > 0
    assert rec["peak_mem_reserved_bytes"] > 0
    assert 0 < rec["mfu"] < 1
    assert len(rec["losses"]) == MAX_STEPS and rec["timed_steps"] == MAX_STEPS - WARMUP
    assert rec["tokens_per_step"] == rec["batch_size"] * rec["context_length"]
    assert len(rec["script_sha256"]) == 64
    assert rec["val_loss"] > 0 and rec["train_loss"] > 0
    # tiny has no dropout: a CPU's flash kernel takes SDPA's training call, compiled or not
    sdpa = rung(rec["step"]).memory.attention != "materialized"
    assert rec["attention_kernel"] == ("flash" if sdpa else "materialized"), rec["notes"]


@pytest.mark.parametrize("script", STEPS[1:])
def test_loss_matches_previous_step(ladder_runs, script):
    check_parity(ladder_runs, script)


@pytest.mark.parametrize("script", BF16_FAST)
def test_bf16_loss_matches_previous_step(bf16_runs, script):
    check_parity(bf16_runs, script)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first bears its fixture's cold compiles
@pytest.mark.parametrize("script", COMPILED[1:])
def test_compiled_loss_matches_previous_step(compiled_runs, script):
    check_parity(compiled_runs, script)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first bears its fixture's cold compiles
@pytest.mark.parametrize("script", COMPILED)
def test_compiled_bf16_loss_matches_previous_step(compiled_bf16_runs, script):
    check_parity(compiled_bf16_runs, script)


def check_one_compile(rec):
    """Each compiled frame compiled once: the model's, and the loss's (step 08's compiled
    cross_entropy; from step 12 on, where Liger cannot run, its fallback compiles step 11's
    loss: where Liger ran, the fused loss runs outside compile); evaluation runs eager (step
    08), so it adds none."""
    c = rec["compiles"]
    frames = 1 if any(n.startswith(LIGER_RAN) for n in rec["notes"]) else 2
    assert c is not None and (c["frames"], c["graphs"]) == (frames, frames), (rec["script"], c)
    assert c["seconds"] is None or c["seconds"] > 0


def test_a_compiled_run_compiles_once(ladder_runs):
    """Step 08 compiles the training graphs once (fp32 here; bf16, where autocast off for
    evaluation recompiled them before evaluation ran eager, in the slow
    test_compiled_steps_compile_once); an eager run's record says null."""
    check_one_compile(ladder_runs[COMPILED[0]][1][0])
    assert ladder_runs[STEPS[7]][1][0]["compiles"] is None  # step 07: never compiled
    assert ladder_runs[COMPILED[-1]][1][0]["compiles"] is None  # TORCH_COMPILE_DISABLE=1


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first bears its fixture's cold compiles
@pytest.mark.parametrize("script", COMPILED)
def test_compiled_steps_compile_once(compiled_runs, compiled_bf16_runs, script):
    check_one_compile(compiled_runs[script][1][0])
    check_one_compile(compiled_bf16_runs[script][1][0])
    assert compiled_bf16_runs[script][1][0]["regime"] == "bf16-compiled"


def test_records_say_their_regime(ladder_runs, bf16_runs):
    """Each record names the numbers it computed with, and so the tolerance it is held to."""

    def regimes(runs):
        return {ladder.step_of(ROOT / s): runs[s][1][0]["regime"] for s in STEPS}

    fp32, bf16 = regimes(ladder_runs), regimes(bf16_runs)
    assert fp32["00"] == "fp32" and fp32["07"] == "fp32" and fp32["08"] == "fp32-compiled"
    assert fp32["14"] == "fp32"  # TORCH_COMPILE_DISABLE=1: eager, and the record says so
    assert bf16["04"] == "fp32" and bf16["05"] == bf16["07"] == "bf16"
    # bf16's 08 says "bf16-compiled" in the slow test_compiled_steps_compile_once
    note = [n for n in bf16_runs[BF16[0]][1][0]["notes"] if "step 05" in n]
    assert not note and bf16_runs[BF16[0]][1][0]["step_active"]  # forced on: active
    assert any("forced off by SPEED_LADDER_BF16" in n for n in ladder_runs[BF16[0]][1][0]["notes"])


def test_a_bf16_step_off_by_more_than_its_regime_allows_fails(bf16_runs):
    """The tolerance follows the regime: a bf16 difference is fine in bf16, not in fp32."""
    prev, cur = bf16_runs[STEPS[5]][1][0], bf16_runs[STEPS[6]][1][0]  # 05 -> 06, both bf16
    worse = dict(cur, losses=[x + 3e-3 for x in prev["losses"]])
    assert not parity.check("06", prev, worse)[0]
    small = dict(cur, losses=[x + 5e-4 for x in prev["losses"]])
    assert parity.check("06", prev, small)[0]
    assert not parity.check("06", dict(prev, regime="fp32"), dict(small, regime="fp32"))[0]


def test_every_run_of_the_ladder_crosses_an_epoch_boundary(tmp_path):
    """What the parity tests above compare spans epochs: an epoch of the test text is shorter
    than MAX_STEPS at both of tiny's batches (and --epochs lets the runs go on)."""
    from speed_ladder.measure.data import TRAIN_RATIO, gpt2_tokenizer, num_windows
    from speed_ladder.presets import PRESETS

    n = len(gpt2_tokenizer().encode(epoch_text(tmp_path).read_text()))
    windows = num_windows(int(TRAIN_RATIO * n), PRESETS["tiny"]["context_length"])
    for batch in (PRESETS["tiny"]["batch_size"], PRESETS["tiny"]["large_batch_size"]):
        assert windows // batch < MAX_STEPS, (n, windows, batch)


def test_every_step_records_where_its_time_goes(ladder_runs):
    """Each record splits its median step into data wait, forward, backward and optimizer
    (measure/phases.py: hooks of the harness, no line of a step file; step 08 compiled), and the
    four add up to its step time. Where forward and backward interleave within a step (step
    18's micro-batches, on tiny where the batch splits), the record says so and has none."""
    for script in STEPS:
        rec = ladder_runs[script][1][0]
        ms = rec["phase_ms"]
        if ms is None and rung(ladder.step_of(ROOT / script)).memory.accumulation != "none":
            assert any("forward and backward interleave" in n for n in rec["notes"]), script
            continue
        assert list(ms) == ["data", "forward", "backward", "optimizer"], script
        assert ms["data"] >= 0 and min(ms["forward"], ms["backward"], ms["optimizer"]) > 0, ms
        assert sum(ms.values()) == pytest.approx(rec["step_time_ms"], rel=0.05), (script, ms)
        assert 0 <= rec["data_share"] < 1


def test_steps_on_cpu_say_why_they_do_nothing(ladder_runs):
    notes = {ladder.step_of(ROOT / s): ladder_runs[s][1][0]["notes"] for s in STEPS}
    assert any("step 02: TF32" in n and "no effect on cpu" in n for n in notes["02"])
    assert any("step 04: pinned memory" in n and "no effect on cpu" in n for n in notes["04"])
    assert any("step 12:" in n and "ran" in n for n in notes["12"])
    # step_active: false exactly where the step's own optimization did nothing on this CPU
    # (tiny has dropout 0, so SDPA's flash kernel runs; 09-14 run eager, but 08 compiles;
    # bf16 is forced off in these runs)
    expected = {num for num, check in CHECKS.items() if check.on_test_cpu}
    assert expected == {"02", "04", "05", "11", "12", "14", "15", "16", "17", "20", "21"}
    recs = {ladder.step_of(ROOT / s): ladder_runs[s][1][0] for s in STEPS}
    inactive = {k for k, r in recs.items() if r["step_active"] is False}
    assert inactive == expected, {k: recs[k]["inactive_reason"] for k in inactive}
    assert all((r["inactive_reason"] is None) == r["step_active"] for r in recs.values())
    # what ran: step 17 finds flash, not cuDNN; each record names the rungs that did nothing
    assert recs["17"]["inactive_reason"] == (
        "flash attention ran, not cuDNN's (cuDNN attention is CUDA's: on cpu step 07's attention "
        "kernel stays)"
    )
    for k, r in recs.items():
        chain = [x.num for x in lineage(k)]
        assert set(r["inactive_rungs"]) == {n for n in chain if n in inactive} | (
            {"08"} if "08" in chain and k != "08" else set()  # 09-17 run eager here
        ), (k, r["inactive_rungs"])


def test_consecutive_diffs_match_goldens():
    for a, b in ladder.pairs():
        golden = (ladder.GOLDEN / f"{ladder.step_of(b)}.diff").read_text()
        assert ladder.unified(a, b) == golden, f"{a.name} -> {b.name} differs from its golden diff"


def test_summary_files_are_identical_to_their_steps():
    by_step = {ladder.step_of(p): p for p in ladder.ladder()}
    for name, step in ladder.SUMMARIES.items():
        assert (ROOT / name).read_bytes() == by_step[step].read_bytes(), name


def test_step_lines_are_tagged():
    """Every line a step adds outside its docstring carries its `step NN` tag nearby."""
    for a, b in ladder.pairs():
        step = ladder.step_of(b)
        diff = ladder.unified(a, b).splitlines()
        body = [ln for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
        code = [ln for ln in body if '"""' not in ln]
        assert any(f"step {step}" in ln for ln in code), f"step {step} adds no tagged line"


def _code(line: str) -> str:
    """A diff line's code: its comment and string-free words are what a learner types."""
    code = line[1:].split("  #")[0]
    return "" if code.lstrip().startswith("#") else code


def test_each_rungs_diff_adds_a_line_that_uses_the_api_it_teaches():
    """A learner who diffs a rung against its base sees the technique in the library's own API
    (the registry's `api`, e.g. LigerFusedLinearCrossEntropyLoss, sdpa_kernel, GradScaler): an
    added line of code, not a comment or the docstring, uses each name."""
    from speed_ladder.ladder import rungs

    api = {r.num: r.api for r in rungs()}
    for a, b in ladder.pairs():
        step = ladder.step_of(b)
        assert api[step], f"step {step} names no api in speed_ladder/data/ladder.json"
        diff = ladder.unified(a, b).split('"""\n', 1)[-1].splitlines()  # after the docstring
        added = [_code(ln) for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
        for name in api[step]:
            assert any(name in ln for ln in added), f"step {step}'s diff uses no {name}"


def test_the_golden_diffs_stay_short():
    """Every rung's diff is its idea and little else: all of them together under 36 changed
    lines a rung on average."""
    changed = 0
    for a, b in ladder.pairs():
        lines = ladder.unified(a, b).splitlines()
        changed += sum(ln[:1] in "+-" and ln[:3] not in ("+++", "---") for ln in lines)
    assert changed < 36 * len(ladder.pairs()), changed


@pytest.mark.parametrize("script", ["00_orig.py", "steps/07_flash_attention_sdpa.py", SUMMARIES[1]])
def test_help(script, capsys, monkeypatch):
    """--help works for a script at the root and in steps/, and shows the path it was started by
    (in this process: every script's run as its own process is the ladder's above)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(ROOT / script), "--help"])
    with pytest.raises(SystemExit) as exit_:
        load_script(script).main()
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ["--device", "--preset", "--max-steps", "--epochs", "--warmup-steps", "--data",
                 "--results", "--seed"]:  # fmt: skip
        assert flag in out
    assert f"python {script}" in out or "torchrun" in out  # the run commands


def usage(script):
    """A docstring's run commands: from its `Run (` line to its end."""
    doc = ast.get_docstring(ast.parse((ROOT / script).read_text()))
    return doc[doc.index("\nRun (") :]


@pytest.mark.parametrize("script", SCRIPTS)
def test_docstring_gives_the_shared_commands(script):
    """--help prints the module docstring: each names its step, the rung it builds on, and how
    to run it, in the same words in every file (`<this file>`, which --help fills in), so they
    never show in a diff (tests/test_step_docs.py checks the rest of the docstring)."""
    doc = ast.get_docstring(ast.parse((ROOT / script).read_text()))
    step = ladder.step_of(ROOT / script) if script in STEPS else dict(ladder.SUMMARIES)[script]
    after = rung(step).after
    assert doc.startswith(f"Step {step} (after step {after}): " if after else f"Step {step}: ")
    assert usage(script) == usage("00_orig.py")
    runs = [ln.strip() for ln in usage(script).splitlines()]
    assert any(ln.startswith("python <this file> --device cpu") for ln in runs)
    assert any(ln.startswith("torchrun") for ln in runs)
