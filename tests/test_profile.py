"""Where the time goes (`--profile`: speed_ladder.measure.profile, op_categories, breakdown): the
categories, backward attribution, the device-time path, the Run's schedule (after the window;
after the warm-up without --max-steps; data running out), the flags, the sweep, the summary and
the chart; a real step, and (slow) every step, 11 and 14 in 2 processes too.

The real steps run with OMP_NUM_THREADS=1: on a 2-core machine shared with other jobs an op
parallelized over both cores waits for a time slice whenever the other core is busy, which adds
milliseconds to random ops and would blur the shares compared here.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, VERDICT, load_script, py, records
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent

from speed_ladder import flags as cli
from speed_ladder.errors import UserError
from speed_ladder.ladder import step_of
from speed_ladder.measure import breakdown, matmul_peak, op_categories, profile
from speed_ladder.measure.run import Run
from speed_ladder.measure.settings import resolve_spec
from speed_ladder.presets import PRESETS
from speed_ladder.spec import KEY_FIELDS, sweep_config

# the tiny preset's model with a small vocabulary: steps of milliseconds
MODEL_KEYS = ("context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")
SMALL = {"vocab_size": 512, **{k: PRESETS["tiny"][k] for k in MODEL_KEYS}}
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def assert_adds_up(share: dict) -> None:
    assert set(share) == set(op_categories.CATEGORIES)
    assert all(v >= 0 for v in share.values()), share
    assert abs(sum(share.values()) - 1) <= 1e-3, share


# ---------------------------------------------------------------- the categories
def test_op_names_give_categories():
    cat = op_categories.named_category
    assert cat("aten::mm") == cat("aten::addmm") == cat("aten::linear") == "matmul"
    assert cat("aten::addmm_") == cat("aten::addmv_") == "matmul"  # in place: step 12's
    assert cat("LigerFusedLinearCrossEntropyFunction") == "loss"  # Liger's: its callees too
    assert cat("aten::matmul") is None  # 4-D q @ k.T is matmul -> bmm: its callee decides
    assert cat("aten::bmm") == cat("aten::_softmax") == cat("aten::masked_fill_") == "attention"
    assert cat("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert cat("aten::native_layer_norm") == cat("aten::gelu_backward") == "norm_act"
    assert cat("aten::_log_softmax") == cat("aten::nll_loss_backward") == "loss"
    assert cat("Optimizer.step#AdamW.step") == cat("aten::_fused_adamw_") == "optimizer"
    assert cat("gloo:all_reduce") == cat("FSDP::all_gather (trf_blocks.1)") == "communication"
    assert cat("torch.distributed.ddp.reducer::copy_bucket_to_grad") == "communication"
    assert cat("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__") == "data_host"
    assert cat("speed-ladder/attention: MultiHeadAttention") == "attention"
    assert cat("speed-ladder/step: 3") is None and cat("aten::mul") is None
    # torch.compile's kernels are named by what they fuse
    assert cat("triton_red_fused__log_softmax_nll_loss_0") == "loss"
    assert cat("triton_per_fused_add_native_layer_norm_3") == "norm_act"
    assert cat("triton_poi_fused_add_embedding_1") is None
    assert op_categories.kernel_category("ncclDevKernel_AllReduce_Sum_f32") == "communication"
    assert op_categories.kernel_category("Memcpy HtoD (Pinned -> Device)") == "data_host"


def test_step12s_loss_without_liger_counts_its_matmul_as_matmul_and_its_cross_entropy_as_loss():
    """Where Liger cannot run, step 12's loss is step 11's: out_head's matmuls (forward and both
    gradients) are matmul, the cross-entropy's ops loss (eager here: compiled, inductor names
    its kernels by the ops they fuse, as step 11's)."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step12 = load_script("steps/12_liger_fused_ce.py")
    torch.manual_seed(0)
    model = step12.GPTModel(SMALL)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    with torch.compiler.set_stance("force_eager"):
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function(f"{breakdown.STEP_RANGE}0"):
                step12.calc_loss_batch(x, y, model).backward()
    by_name: dict = {}
    breakdown.breakdown(prof.events(), 1, use_device=False, by_name=by_name)
    cats: dict = {}
    for cat, name in by_name:
        cats.setdefault(name, set()).add(cat)
    assert cats["aten::mm"] == {"matmul"}, cats
    assert cats["aten::_log_softmax"] == cats["aten::nll_loss_forward"] == {"loss"}, cats


def test_a_known_model_adds_up_and_backward_ops_follow_their_forward_op():
    """Step 00's model (hand-written LayerNorm, GELU and attention), tiny's shape: every
    category is found, backward ops included, the shares add up to 100%, run.paused() is out."""
    m = load_script("00_orig.py")
    torch.manual_seed(0)
    model = m.GPTModel(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    hooks = op_categories.ModuleRanges(model)
    assert hooks.install() == 2 * 4 + 1  # per block: 2 norms, GELU, attention; the final norm
    hooks.remove()
    share, res, by_name, events = _profile_steps(m, model, opt, x, y, steps=2, pause=True)
    assert not any(mod._forward_hooks for mod in model.modules())  # removed again
    assert_adds_up(share)
    assert res.steps == 2 and res.basis.startswith("self CPU time")
    for c in ("matmul", "attention", "norm_act", "loss", "optimizer", "data_host"):
        assert share[c] > 0, (c, share)
    assert share["communication"] == 0
    names = {c: {n for (cc, n) in by_name if cc == c} for c in op_categories.CATEGORIES}
    # backward nodes take their forward op's category: hand-written GELU and LayerNorm, attention
    assert {"aten::tanh_backward", "autograd::engine::evaluate_function: PowBackward0"} <= names[
        "norm_act"
    ]
    assert "autograd::engine::evaluate_function: VarBackward0" in names["norm_act"]
    assert "autograd::engine::evaluate_function: BmmBackward0" in names["attention"]
    assert "aten::_softmax_backward_data" in names["attention"]
    assert "aten::_log_softmax_backward_data" in names["loss"]
    assert "aten::mm" in names["matmul"] and "aten::mm" not in names["attention"]
    assert "aten::tanh" not in names["other"] and "aten::var" not in names["other"]
    ranges = [e for e in events if e.name.startswith(breakdown.STEP_RANGE)]
    paused = [e for e in events if e.name == breakdown.PAUSED_RANGE]
    wall = sum(r.time_range.elapsed_us() for r in ranges) - sum(
        p.time_range.elapsed_us() for p in paused
    )
    assert res.wall_s == pytest.approx(wall / 1e6, rel=1e-6)


def test_sdpa_takes_attention_into_one_fused_kernel():
    """Steps 06 and 07's models (hand-written attention vs scaled_dot_product_attention) profiled
    a step each: step 06's attention is the ops that materialize the (T, T) scores (bmm,
    masked_fill, softmax, dropout, and their backward ops), step 07's the CPU flash kernel,
    forward and backward, and none of those. What ran, not how long: times compared would
    measure whatever else the machine runs."""
    names = {}
    for s in ("06_native_layernorm_gelu", "07_flash_attention_sdpa"):
        m = load_script(f"steps/{s}.py")
        torch.manual_seed(0)
        model = m.GPTModel(dict(SMALL, context_length=256))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        x, y = torch.randint(0, 512, (2, 256)), torch.randint(0, 512, (2, 256))
        share, _, by_name, _ = _profile_steps(m, model, opt, x, y, steps=1)
        assert_adds_up(share)
        assert share["attention"] > 0, share
        names[step_of(s + ".py")] = {n for c, n in by_name if c == "attention"}
    scores = {"aten::bmm", "aten::masked_fill_", "aten::_softmax", "aten::_softmax_backward_data",
              "aten::dropout"}  # fmt: skip
    flash = {"aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}  # fmt: skip
    assert scores <= names["06"] and not flash & names["06"], names["06"]
    assert flash <= names["07"] and not scores & names["07"], names["07"]


def _profile_steps(m, model, opt, x, y, steps: int, pause: bool = False):
    """(shares, breakdown, by_name, events) of `steps` steps profiled as the harness does."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    def step():
        opt.zero_grad()
        m.calc_loss_batch(x, y, model).backward()
        opt.step()

    step()
    hooks = op_categories.ModuleRanges(model)
    hooks.install()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for n in range(steps):
            with record_function(f"{breakdown.STEP_RANGE}{n}"):
                step()
                if pause:
                    with record_function(breakdown.PAUSED_RANGE), torch.no_grad():
                        model(x)  # an evaluation: neither counted nor in the wall time
    hooks.remove()
    by_name: dict = {}
    res = breakdown.breakdown(prof.events(), steps, use_device=False, by_name=by_name)
    return breakdown.shares(res.seconds), res, by_name, prof.events()


def _ev(eid, name, start, end, thread=1, device=DeviceType.CPU, linked=0, seq=-1, fwd=None):
    """A FunctionEvent as torch 2.13 makes it: linked to its op and typed. torch 2.11's
    FunctionEvent takes neither argument, so both are set after it is made."""
    kind = "cpu_op" if device == DeviceType.CPU else "gpu_memcpy" if "Memcpy" in name else "kernel"
    e = FunctionEvent(
        id=eid, name=name, thread=thread, start_us=start, end_us=end, fwd_thread=fwd,
        sequence_nr=seq, device_type=device, use_device="cuda",
    )  # fmt: skip
    e.linked_correlation_id, e.activity_type = linked, kind
    return e


def _tree(events):
    """The events as torch hands them over: an EventList, its CPU call tree built."""
    el = EventList(events, use_device="cuda")
    el._build_tree()
    return el


def _device_events():
    """One profiled step on a made-up GPU: its CPU ops and the kernels they launched."""
    gpu = DeviceType.CUDA
    events = [
        _ev(1, breakdown.STEP_RANGE + "0", 0, 1000),
        _ev(2, "aten::copy_", 10, 20),
        _ev(3, "speed-ladder/attention: MultiHeadAttention", 30, 90),
        _ev(4, "aten::matmul", 40, 80, seq=7),  # 4-D: its bmm's category, attention
        _ev(5, "aten::bmm", 50, 70),
        _ev(6, "aten::mm", 100, 200),
        _ev(7, "nccl:all_reduce", 300, 310),
        _ev(8, breakdown.PAUSED_RANGE, 800, 900),
        _ev(9, "aten::mm", 810, 820),
        # the autograd engine's device thread: the node of forward op 4 (sequence number 7)
        _ev(10, breakdown.BACKWARD + "UnsafeViewBackward0", 500, 560, thread=2, seq=7, fwd=1),
        _ev(11, "aten::mul", 510, 520, thread=2),
        # the runtime calls that launched kernels 102 and 103: CPU events with the kernels'
        # own ids (CUPTI's correlation ids, another count than the ops'), linked to their op
        _ev(102, "cudaLaunchKernel", 55, 58, linked=5),
        _ev(103, "cudaLaunchKernel", 110, 113, linked=6),
        # the kernels, each linked to the op that launched it
        _ev(101, "Memcpy HtoD (Pageable -> Device)", 20, 60, device=gpu, linked=2),
        _ev(102, "ampere_sgemm_128x64_tn", 60, 100, device=gpu, linked=5),
        _ev(103, "ampere_sgemm_128x64_nn", 150, 450, device=gpu, linked=6),
        _ev(104, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 500, device=gpu, linked=7),
        _ev(105, "vectorized_elementwise_kernel", 520, 580, device=gpu, linked=11),
        _ev(106, "triton_red_fused__log_softmax_0", 600, 700, device=gpu),  # no op: by name
        _ev(107, "ampere_sgemm_32x32", 820, 880, device=gpu, linked=9),  # paused: not counted
    ]
    drawn = _ev(108, breakdown.STEP_RANGE + "0", 0, 1000, device=gpu)  # a range, not device work
    drawn.activity_type = "gpu_user_annotation"
    drawn.is_user_annotation = True
    return events + [drawn]


def test_device_time_breakdown():
    """CUDA: kernels counted in their launching op's category (the backward thread's too),
    overlapping kernels scaled to the busy time, idle GPU time and host copies data and host,
    a paused evaluation's kernels left out; no GPU needed (the profiler's events, made up)."""
    res = breakdown.breakdown(_tree(_device_events()), 1, use_device=True)
    assert res.basis == "device time" and res.wall_s == pytest.approx(900e-6)
    us = {c: v * 1e6 for c, v in res.seconds.items()}
    # kernels: 40 + 40 + 300 + 200 + 60 + 100 = 740 us, busy (their union) 590 us
    scale = 590 / 740
    assert us["matmul"] == pytest.approx(300 * scale)
    assert us["attention"] == pytest.approx((40 + 60) * scale)  # bmm's, and its backward's
    assert us["communication"] == pytest.approx(200 * scale)
    assert us["loss"] == pytest.approx(100 * scale)
    assert us["data_host"] == pytest.approx(40 * scale + (900 - 590))  # the copy, the idle GPU
    assert sum(us.values()) == pytest.approx(900)
    assert_adds_up(breakdown.shares(res.seconds))


def test_device_ms_per_step_and_the_idle_gpu():
    """The same made-up step in milliseconds (`time_breakdown_ms`): each category's device time
    alone (the busy-scaled kernels; data and host only its copy) and `idle`, the 310 us the GPU
    ran nothing, adding up to the step's 0.9 ms. Two steps halve every number."""
    res = breakdown.breakdown(_tree(_device_events()), 1, use_device=True)
    ms = breakdown.per_step_ms(res)
    scale = 590 / 740
    assert ms["matmul"] == pytest.approx(0.3 * scale, abs=1e-4)
    assert ms["attention"] == pytest.approx(0.1 * scale, abs=1e-4)
    assert ms["data_host"] == pytest.approx(0.04 * scale, abs=1e-4)  # the copy, no idle
    assert ms["idle"] == pytest.approx(0.31) and res.idle_s == pytest.approx(310e-6)
    assert sum(ms.values()) == pytest.approx(0.9, abs=1e-3)
    halved = breakdown.per_step_ms(replace(res, steps=2))
    assert halved["idle"] == pytest.approx(0.155) and halved["matmul"] == pytest.approx(
        ms["matmul"] / 2, abs=1e-4
    )


def _as_torch_2_11(events):
    """The same events as torch 2.11 gives them: no `linked_correlation_id`, no
    `activity_type`; and the profiler's kineto events they were made from, which have the
    link (torch's _ProfilerResult: trace_start_ns(), events())."""
    t0 = 1_764_000_000_000_000_000
    kineto = [
        SimpleNamespace(
            correlation_id=lambda e=e: e.id,
            device_type=lambda e=e: e.device_type,
            start_ns=lambda e=e: t0 + round(e.time_range.start * 1000),
            linked_correlation_id=lambda k=e.linked_correlation_id: k,
        )
        for e in events
    ]
    for e in events:
        del e.linked_correlation_id, e.activity_type
    return events, SimpleNamespace(trace_start_ns=lambda: t0, events=lambda: kineto)


def test_without_linked_ids_kernels_are_linked_from_kineto():
    """torch 2.11 (the GPU image's) leaves a kernel's launching op out of its events:
    link_kernels copies it from the kineto events, and the breakdown is the one above. Without
    it the kernels lose their ops (a paused evaluation's kernel counts, the copy is other)."""
    want = breakdown.breakdown(_tree(_device_events()), 1, use_device=True)
    events, kineto = _as_torch_2_11(_device_events())
    assert breakdown.link_kernels(events, kineto) == 8  # 6 kernels + 2 runtime calls linked
    assert breakdown.breakdown(_tree(events), 1, use_device=True) == want
    unlinked, _ = _as_torch_2_11(_device_events())
    assert breakdown.breakdown(_tree(unlinked), 1, use_device=True) != want
    assert breakdown.link_kernels(_device_events(), kineto) == 0  # torch 2.13: has them


def test_every_profiled_event_is_found_among_its_kineto_events():
    """link_kernels's match, on a real profile of this torch: each FunctionEvent's
    (correlation id, device, start) is one of the kineto events torch made it from."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    x = torch.randn(32, 32, requires_grad=True)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        (x @ x).relu().sum().backward()
    links = breakdown.kineto_links(prof.profiler.kineto_results)
    events = prof.events()
    assert len(events) > 10 and all(breakdown.event_key(e) in links for e in events)


# ---------------------------------------------------------------- the Run's schedule
def _run(monkeypatch, argv, step="06_native_layernorm_gelu.py"):
    rates = {"fp32": 5e10, "bf16": 1e9}  # not measured again here (about 30 s on 2 cores)
    monkeypatch.setattr(matmul_peak, "measured_matmul_rates", lambda device: rates)
    args = cli.parse_args(None, ["--device", "cpu", "--preset", "tiny", *argv])
    return Run(args, step_of(step), str(ROOT / "steps" / step))


def _train(run, batches: int, pause_at=None, epoch_mode=False):
    """A step-06 model trained like a step script does, `batches` batches in one epoch."""
    m = load_script("steps/06_native_layernorm_gelu.py")
    torch.manual_seed(0)
    model = m.GPTModel(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    run.set_model(model, SMALL, 2)
    for _ in range(batches):
        opt.zero_grad()
        loss = m.calc_loss_batch(x, y, model)
        loss.backward()
        opt.step()
        run.step_done(loss, tokens=x.numel())
        if run.steps_done == pause_at:
            with run.paused(), torch.no_grad():
                model(x)
        if run.finished:
            break
    return run.finish(None, None)


def test_after_the_timed_window_profiled_steps_are_not_timed(monkeypatch, tmp_path):
    run = _run(monkeypatch, ["--max-steps", "4", "--warmup-steps", "1", "--profile", "2"])
    seen = []
    real_end = run._close_window
    monkeypatch.setattr(run, "_close_window", lambda: (seen.append(run.steps_done), real_end()))
    rec = _train(run, 10, pause_at=5)
    assert seen == [4]  # the window's peak memory is read before profiling starts
    assert run.steps_done == 6 and rec["timed_steps"] == 3 and len(rec["losses"]) == 6
    assert rec["profiled_steps"] == 2 and rec["profiled_ms"] > 0
    ms = rec["time_breakdown_ms"]  # CPU: self CPU ms per step, the rest idle; adds up
    assert sum(ms.values()) == pytest.approx(rec["profiled_ms"] / 2, rel=1e-3) and ms["idle"] >= 0
    assert rec["peak_mem_reserved_bytes"] == run.window.peak[0]
    assert_adds_up(rec["time_breakdown"])
    assert "after the timed window" in " ".join(rec["notes"]) and "trace" not in rec


def test_without_max_steps_the_steps_after_warm_up_are_profiled(monkeypatch):
    """Epoch mode (gpt2-124m's default): the end is not known, so the steps right after the
    warm-up are profiled and the timed window starts after them."""
    monkeypatch.setitem(PRESETS["tiny"], "max_steps", None)  # epoch mode
    run = _run(monkeypatch, ["--warmup-steps", "2", "--profile", "2"])
    windows = []
    real_start = run._open_window
    start = lambda: (windows.append(run.steps_done), real_start())  # noqa: E731
    monkeypatch.setattr(run, "_open_window", start)
    rec = _train(run, 8, pause_at=3)
    assert windows == [4] and run.steps_done == 8
    assert rec["timed_steps"] == 4 and rec["profiled_steps"] == 2
    assert_adds_up(rec["time_breakdown"])
    assert "after the warm-up, before it" in " ".join(rec["notes"])
    assert "peak RSS may include memory the profiler freed" in " ".join(rec["notes"])


def test_data_running_out_keeps_the_profiled_steps(monkeypatch):
    run = _run(monkeypatch, ["--max-steps", "3", "--warmup-steps", "1", "--profile", "3"])
    rec = _train(run, 4)  # one step after the window, then the loop ends
    assert rec["timed_steps"] == 2 and rec["profiled_steps"] == 1
    assert_adds_up(rec["time_breakdown"])
    assert "the data ran out after 1 of 3 profiled steps" in " ".join(rec["notes"])

    run = _run(monkeypatch, ["--max-steps", "5", "--warmup-steps", "1", "--profile"])
    rec = _train(run, 4)  # the data runs out inside the window: nothing profiled
    assert rec["time_breakdown"] is None and rec["timed_steps"] == 3
    assert "before step 6, the first to profile" in " ".join(rec["notes"])


def test_a_profiler_that_cannot_start_costs_the_run_nothing(monkeypatch):
    import torch.profiler

    def broken(**kw):
        raise RuntimeError("no kineto here")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    monkeypatch.setitem(PRESETS["tiny"], "max_steps", None)  # epoch mode: the window would
    run = _run(monkeypatch, ["--warmup-steps", "2", "--profile"])  # wait for the profiled steps
    rec = _train(run, 5)
    assert rec["timed_steps"] == 3 and rec["time_breakdown"] is None
    assert "could not start torch.profiler: RuntimeError: no kineto here" in " ".join(rec["notes"])
    assert not any(m._forward_hooks for m in run.profiler.model.modules())


# ---------------------------------------------------------------- flags
def test_profile_flags_are_passed_but_do_not_identify_a_run(tmp_path):
    p = cli.Parser()
    from speed_ladder.sweep import command as sweep_command

    sweep_command.add_run_parser(p.add_subparsers(dest="command"))
    values = vars(p.parse_args(["run", "--profile", "--trace", str(tmp_path)]))
    assert values["profile"] == profile.PROFILE_STEPS == 3
    config = sweep_config(resolve_spec(values, "cpu"), 1)  # what the run's record is matched by
    assert set(config) == {*KEY_FIELDS, "nproc"} and not {"profile", "trace"} & set(config)
    assert cli.child_argv(values)[-4:] == ["--profile", "3", "--trace", str(tmp_path)]
    assert cli.parse_args(None, ["--profile", "5"]).profile == 5
    assert cli.parse_args(None, []).profile is None
    file = tmp_path / "a-file"
    file.write_text("")
    with pytest.raises(UserError, match=r"--trace .*a-file: is a file, not a folder"):
        profile.from_args(cli.parse_args(None, ["--trace", str(file)]), None, None, None, "")


def test_a_profiled_sweep_reruns_steps_without_a_breakdown_and_charts_it(tmp_path, capsys):
    """Fixture steps: --profile keeps the configuration (same runs.jsonl config), reruns the
    steps whose latest runs have no time breakdown, and draws time_breakdown.png, which the
    README links."""
    from conftest import sweep_here
    from test_sweep import FIXTURES, runs_of, summary_of

    from speed_ladder.report.charts.time_chart import TIME_CHART
    from speed_ladder.report.pages.tag_page import tag_markdown

    results = tmp_path / "results"
    base = ["--ladder-dir", FIXTURES / "ladder_ok", "--results-dir", results, "--device", "cpu"]
    base += ["--steps", "00,01"]
    assert sweep_here(capsys, *base, "--no-plots")[0] == 0
    tag = results / runs_of(results)[0]["sweep"]["tag"]
    assert not (tag / TIME_CHART).exists()
    code, out, err = sweep_here(capsys, *base, "--profile")
    assert code == 0, out + err
    recs = runs_of(results)
    assert len(recs) == 4 and "up to date" not in out
    assert recs[0]["sweep"]["config"] == recs[2]["sweep"]["config"]
    assert "--profile" in recs[2]["sweep"]["command"] and recs[2]["time_breakdown"]
    row = summary_of(results)["01"]
    assert row["time_attention"] == 0.15 and row["time_matmul"] == 0.5
    assert (tag / TIME_CHART).read_bytes()[:4] == b"\x89PNG"
    assert f"[where the time goes]({tag.name}/{TIME_CHART})" in tag_markdown(tag, results)
    code, out, _ = sweep_here(capsys, *base, "--profile", "--no-plots")
    assert code == 0 and out.count("up to date") == 2


def test_time_chart_bars_only_profiled_steps(tmp_path, monkeypatch):
    """A stacked bar per profiled step, its shares scaled to 100%; the others are labels."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from test_plot import FIXTURE_TAG

    from speed_ladder.report.charts.time_chart import plot_time_breakdown
    from speed_ladder.report.summary import TIME_COLUMNS

    tag = tmp_path / "cpu-fixture"
    tag.mkdir()
    df = pd.read_csv(FIXTURE_TAG / "summary.csv", dtype={"step": str})
    assert plot_time_breakdown(FIXTURE_TAG) == []  # nothing profiled: no chart
    ok = df.index[df["status"] == "ok"]
    for col in TIME_COLUMNS:
        df[col] = None
    df.loc[ok[0], TIME_COLUMNS] = [0.5, 0.2, 0.1, 0.1, 0.05, 0.0, 0.04, 0.02]  # adds to 1.01
    df.to_csv(tag / "summary.csv", index=False)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    (path,) = plot_time_breakdown(tag)
    assert path.name == "time_breakdown.png" and path.read_bytes()[:4] == b"\x89PNG"
    ax = figures[0].axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert len(widths) == 7 and sum(widths) == pytest.approx(100)  # communication is 0
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("not profiled (run with --profile)") == len(ok) - 1
    assert "50%" in texts and "failed (oom)" in texts


# ---------------------------------------------------------------- real steps
def _profiled(tmp_path, script, *extra, env=None, launcher=()):
    out = tmp_path / f"{Path(script).stem}{'-x2' if launcher else ''}.jsonl"
    args = [script, "--device", "cpu", "--preset", "tiny", "--data", VERDICT, "--results", out]
    args += ["--max-steps", 5, "--profile", *extra]
    if launcher:
        from conftest import run_script

        p = run_script([*launcher, ROOT / script, *args[1:]], env={**ONE_THREAD, **(env or {})})
    else:
        p = py(*args, env={**ONE_THREAD, **(env or {})})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (rec,) = records(out)
    assert rec["status"] == "ok" and rec["profiled_steps"] == 3, rec.get("notes")
    assert rec["timed_steps"] == 5 - 2 and len(rec["losses"]) == 8
    assert_adds_up(rec["time_breakdown"])
    assert rec["time_breakdown"]["optimizer"] > 0 and rec["time_breakdown"]["matmul"] > 0
    return rec


def test_a_real_step_records_its_breakdown_and_trace(tmp_path):
    """Step 07 on tiny with --profile --trace: 3 profiled steps after the timed window, which
    keeps its 3 steps; the breakdown adds up; the trace opens as Chrome trace JSON."""
    rec = _profiled(tmp_path, "steps/07_flash_attention_sdpa.py", "--trace", tmp_path / "tr")
    # named inside its folder, not where the folder is (files.portable_path)
    assert rec["trace"].startswith("07-") and rec["peak_mem_reserved_bytes"]
    trace = json.loads((tmp_path / "tr" / rec["trace"]).read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"speed-ladder/step: 6", "speed-ladder/step: 8"} <= names
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names


@pytest.mark.slow
def test_every_step_profiles_on_cpu(tmp_path):
    """Steps 00-14 on tiny with --profile (08 compiled; 09-14 eager to save the compiles), and
    11 and 14 in 2 processes, where communication shows."""
    from speed_ladder.ladder import discover

    no_compile = {"TORCH_COMPILE_DISABLE": "1"}
    first = next(s for s in discover(ROOT) if s.compiled)
    for s in discover(ROOT):
        env = no_compile if s.compiled and s != first else None
        _profiled(tmp_path, s.rel, env=env)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    for script in ("steps/11_ddp.py", "steps/14_fsdp2.py"):
        rec = _profiled(tmp_path, script, env=no_compile, launcher=torchrun)
        assert rec["world_size"] == 2 and rec["time_breakdown"]["communication"] > 0
