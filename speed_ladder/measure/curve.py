"""A run's loss curve on its training clock, and its time to a target loss (`--to-loss`;
docs/measurement.md, Time to a target loss). Each evaluation adds [tokens, train_s, val_loss];
`train_s` is the wall time between the pauses, so evaluation is never in it. A --to-loss run
evaluates every `eval_tokens` tokens on the same validation tokens on every rung and stops at its
target (read linearly between two evaluations) or budget, with timed steps always (`size`)."""

import math
import time
from dataclasses import asdict

from speed_ladder.errors import UserError

MIN_TIMED_STEPS = 5  # a to-loss run's fewest timed steps: their median counts its warm-up


def val_batches(val_tokens: int, batch: int, context_length: int) -> int:
    """Evaluation batches of `batch` sequences that cover the first `val_tokens` tokens of the
    validation split (its loader keeps their order)."""
    return max(1, math.ceil(val_tokens / (batch * context_length)))


def crossing(before: list | None, at: list, target: float) -> list:
    """[tokens, train_s] where the validation loss crossed `target`: linear between the last
    evaluation above it (`before`) and the first at or below it (`at`), each [tokens, train_s,
    loss]; `at` itself where nothing came before or it was already below."""
    if before is None or before[2] <= target:
        return at[:2]
    frac = (before[2] - target) / (before[2] - at[2])
    return [round(b + frac * (a - b), 3) for b, a in zip(before[:2], at[:2], strict=True)]


class LossCurve:
    """The training clock, the tokens trained on and the evaluations (see the module doc);
    `to_loss`: the run's --to-loss settings, or None."""

    def __init__(self, to_loss: dict | None):
        self.to_loss = to_loss
        self.budget = to_loss.budget_tokens if to_loss else None  # may grow: `size`
        self.floor = 0  # tokens trained before the run may stop at its target: `size`
        self.step_tokens = 0  # tokens a step, all ranks
        self.points: list[list] = []  # [tokens, train_s, val_loss]
        self.tokens = 0
        self.warmup_s: float | None = None
        self.reached: list | None = None  # [tokens, train_s] where the loss crossed the target
        self._train_s = 0.0
        self._since: float | None = None  # the clock's last (re)start; None while paused
        self._evaluated_at = 0  # tokens at the last evaluation

    # ------------------------------------------------------------ the training clock
    def start(self) -> None:
        """The training clock runs (set_model, and after each pause)."""
        self._since = time.perf_counter()

    def pause(self) -> None:
        """The training clock stops (the device synchronized before it)."""
        if self._since is not None:
            self._train_s += time.perf_counter() - self._since
            self._since = None

    def train_s(self) -> float:
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._train_s + running

    def warmed_up(self) -> None:
        """The warm-up steps are done (the timed window's start, synchronized)."""
        if self.warmup_s is None:
            self.warmup_s = self.train_s()

    def step(self, tokens: int) -> None:
        self.tokens += tokens

    def size(self, step_tokens: int, warmup_steps: int, budget_given: bool) -> str | None:
        """--to-loss at `step_tokens` tokens a step (the batch the rung picked, all ranks): the
        run trains its warm-up and MIN_TIMED_STEPS steps at least, and the preset's budget grows
        to that (a note says so); a --token-budget (`budget_given`) that leaves no timed step
        is a UserError."""
        if self.to_loss is None:
            return None
        self.step_tokens = step_tokens
        self.floor = (warmup_steps + MIN_TIMED_STEPS) * step_tokens
        least = (warmup_steps + 1) * step_tokens
        if budget_given and self.budget < least:
            raise UserError(
                f"--token-budget {self.budget:,} leaves no timed step: {warmup_steps} warm-up "
                f"steps of {step_tokens:,} tokens come first; give at least {least:,}"
            )
        if budget_given or self.budget >= self.floor:
            return None
        self.budget = self.floor
        return (
            f"token budget raised to {self.floor:,}: {warmup_steps} warm-up and "
            f"{MIN_TIMED_STEPS} timed steps of {step_tokens:,} tokens"
        )

    # ------------------------------------------------------------ evaluations and the target
    def eval_due(self) -> bool:
        """--to-loss: another `eval_tokens` tokens trained on since the last evaluation."""
        if self.to_loss is None:
            return False
        return self.tokens - self._evaluated_at >= self.to_loss.eval_tokens

    def add(self, val_loss: float) -> None:
        """An evaluation's validation loss, at the tokens and training time so far."""
        self._evaluated_at = self.tokens
        if self.points and self.points[-1][0] == self.tokens:
            return  # the run's final evaluation, right after the last one: the same point
        point = [self.tokens, round(self.train_s(), 3), float(val_loss)]
        before = self.points[-1] if self.points else None
        self.points.append(point)
        target = self.to_loss and self.to_loss.target
        if target and self.reached is None and val_loss <= target:
            self.reached = crossing(before, point, target)

    def done(self) -> bool:
        """--to-loss: the target reached, or the token budget spent."""
        if self.to_loss is None:
            return False
        reached = self.reached is not None and self.tokens >= self.floor
        return reached or self.tokens >= self.budget

    def fields(self, median_step_s: float | None, warmup_steps: int) -> dict:
        """The record's `curve`, `warmup_s` and `to_loss` (None without --to-loss)."""
        warmup_s = self.warmup_s if self.warmup_s is not None else 0.0
        out = {"curve": self.points, "warmup_s": round(warmup_s, 3), "to_loss": None}
        if self.to_loss is None:
            return out
        result = asdict(self.to_loss) | {"budget_tokens": self.budget}
        result["reached"] = self.reached is not None
        result.update(tokens=None, train_s=None, time_s=None)
        if self.reached is not None:
            tokens, train_s = self.reached
            steady = warmup_steps * median_step_s if median_step_s else warmup_s
            time_s = train_s - warmup_s + steady
            if train_s < warmup_s and median_step_s and self.step_tokens:  # inside the warm-up
                time_s = tokens / self.step_tokens * median_step_s
            result.update(tokens=round(tokens), train_s=train_s, time_s=round(time_s, 3))
        out["to_loss"] = result
        return out
