"""`Run`: what a step calls to time its steps and write its record (device, preset and data too).

The timed window: the first `warmup_steps` optimizer steps are left out (allocator warm-up,
cuDNN/oneDNN plans, torch.compile). At the window start the device is synchronized and the
peak-memory counters are reset; at its end (the last timed step) they are read, with the step
times. A step's time is end-to-end, from the previous step's end (data loading included) to its
own, on a clock that does not drain the GPU at every step (clock.py: CUDA events, losses read in
batches). Evaluation and sampling run inside `run.paused()`, which restarts the clock after them,
so they are never timed, and leaves them out of the peak memory (device.PeakWindow: on CUDA, MPS
and Linux CPUs the recorded peak is the training steps' alone, the final evaluation's neither).
tokens/s = tokens per step (all ranks) / median step time. Over the window rank 0 measures
`other_load` (cpu_load.py), each rank its GPU's idle share (gpu_idle.py); the record carries
the machine's fingerprint (machine.py). --profile: N more steps after the window, never timed,
say where their time goes (measure/profile.py); the last warm-up step's ops say which attention
kernel ran (measure/attention_kernel.py).

MFU = tokens/s x (6N + 12*L*H*Q*T) / (peak x devices), N the parameters that take part in matmuls
(embedding tables excluded, the output layer included), L layers, H heads, Q head size, T context
(PaLM, Chowdhery et al. 2022, app. B). The peak is the device's dense bf16 peak for every step,
fp32 steps included (gpus.py's datasheet table; CPU and MPS: the best matmul rate measured here,
matmul_peak.py). HFU, beside it where a rung checkpoints its blocks: the same over the FLOPs the
hardware ran, the recomputed forward counted (run_record.hfu_of).
"""

import datetime as dt
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from speed_ladder.errors import UserError, on_failure, os_error_why
from speed_ladder.files import check_cache_dir
from speed_ladder.measure import attention_kernel, cpu_load, matmul_peak, profile
from speed_ladder.measure import device as dev
from speed_ladder.measure.across_ranks import Measured, across_ranks, process_group
from speed_ladder.measure.clock import StepClock
from speed_ladder.measure.curve import LossCurve
from speed_ladder.measure.data import gpt2_tokenizer, load_split
from speed_ladder.measure.gpu_idle import IdleMeter
from speed_ladder.measure.inactive import (
    LIGER_INTERPRETED,
    LIGER_RAN,
    asked,
    triton_interpreted,
)
from speed_ladder.measure.memory_snapshot import from_args as memory_snapshot
from speed_ladder.measure.rank_memory import announce
from speed_ladder.measure.run_record import base_record, hfu_of, mfu_of
from speed_ladder.measure.settings import check_accum_steps, resolve_spec
from speed_ladder.records import FIELDS, append_jsonl
from speed_ladder.writable import check_file

# The GPT_CONFIG settings a preset sets (every preset sets them all); vocab_size is the step's.
MODEL_KEYS = ("context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")


class Run:
    def __init__(self, args, step: str, script: str):
        self.args, self.step = args, step
        self.script = Path(script).resolve()
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.t_begin = time.time()
        self.is_rank0 = int(os.environ.get("RANK", "0")) == 0
        self.notes: list[str] = []
        self.inactive_reason: str | None = None  # why this step's own optimization did nothing
        self.inactive_rungs: dict = {}  # {rung: why} of its chain's rungs that did nothing here
        self.fused_loss = None  # step 12's Liger loss, where the step built one (set_model)
        self.device = dev.resolve(args.device)
        # every place this run writes, checked now rather than after the training
        if args.results is not None and self.is_rank0:
            check_file(args.results, "--results")
        check_cache_dir()
        self.snapshot = memory_snapshot(args, self.device)  # --memory-snapshot: CUDA only

        # the run's settings, as the sweep resolved them for its plan (speed_ladder.spec)
        self.spec = resolve_spec(vars(args), self.device.type, dev.gpu_memory(self.device))
        self.settings, self.preset_name = self.spec.settings, self.spec.preset
        self.print(f"[{step}] preset {self.spec.preset} ({self.spec.why}); device "
                   f"{self.device.type}: {dev.name(self.device)}")  # fmt: skip
        if self.settings["batch_rule"] is not None:  # a GPU too small for the preset's batch
            self.note(f"batch rule: {self.settings['batch_rule']['reason']}")
        check_accum_steps(self.spec, step, vars(args).get("accum_steps"))  # cannot split: refused

        self.steps_done = 0
        self.clock = StepClock(self.device)  # step times and losses (clock.py)
        self.step_times, self.losses = self.clock.times, self.clock.losses  # its lists, read
        self.tokens_per_step = 0
        self.flops_per_token = None
        self.cfg, self.batch_size = None, None
        self._t_print = 0.0
        self._window = "before"  # -> open -> closed
        self._window_note = None
        self._idle = IdleMeter(self.device)  # the GPU's idle share over the window
        self._load = cpu_load.Meter()  # other processes' CPU use over the timed window
        self._busy: dict = {}  # cpu_load.Meter.stop() of rank 0, at the window's end
        self._memory = dev.PeakWindow(self.device)  # the timed steps' peak, pauses left out
        self._written = False
        self.memory_prediction: dict = {}  # rank_memory.announce, before the first step
        self._window_peak = None  # (reserved, allocated) at the window's end, when work follows
        self.profiler = profile.from_args(args, self)  # --profile/--trace, else None
        self.attention = attention_kernel.Watch(self)  # the SDPA kernel the training call ran
        self.curve = LossCurve(self.settings["to_loss"])  # evaluations on the training clock
        on_failure.register(self.write_failure)  # from here on, a failure can be recorded

    # ------------------------------------------------------------ helpers for the step
    def print(self, *a, **k) -> None:
        if self.is_rank0:
            print(*a, **k, flush=True)

    def note(self, text: str) -> None:
        """A remark for the record, e.g. why an optimization does nothing on this device."""
        if text not in self.notes:
            self.notes.append(text)
            self.print(f"[{self.step}] note: {text}")
            if text.startswith(LIGER_RAN) and triton_interpreted():  # said where it is seen
                self.note(LIGER_INTERPRETED)

    def inactive(self, step: str, reason: str | None, acted: str | None = None) -> None:
        """What set_model found for rung `step` (measure/inactive.py, `asked`). `reason` None: its
        idea acts here, noted `step NN: acted` where `acted` says what ran. A text: it does
        nothing in this run (TF32 on a CPU, Liger's fallback, ...), noted `step NN: reason` and
        in `inactive_rungs`; when `step` is the run's own, the record says `step_active: false`
        and `inactive_reason`, so that a no-op is never read as a gain. Asked again: nothing."""
        if reason is None and acted is not None:
            self.note(f"step {step}: {acted}")
        elif reason is not None:
            self.note(f"step {step}: {reason}")
            self.inactive_rungs.setdefault(step, reason)
            self.inactive_reason = self.inactive_rungs.get(self.step)

    def model_overrides(self) -> dict:
        """The preset's model settings (speed_ladder/presets.py), which replace GPT-2 124M's in a
        step's GPT_CONFIG: `GPT_CONFIG = {...124M...} | run.model_overrides()`."""
        return {k: self.settings[k] for k in MODEL_KEYS}

    def tokenizer(self):
        return gpt2_tokenizer()

    def load_tokens(self, context_length: int, batch_size: int):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return load_split(self.args.data, context_length, batch_size, world)

    def set_model(
        self, model: torch.nn.Module, cfg: dict, batch_size: int, fused_loss=None
    ) -> None:
        """Record why each rung of this step does nothing here (`inactive`), count FLOPs per
        token and start the clock (call right before the training loop). `fused_loss`: step 12's
        Liger module where the step built one (its memory prediction and phase hooks), else
        None (its loss is in the model's logits and the compiled cross-entropy)."""
        self.cfg, self.batch_size, self.fused_loss = cfg, batch_size, fused_loss
        drop = self.settings["drop_rate"]
        accum = self.settings["accum_steps"]  # step 18's micro-batches, where they split the batch
        facts = (self.step, self.device, cfg, drop, batch_size, accum)
        for step, reason, acted in asked(*facts, settings=self.settings):
            self.inactive(step, reason, acted)
        self.memory_prediction = announce(self, model)
        tokens = batch_size * cfg["context_length"] * self._world()  # a step's, all ranks
        budget_given = getattr(self.args, "token_budget", None) is not None
        sized = self.curve.size(tokens, self.settings["warmup_steps"], budget_given)
        if sized:
            self.note(sized)
        emb = {
            id(p)
            for m in model.modules()
            if isinstance(m, torch.nn.Embedding)
            for p in m.parameters()
        }
        n = sum(p.numel() for p in model.parameters() if id(p) not in emb)
        L, H, T = cfg["n_layers"], cfg["n_heads"], cfg["context_length"]
        Q = cfg["emb_dim"] // H
        self.flops_per_token = 6 * n + 12 * L * H * Q * T
        self.peak, self.peak_source = matmul_peak.peak_flops(self.device)  # cached once measured
        if self.profiler is not None:
            self.profiler.attach(model)
        self.clock.phases.attach(model, self.fused_loss)  # data/forward/... hooks (phases.py)
        self._profile_or_window()
        self.clock.restart()
        self.curve.start()

    @property
    def finished(self) -> bool:
        m = self.settings["max_steps"]
        more = self.profiler is not None and self.profiler.wants_more  # profiled steps to come
        return (m is not None and self.steps_done >= m and not more) or self.curve.done()

    def eval_due(self) -> bool:
        """Every eval_freq steps in a tutorial run; with --to-loss, every `eval_tokens` tokens
        (measure/curve.py). Another measuring run (--max-steps or --results, as in the sweep)
        evaluates once, after its last step (the step's `finish`): an evaluation inside the run
        costs wall time that no record shows (gpt2-124m evaluated at step 50 of 60, inside the
        timed window), and its pause empties the allocator's cache, so the next step allocates
        its memory again (tens of GB on a GPU)."""
        if self.curve.to_loss is not None:
            return self.curve.eval_due()
        f = self.settings["eval_freq"]
        measuring = self.args.max_steps is not None or self.args.results is not None
        return bool(f) and not measuring and self.steps_done % f == 0

    def evaluated(self, epoch: int, train_loss: float, val_loss: float) -> None:
        """An evaluation's losses (inside run.paused()): printed, and a point of the record's
        loss curve at the tokens and training time so far (measure/curve.py)."""
        self.curve.add(val_loss)
        self.print(f"Ep {epoch + 1} (step {self.steps_done:06d}, {self.curve.tokens:,} tokens): "
                   f"train loss {train_loss:.3f}, val loss {val_loss:.3f}")  # fmt: skip

    def sample_due(self) -> bool:
        """Epoch-end samples belong to tutorial runs; a measuring run (--max-steps or
        --results given, as in the sweep) skips them: they take time and measure nothing."""
        return self.args.max_steps is None and self.args.results is None

    @contextmanager
    def paused(self):
        """Evaluation, sampling and printing inside this block are not timed, and the memory
        they take is not in the recorded peak (device.PeakWindow)."""
        dev.synchronize(self.device)
        self.curve.pause()
        self.clock.read(wait=True)  # the steps so far, closed before the pause
        self._memory.pause()
        self._idle.pause()
        try:
            with profile.excluded(self.profiler), self.attention.excluded():  # nor profiled
                yield
        finally:
            dev.synchronize(self.device)
            self._memory.resume()
            self._idle.resume()
            self.clock.restart()
            self.curve.start()

    # ------------------------------------------------------------ timing
    def _start_window(self) -> None:
        dev.synchronize(self.device)
        self.curve.warmed_up()
        self._window = "open"
        self._window_note = self._memory.start()
        if self.is_rank0:
            self._load.start()
        self._idle.start()

    def _end_window(self) -> None:
        """The open timed window's step times, peak memory, other processes' load and GPU idle
        share, read at its end (the last timed step, or the run's end), before the profiled
        steps (whose profiler buffers raise a CPU process's RSS); finish() reports them."""
        self._window = "closed"
        dev.synchronize(self.device)
        self._idle.stop()
        self.clock.read(wait=True)
        self._window_peak = self._memory.peak()
        if self.snapshot is not None:
            self.snapshot.dump(self.note)
        if self.is_rank0:
            self._busy = self._load.stop()

    def _profile_or_window(self) -> bool:
        """At a step boundary: end the timed window, start the profiled steps (see profile.py)
        or the window when they are due; True if any did (the clock then restarts)."""
        started = self.attention.at(self.steps_done)  # the last warm-up step: attention_kernel
        if self._window == "open" and self.steps_done == self.settings["max_steps"]:
            self._end_window()  # a measuring run's last timed step
            started = True
        p = self.profiler
        if p is not None and p.state == "waiting" and self.steps_done == p.starts_after:
            p.start(self.steps_done + 1)
            started = True
        delay = p.window_delay if p is not None else 0
        if self.steps_done == self.settings["warmup_steps"] + delay:
            self._start_window()
            started = True
        return started

    def step_done(self, loss: torch.Tensor, tokens: int) -> None:
        """Call after optimizer.step(): marks the step's end on the clock (no synchronize, no
        .item(): clock.py), logs progress."""
        self._memory.step_end()
        self.steps_done += 1
        p = self.profiler  # a profiled step (speed_ladder.measure.profile) is never timed
        running = p is not None and p.state == "running"
        warm = self.steps_done <= self.settings["warmup_steps"]
        self.clock.step_end(loss, timed=not warm and not running)
        self.curve.step(tokens * self._world())
        if running:  # its range ends with its device work (breakdown.py); outside the window
            dev.synchronize(self.device)
            p.step_ended(self.steps_done)
        elif not warm:
            self.tokens_per_step = tokens
        if self._profile_or_window():
            self.clock.restart()
        now = time.perf_counter()
        if now - self._t_print > 2.0 or self.finished:  # every rank reads what has passed
            self._t_print = now
            total = self.settings["max_steps"] or "?"
            self.print(self.clock.progress(self.steps_done, total, tokens * self._world()))

    def _world(self) -> int:
        d = process_group()
        return d.get_world_size() if d else 1

    # ------------------------------------------------------------ the record
    def finish(self, train_loss: float | None, val_loss: float | None) -> dict:
        """Reduce across ranks, print the summary and append the record (rank 0)."""
        if self.profiler is not None:
            self.profiler.close()  # a profile the data cut short keeps its whole steps
        self.curve.pause()  # the training is over
        if val_loss is not None:
            self.curve.add(val_loss)  # the final evaluation
        if self._window == "open":  # an epoch-mode run, or the data ran out
            self._end_window()
        self.clock.read(wait=True)  # the losses of the steps after it (profiled)
        if not self.step_times:
            but = ""
            if self.profiler is not None and self.profiler.profiled:
                but = f" ({self.profiler.profiled} profiled)"
            raise UserError(
                f"no timed steps: the run ended after {self.steps_done} steps, all warm-up{but}; "
                "raise --max-steps/--epochs or lower --warmup-steps"
            )
        reserved, allocated = self._window_peak or self._memory.peak()
        busy = self._busy
        if self._window_note:
            self.note(self._window_note)
        if cpu_load.busy_note(busy.get("other_load")):
            self.note(cpu_load.busy_note(busy["other_load"]))
        m = across_ranks(
            Measured(
                tokens=self.tokens_per_step,
                step_time=statistics.median(self.step_times),
                reserved=reserved,
                allocated=allocated,
                losses=list(self.losses),
                train_loss=train_loss,
                val_loss=val_loss,
            ),
            self.device,
        )
        tps = m.tokens / m.step_time
        world = self._world()
        mfu, mfu_invalid = mfu_of(tps, self, world)
        hfu = hfu_of(mfu, self)  # where the rung recomputes its forward
        rec = base_record(self, "ok", world)
        rec.update(
            tokens_per_sec=round(tps, 1),
            step_time_ms=round(m.step_time * 1000, 3),
            peak_mem_reserved_bytes=m.reserved,
            peak_mem_allocated_bytes=m.allocated,
            mfu=round(mfu, 5) if mfu is not None else None,
            hfu=round(hfu, 5) if hfu is not None else None,
            train_loss=m.train_loss,
            val_loss=m.val_loss,
            losses=m.losses,
            timed_steps=len(self.step_times),
            tokens_per_step=m.tokens,
            flops_per_token=self.flops_per_token,
            peak_mem_reserved_per_rank=m.reserved_per_rank,
            **busy,
            **self._idle.fields(sum(self.step_times) / len(self.step_times)),
            **self.clock.phases.fields(self.note),  # phase_ms, data_share
            **self.curve.fields(m.step_time, self.settings["warmup_steps"]),  # curve, to_loss
        )
        if rec["gpu_idle_share"] is None and self.device.type == "cuda":
            self.note(f"GPU idle share: none ({rec['gpu_idle_source']})")
        if mfu_invalid is not None:
            rec["mfu_invalid"] = mfu_invalid
        if self.profiler is not None:
            rec.update(self.profiler.fields())  # time_breakdown, trace (measure/profile.py)
        rec = {k: rec[k] for k in FIELDS} | {k: v for k, v in rec.items() if k not in FIELDS}
        gib = (m.reserved or 0) / 2**30
        self.print(
            f"[{self.step}] done: {tps:,.0f} tok/s ({world} x {self.batch_size} x "
            f"{rec['context_length']} tokens / {m.step_time * 1000:.1f} ms median over "
            f"{len(self.step_times)} timed steps)  peak mem {gib:.2f} GiB  "
            f"MFU {'invalid' if mfu_invalid else '-' if mfu is None else f'{mfu:.1%}'}"
            f"{f' (HFU {hfu:.1%})' if hfu else ''}  train loss "
            f"{'-' if m.train_loss is None else f'{m.train_loss:.3f}'}  val loss "
            f"{'-' if m.val_loss is None else f'{m.val_loss:.3f}'}"
        )
        self._write(rec)
        return rec

    def _write(self, rec: dict) -> None:
        if self.args.results and self.is_rank0 and not self._written:
            self._written = True  # one try: a failure record would fail the same way
            try:
                append_jsonl(self.args.results, rec)
            except OSError as e:  # a disk that filled up during the run: keep the record
                print(json.dumps(rec), flush=True)
                raise UserError(
                    f"cannot write the record to {self.args.results}: {os_error_why(e)}; the "
                    "record is printed on stdout above: append that line to the file by hand"
                ) from None

    def write_failure(self, status: str, reason: str) -> None:
        try:
            if self.snapshot is not None:  # what led to a failure, out of memory included
                self.snapshot.dump(self.note)
            rec = base_record(self, status, self._world())
            rec["reason"] = reason
            self._write(rec)
        except Exception as e:  # never hide the original error behind this one
            print(f"(could not write the failure record: {e})", file=sys.stderr)
