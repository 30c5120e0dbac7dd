"""tools/peer.py: the peer of the speed check, made from a fetched copy of Raschka's
01_opt_single_gpu.py, which stays outside the repository. Here a stand-in with the same anchors
(the places the tool changes) and a tiny model, so the changed script really runs on a CPU: it
trains in the ladder's window on the ladder's clock (tools/peer.py), never synchronizing
inside it, and writes a record that tools/peer_compare.py sets beside the ladder's runs."""

import contextlib
import hashlib
import io
import json
import runpy
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import BPE, ROOT, count_host_syncs, records, run_script

from speed_ladder.measure import clock as clock_mod
from speed_ladder.measure import device as dev

sys.path.insert(0, str(ROOT / "tools"))
import peer as peer_tool  # noqa: E402
import peer_compare  # noqa: E402

# the anchors as rasbt/LLMs-from-scratch ch05/10 has them (28c65cd), around a model that trains
STAND_IN = """import os
import time

import matplotlib.pyplot as plt
import torch
import tiktoken


def calc_loss_batch(inp, tgt, model, device):
    return torch.nn.functional.mse_loss(model(inp), tgt)


def plot_losses(*a):
    raise SystemExit("the plot is drawn")


def train_model_simple_with_timing(**kw):
    raise SystemExit("the original training ran")


def main(gpt_config, settings):
    torch.manual_seed(123)
    device = torch.device("cpu")
    file_path = "middlemarch.txt"
    with open(file_path, "r", encoding="utf-8") as file:
        text_data = file.read()
    here = os.path.dirname(os.path.abspath(__file__))
    assert os.environ["TIKTOKEN_CACHE_DIR"] == os.path.join(here, "tiktoken")
    model = torch.nn.Linear(4, 4)
    model.to(device).to(torch.bfloat16)
    print("CONFIG", gpt_config["context_length"], gpt_config["emb_dim"], settings["batch_size"],
          gpt_config["drop_rate"])
    print("DTYPE", next(model.parameters()).dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(3, 4), torch.randn(3, 4)) for _ in range(7)]  # 7 batches an epoch
    train_loader = [(x.to(next(model.parameters()).dtype), y.to(next(model.parameters()).dtype))
                    for x, y in data]
    tokenizer = None

    train_losses, val_losses, tokens_seen = train_model_simple_with_timing(
        model=model,
        train_loader=train_loader,
        tokenizer=tokenizer
    )

    return train_losses, val_losses, tokens_seen, model


if __name__ == "__main__":

    GPT_CONFIG_124M = {
        "vocab_size": 50304,     # Vocabulary size
        "context_length": 1024,  # Input tokens per training example
        "emb_dim": 768,          # Embedding dimension
        "n_heads": 12,           # Number of attention heads
        "n_layers": 12,          # Number of layers
        "drop_rate": 0.1,        # Dropout rate
        "qkv_bias": False        # Query-key-value bias
    }

    OTHER_SETTINGS = {
        "learning_rate": 5e-4,
        "num_epochs": 15,
        "batch_size": 32,
        "weight_decay": 0.1
    }

    train_losses, val_losses, tokens_seen, model = main(GPT_CONFIG_124M, OTHER_SETTINGS)

    epochs_tensor = torch.linspace(0, OTHER_SETTINGS["num_epochs"], len(train_losses))
    plot_losses(epochs_tensor, tokens_seen, train_losses, val_losses)
    plt.savefig("loss.pdf")
"""


def make(tmp_path, *args, src=STAND_IN):
    """tools/peer.py's main, in this process: (its exit code, stdout and stderr), the folder."""
    (tmp_path / "src.py").write_text(src)
    out = tmp_path / "data" / "peer"
    argv = [tmp_path / "src.py", "--out", out, "--bpe", BPE, *args]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = peer_tool.main([str(a) for a in argv])
    return SimpleNamespace(returncode=rc, stdout=stdout.getvalue(), stderr=stderr.getvalue()), out


def run_peer(out):
    """The changed peer, run from its folder: no tiktoken cache set."""
    cmd = [sys.executable, out / "01_opt_single_gpu.py"]
    return run_script(cmd, cwd=out, env={"TIKTOKEN_CACHE_DIR": None}, timeout=120)


def test_the_peer_trains_the_sweeps_window_and_writes_its_record(tmp_path):
    """As published (gpt2-124m on CUDA, the default): its config and bf16 cast kept, 10 warm-up
    and 50 timed steps (the sweep's length), over its 7-batch epochs; the record says what ran."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "middlemarch.txt").write_text("text")  # ../ from the peer's folder
    proc, out = make(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (out / "tiktoken").iterdir()) == sorted(
        ["6d1cbeee0f20b3d9449abfede4726ed8212e3aee", "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"]
    )  # tiktoken's cache names of vocab.bpe and encoder.json
    run = run_peer(out)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert (
        "CONFIG 1024 768 32 0.1" in lines and "DTYPE torch.bfloat16" in lines
    )  # the GPU peer as is
    (done,) = [ln for ln in lines if ln.startswith("PEER done: ")]
    assert "median over 50 timed steps after 10 warm-up" in done, done
    (rec,) = records(out / "peer.jsonl")
    assert (rec["peer"], rec["status"], rec["preset"], rec["dtype"]) == (
        "peer", "ok", "gpt2-124m", "bfloat16"
    )  # fmt: skip
    assert (rec["warmup_steps"], rec["timed_steps"], len(rec["losses"])) == (10, 50, 60)
    assert rec["batch_size"] == 32 and rec["context_length"] == 1024 and rec["drop_rate"] == 0.1
    assert rec["tokens_per_step"] == 12  # the stand-in's batch: 3 x 4
    assert rec["tokens_per_sec"] == pytest.approx(12e3 / rec["step_time_ms"], rel=5e-3)
    assert rec["source_sha256"] == hashlib.sha256(STAND_IN.encode()).hexdigest()
    assert rec["script_sha256"] != rec["source_sha256"] and rec["dropout_off"] is False
    text_sha = hashlib.sha256(b"text").hexdigest()[:12]
    assert rec["changes"][0] == f"text: middlemarch.txt sha256:{text_sha}"  # wherever it lies
    assert rec["machine"]["device_name"] == rec["device_name"] and "speed_ladder" in rec["timing"]
    # made again: its record is there, so nothing to run; --force makes it all the same
    (out / "01_opt_single_gpu.py").unlink()
    proc, _ = make(tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("up to date: "), proc.stdout
    assert not (out / "01_opt_single_gpu.py").exists()
    proc, _ = make(tmp_path, "--force")
    assert proc.returncode == 0 and (out / "01_opt_single_gpu.py").is_file(), proc.stderr


@pytest.mark.parametrize(
    "extra, dropout",
    [([], "0.1"), (["--no-dropout"], "0.0")],  # the cpu preset's model; without dropout
    ids=["preset", "no-dropout"],
)
def test_the_cpu_peer_is_the_cpu_presets_model_in_fp32(tmp_path, extra, dropout):
    proc, out = make(tmp_path, "--device", "cpu", "--fp32", *extra)
    assert proc.returncode == 0, proc.stderr
    (out.parent / "middlemarch.txt").write_text("text")
    run = run_peer(out)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"CONFIG 256 384 4 {dropout}" in run.stdout and "DTYPE torch.float32" in run.stdout
    (rec,) = records(out / "peer.jsonl")
    assert rec["peer"] == "peer" + ("-no-dropout" if extra else "") + "-fp32"
    assert (rec["preset"], rec["warmup_steps"], rec["timed_steps"]) == ("cpu", 2, 8)
    assert rec["dropout_off"] is bool(extra)
    want = ["fp32: no bf16 cast of the model"] + (["dropout: drop_rate 0.0"] if extra else [])
    assert rec["changes"][4:] == want  # after the text, tokenizer, training and preset


def test_the_peers_window_never_synchronizes_nor_reads_a_loss(tmp_path, monkeypatch):
    """The changed peer, run in this process on the tiny preset: between the window's start and
    its end no synchronize and no `.item()`; the step ends go to the ladder's StepClock, warm-up
    untimed; the losses are read in batches (a progress line's), the same floats as `.item()`."""
    proc, out = make(tmp_path, "--device", "cpu", "--preset", "tiny", "--max-steps", "12")
    assert proc.returncode == 0, proc.stderr
    (out.parent / "middlemarch.txt").write_text("text")
    calls = {"sync": 0, "item": 0, "tolist": 0}
    phase = {"window": False}
    marks, seen = [], []

    def counting(name, real):
        def wrapper(*a, **k):
            calls[name] += phase["window"]
            return real(*a, **k)

        return wrapper

    real_item, real_end = torch.Tensor.item, clock_mod.StepClock.step_end
    real_start, real_close = peer_tool.Window.start_window, peer_tool.Window.end_window

    def step_end(self, loss, timed):
        was, phase["window"] = phase["window"], False
        seen.append(real_item(loss))  # what .item() gives, not counted
        phase["window"] = was
        marks.append(timed)
        real_end(self, loss, timed)

    def start(self):
        real_start(self)
        phase["window"] = True

    def close(self):
        phase["window"] = False
        real_close(self)

    count_host_syncs(monkeypatch, counting)
    monkeypatch.setattr(clock_mod.StepClock, "step_end", step_end)
    monkeypatch.setattr(peer_tool.Window, "start_window", start)
    monkeypatch.setattr(peer_tool.Window, "end_window", close)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the peer puts tools/ first
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(out / "tiktoken"))  # what it sets
    monkeypatch.chdir(out)
    runpy.run_path(str(out / "01_opt_single_gpu.py"), run_name="__main__")
    assert calls["sync"] == 0 and calls["item"] == 0, calls
    assert calls["tolist"] <= 1, calls  # at most a progress line's batch (one every 2 s)
    assert marks == [False, False] + [True] * 10  # tiny: 2 warm-up steps, then the window
    (rec,) = records(out / "peer.jsonl")
    assert rec["losses"] == seen and rec["timed_steps"] == 10 and rec["preset"] == "tiny"


def test_on_a_cuda_clock_the_window_times_the_gaps_between_step_ends(monkeypatch):
    """The peer's window with the ladder's CUDA clock on a made-up GPU timeline
    (tests/test_clock.py's): warm-up left out, each timed step the gap between two step-end
    events, the device synchronized only where the window opens and closes."""
    from test_clock import Timeline

    line, syncs = Timeline(), []

    def synchronize(device):
        syncs.append(line.now)
        line.passed = line.now

    monkeypatch.setattr(dev, "synchronize", synchronize)
    w = peer_tool.Window(torch.device("cpu"), warmup_steps=2, max_steps=5)
    w.clock = clock_mod.StepClock(torch.device("cuda"), event=line.event)
    w.begin()
    for n, ms in enumerate([100, 50, 11, 12, 13], 1):
        line.now += ms
        w.step_done(torch.tensor(float(n)), tokens=8)
    assert w.finished and w.state == "closed"
    assert w.clock.times == pytest.approx([0.011, 0.012, 0.013])
    assert w.clock.losses == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert syncs == [150, 186]  # the window's start (after warm-up) and its end, nowhere else


def _ladder_run(step, tps, peer, **over):
    """A ladder record of `step` as the sweep writes it, comparable with `peer`'s."""
    rec = {"step": step, "status": "ok", "tokens_per_sec": tps, "preset": peer["preset"],
           "batch_size": peer["batch_size"], "context_length": peer["context_length"],
           "timed_steps": peer["timed_steps"], "spec": {"warmup_steps": peer["warmup_steps"]},
           "machine": peer["machine"], "peak_mem_reserved_bytes": 2**30,
           "sweep": {"round": 1}}  # fmt: skip
    return rec | over


def test_the_comparison_sets_each_peer_beside_the_rungs_of_its_model(tmp_path):
    """peer.jsonl beside runs.jsonl: the published peer against the first rung with bf16 weights
    and dropout, the one without dropout against the first without and the last; only ok,
    comparable runs that are not the A/A control count; the ratio is ours / the peer's."""
    same = peer_compare.rungs_for(False)
    off = peer_compare.rungs_for(True)
    assert len(same) == 1 and same[0].memory.bf16_weights and same[0].memory.dropout == "preset"
    last = [s for s in peer_compare.rungs() if s.memory.bf16_weights][-1]  # the top speed rung
    assert off[0].memory.dropout == "off" and off[-1] == last
    fp = {"device_name": "GPU", "host_id": "h"}
    base = {"status": "ok", "preset": "gpt2-124m", "batch_size": 32, "context_length": 1024,
            "warmup_steps": 10, "timed_steps": 50, "machine": fp, "device_name": "GPU",
            "source": "01_opt_single_gpu.py", "dtype": "bfloat16",
            "step_time_ms": 80.0}  # fmt: skip
    # the published peer in three rounds (median 400), one of them of another source: left out
    peers = [base | {"peer": "peer", "tokens_per_sec": 999.0, "drop_rate": 0.1,
                     "source_sha256": "old"},
             base | {"peer": "peer", "tokens_per_sec": 380.0, "drop_rate": 0.1},
             base | {"peer": "peer-no-dropout", "tokens_per_sec": 500.0, "drop_rate": 0.0,
                     "dropout_off": True},
             base | {"peer": "peer", "tokens_per_sec": 400.0, "drop_rate": 0.1},
             base | {"peer": "peer", "tokens_per_sec": 430.0, "drop_rate": 0.1}]  # fmt: skip
    a, b, top = same[0].num, off[0].num, off[-1].num
    runs = [
        _ladder_run(a, 440.0, base),
        _ladder_run(a, 460.0, base, sweep={"round": 2}),
        _ladder_run(a, 900.0, base, sweep={"round": 1, "control": True}),  # the A/A control
        _ladder_run(a, 900.0, base, batch_size=16),  # another batch: not comparable
        _ladder_run(a, 900.0, base, machine={"device_name": "GPU", "host_id": "other"}),
        _ladder_run(b, 550.0, base),
        _ladder_run(top, 600.0, base, status="failed"),
    ]
    for name, recs in (("peer.jsonl", peers), ("runs.jsonl", runs)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = subprocess.run([sys.executable, ROOT / "tools" / "peer_compare.py", tmp_path],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"step {a} " in text and "450 tok/s over 2 run(s)" in text
    assert (
        "peer (01_opt_single_gpu.py, bfloat16 weights, dropout 0.1): 400 tok/s [380-430] "
        "over 3 run(s)" in text
    ), text
    assert "1.125x [1.100-1.150] the peer's median tok/s" in text, text
    assert "550 tok/s over 1 run(s)" in text and "1.100x the peer's" in text
    assert f"step {top} " in text and "no ok run here with the peer's preset" in text
    assert text.splitlines()[-1] == (
        f"in short: step {a} 1.125x peer; step {b} 1.100x peer-no-dropout; step {top} not run"
    )
    # a tag's page shows the same lines under its own heading, and none without a peer.jsonl
    from speed_ladder.report.compare import peers

    section = peers.page_section(tmp_path)
    assert section[0] == "## Beside the peer" and "(peer.jsonl)" in section[2]
    assert section[5:-2] == text.splitlines()[:-1]
    assert peers.page_section(tmp_path / "x") == []
    proc = subprocess.run([sys.executable, ROOT / "tools" / "peer_compare.py", tmp_path / "x"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (
        proc.returncode == 2 and proc.stderr.startswith("error: ") and "no ok peer" in proc.stderr
    )


def test_the_rung_that_fits_its_batch_stands_beside_the_peer_at_its_own_batch(tmp_path):
    """Step 20 trains the batch that fits the GPU, not the peer's: it stands beside the peer at
    its own batch, both batches named (on this GPU, which trains faster); a rung at a fixed
    batch still needs the peer's."""
    fp = {"device_name": "GPU", "host_id": "h"}
    base = {"status": "ok", "preset": "gpt2-124m", "batch_size": 32, "context_length": 1024,
            "warmup_steps": 10, "timed_steps": 50, "machine": fp, "device_name": "GPU",
            "source": "01_opt_single_gpu.py", "dtype": "bfloat16", "step_time_ms": 80.0,
            "peer": "peer-no-dropout", "tokens_per_sec": 400.0, "drop_rate": 0.0,
            "dropout_off": True}  # fmt: skip
    off = peer_compare.rungs_for(True)
    first, top = off[0], off[-1]
    assert top.memory.batch == "fits" and first.memory.batch != "fits"
    runs = [_ladder_run(first.num, 440.0, base, batch_size=256),  # another batch: left out
            _ladder_run(top.num, 560.0, base, batch_size=256)]  # fmt: skip
    (tmp_path / "peer.jsonl").write_text(json.dumps(base) + "\n")
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    lines, short = peer_compare.compare(tmp_path)
    text = "\n".join(lines)
    assert f"step {first.num} " in text and "no ok run here with the peer's preset" in text
    assert "at batch 256 (the peer's 32): 560 tok/s over 1 run(s)" in text, text
    assert "1.400x the peer's median tok/s" in text and f"step {top.num} 1.400x" in short


def test_another_peer_or_bad_input_is_one_error_line(tmp_path):
    moved = STAND_IN.replace('    file_path = "middlemarch.txt"\n', '    file_path = "x.txt"\n')
    renamed = STAND_IN.replace("def main(gpt_config, settings):", "def main(cfg, settings):")
    for args, src, says in (
        ([], moved, "not the peer this tool knows: 'file_path = \"middlemarch.txt\"' found 0x"),
        ([], renamed, "not the peer this tool knows: 'def main(gpt_config, settings):' found 0x"),
        (["--max-steps", "10"], STAND_IN, "--max-steps 10 leaves no timed step after 10 warm-up"),
        (["--check"], moved, "not the peer this tool knows"),
    ):
        proc, out = make(tmp_path, *args, src=src)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert proc.stderr.startswith("error: ") and says in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not (out / "01_opt_single_gpu.py").exists()
    proc, out = make(tmp_path, "--check")
    assert proc.returncode == 0 and proc.stdout.startswith("ok: ") and not out.exists()
