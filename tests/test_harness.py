"""The shared harness: data, tokenizer cache, MFU, peaks, the bf16 gate and records."""

import http.server
import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch
from conftest import ROOT, VERDICT, py, records, rung_reasons

from speed_ladder import records as record
from speed_ladder.errors import UserError
from speed_ladder.measure import data, device, matmul_peak
from speed_ladder.presets import GPT2_VOCAB, PRESETS, flop_split


def test_middlemarch_download_is_atomic_and_cached(tmp_path, monkeypatch):
    body = "Miss Brooke had that kind of beauty. " * 500
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "pg145.txt").write_text(body)

    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "srv"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = tmp_path / "data" / "middlemarch.txt"
        monkeypatch.setenv("SPEED_LADDER_SHARED", str(tmp_path / "no-mirror"))
        monkeypatch.setattr(data, "DEFAULT_TEXT", target)
        monkeypatch.setattr(
            data, "GUTENBERG_URL", f"http://127.0.0.1:{server.server_port}/pg145.txt"
        )
        text, path = data.read_text(None)
        assert text == body and path == target and target.read_text() == body
        assert [p.name for p in target.parent.iterdir()] == ["middlemarch.txt"]  # no temp left
        server.shutdown()
        assert data.read_text(None)[0] == body  # second time: from disk, no server needed
    finally:
        server.server_close()


def test_offline_without_text_names_data_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEED_LADDER_SHARED", str(tmp_path / "no-mirror"))
    monkeypatch.setattr(data, "DEFAULT_TEXT", tmp_path / "middlemarch.txt")
    monkeypatch.setattr(data, "GUTENBERG_URL", "http://127.0.0.1:9/pg145.txt")  # nothing listens
    with pytest.raises(UserError, match="--data"):
        data.read_text(None)
    assert not (tmp_path / "middlemarch.txt").exists()


def test_offline_mirror_supplies_text_and_tokenizer(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    (shared / "data").mkdir(parents=True)
    (shared / "data" / "middlemarch.txt").write_text("Dorothea. " * 100)
    monkeypatch.setenv("SPEED_LADDER_SHARED", str(shared))
    monkeypatch.setattr(data, "DEFAULT_TEXT", tmp_path / "data" / "middlemarch.txt")
    monkeypatch.setattr(data, "GUTENBERG_URL", "http://127.0.0.1:9/pg145.txt")
    assert data.read_text(None)[0] == "Dorothea. " * 100
    assert (tmp_path / "data" / "middlemarch.txt").is_file()  # copied once, like a download


def test_offline_tokenizer_error_names_cache_dir(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("A text this machine has never tokenized. " * 300)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"TIKTOKEN_CACHE_DIR": str(empty), "SPEED_LADDER_CACHE": str(tmp_path / "c"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}  # fmt: skip
    proc = py("00_orig.py", "--preset", "tiny", "--data", text, env=env, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TIKTOKEN_CACHE_DIR" in lines[0] and "Traceback" not in proc.stderr


def test_tokens_are_cached_by_text_hash_and_split_90_10():
    text = VERDICT.read_text(encoding="utf-8-sig")
    ids = data.token_ids(text)
    cached = list(data.cache_dir().glob("tokens-gpt2-*.npy"))
    assert cached and (data.token_ids(text) == ids).all()
    train, val = data.load_split(str(VERDICT), context_length=32, batch_size=2, world_size=1)
    assert len(train) == int(0.9 * len(ids)) and len(train) + len(val) == len(ids)
    assert train.dtype == torch.int64 and int(train.max()) < GPT2_VOCAB


def test_too_short_text_is_one_clear_error(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Too short to train on.")
    with pytest.raises(UserError, match="text too short"):
        data.load_split(str(short), context_length=32, batch_size=4, world_size=1)


def test_mfu_flops_per_token_gpt2_124m():
    sys.path.insert(0, str(ROOT))
    import importlib.util

    spec = importlib.util.spec_from_file_location("orig", ROOT / "00_orig.py")
    orig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(orig)
    p = PRESETS["gpt2-124m"]
    keys = ["context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias"]
    cfg = {"vocab_size": GPT2_VOCAB, **{k: p[k] for k in keys}}
    with torch.device("meta"):
        model = orig.GPTModel(cfg)

    class Args:
        device, preset, max_steps, epochs, warmup_steps, batch_size = (
            "cpu",
            "gpt2-124m",
            20,
            1,
            1,
            None,
        )
        data, results, seed = None, None, 1

    from speed_ladder.measure.run import Run

    run = Run(Args, "00", str(ROOT / "00_orig.py"))
    total = sum(t.numel() for t in model.parameters())
    n = total - GPT2_VOCAB * 768 - 1024 * 768  # matmul parameters: no embedding tables
    run.set_model(model, cfg, 8)
    assert total == 163_009_536  # GPT-2 124M with an untied output layer (Raschka ch. 4)
    assert run.flops_per_token == 6 * n + 12 * 12 * 12 * 64 * 1024


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    """Measured into an empty cache, then read from it. The 1024^3 matmuls are stand-ins (real
    ones take seconds, and measured beside another test they would be busy and never cached):
    what is tested is the once-and-cached logic."""
    cpu = torch.device("cpu")
    monkeypatch.delenv(matmul_peak.PEAK_ENV, raising=False)
    monkeypatch.setenv("SPEED_LADDER_CACHE", str(tmp_path))
    monkeypatch.setattr(matmul_peak.cpu_load, "is_busy", lambda others: False)
    timed = []

    def rate(device, dtype):
        timed.append(dtype)
        return 7e10 if dtype == torch.float32 else 2e9

    monkeypatch.setattr(matmul_peak, "_matmul_rate", rate)
    first = matmul_peak.measured_matmul_rates(cpu)
    assert first == {"fp32": 7e10, "bf16": 2e9} and timed == [torch.float32, torch.bfloat16]
    table = json.loads((tmp_path / "matmul_peak.json").read_text())
    assert table[matmul_peak.rates_key(cpu)] == first
    assert matmul_peak.measured_matmul_rates(cpu) == first
    assert len(timed) == 2  # read from the cache, not measured again


def test_cpu_peak_rss_resets_at_window_start():
    cpu = torch.device("cpu")
    big = torch.ones(256, 1024, 1024)  # 1 GiB
    del big
    assert device.reset_peak_memory(cpu) is None  # clear_refs works here
    peak, allocated = device.peak_memory(cpu)
    assert allocated is None and peak < 2**30  # the freed GiB is not in the new window


def test_cpu_preset_keeps_gpt2_flop_split():
    assert flop_split(PRESETS["gpt2-124m"]) == pytest.approx(0.30, abs=0.02)
    assert flop_split(PRESETS["cpu"]) <= 0.5  # the output layer must not dominate


def test_gpt2_family_presets_are_the_literal_values():
    """gpt2-medium, -large and -xl, built from one family base, are exactly the dictionaries
    they were written as (key order included)."""
    common = {"drop_rate": 0.1, "qkv_bias": False}
    tail = {"weight_decay": 0.1, "epochs": 1, "max_steps": 30, "warmup_steps": 10,
            "eval_freq": 0, "eval_iters": 5, "sample_tokens": 50}  # fmt: skip
    literal = {
        "gpt2-medium": {"context_length": 1024, "emb_dim": 1024, "n_heads": 16, "n_layers": 24,
                        **common, "batch_size": 4, "large_batch_size": 16, "accum_steps": 2,
                        "lr": 3e-4, **tail},
        "gpt2-large": {"context_length": 1024, "emb_dim": 1280, "n_heads": 20, "n_layers": 36,
                       **common, "batch_size": 2, "large_batch_size": 8, "accum_steps": 2,
                       "lr": 2.5e-4, **tail},
        "gpt2-xl": {"context_length": 1024, "emb_dim": 1600, "n_heads": 25, "n_layers": 48,
                    **common, "batch_size": 1, "large_batch_size": 4, "accum_steps": 2,
                    "lr": 2e-4, **tail},
    }  # fmt: skip
    for name, values in literal.items():
        assert list(PRESETS[name].items()) == list(values.items()), name
        assert all(type(PRESETS[name][k]) is type(v) for k, v in values.items()), name
    assert PRESETS["gpt2-medium"] is not PRESETS["gpt2-large"]  # no shared, mutable dict


def test_append_jsonl_survives_a_torn_line(tmp_path):
    f = tmp_path / "r.jsonl"
    record.append_jsonl(f, {"a": 1})
    with open(f, "a") as h:
        h.write('{"b": ')  # a writer killed mid-line
    assert record.read_jsonl(f) == [{"a": 1}]


def test_bf16_step_runs_bf16_where_the_device_is_fast(tmp_path):
    """With a (fake) cached measurement saying bf16 is faster, step 05 trains in bf16 autocast:
    its loss moves off step 04's by rounding, within the precision step's tolerance. Two steps
    of batch 1: where bf16 is emulated (no AVX-512 bf16) a step of tiny's batch 4 takes ~7 s."""
    cache = tmp_path / "cache"
    cache.mkdir()
    key = matmul_peak.rates_key(torch.device("cpu"))
    (cache / "matmul_peak.json").write_text(json.dumps({key: {"fp32": 1e11, "bf16": 2e11}}))
    out = {}
    for script in ["steps/04_pinned_memory.py", "steps/05_bf16.py"]:
        res = tmp_path / f"{script[6:8]}.jsonl"
        proc = py(script, "--preset", "tiny", "--device", "cpu", "--max-steps", 2,
                  "--warmup-steps", 1, "--batch-size", 1, "--data", VERDICT, "--results", res,
                  env={"SPEED_LADDER_CACHE": str(cache), matmul_peak.BF16_ENV: "auto",
                       matmul_peak.PEAK_ENV: None})  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[script[6:8]] = records(res)[0]
    assert not any("mixed precision off" in n for n in out["05"]["notes"])
    diffs = [abs(a - b) for a, b in zip(out["04"]["losses"], out["05"]["losses"], strict=True)]
    assert 0 < max(diffs) <= 0.02


def test_no_committed_data_or_tokenizer_files():
    tracked = os.popen(f"git -C {ROOT} ls-files").read().split()
    assert not [t for t in tracked if Path(t).name in
                {"middlemarch.txt", "encoder.json", "vocab.bpe", "the-verdict.txt"}]  # fmt: skip


def test_a_measuring_run_evaluates_only_after_its_last_step():
    """gpt2-124m evaluates every 50 steps: in a tutorial run, yes; in a measuring run (the
    sweep's --max-steps/--results) no, since its step 50 is inside the timed window and its pause
    empties the allocator. The final evaluation stays."""
    from speed_ladder.measure.curve import LossCurve
    from speed_ladder.measure.schedule import Schedule
    from speed_ladder.measure.settings import resolve_spec

    spec = resolve_spec({"preset": "gpt2-124m"}, "cuda")
    assert spec.eval_freq == 50

    def due(max_steps, results, step):
        measuring = max_steps is not None or results is not None  # as Run says
        return Schedule(spec, measuring, LossCurve(None)).eval_due(step)

    assert due(None, None, 50) and not due(None, None, 49)
    assert not due(60, None, 50) and not due(None, "r.jsonl", 50)


def test_the_harness_asks_each_rungs_check_for_it_and_every_rung_built_on_it(monkeypatch):
    """Run.set_model asks the registry's inactive check of the run's own rung and of every rung
    it builds on (`after`, transitively), first rung first, and no step file records one
    itself: a step holds only the lines that decide what it runs."""
    from speed_ladder import ladder
    from speed_ladder.measure.rung_checks import CHECKS

    monkeypatch.setenv("SPEED_LADDER_BF16", "0")  # step 05's decision, not measured here
    cfg = {"vocab_size": GPT2_VOCAB, **{k: PRESETS["tiny"][k] for k in ["context_length",
           "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias"]}}  # fmt: skip
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # Liger: not on this CPU
    cpu = torch.device("cpu")
    for r in ladder.rungs():
        asked = rung_reasons(r.num, cpu, cfg, kernel="flash")
        assert [a[0] for a in asked] == [s.num for s in ladder.lineage(r.num) if s.num in CHECKS]
        assert "run.inactive(" not in r.path.read_text(), r.rel
    asked = rung_reasons("17", cpu, cfg, kernel="flash")
    on_cpu = dict((n, why) for n, why, _ in asked)
    assert on_cpu["12"].endswith(
        "not Liger's (Liger runs Triton GPU kernels: no CUDA device (cpu))"
    )
    assert on_cpu["16"].startswith("the preset")
    assert on_cpu["15"] == CHECKS["15"].why  # its fixed reason
    assert "forced off by SPEED_LADDER_BF16" in on_cpu["05"] and on_cpu["07"] is None
    # before the warm-up has shown the kernel, the checks that judge on it (07, 17) wait
    assert {"07", "17"}.isdisjoint(a[0] for a in rung_reasons("17", cpu, cfg))
