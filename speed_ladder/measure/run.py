"""`Run`: what a step calls to time its steps and write its record, in parts: its settings
(spec.py), the clock (clock.py), the timed window (window.py), the evaluation schedule
(schedule.py), the loss curve (curve.py) and the recorder (run_record.py). How it measures:
docs/measurement.md. The one MFU formula: tokens/s x (6N + 12*L*H*Q*T) / (peak x devices), N the
parameters in matmuls (embedding tables left out), over the device's dense bf16 peak (PaLM,
Chowdhery et al. 2022, app. B; run_record.flops_per_token)."""

import datetime as dt
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from speed_ladder.errors import UserError, on_failure
from speed_ladder.files import check_cache_dir
from speed_ladder.measure import attention_kernel, matmul_peak, profile, rung_checks
from speed_ladder.measure import device as dev
from speed_ladder.measure.across_ranks import Measured, across_ranks, process_group
from speed_ladder.measure.clock import StepClock
from speed_ladder.measure.cpu_load import busy_note
from speed_ladder.measure.curve import LossCurve
from speed_ladder.measure.data import gpt2_tokenizer, load_split
from speed_ladder.measure.memory_snapshot import from_args as memory_snapshot
from speed_ladder.measure.rank_memory import announce
from speed_ladder.measure.run_record import (
    Recorder,
    base_record,
    flops_per_token,
    hfu_of,
    mfu_of,
)
from speed_ladder.measure.schedule import Schedule
from speed_ladder.measure.settings import refuse_unused, resolve_spec
from speed_ladder.measure.window import TimedWindow
from speed_ladder.records import FIELDS
from speed_ladder.writable import check_file

# The GPT_CONFIG settings a preset sets (every preset sets them all); vocab_size is the step's.
MODEL_KEYS = ("context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")


class Run:
    def __init__(self, args, step: str, script: str):
        self.args, self.step = args, step
        self.script = Path(script).resolve()
        self.started = (dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), time.time())
        is_rank0 = int(os.environ.get("RANK", "0")) == 0
        self.recorder = Recorder(step, args.results, is_rank0)
        self.device = dev.resolve(args.device)
        # every place this run writes, checked now rather than after the training
        if args.results is not None and is_rank0:
            check_file(args.results, "--results")
        check_cache_dir()
        self.snapshot = memory_snapshot(args, self.device)  # --memory-snapshot: CUDA only
        self.spec = resolve_spec(vars(args), self.device.type, dev.gpu_memory(self.device))
        self.print(
            f"[{step}] preset {self.spec.preset} ({self.spec.why}); device "
            f"{self.device.type}: {dev.name(self.device)}"
        )
        if self.spec.batch_rule is not None:  # a GPU too small for the preset's batch
            self.note(f"batch rule: {self.spec.batch_rule.reason}")
        refuse_unused(self.spec, step)  # --accum-steps where the rung does not use it

        self.steps_done = 0
        self.clock = StepClock(self.device)  # step times and losses (clock.py)
        self.step_times, self.losses = self.clock.times, self.clock.losses  # its lists, read
        self.tokens_per_step = 0
        self.flops_per_token = None
        self.cfg, self.batch_size, self.fused_loss = None, None, None
        self._t_print = 0.0
        self.window = TimedWindow(self.device, is_rank0)
        self.memory_prediction: dict = {}  # rank_memory.announce, before the first step
        self.profiler = profile.from_args(
            args, self.spec, self.device, self.recorder, self.started[0]
        )  # --profile/--trace, else None
        # the SDPA kernel the training call ran, and the rungs that judge by it
        self.attention = attention_kernel.Watch(
            step, self.device, self.spec.warmup_steps, self._kernel_found
        )
        self.curve = LossCurve(self.spec.to_loss)  # evaluations on the training clock
        measuring = args.max_steps is not None or args.results is not None
        self.schedule = Schedule(self.spec, measuring, self.curve)
        on_failure.register(self.write_failure)  # from here on, a failure can be recorded

    # ------------------------------------------------------------ helpers for the step
    @property
    def notes(self) -> list[str]:
        return self.recorder.notes

    def print(self, *a, **k) -> None:
        self.recorder.say(*a, **k)

    def note(self, text: str) -> None:
        """A remark for the record, e.g. why an optimization does nothing on this device."""
        self.recorder.note(text)

    def model_overrides(self) -> dict:
        """The preset's model settings, which replace GPT-2 124M's in a step's GPT_CONFIG:
        `GPT_CONFIG = {...124M...} | run.model_overrides()`."""
        return {k: getattr(self.spec, k) for k in MODEL_KEYS}

    def tokenizer(self):
        return gpt2_tokenizer()

    def load_tokens(self, context_length: int, batch_size: int):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return load_split(self.args.data, context_length, batch_size, world)

    def _facts(self, kernel: str | None = None) -> rung_checks.Facts:
        return rung_checks.Facts(
            self.step, self.device, self.cfg, self.spec, self.batch_size, kernel
        )

    def _kernel_found(self, kernel: str | None, how: str) -> None:
        """The attention kernel known (after the warm-up): noted, and the rungs that judge by it
        asked (rung_checks.py)."""
        self.note(f"attention kernel: {kernel or 'unknown'} ({how})")
        judged = rung_checks.reasons(self._facts(kernel or "unknown"), only_after_warmup=True)
        for step, reason, acted in judged:
            self.recorder.inactive(step, reason, acted)

    def set_model(
        self, model: torch.nn.Module, cfg: dict, batch_size: int, fused_loss=None
    ) -> None:
        """Right before the training loop: why each rung of this step does nothing here, the
        memory prediction, FLOPs per token, and the clock started. `fused_loss`: step 12's Liger
        module where the step built one (its memory prediction and phase hooks), else None."""
        self.cfg, self.batch_size, self.fused_loss = cfg, batch_size, fused_loss
        self.attention.cfg = cfg
        for step, reason, acted in rung_checks.reasons(self._facts()):
            self.recorder.inactive(step, reason, acted)
        self.memory_prediction = announce(
            self.spec,
            self.step,
            cfg,
            batch_size,
            self.device,
            model,
            fused_loss is not None,
            self.recorder,
        )
        tokens = batch_size * cfg["context_length"] * self._world()  # a step's, all ranks
        budget_given = getattr(self.args, "token_budget", None) is not None
        sized = self.curve.size(tokens, self.spec.warmup_steps, budget_given)
        if sized:
            self.note(sized)
        self.flops_per_token = flops_per_token(model, cfg)
        self.peak = matmul_peak.peak_flops(self.device)  # (FLOP/s, what it is), cached
        if self.profiler is not None:
            self.profiler.attach(model)
        self.clock.phases.attach(model, self.fused_loss)  # data/forward/... hooks (phases.py)
        self._profile_or_window()
        self.clock.restart()
        self.curve.start()

    @property
    def finished(self) -> bool:
        more = self.profiler is not None and self.profiler.wants_more  # profiled steps to come
        return self.schedule.finished(self.steps_done, more)

    def eval_due(self) -> bool:
        return self.schedule.eval_due(self.steps_done)

    def sample_due(self) -> bool:
        return self.schedule.sample_due()

    def evaluated(self, epoch: int, train_loss: float, val_loss: float) -> None:
        """An evaluation's losses (inside run.paused()): printed, and a point of the record's
        loss curve at the tokens and training time so far (measure/curve.py)."""
        self.curve.add(val_loss)
        self.print(
            f"Ep {epoch + 1} (step {self.steps_done:06d}, {self.curve.tokens:,} tokens): "
            f"train loss {train_loss:.3f}, val loss {val_loss:.3f}"
        )

    @contextmanager
    def paused(self):
        """Evaluation, sampling and printing inside this block are not timed, and the memory
        they take is not in the recorded peak (device.PeakWindow)."""
        dev.synchronize(self.device)
        self.curve.pause()
        self.clock.read(wait=True)  # the steps so far, closed before the pause
        self.window.pause()
        try:
            with profile.excluded(self.profiler), self.attention.excluded():  # nor profiled
                yield
        finally:
            dev.synchronize(self.device)
            self.window.resume()
            self.clock.restart()
            self.curve.start()

    # ------------------------------------------------------------ timing
    def _open_window(self) -> None:
        self.window.open()
        self.curve.warmed_up()

    def _close_window(self) -> None:
        self.window.close(self.clock)
        if self.snapshot is not None:
            self.snapshot.dump(self.note)

    def _profile_or_window(self) -> bool:
        """At a step boundary: end the timed window, start the profiled steps (see profile.py)
        or the window when they are due; True if any did (the clock then restarts)."""
        started = self.attention.at(self.steps_done)  # the last warm-up step
        if self.window.state == "open" and self.steps_done == self.spec.max_steps:
            self._close_window()  # a measuring run's last timed step
            started = True
        p = self.profiler
        if p is not None and p.state == "waiting" and self.steps_done == p.starts_after:
            p.start(self.steps_done + 1)
            started = True
        delay = p.window_delay if p is not None else 0
        if self.steps_done == self.spec.warmup_steps + delay:
            self._open_window()
            started = True
        return started

    def step_done(self, loss: torch.Tensor, tokens: int) -> None:
        """Call after optimizer.step(): marks the step's end on the clock (no synchronize, no
        .item(): clock.py), logs progress."""
        self.window.memory.step_end()
        self.steps_done += 1
        p = self.profiler  # a profiled step (speed_ladder.measure.profile) is never timed
        running = p is not None and p.state == "running"
        warm = self.steps_done <= self.spec.warmup_steps
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
            total = self.spec.max_steps or "?"
            self.print(self.clock.progress(self.steps_done, total, tokens * self._world()))

    def _world(self) -> int:
        d = process_group()
        return d.get_world_size() if d else 1

    # ------------------------------------------------------------ the record
    def _base(self, status: str) -> dict:
        return base_record(
            self.recorder,
            status,
            script=self.script,
            device=self.device,
            spec=self.spec,
            world=self._world(),
            batch=self.batch_size,
            cfg=self.cfg,
            attention_kernel=self.attention.kernel,
            memory_prediction=self.memory_prediction,
            started=self.started,
        )

    def _measured(self, train_loss: float | None, val_loss: float | None) -> Measured:
        """The window's figures, across ranks."""
        if not self.step_times:
            but = ""
            if self.profiler is not None and self.profiler.profiled:
                but = f" ({self.profiler.profiled} profiled)"
            raise UserError(
                f"no timed steps: the run ended after {self.steps_done} steps, all warm-up{but}; "
                "raise --max-steps/--epochs or lower --warmup-steps"
            )
        reserved, allocated = self.window.peak or self.window.memory.peak()
        if self.window.start_note:
            self.note(self.window.start_note)
        if busy_note(self.window.busy.get("other_load")):
            self.note(busy_note(self.window.busy["other_load"]))
        m = Measured(
            tokens=self.tokens_per_step,
            step_time=statistics.median(self.step_times),
            reserved=reserved,
            allocated=allocated,
            losses=list(self.losses),
            train_loss=train_loss,
            val_loss=val_loss,
        )
        return across_ranks(m, self.device)

    def finish(self, train_loss: float | None, val_loss: float | None) -> dict:
        """Reduce across ranks, print the summary and append the record (rank 0)."""
        if self.profiler is not None:
            self.profiler.close(self.steps_done)  # a profile the data cut short: whole steps
        self.curve.pause()  # the training is over
        if val_loss is not None:
            self.curve.add(val_loss)  # the final evaluation
        if self.window.state == "open":  # an epoch-mode run, or the data ran out
            self._close_window()
        self.clock.read(wait=True)  # the losses of the steps after it (profiled)
        m = self._measured(train_loss, val_loss)
        tps, world = m.tokens / m.step_time, self._world()
        mfu, invalid = mfu_of(tps, self.flops_per_token, self.peak, world, self.device, self.note)
        hfu = hfu_of(mfu, self.step, self.cfg, self.flops_per_token)  # where it recomputes
        rec = self._base("ok") | {
            "tokens_per_sec": round(tps, 1),
            "step_time_ms": round(m.step_time * 1000, 3),
            "peak_mem_reserved_bytes": m.reserved,
            "peak_mem_allocated_bytes": m.allocated,
            "mfu": round(mfu, 5) if mfu is not None else None,
            "hfu": round(hfu, 5) if hfu is not None else None,
            "train_loss": m.train_loss,
            "val_loss": m.val_loss,
            "losses": m.losses,
            "timed_steps": len(self.step_times),
            "tokens_per_step": m.tokens,
            "flops_per_token": self.flops_per_token,
            "peak_mem_reserved_per_rank": m.reserved_per_rank,
            **self.window.busy,
            **self.window.idle.fields(sum(self.step_times) / len(self.step_times)),
            **self.clock.phases.fields(self.note),  # phase_ms, data_share
            **self.curve.fields(m.step_time, self.spec.warmup_steps),  # curve, to_loss
        }
        if rec["gpu_idle_share"] is None and self.device.type == "cuda":
            self.note(f"GPU idle share: none ({rec['gpu_idle_source']})")
        if invalid is not None:
            rec["mfu_invalid"] = invalid
        if self.profiler is not None:
            rec.update(self.profiler.fields())  # time_breakdown, trace (measure/profile.py)
        rec = {k: rec[k] for k in FIELDS} | {k: v for k, v in rec.items() if k not in FIELDS}
        self.print(self._done_line(tps, world, m, mfu, invalid, hfu))
        self.recorder.write(rec)
        return rec

    def _done_line(self, tps, world, m, mfu, invalid, hfu) -> str:
        mfu_text = "invalid" if invalid else "-" if mfu is None else f"{mfu:.1%}"
        loss = lambda x: "-" if x is None else f"{x:.3f}"
        return (
            f"[{self.step}] done: {tps:,.0f} tok/s ({world} x {self.batch_size} x "
            f"{self.cfg['context_length']} tokens / {m.step_time * 1000:.1f} ms median over "
            f"{len(self.step_times)} timed steps)  peak mem {(m.reserved or 0) / 2**30:.2f} GiB  "
            f"MFU {mfu_text}{f' (HFU {hfu:.1%})' if hfu else ''}  train loss "
            f"{loss(m.train_loss)}  val loss {loss(m.val_loss)}"
        )

    def write_failure(self, status: str, reason: str) -> None:
        try:
            if self.snapshot is not None:  # what led to a failure, out of memory included
                self.snapshot.dump(self.note)
            self.recorder.write(self._base(status) | {"reason": reason})
        except Exception as e:  # never hide the original error behind this one
            print(f"(could not write the failure record: {e})", file=sys.stderr)
