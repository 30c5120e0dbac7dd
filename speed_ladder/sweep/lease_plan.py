"""A plan for a lent GPU (`tools/gpu_session.sh --plan`): which calls, which steps in each,
and how much device time the bounded ladder should take, before any device time is spent.

The lease (docs/gpu-machines.md, "A machine lent for a while"): at most `--lease` 1800 s of
device time a session, each fresh machine's start-up counted (`MACHINE_START_S` = 90 s: the
lease says 1-2 minutes), each command at most 600 s (the plan uses calls of `--budget` 540 s,
the session script's own --budget, leaving 60 s for the lease's transfers), a fresh bare
machine a call (only the packed archive survives). Target: the whole ladder in at most
`--target` 1200 s.

The timing model, per run of a step (every number is an assumption until a GPU measures it):
- tok/s: the published A100 ladder (results/reference/published_a100_ladder.csv, steps 00-10;
  rasbt/LLMs-from-scratch, not measured here). Not in it on one GPU, assumed: step 11 (DDP, one
  process) at step 10's rate (the csv's 11 is 4 GPUs), 12 at 10's rate, 13 at 0.75x of 12
  (gradient checkpointing recomputes the forward), 14 at 0.9x of 13 (FSDP2 on one process).
- scaled to `--gpu` by the ratio of dense bf16 peaks in speed_ladder/measure/gpus.py (H100 SXM 989.5
  / A100 312 TFLOP/s = 3.17x), fp32 steps (00-04) by the same ratio (one ratio, kept simple), and to
  a larger preset by the ratio of matmul parameters (12 d^2 L + d V) to gpt2-124m's.
- tokens: (warm-up + timed steps, presets.SWEEP_LENGTH: 10 + 50) x batch x context, batch =
  the preset's batch_size, large_batch_size from step 10 on (gpt2-124m: 8, then 32; x 1024).
- a run's seconds = `PROCESS_S` 15 (python + torch import, the data) + `TORCHRUN_S` 5 for a
  step launched through torchrun (11-14) + tokens / tok/s + `EVAL_S` 5 (eval_freq 50: two
  evaluations of eval_iters batches, forward only) + `PROFILE_S` 10 (the session's --profile
  window after the timed steps) + compile: `COMPILE_S` 40 on an H100 for a step that calls
  torch.compile (08-14; one compile a run).
- with `--results DIR` (a tag's runs.jsonl), a step's measured durations replace the model
  (preflight.run_seconds: the median of its ok runs) and measured compile seconds replace
  `COMPILE_S` (preflight.compile_seconds, else step 08's).
Calls are packed greedily in ladder order: a call holds the runs whose expected seconds fit its
budget less its machine's start-up and `MARGIN_S` 65 s (the session script keeps 45 s after the
last phase for the summary, the charts and the pack, and 20 s for stopping a test). The GPU tests
come after the sweep, as tools/gpu_session.sh runs them: `--tests` seconds (`TESTS_S` 150 s, the
fast part `-m "gpu and not slow"` on an H100: about 20 s of pytest and imports, 40 s of Liger's
Triton kernels compiling, 45 s for three eager gpt2-124m runs of the peak test, 30 s for two DDP
starts, a guess until a GPU measures it) in the last call's time left, else in a call of their
own. `total` is the ladder's device time (its calls' start-ups and runs), the 20-minute target;
`session` adds the tests, within the lease.
"""

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from speed_ladder.ladder import ROOT, discover, parse_steps
from speed_ladder.measure import gpus
from speed_ladder.presets import GPT2_VOCAB, PRESETS, SWEEP_LENGTH
from speed_ladder.spec import config_of
from speed_ladder.sweep import preflight

CSV = ROOT / "results" / "reference" / "published_a100_ladder.csv"
A100 = "NVIDIA A100-SXM4-80GB"  # the published ladder's GPU (its bf16 peak: gpus.py)
DEFAULT_GPU = "NVIDIA H100 80GB HBM3"  # the lent H100 (gpus.py: the SXM board)
MACHINE_START_S = 90.0
PROCESS_S = 15.0
TORCHRUN_S = 5.0
EVAL_S = 5.0
PROFILE_S = 10.0
COMPILE_S = 40.0
MARGIN_S = 65.0
TESTS_S = 150.0
ASSUMED = {"11": ("10", 1.0), "12": ("10", 1.0), "13": ("12", 0.75), "14": ("13", 0.9)}


@dataclass
class Run:
    step: str
    seconds: float
    measured: bool = False


@dataclass
class Call:
    number: int
    runs: list  # [Run]
    budget: float
    tests: float = 0.0  # expected seconds of the GPU tests in this call, after its runs

    @property
    def seconds(self) -> float:
        return MACHINE_START_S + sum(r.seconds for r in self.runs) + self.tests


def a100_rates(path: Path = CSV) -> dict[str, float]:
    """Single-GPU tok/s a step on the A100, the csv's and the assumed ones (ASSUMED)."""
    with open(path, newline="") as f:
        rates = {r["step"]: float(r["tokens_per_sec"]) for r in csv.DictReader(f)
                 if r["hardware"].startswith("1x")}  # fmt: skip
    for step, (base, factor) in ASSUMED.items():
        rates[step] = rates[base] * factor
    return rates


def matmul_params(p: dict) -> float:
    return 12 * p["emb_dim"] ** 2 * p["n_layers"] + p["emb_dim"] * GPT2_VOCAB


def load_records(results: Path | None) -> list[dict]:
    path = results / "runs.jsonl" if results and results.is_dir() else results
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def expected(step, preset: str, gpu: str, recs: list[dict]) -> Run:
    """One run's expected seconds (the module doc's model, or this tag's measurements)."""
    mine = [r for r in recs if r.get("step") == step.num]
    if recs:
        last = recs[-1].get("sweep") or {}
        cmp = preflight.compile_seconds(step, recs, config_of(recs[-1]), last.get("machine"))
        took, measured = preflight.run_seconds(step, mine, "cuda", cmp)
        if measured:
            return Run(step.num, took, True)
    else:
        cmp = None
    p = PRESETS[preset]
    ratio = gpus.lookup(gpu).flops / gpus.lookup(A100).flops
    rate = a100_rates()[step.num] * ratio * matmul_params(PRESETS["gpt2-124m"]) / matmul_params(p)
    length = SWEEP_LENGTH.get(preset, {"warmup_steps": 10, "timed_steps": 50})
    batch = p["large_batch_size"] if step.num >= "10" else p["batch_size"]
    tokens = (length["warmup_steps"] + length["timed_steps"]) * batch * p["context_length"]
    s = PROCESS_S + tokens / rate + EVAL_S + PROFILE_S
    s += TORCHRUN_S if step.distributed else 0.0
    s += (cmp or COMPILE_S) if preflight.uses_compile(step.path) else 0.0
    return Run(step.num, s)


def plan(runs: list[Run], budget: float, tests: float = 0.0) -> list[Call]:
    """Greedy packing in ladder order, then the tests in the last call's time left or a call of
    their own; a run that fits no call still gets one of its own (and `fits` then says over)."""
    calls: list[Call] = []
    room = budget - MACHINE_START_S - MARGIN_S
    for run in runs:
        used = calls[-1].seconds - MACHINE_START_S if calls else 0.0
        if not calls or (calls[-1].runs and used + run.seconds > room):
            calls.append(Call(len(calls) + 1, [], budget))
        calls[-1].runs.append(run)
    if tests:
        if not calls or calls[-1].seconds - MACHINE_START_S + tests > room:
            calls.append(Call(len(calls) + 1, [], budget))
        calls[-1].tests = tests
    return calls


def total(calls: list[Call]) -> float:
    """The ladder's device time: its calls' start-ups and runs (the tests left out)."""
    return sum(c.seconds - c.tests for c in calls if c.runs)


def session(calls: list[Call]) -> float:
    """Everything: the ladder and the tests, start-ups included."""
    return sum(c.seconds for c in calls)


def fits(calls: list[Call], target: float, lease: float) -> bool:
    within = all(c.seconds + MARGIN_S <= c.budget for c in calls)
    return within and total(calls) <= target and session(calls) <= lease


def report(calls: list[Call], target: float, lease: float, gpu: str, preset: str) -> list[str]:
    peak = gpus.lookup(gpu)
    ratio = peak.flops / gpus.lookup(A100).flops
    out = [
        f"plan: {preset} on {gpu} ({peak.label}, {peak.flops / 1e12:.1f} TFLOP/s {peak.precision}"
        f" = {ratio:.2f}x the A100's 312); lease {lease:.0f} s, calls of {calls[-1].budget:.0f} s",
        "model: A100 tok/s (published csv) x peak ratio; assumed: 11 and 12 at 10's rate, 13 at "
        "0.75x of 12, 14 at 0.9x of 13",
        f"  a run: {PROCESS_S:.0f} s start-up (+{TORCHRUN_S:.0f} torchrun) + tokens/rate + "
        f"{EVAL_S:.0f} s eval + {PROFILE_S:.0f} s profile (+{COMPILE_S:.0f} s compile if not "
        f"measured); a call: +{MACHINE_START_S:.0f} s machine start-up, {MARGIN_S:.0f} s margin",
    ]
    for c in calls:
        what = []
        if c.runs:
            steps = " ".join(f"{r.step}={r.seconds:.0f}s{'*' * r.measured}" for r in c.runs)
            what.append(f"steps {c.runs[0].step}-{c.runs[-1].step}: {steps}")
        if c.tests:
            what.append(f"then the GPU tests {c.tests:.0f}s (--tests)")
        out.append(f"call {c.number}: {'; '.join(what)}; "
                   f"{c.seconds:.0f} s with start-up (budget {c.budget:.0f} s)")  # fmt: skip
    if any(r.measured for c in calls for r in c.runs):
        out.append("  * measured (--results)")
    out.append(f"session: {session(calls):.0f} s ({session(calls) / 60:.1f} min) of the "
               f"{lease:.0f} s lease, the tests included")  # fmt: skip
    t = total(calls)
    word = "within" if fits(calls, target, lease) else "over"
    out.append(f"total: {t:.0f} s ({t / 60:.1f} min) of device time, {word} the "
               f"{target / 60:.0f}-minute target")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/gpu_session.sh --plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--gpu", default=DEFAULT_GPU, help="a torch.cuda.get_device_name()")
    ap.add_argument("--preset", default="gpt2-124m", choices=list(PRESETS))
    ap.add_argument("--budget", type=float, default=540.0, help="seconds a call")
    ap.add_argument("--lease", type=float, default=1800.0, help="device seconds a session")
    ap.add_argument("--target", type=float, default=1200.0, help="device seconds, the ladder")
    ap.add_argument("--steps", default="00-14")
    ap.add_argument("--tests", type=float, default=TESTS_S,
                    help="expected seconds of the GPU tests after the sweep (0: none)")  # fmt: skip
    ap.add_argument("--slower", type=float, default=1.0, help="every run this many times slower")
    ap.add_argument("--results", type=Path, help="a tag's folder (runs.jsonl): measured times")
    a = ap.parse_args(argv)
    if gpus.lookup(a.gpu) is None or gpus.lookup(a.gpu).flops is None:
        print(
            f"error: --gpu {a.gpu!r}: not in speed_ladder/measure/gpus.py's table", file=sys.stderr
        )
        return 2
    recs = load_records(a.results)
    steps = parse_steps(a.steps, discover())
    runs = [expected(s, a.preset, a.gpu, recs) for s in steps]
    for r in runs:
        r.seconds *= a.slower
    calls = plan(runs, a.budget, a.tests)
    print("\n".join(report(calls, a.target, a.lease, a.gpu, a.preset)))
    return 0 if fits(calls, a.target, a.lease) else 1


if __name__ == "__main__":
    from speed_ladder.errors import pipe_safe

    raise SystemExit(pipe_safe(main))
