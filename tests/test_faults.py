"""Faults a user hits: no finished record lost, no corrupt cache trusted, no absurd
number shown, bad output locations found before the work, and one line for every error the
environment causes. Mostly in-process and on the fixture ladders (milliseconds); a few
subprocesses where the process itself is what is tested (a closed pipe, torch.compile)."""

import errno
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, VERDICT, py, records, sweep_here

from speed_ladder import errors, files
from speed_ladder import flags as cli
from speed_ladder.errors import UserError
from speed_ladder.ladder import discover, processes_suffix
from speed_ladder.measure import data, matmul_peak
from speed_ladder.report import summary
from speed_ladder.report.charts import bar_charts, chart_style
from speed_ladder.report.compare import reference
from speed_ladder.report.pages import redraw as report
from speed_ladder.report.pages import tag_page
from speed_ladder.report.rows import format_table
from speed_ladder.store import load_runs, recover
from speed_ladder.sweep import driver as sweep
from speed_ladder.sweep import launch

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TAG = sweep.tag_base("cpu") + processes_suffix(1)  # this machine's 1-process tag


def fixture_sweep(capsys, results, *args):
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    return sweep_here(capsys, *base, "--no-plots", *args)


def one_line(err: str) -> str:
    """stderr holds exactly one line, an `error:` one, and no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ---------------------------------------------------------------- runs.jsonl: nothing lost
def test_a_last_record_without_its_newline_is_kept(tmp_path, capsys):
    results = tmp_path / "results"
    assert fixture_sweep(capsys, results, "--steps", "00,01")[0] == 0
    runs = results / TAG / "runs.jsonl"
    before = runs.read_bytes()
    runs.write_bytes(before.rstrip(b"\n"))  # an editor that saves without a final newline
    code, out, err = fixture_sweep(capsys, results, "--steps", "00,01")
    assert code == 0, err
    assert out.count("up to date") == 2  # step 01's record was not deleted, nor re-run
    assert runs.read_bytes() == before and "cut" not in err
    assert not (results / TAG / "runs.jsonl.cut").exists()


def test_a_torn_last_line_is_cut_kept_aside_and_named(tmp_path, capsys):
    tag_dir = tmp_path / TAG
    tag_dir.mkdir()
    runs = tag_dir / "runs.jsonl"
    good = json.dumps({"step": "00", "status": "ok", "sweep": {"run_id": "a" * 32}})
    runs.write_text(good + "\n" + '{"step": "01", "status": "o')
    recover(tag_dir)
    err = capsys.readouterr().err
    assert runs.read_text() == good + "\n"
    assert (tag_dir / "runs.jsonl.cut").read_text() == '{"step": "01", "status": "o\n'
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("warning: ") and "line 2" in line and "27 bytes" in line
    assert '{"step": "01", "status": "o' in line and "runs.jsonl.cut" in line


def test_unusable_lines_are_skipped_with_one_warning_each_and_never_rewritten(tmp_path, capsys):
    results = tmp_path / "results"
    assert fixture_sweep(capsys, results, "--steps", "00")[0] == 0
    runs = results / TAG / "runs.jsonl"
    bad = [
        b'{"step": "00", "status": "ok", "sweep": "oops"}',  # the wrong shape
        b"\xff\xfe not UTF-8 \x80",
        b"[1, 2, 3]",
        b'{"step": 1, "status": "ok"}',
        b'{"step": "01", "status": "ok", "tokens_per_sec": "fast"}',
        b"null",
        b"{not json",
    ]
    runs.write_bytes(runs.read_bytes() + b"\n".join(bad) + b"\n")
    for _ in range(2):  # each sweep: a warning per line, the file left as it is
        before = runs.read_bytes()
        code, out, err = fixture_sweep(capsys, results, "--steps", "00,01")
        assert code == 0 and "Traceback" not in err, err
        warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
        numbers = [w.split(" line ")[1].split(" ")[0] for w in warnings]
        assert numbers == [str(n) for n in range(2, 9)]
        assert all(str(runs) in w and "skipped" in w for w in warnings)
        assert '"sweep" is a string, not an object' in warnings[0]
        assert "not UTF-8" in warnings[1] and "not JSON" in warnings[6]
        assert runs.read_bytes().startswith(before)  # appended to, never rewritten
        assert all(b in runs.read_bytes() for b in bad)
        import speed_ladder.store

        speed_ladder.store._WARNED.clear()  # a new sweep process warns again
    assert [r["step"] for r in load_runs(results / TAG)] == ["00", "01"]


def test_a_first_line_with_a_byte_order_mark_is_a_record(tmp_path, capsys):
    tag_dir = tmp_path / TAG
    tag_dir.mkdir()
    rec = {"step": "00", "status": "ok", "sweep": {"run_id": "a" * 32}}
    (tag_dir / "runs.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(rec).encode() + b"\r\n")
    assert load_runs(tag_dir) == [rec] and not capsys.readouterr().err  # Windows Notepad


# ---------------------------------------------------------------- the token cache
CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "garbage": lambda p: p.write_bytes(os.urandom(2000)),
    "empty": lambda p: p.write_bytes(b""),
    "all zeros": lambda p: np.save(p, np.zeros_like(np.load(p))),
    "shortened": lambda p: np.save(p, np.load(p)[:-7]),
    "wrong dtype": lambda p: np.save(p, np.load(p).astype(np.int64)),
    "out of vocabulary": lambda p: np.save(p, np.load(p) | np.uint16(0xFFF0)),
    "a folder": lambda p: (p.unlink(), p.mkdir()),
    "sidecar garbage": lambda p: p.with_suffix(".json").write_text("{oops"),
    "sidecar missing": lambda p: p.with_suffix(".json").unlink(),
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupt_token_cache_is_rebuilt_and_said_so(how, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))
    text = VERDICT.read_text(encoding="utf-8-sig")[:3000]
    ids = data.token_ids(text)
    (path,) = tmp_path.glob("tokens-gpt2-*.npy")
    CORRUPTIONS[how](path)
    capsys.readouterr()
    again = data.token_ids(text)
    assert again.dtype == np.uint16 and np.array_equal(again, ids)
    line, *more = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert line.startswith(f"warning: token cache {path} failed its check (")
    assert line.endswith("rebuilding it from the text")
    assert len(more) == (how == "a folder")  # a folder in the way: also "not cached"
    if how != "a folder":  # rebuilt in place, and trusted from then on
        assert np.array_equal(np.load(path), ids)
        assert np.array_equal(data.token_ids(text), ids) and not capsys.readouterr().err


def test_a_token_cache_that_cannot_be_written_costs_only_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))

    def full(path, payload):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(data, "atomic_write_bytes", full)
    ids = data.token_ids("A short text that is tokenized. " * 20)
    assert len(ids) > 0 and not list(tmp_path.iterdir())
    err = capsys.readouterr().err
    assert "warning: token ids not cached" in err and "No space left on device" in err


# ---------------------------------------------------------------- the CPU peak cache
BAD_PEAKS = {
    "1e3 FLOP/s": {"fp32": 1e3, "bf16": 1e3},
    "negative": {"fp32": -5e10, "bf16": -1.0},
    "1e20": {"fp32": 1e20, "bf16": 1e10},
    "NaN": {"fp32": float("nan"), "bf16": 1e10},
    "a string": {"fp32": "fast", "bf16": 1e10},
    "a boolean": {"fp32": True, "bf16": 1e10},
    "missing bf16": {"fp32": 1e10},
    "a list": [1e10, 1e10],
    "a number": 5e10,
}


@pytest.mark.parametrize("how", [*BAD_PEAKS, "not JSON", "not an object", "a folder"])
def test_an_implausible_cpu_peak_is_measured_again(how, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(matmul_peak.PEAK_ENV, raising=False)  # measured here, not fixed
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    key = matmul_peak.rates_key(cpu)
    path = tmp_path / "matmul_peak.json"
    other = {"cpu|another machine|threads=8|torch=x": {"fp32": 1e11, "bf16": 2e11}}
    if how == "not JSON":
        path.write_bytes(b"\x00\xffnot json")
    elif how == "not an object":
        path.write_text("[1, 2]")
    elif how == "a folder":
        path.mkdir()
    else:
        path.write_text(json.dumps({key: BAD_PEAKS[how], **other}))
    measured = []

    def rate(dev, dtype, n=1024):  # the measurement itself is not under test: 50/25 GFLOP/s
        measured.append(dtype)
        return 5e10 if dtype == torch.float32 else 2.5e10

    monkeypatch.setattr(matmul_peak, "_matmul_rate", rate)
    capsys.readouterr()
    peak, source = matmul_peak.peak_flops(cpu)
    assert peak == 5e10 and "measured cpu matmul peak 50 GFLOP/s" in source
    assert measured == [torch.float32, torch.bfloat16]
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "measuring" in err or "not cached" in err  # said, in a line
    if how == "a folder":
        assert "not cached" in err
    else:
        table = json.loads(path.read_text())
        assert table[key] == {"fp32": 5e10, "bf16": 2.5e10}
        if how in BAD_PEAKS:
            assert table[next(iter(other))] == other[next(iter(other))]  # others kept
            assert "implausible" in err
        assert matmul_peak.peak_flops(cpu)[0] == 5e10 and len(measured) == 2  # cached from now on


def test_an_implausible_measurement_is_not_cached_and_gives_no_mfu(tmp_path, monkeypatch):
    monkeypatch.delenv(matmul_peak.PEAK_ENV, raising=False)  # measured here, not fixed
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))
    monkeypatch.setenv(matmul_peak.BF16_ENV, "auto")  # the measured rule, whatever the suite forces
    monkeypatch.setattr(matmul_peak, "_matmul_rate", lambda *a, **k: 1e3)  # a machine frozen solid
    peak, source = matmul_peak.peak_flops(torch.device("cpu"))
    assert peak is None and "implausible" in source and "MFU left empty" in source
    assert not (tmp_path / "matmul_peak.json").exists()
    assert matmul_peak.bf16_is_fast(torch.device("cpu"))[0] is False


def test_a_peak_measured_on_a_busy_machine_is_used_once_and_not_cached(
    tmp_path, monkeypatch, capsys
):
    """Another process sharing the cores lowers the measured rate; caching it would understate
    the peak (and overstate MFU) on every later run of this machine."""
    from speed_ladder.measure import cpu_load

    monkeypatch.delenv(matmul_peak.PEAK_ENV, raising=False)  # measured here, not fixed
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))
    monkeypatch.setattr(matmul_peak, "_matmul_rate", lambda d, dtype, n=1024: 3e10)
    monkeypatch.setattr(cpu_load.Meter, "stop", lambda self: {"other_load": 1.4})
    peak, _ = matmul_peak.peak_flops(torch.device("cpu"))
    assert peak == 3e10  # this run uses it
    assert not (tmp_path / "matmul_peak.json").exists()
    err = capsys.readouterr().err
    assert "other processes used 1.40 CPU cores: not cached" in err and "Traceback" not in err
    monkeypatch.setattr(cpu_load.Meter, "stop", lambda self: {"other_load": 0.01})  # quiet now
    matmul_peak.peak_flops(torch.device("cpu"))
    assert json.loads((tmp_path / "matmul_peak.json").read_text())


def test_a_fixed_peak_is_taken_as_set_and_nothing_is_measured(tmp_path, monkeypatch):
    """$SPEED_LADDER_PEAK_FLOPS (the tests set it): both rates, the MFU peak and step 05's rule
    (bf16 = fp32: off), no matmul timed and nothing cached; a bad value is one error line."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))
    monkeypatch.setenv(matmul_peak.PEAK_ENV, "2e11")
    monkeypatch.setenv(matmul_peak.BF16_ENV, "auto")
    monkeypatch.setattr(matmul_peak, "_matmul_rate", lambda *a, **k: pytest.fail("measured"))
    peak, source = matmul_peak.peak_flops(cpu)
    assert peak == 2e11 and source.startswith("cpu matmul peak set by SPEED_LADDER_PEAK_FLOPS 200")
    ok, why = matmul_peak.bf16_is_fast(cpu)
    assert not ok and why.startswith("matmul set by SPEED_LADDER_PEAK_FLOPS: bf16 200 vs fp32 200")
    assert not (tmp_path / "matmul_peak.json").exists()
    for bad in ("fast", "0", "-1e11", "nan", "inf"):
        monkeypatch.setenv(matmul_peak.PEAK_ENV, bad)
        with pytest.raises(UserError, match=f"SPEED_LADDER_PEAK_FLOPS='{bad}': a number of FLOP/s"):
            matmul_peak.peak_flops(cpu)


def test_a_slow_dtype_is_measured_on_smaller_matrices(monkeypatch):
    """bf16 on a CPU without native bf16 runs at ~1 GFLOP/s: a 1024^3 matmul takes 2 s, and 5
    bursts of 2 of them took half a minute at every first run. Over 0.25 s a call, n halves."""
    sizes = []
    real = torch.randn

    def randn(*shape, **kw):
        sizes.append(shape[0])
        return real(*shape, **kw)

    real_clock = matmul_peak.time.perf_counter
    clock = iter(range(0, 10**6, 1))  # every call of the clock: 1 s later
    monkeypatch.setattr(matmul_peak.torch, "randn", randn)
    monkeypatch.setattr(matmul_peak.time, "perf_counter", lambda: float(next(clock)))
    rate = matmul_peak._matmul_rate(torch.device("cpu"), torch.float32)
    assert sizes[::2] == [1024, 512, 256] and rate > 0  # halved while slow, to 256 at most
    sizes.clear()
    monkeypatch.setattr(matmul_peak.time, "perf_counter", real_clock)
    matmul_peak._matmul_rate(torch.device("cpu"), torch.float32, n=64)
    assert sizes == [64, 64]  # fast: measured at the size asked


def test_measuring_the_matmul_peak_leaves_the_random_stream_alone():
    """A run measures the peak after the seed and the model (run.set_model): drawn from the
    global generator, its operands moved the run's dropout masks, so the first run of each
    sweep trained to other losses than the next (1.4e-2 at step 1 on the cpu preset)."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    matmul_peak._matmul_rate(torch.device("cpu"), torch.float32, n=64)
    assert torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------- MFU outside (0, 100%]
class Args:
    device, preset, max_steps, epochs, warmup_steps, batch_size = "cpu", "tiny", 3, 1, 1, None
    data, results, seed = None, None, 123


def test_an_mfu_above_100_percent_is_flagged_in_the_record(tmp_path, monkeypatch, capsys):
    from speed_ladder.measure.run import Run

    monkeypatch.setattr(matmul_peak, "peak_flops", lambda d: (1e3, "a 1e3 FLOP/s peak"))
    args = type("A", (Args,), {"results": str(tmp_path / "r.jsonl")})
    run = Run(args, "00", str(ROOT / "00_orig.py"))
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 100))
    run.set_model(model, {"n_layers": 1, "n_heads": 1, "context_length": 8, "emb_dim": 16}, 2)
    for _ in range(3):
        run.step_done(torch.tensor(1.0), tokens=16)
    rec = run.finish(1.0, 1.0)
    (written,) = records(tmp_path / "r.jsonl")
    for r in (rec, written):
        assert r["status"] == "ok" and r["mfu"] is None
        assert r["mfu_invalid"]["value"] > 1 and "above 100%" in r["mfu_invalid"]["reason"]
        assert any("MFU left empty" in n for n in r["notes"])
        assert not [n for n in r["notes"] if str(files.cache_dir()) in n]  # no path recorded
    assert "MFU invalid" in capsys.readouterr().out


def _records_for(steps, mfus):
    """ok records of the fixture ladder's steps with these MFU values, as the sweep keeps."""
    config = {"preset": None, "nproc": 1}
    out = []
    for i, (s, mfu) in enumerate(zip(steps, mfus, strict=True)):
        out.append(
            {
                "step": s.num,
                "status": "ok",
                "tokens_per_sec": 1000.0 * (i + 1),
                "peak_mem_reserved_bytes": 2**30,
                "mfu": mfu,
                "val_loss": 9.0,
                "sweep": {"run_id": str(i), "config": config, "script_sha256": "x"},
            }
        )
    configs = {s.num: config for s in steps}
    return out, configs, {s.num: "x" for s in steps}


def test_an_impossible_mfu_is_never_shown_as_a_number(tmp_path):
    steps = discover(FIXTURES / "ladder_ok")
    # 37,039,498.539 = the 3,703,949,853.9% of a 1e3 FLOP/s peak; -0.2; flagged by the step
    recs, configs, shas = _records_for(steps, [0.25, 37039498.539, -0.2, None])
    recs[3]["mfu"] = None  # the step's own record already left it out, and said why
    recs[3]["mfu_invalid"] = {"value": 7.5, "reason": "MFU above 100%: the peak ..."}
    df = summary.summarize(steps, recs, configs, shas, 1)
    rows = {r["step"]: r for r in df.to_dict("records")}
    assert rows["00"]["mfu"] == 0.25 and not isinstance(rows["00"]["mfu_invalid"], str)
    for n in ("01", "02", "03"):
        assert rows[n]["mfu"] != rows[n]["mfu"] and rows[n]["mfu_invalid"]  # NaN, and why
    assert rows["01"]["mfu_invalid"].startswith("MFU above 100%: the peak FLOP/s")
    assert rows["02"]["mfu_invalid"].startswith("MFU is not above 0")
    tag = tmp_path / "results" / TAG
    tag.mkdir(parents=True)
    summary.write_summary(tag, df)
    back = summary.read_summary(tag)
    assert list(back["mfu_invalid"])[1:] == [rows[n]["mfu_invalid"] for n in ("01", "02", "03")]

    table = format_table(back)  # the terminal
    lines = {ln.split()[0]: ln for ln in table.splitlines()[2:6]}
    assert "25.0%" in lines["00"] and all("invalid" in lines[n] for n in ("01", "02", "03"))
    assert "MFU of step 01 not shown: MFU above 100%: the peak FLOP/s" in table

    md = tag_page.tag_markdown(tag, tmp_path)  # the tag's table
    assert "| 25.0% |" in md and md.count("| invalid |") == 3
    assert "MFU not shown: step 01: MFU above 100%: the peak FLOP/s" in md

    plt = chart_style.pyplot()  # the chart: a flag label, no bar
    fig = bar_charts._mfu_figure(plt, back.to_dict("records"), "t")
    ax = fig.axes[0]
    assert [round(p.get_width(), 1) for p in ax.patches] == [25.0]
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith("MFU invalid: ") for t in texts) == 3
    assert "MFU invalid: above 100%: the peak FLOP/s it divides by is too low" in texts
    plt.close(fig)
    for shown in (table, md, " ".join(texts)):  # the absurd number is printed nowhere
        assert "3703949853" not in shown and "37039498" not in shown and "-20.0%" not in shown

    # a summary without `mfu_invalid`: its impossible number is flagged too, not drawn
    old = tmp_path / "old" / TAG
    old.mkdir(parents=True)
    df.drop(columns=["mfu_invalid"]).assign(mfu=[0.25, 37039498.539, -0.2, 7.5]).to_csv(
        old / "summary.csv", index=False
    )
    back = summary.read_summary(old)
    assert format_table(back).count("invalid") == 3
    assert tag_page.tag_markdown(old, tmp_path).count("| invalid |") == 3


# ---------------------------------------------------------------- output locations, at start-up
def _long(tmp_path):
    return tmp_path / ("r" * 300 + ".jsonl")


@pytest.mark.parametrize(
    "where,expected",
    [
        (lambda t: t, "is a folder, not a file"),
        (lambda t: t / "file.txt" / "r.jsonl", "file.txt is a file, not a folder"),
        (_long, "name too long (306 bytes; at most 255"),
        (lambda t: Path("/sys/speed-ladder-results.jsonl"), "cannot write in /sys"),
    ],
    ids=["a folder", "under a file", "name too long", "unwritable"],
)
def test_results_location_is_checked_before_the_model_is_built(where, expected, tmp_path):
    from speed_ladder import writable
    from speed_ladder.measure.run import Run

    (tmp_path / "file.txt").write_text("x")
    path = where(tmp_path)
    if str(path).startswith("/sys") and writable.probe(Path("/sys")) is None:
        pytest.skip("/sys is writable here")
    before = sorted(tmp_path.iterdir())
    args = type("A", (Args,), {"results": str(path)})
    with pytest.raises(UserError, match=f"--results .*{expected}".replace("(", r"\(")):
        Run(args, "00", str(ROOT / "00_orig.py"))
    assert sorted(tmp_path.iterdir()) == before  # nothing created, no empty results file


def test_a_full_disk_is_found_at_start_up(tmp_path, monkeypatch):
    from speed_ladder import writable

    monkeypatch.setattr(shutil, "disk_usage", lambda p: types.SimpleNamespace(free=4096))
    with pytest.raises(UserError, match=r"--results .*: the disk is full \(4 KiB free"):
        writable.check_file(tmp_path / "r.jsonl", "--results")


def test_a_step_with_a_bad_results_path_stops_in_its_first_seconds(tmp_path):
    proc = py("00_orig.py", "--preset", "tiny", "--data", VERDICT, "--results", tmp_path,
              timeout=120)  # fmt: skip
    assert one_line(proc.stderr) == f"error: --results {tmp_path}: is a folder, not a file"
    assert "preset" not in proc.stdout  # stopped before the preset, data and model


@pytest.mark.parametrize("case", ["results-dir is a file", "tag is a file", "runs is a folder",
                                  "summary is a folder", "tag too long"])  # fmt: skip
def test_sweep_output_locations_are_checked_before_any_step(case, tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    extra = []
    if case == "results-dir is a file":
        results.rmdir()
        results.write_text("x")
    elif case == "tag is a file":
        (results / TAG).write_text("x")
    elif case == "runs is a folder":
        (results / TAG / "runs.jsonl").mkdir(parents=True)
    elif case == "summary is a folder":
        (results / TAG / "summary.csv").mkdir(parents=True)
    else:
        extra = ["--tag", "t" * 300]
    code, out, err = fixture_sweep(capsys, results, *extra)
    assert code == 2 and "sweep " not in out  # nothing ran
    line = one_line(err)
    assert line.startswith(("error: results folder", "error: results file")), line


def test_a_cache_folder_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    from speed_ladder.measure.run import Run

    (tmp_path / "cache").write_text("x")
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError, match=r"SPEED_LADDER_CACHE=.*cache: is a file, not a folder"):
        Run(Args, "00", str(ROOT / "00_orig.py"))


@pytest.fixture
def tags_dir(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES / "summary" / "cpu-fixture", results / TAG)
    return results


def test_data_that_is_not_a_readable_text_file_is_named(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"--data .*: is a folder; name a text file"):
        data.read_text(str(tmp_path))
    with pytest.raises(UserError, match=r"--data /dev/null: not a regular file"):
        data.read_text("/dev/null")
    secret = tmp_path / "secret.txt"
    secret.write_text("x")

    def denied(self, *a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(UserError, match=r"secret.txt: cannot read it \(Permission denied\)"):
        data.read_text(str(secret))


def test_tiktoken_cache_dir_that_is_a_file_is_named(tmp_path, monkeypatch):
    (tmp_path / "tk").write_text("x")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tk"))
    with pytest.raises(UserError, match=r"^TIKTOKEN_CACHE_DIR=.*tk: is a file, not a folder$"):
        data.gpt2_tokenizer()


def test_an_empty_results_name_is_refused(tmp_path):
    from speed_ladder.measure.run import Run

    with pytest.raises(UserError, match=r"^--results '': no name given$"):
        Run(type("A", (Args,), {"results": ""}), "00", str(ROOT / "00_orig.py"))


def test_plot_results_checks_its_readme_before_drawing(tags_dir, capsys):
    code = report.main([str(tags_dir / TAG), "--readme", str(tags_dir)])
    assert code == 2 and one_line(capsys.readouterr().err).endswith("is a folder, not a file")
    assert not list((tags_dir / TAG).glob("*.png"))


# ---------------------------------------------------------------- a read-only checkout
@pytest.fixture
def read_only_checkout(tmp_path, monkeypatch):
    """A checkout whose files cannot be written (EROFS for anything in it)."""
    from speed_ladder import writable

    checkout = tmp_path / "checkout"
    (checkout / "data").mkdir(parents=True)
    real_probe = writable.probe

    def probe(folder):
        if Path(folder).resolve().is_relative_to(checkout):
            return OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder))
        return real_probe(folder)

    monkeypatch.setattr(writable, "probe", probe)
    monkeypatch.setattr(files, "ROOT", checkout)
    monkeypatch.setattr(files, "_CACHE_CHOICE", {})
    monkeypatch.delenv("SPEED_LADDER_CACHE")
    monkeypatch.setattr(sys, "platform", "linux")
    return checkout


def test_a_read_only_checkout_caches_in_the_users_cache_folder(
    read_only_checkout, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    capsys.readouterr()
    where = files.cache_dir()
    assert where == tmp_path / "xdg" / "speed-ladder"
    assert files.cache_dir() == where  # chosen once
    (note,) = capsys.readouterr().err.strip().splitlines()
    assert note == (
        f"note: cannot cache in {read_only_checkout / 'data' / 'cache'} (cannot write in "
        f"{read_only_checkout / 'data'} (Read-only file system)); caching in {where} instead "
        "(SPEED_LADDER_CACHE=DIR chooses)"
    )
    ids = data.token_ids("Cached outside the checkout. " * 10)
    assert list(where.glob("tokens-gpt2-*.npy")) and len(ids) > 0
    assert not (read_only_checkout / "data" / "cache").exists()


def test_user_cache_folder_follows_the_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert files.user_cache_dir() == tmp_path / "home" / ".cache" / "speed-ladder"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert files.user_cache_dir() == tmp_path / "home" / "Library" / "Caches" / "speed-ladder"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert files.user_cache_dir() == tmp_path / "local" / "speed-ladder"
    monkeypatch.setattr(sys, "platform", "linux")  # no home at all: the temp folder

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert files.user_cache_dir().parent == Path(tempfile.gettempdir())


# ---------------------------------------------------------------- out of memory on a CPU
def _main_exit(capsys, fn):
    """speed_ladder.main(fn): (exit code, stderr, the failure recorded)."""
    recorded = []
    errors.on_failure.register(lambda status, reason: recorded.append((status, reason)))
    try:
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            errors.main(fn)
        return e.value.code, capsys.readouterr().err, recorded
    finally:
        errors.on_failure.register(None)


def _cpu_alloc():
    torch.empty(2**52, dtype=torch.uint8)  # 4 PiB: the real DefaultCPUAllocator error


def _bad_alloc():
    raise RuntimeError("std::bad_alloc")


def _memory_error():
    raise MemoryError()


@pytest.mark.parametrize("fn", [_cpu_alloc, _bad_alloc, _memory_error])
def test_out_of_memory_on_a_cpu_is_oom_with_exit_3(fn, capsys):
    code, err, recorded = _main_exit(capsys, fn)
    assert code == 3
    line = one_line(err)
    assert line.startswith("error: out of memory: ")
    assert recorded and recorded[0][0] == "oom"
    if fn is _cpu_alloc:
        assert line.startswith("error: out of memory: DefaultCPUAllocator: can't allocate memory")


# ---------------------------------------------------------------- a full disk while writing; Ctrl-C
def test_os_errors_of_the_environment_are_one_line(capsys):
    def full():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/cache/x.npy")

    code, err, recorded = _main_exit(capsys, full)
    assert code == 1
    assert one_line(err) == (
        "error: cannot use /data/cache/x.npy: No space left on device (the disk is full)"
    )
    assert recorded == [("error", err.strip()[len("error: ") :])]


def test_a_record_that_cannot_be_written_is_printed_not_lost(capsys, monkeypatch):
    from speed_ladder.measure.run import Run

    monkeypatch.setattr(matmul_peak, "peak_flops", lambda d: (1e11, "a fixed peak"))
    args = type("A", (Args,), {"results": "/dev/full"})  # every write: ENOSPC
    run = Run(args, "00", str(ROOT / "00_orig.py"))
    run.set_model(torch.nn.Linear(4, 4), {"n_layers": 1, "n_heads": 1, "context_length": 4,
                                          "emb_dim": 4}, 1)  # fmt: skip
    for _ in range(3):
        run.step_done(torch.tensor(1.0), tokens=4)
    with pytest.raises(UserError, match="cannot write the record to /dev/full: No space left"):
        run.finish(1.0, 1.0)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["status"] == "ok" and printed["tokens_per_sec"] > 0


def test_a_full_disk_during_the_sweep_keeps_the_record_for_the_next(tmp_path, capsys, monkeypatch):
    real = launch.append_jsonl

    def append(path, rec):
        if Path(path).name == "runs.jsonl":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, rec)

    monkeypatch.setattr(launch, "append_jsonl", append)
    code, _, err = fixture_sweep(capsys, tmp_path, "--steps", "00,01")
    assert code == 1
    line = one_line(err)
    assert "No space left on device" in line and "the next sweep recovers it" in line
    assert len(list((tmp_path / TAG).glob(".tmp-00-*.jsonl"))) == 1  # the finished run, kept
    monkeypatch.setattr(launch, "append_jsonl", real)
    code, out, err = fixture_sweep(capsys, tmp_path, "--steps", "00,01")
    assert code == 0 and "recovered 1 finished record" in out
    recs = load_runs(tmp_path / TAG)
    assert [r["step"] for r in recs] == ["00", "01"] and recs[0]["sweep"]["recovered"]


def test_plot_results_on_a_full_disk_is_one_line_and_leaves_no_half_chart(
    tags_dir, capsys, monkeypatch
):
    def full(path, payload):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(chart_style, "atomic_write_bytes", full)
    capsys.readouterr()
    assert report.main([str(tags_dir / TAG), "--no-readme"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "tokens_per_sec.png: No space left on device" in line
    assert sorted(p.name for p in (tags_dir / TAG).iterdir()) == ["summary.csv"]


def test_plot_results_interrupted_is_one_line(tags_dir, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(bar_charts, "plot_tag", interrupted)
    monkeypatch.setattr(report, "plot_tag", interrupted)
    capsys.readouterr()
    try:
        code = report.main([str(tags_dir / TAG), "--no-readme"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped plot_results.py as a traceback")
    assert code == 130
    assert one_line(capsys.readouterr().err).startswith("error: interrupted")


# ---------------------------------------------------------------- a closed stdout (`| head`)
def _close_after_first_line(cmd, env=None, lines=1):
    """Run cmd with its stdout read for `lines` lines, then closed (as `| head -1`)."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **(env or {})})  # fmt: skip
    first = proc.stdout.readline() if lines else b""
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), first.decode(), err


def test_a_step_whose_stdout_is_closed_exits_quietly(tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport speed_ladder\n"
        "speed_ladder.main(lambda: [print('line', i, flush=True) for i in range(10**7)])\n"
    )
    code, first, err = _close_after_first_line([sys.executable, script])
    assert first == "line 0\n" and code == 1
    assert one_line(err) == "error: stdout was closed (broken pipe): training stopped"


def test_a_sweep_whose_stdout_is_closed_keeps_its_records(tmp_path):
    cmd = [sys.executable, "-m", "speed_ladder", "run", "--ladder-dir", FIXTURES / "ladder_ok",
           "--results-dir", tmp_path, "--device", "cpu", "--no-plots"]  # fmt: skip
    code, first, err = _close_after_first_line(cmd, env={"SWEEP_FIXTURE_SLEEP": "0.3"})
    assert first.startswith("sweep ") and code == 1
    assert one_line(err).startswith("error: output closed (broken pipe); finished runs are kept")
    recs = load_runs(tmp_path / TAG)
    assert all(r["status"] == "ok" for r in recs)
    assert not (tmp_path / TAG / ".lock").exists()


def test_plot_results_whose_stdout_is_closed_exits_quietly(tags_dir):
    """Closed before its first line, its stdout block-buffered (a shell's pipe): the flush at
    the end meets the closed pipe, inside plot_results' handler, not in Python's exit."""
    cmd = [sys.executable, ROOT / "plot_results.py", tags_dir / TAG, "--no-readme"]
    code, _, err = _close_after_first_line(cmd, env={"PYTHONUNBUFFERED": ""}, lines=0)
    assert code == 1
    assert one_line(err) == "error: output closed (broken pipe)"


def test_a_module_command_whose_stdout_is_closed_exits_quietly():
    """`python -m speed_ladder.measure.memory_model | head -1`: one line, not a traceback."""
    module = "speed_ladder.measure.memory_model"
    code, _, err = _close_after_first_line([sys.executable, "-m", module],
                                           env={"PYTHONUNBUFFERED": ""}, lines=0)  # fmt: skip
    assert code == 1 and one_line(err) == "error: output closed (broken pipe)", err


# ---------------------------------------------------------------- --seed
def test_seed_out_of_range_is_one_line(capsys):
    assert cli.parse_args(None, ["--seed", str(2**63 - 1)]).seed == 2**63 - 1
    for bad in (str(2**64), str(2**63), "-1", "1e3"):
        with pytest.raises(SystemExit) as e:
            cli.parse_args(None, ["--seed", bad])
        assert e.value.code == 2
        assert one_line(capsys.readouterr().err).startswith("error: argument --seed: ")
    code, _, err = sweep_here(capsys, "--seed", str(2**64))
    assert code == 2 and "--seed" in one_line(err)


# ---------------------------------------------------------------- a summary.csv that cannot be read
BAD_SUMMARIES = {
    "empty": b"",
    "no step column": b"title,status\nthe baseline,ok\n",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe",
    "a bad step": b"step,title,status\nabc,x,ok\n",
    "ragged": b'step,title\n00,"unclosed\n',
}


@pytest.mark.parametrize("how", BAD_SUMMARIES)
def test_plot_results_on_a_bad_summary_is_one_line(how, tags_dir, capsys):
    bad = tags_dir / "bad-tag"
    bad.mkdir()
    (bad / "summary.csv").write_bytes(BAD_SUMMARIES[how])
    readme_md = tags_dir / "README.md"
    readme_md.write_text("<!-- results:begin -->\nold\n<!-- results:end -->\n")
    capsys.readouterr()
    code = report.main([str(tags_dir / TAG), str(bad), "--readme", str(readme_md)])
    err = capsys.readouterr().err
    assert code == 2
    line = one_line(err)
    assert (
        line.startswith(f"error: {bad / 'summary.csv'}: ") and "python -m speed_ladder run" in line
    )
    assert "old" in readme_md.read_text() and not list((tags_dir / TAG).glob("*.png"))


def test_a_broken_summary_of_another_tag_only_leaves_it_out_of_the_comparison(tags_dir, capsys):
    (tags_dir / "other").mkdir()
    (tags_dir / "other" / "summary.csv").write_text("")
    written = report.draw_charts([tags_dir / TAG], summary.find_tags(tags_dir))
    assert [p.name for p in written] == list(report.TAG_CHARTS)  # this tag's, no comparison
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warning: ") and "left out of the comparison chart" in line


def test_a_corrupt_reference_csv_only_costs_its_panel(tmp_path, capsys):
    bad = tmp_path / "ref.csv"
    bad.write_text("step,tokens_per_sec\n00,fast\n")
    assert reference.read_reference(bad) is None
    assert "charts drawn without it" in capsys.readouterr().err
    assert reference.read_reference(tmp_path / "missing.csv") is None


# ---------------------------------------------------------------- torch.compile cannot compile
def _wrapped(inner):
    """`inner` as torch.compile raises it: inside InductorError (a BackendCompilerFailed)."""
    from torch._inductor.exc import InductorError

    try:
        raise inner
    except Exception as e:
        try:
            raise InductorError(e, None) from e
        except InductorError as outer:
            return outer


def test_compile_failures_are_named_with_their_fix():
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor import exc

    from speed_ladder.errors import compile_failure_line, out_of_memory_line

    no_cxx = exc.InvalidCxxCompiler()  # no argument: the form torch 2.11 and 2.13 both take
    cases = {
        f"no working C++ compiler ({no_cxx})": no_cxx,
        "the C++ compiler failed on the generated code (x.cpp:1: fatal error: Python.h: No such "
        "file or directory)": exc.CppCompileError(
            ["g++", "x.cpp"],
            "In file included from x.cpp:1:\nx.cpp:1: fatal error: Python.h: "
            "No such file or directory\ncompilation terminated.",
        ),
        "no working Triton installation": exc.TritonMissing(None),
        # cpp_builder's wording for a Windows compiler it cannot run (MinGW; MSVC too on 2.11)
        "no working C++ compiler (Compiler: g++ is not found.)": RuntimeError(
            "Compiler: g++ is not found."
        ),
    }
    if "compiler" in inspect.signature(exc.InvalidCxxCompiler).parameters:  # newer torch (2.13)
        cases["no working C++ compiler (Compiler: cl is not found.)"] = exc.InvalidCxxCompiler("cl")
    for cause, inner in cases.items():
        line = compile_failure_line(_wrapped(inner))
        assert line.startswith(f"torch.compile failed: {cause}"), line
        assert "TORCH_COMPILE_DISABLE=1" in line and "\n" not in line
    assert "triton" in compile_failure_line(_wrapped(exc.TritonMissing(None))).lower()
    other = BackendCompilerFailed(lambda: None, ValueError("boom"), None)
    assert compile_failure_line(other).startswith("torch.compile failed: ValueError: boom")
    assert compile_failure_line(RuntimeError("a plain bug")) is None
    assert out_of_memory_line(RuntimeError("a plain bug")) is None


def test_step_08_without_a_cpp_compiler_is_one_line_and_recorded(tmp_path):
    """The real failure: inductor finds no C++ compiler (CXX names none), in a fresh inductor
    cache so that nothing compiled earlier is reused."""
    res = tmp_path / "r.jsonl"
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    proc = py("steps/08_torch_compile.py", "--preset", "tiny", "--device", "cpu", "--max-steps",
              3, "--warmup-steps", 1, "--data", VERDICT, "--results", res, env=env,
              timeout=300)  # fmt: skip
    assert proc.returncode == 1
    line = one_line(proc.stderr)
    assert line.startswith("error: torch.compile failed: no working C++ compiler (")
    assert "install a C++ compiler" in line and "TORCH_COMPILE_DISABLE=1" in line
    (rec,) = records(res)
    assert rec["status"] == "error" and rec["reason"] == line[len("error: ") :]


# ---------------------------------------------------------------- platforms
def test_the_sweep_on_windows_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    code, _, err = fixture_sweep(capsys, tmp_path)
    assert code == 2 and "needs Linux or macOS" in one_line(err) and "WSL2" in err
    assert not list(tmp_path.iterdir())
