"""When a run evaluates, samples and stops. A tutorial run (no --max-steps, no --results) trains
its epochs, evaluates every `eval_freq` steps and samples at each epoch's end; a measuring run (as
the sweep's) evaluates once, after its last step: an evaluation inside it costs wall time no record
shows, and its pause empties the allocator's cache. A --to-loss run evaluates every
`eval_tokens` tokens and stops at its target or budget (curve.py)."""

from dataclasses import dataclass

from speed_ladder.measure.curve import LossCurve
from speed_ladder.spec import RunSpec


@dataclass
class Schedule:
    spec: RunSpec
    measuring: bool  # --max-steps or --results given
    curve: LossCurve

    def eval_due(self, steps_done: int) -> bool:
        if self.spec.to_loss is not None:
            return self.curve.eval_due()
        f = self.spec.eval_freq
        return bool(f) and not self.measuring and steps_done % f == 0

    def sample_due(self) -> bool:
        """Epoch-end samples belong to tutorial runs: they take time and measure nothing."""
        return not self.measuring

    def finished(self, steps_done: int, profiling: bool) -> bool:
        """The last step is done: --max-steps reached (`profiling`: profiled steps are to come
        after it), or the target or budget of a --to-loss run."""
        m = self.spec.max_steps
        return (m is not None and steps_done >= m and not profiling) or self.curve.done()
