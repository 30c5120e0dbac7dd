"""What a lent GPU's session costs, for the lease plan (lease_plan.py): each step's run, a call's
set-up and end, a machine's start-up, and where each number comes from.

Measured on one H200 on 2026-11-27 (../shared/gpu-runs/2026-11-27-h200/, committed as
results/nvidia-h200-x1/runs.jsonl; two calls of tools/gpu_session.sh on one warm machine):
- **a run**: each step's record `sweep.duration_s`, the wall time the sweep saw (process start,
  torchrun, a cold torch.compile, 60 steps, evaluation and the --profile window): 00 29 s ... 13
  81 s, 491 s for the 13 runs. The record's own `duration_s` (376 s for the 13) is the time inside
  the step's process only, and leaves out 115 s. The median of a step's ok runs
  (preflight.run_seconds, as the sweep's --budget reckons it).
- `BETWEEN_RUNS_S` 1 s: the sweep's own time between runs (sweep.log's elapsed against "in N s").
- `SETUP_S` 26 s: gpu_session.sh before the sweep (the wheel, the Liger check, versions, pip
  freeze, nvidia-smi): each call's --budget less its sweep's budget less the 45 s it keeps
  (485 - 45 - 414 and 320 - 45 - 249). `SWEEP_START_S` 5 s: the sweep's imports and plan.
- `END_S` 20 s: what followed the sweep in call 2 (240 s of command time, 26 s of set-up, 194 s
  of sweep, its summary and charts included): the pack, which gzipped the 86 MiB compile cache,
  found the archive over the 16 MiB --pack-limit and archived again without it. A lease's calls
  pass `--no-cache-pack` (the cache can never come back: over 16 MiB a file, and carry holds
  64 MiB in all): one tar of ~2 MB. `END_LEAN_S` 8 s for it, assumed.
- `SETUP_AGAIN_S` 3 s, assumed: a later call on the same warm machine into the same OUT, where
  gpu_session.sh finds its own `.setup` mark (this boot's id) and skips the wheel install, the
  Liger check and the machine's description (nvidia-smi, pip freeze, versions: three Python
  starts importing torch, 5.6 s each on this project's 2-core CPU, and pip freeze 2.4 s).
- `MID_EVAL`: every measuring run evaluated at step 50 (sweep.log: "Ep 1 (step 000050): train
  loss ...", gpt2-124m's eval_freq 50) as well as at its end: 2 x eval_iters (5) forward passes
  at the run's batch, eager (compiled steps evaluate under set_stance("force_eager")). A forward
  is taken as a third of a training step, and a compiled step's eager forward as 1.75x its
  compiled one (step 07 eager 46.7 ms against step 08 compiled 26.8 ms a step): 0.16-0.74 s a
  run, 6 s over the 15. The lead developer's change to measure/run.py (a measuring run, with
  --max-steps or --results, evaluates at its end only) removes it; `MID_EVAL_SKIPPED` says the
  plan counts on that change (until it lands each run is that much longer, inside SLACK).
- `KINDS["nvidia-h200"].start_s` 30 s: that session's machine start-up.

Not measured, and said so where the plan prints them:
- steps 11 and 14 have no sweep record (run by hand with 40 steps and a warm compile cache:
  step11-1proc.*, step14-1proc.*). Modelled from the tag: 11 as step 12's run (both through
  torchrun on one process, batch 32, compiled cold; 11's hand run took 34.6 s in its process for
  40 steps, 12's 42.2 s for 60), 14 as 1.1x step 13's (FSDP2 over 13: 123 ms a step by hand
  against 13's 93 ms, 2 s over 60 steps, and its wrapping; 10% on top).
- a step measured nowhere (a new rung): `ASSUMED_RUN_S` 90 s, the slowest measured run and more.
- `TESTS_S` 70 s, the fast GPU tests (tests/test_gpu.py, `gpu and not slow`; never run on CUDA):
  ~10 s of pytest and imports, 2 s for the peak table and batch rule, ~40 s for the seven Liger
  tests (Triton compiles its kernels once; one runs step 12's loss at gpt2-124m's shape), ~10 s
  for step 11 as a world of one under plain python, rounded up. In a session the peak test
  (steps 10, 12, 13 at gpt2-124m) and the torchrun DDP test read the records the sweep has just
  written on this GPU (tests/session_records.py) instead of running three gpt2-124m processes
  and a torchrun again (~55 s: 150 s were estimated with them). At their limits
  (@pytest.mark.limit) the tests could take 960 s: the --budget cuts them. `LONGEST_TEST_S` 30 s:
  the longest single test (a Liger test's first Triton compile, or the step-11 process), what a
  cut test costs to run again.
- `TRANSFER_S` 10 s a call (the ~6 MB tree and ~4 MB .carry/ out, an archive of at most 16 MiB
  back), `GAP_S` 30 s between calls (the most that keeps the machine), `CLOSE_S` 10 s for
  give_back; `PROFILE_S` 4.5 s a run that --no-profile would save (sweep.log: "profile analysed
  in 0.7-4.6 s", 3 profiled steps, the profiler's start).
- **current** (what a plan may leave out and resume): a step whose committed record is an ok sweep
  run of the file as it is now (`sweep.script_sha256` == records.file_sha256, as the summary
  matches records), of the lease's configuration (`LEASE_CONFIG`: gpt2-124m, the sweep's length,
  the carried text, the seed; nproc aside) on this kind's GPU, one of them. A record of another
  version of the script still gives the step's duration, but the step must run again: commit
  870e67d changed every step file, so no 2026-11-27 record is current.
- the H100 (`nvidia-h100-x1`): no run measured there. Its start-up is taken as 90 s (the device
  tool's README: a cold start takes "a minute or more", and a start that fails costs 1-2
  minutes); its runs as 1.2x the H200's (the same bf16 rate, 798 vs 788 TFLOP/s measured by the
  device tool, 3.0 against 4.3 TB/s of copy bandwidth: the eager steps are partly memory-bound,
  process start and compiles are not).
"""

from dataclasses import dataclass
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.records import file_sha256, read_jsonl
from speed_ladder.spec import config_of
from speed_ladder.sweep import preflight

BETWEEN_RUNS_S = 1.0
SETUP_S = 26.0
SWEEP_START_S = 5.0
END_S = 20.0
END_LEAN_S = 8.0
SETUP_AGAIN_S = 3.0
TESTS_S = 70.0
LONGEST_TEST_S = 30.0
TRANSFER_S = 10.0
IDLE_S = 30.0
GAP_S = 30.0
CLOSE_S = 10.0
PROFILE_S = 4.5
ASSUMED_RUN_S = 90.0
MID_EVAL_SKIPPED = True  # measure/run.py: a measuring run evaluates at its end only
EVAL_FORWARDS = 2 * 5  # train and val, gpt2-124m's eval_iters
EAGER_OVER_COMPILED = 1.75  # step 07's 46.7 ms a step against step 08's 26.8 ms
# what a lease's calls carry and pass (docs/gpu-machines.md): the text, the BPE files and the
# liger wheel in .carry/, named by every call of both plans (lease_plan.py, lease_session.py)
CARRY = [".carry"]
FLAGS = "--data .carry/middlemarch.txt --bpe .carry/gpt2_bpe --wheels .carry/wheels"
SLACK = 1.1  # both plans: the planned work, this much slower, must fit its --budget
KEPT_S = 30  # gpu_session.sh's MARGIN without a cache to pack: its sweep ends that much before
# --budget (every lease call passes --no-cache-pack, or no --pack at all)
# a lease's sweep (FLAGS: the carried text; presets.SWEEP_LENGTH; the default seed)
LEASE_CONFIG = {"device": "cuda", "preset": "gpt2-124m", "max_steps": 60, "warmup_steps": 10,
                "data": ".carry/middlemarch.txt", "seed": 123}  # fmt: skip
# the sweep's own estimate of a run with no record (preflight: 60 s, step 08's compile measured)
SWEEP_GUESS_S = 86.0


@dataclass(frozen=True)
class Kind:
    name: str  # the device tool's kind
    gpu: str
    tag: str  # the results/ folder whose durations it uses
    start_s: float
    factor: float  # its runs against that tag's
    host_id: str  # SPEED_LADDER_HOST_ID: one pool with that tag's records
    why: str


KINDS = {
    "nvidia-h200": Kind("nvidia-h200", "NVIDIA H200", "nvidia-h200-x1", 30.0, 1.0, "h200-lease",
                        "start-up and runs measured on one, 2026-11-27"),
    "nvidia-h100-x1": Kind("nvidia-h100-x1", "NVIDIA H100 80GB HBM3", "nvidia-h200-x1", 90.0, 1.2,
                           "h100-lease", "assumed: runs 1.2x the H200's, a cold start"),
}  # fmt: skip


@dataclass
class PlannedRun:
    """One step's run as a lease's plan expects it (measure/run.py's `Run` is the run itself)."""

    step: str
    seconds: float
    source: str  # measured, modelled or assumed
    compiled: bool = False
    why: str = ""
    current: bool = False  # a committed record of the file as it is now (is_current)
    expected: float = SWEEP_GUESS_S  # what the sweep expects of it (its --budget's start check)

    @property
    def mark(self) -> str:
        return {"measured": "", "modelled": "~", "assumed": "?"}[self.source]


def measured(tag: Path, name: str) -> tuple[list, str]:
    """(the tag's records, what they are) from its runs.jsonl: records.read_jsonl (a torn line
    is skipped); no file is no records, said."""
    path = tag / "runs.jsonl" if tag.is_dir() else tag
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise UserError(f"--results {tag}: not a tag folder or a runs.jsonl")
    if not path.is_file():
        return [], f"none ({name} not found): every step assumed"
    recs = [r for r in read_jsonl(path) if isinstance(r, dict)]
    ok = [r for r in recs if r.get("status") == "ok"]
    days = sorted({str(r.get("started_at", ""))[:10] for r in ok} - {""})
    return recs, (f"{name} ({len(ok)} ok runs, {', '.join(days) or 'undated'}; "
                  "each run's sweep.duration_s, the sweep's wall time)")  # fmt: skip


def _own(step, recs: list) -> float | None:
    mine = [r for r in recs if r.get("step") == step.num]
    took, ok = preflight.run_seconds(step, mine, "cuda")
    return took if ok else None


def run_seconds(step, recs: list, kind: Kind, profile: bool = True) -> PlannedRun:
    """One run of `step` on `kind`: measured in the tag, modelled from a measured step (the
    rung's `lease` in ladder.json), else assumed; x the kind's factor, less PROFILE_S without
    --profile."""
    compiled = step.compiled
    took = _own(step, recs)
    if took is not None:
        run = PlannedRun(step.num, took, "measured", compiled, expected=took)
    elif step.lease and (base := _base(step, recs)) is not None:
        like, factor = step.lease["like"], step.lease["factor"]
        run = PlannedRun(step.num, base * factor, "modelled", compiled,
                         f"modelled, no sweep record: {factor:g}x step {like}'s run")  # fmt: skip
    else:
        run = PlannedRun(step.num, ASSUMED_RUN_S, "assumed", compiled,
                         f"assumed: measured nowhere, {ASSUMED_RUN_S:.0f} s")  # fmt: skip
    if kind.factor != 1.0 and run.source != "assumed":
        run.seconds *= kind.factor
    if MID_EVAL_SKIPPED and run.source != "assumed":
        run.seconds -= mid_eval_s(step, recs, compiled) * kind.factor
    if not profile:
        run.seconds = max(1.0, run.seconds - PROFILE_S)
    run.current = is_current(step, recs, kind)
    return run


def is_current(step, recs: list, kind: Kind) -> bool:
    """Whether `step` is measured as it is now: an ok record of the file's sha256, the lease's
    configuration and this kind's GPU (one); a record of another version of the script is not."""
    sha = file_sha256(step.path)
    for r in recs:
        sw, machine = r.get("sweep") or {}, (r.get("sweep") or {}).get("machine") or {}
        config = {k: v for k, v in (config_of(r) or {}).items() if k != "nproc"}
        if (r.get("step") == step.num and r.get("status") == "ok"
                and sw.get("script_sha256") == sha and config == LEASE_CONFIG
                and machine.get("device_name") == kind.gpu
                and machine.get("device_count") == 1):  # fmt: skip
            return True
    return False


def mid_eval_s(step, recs: list, compiled: bool) -> float:
    """The step-50 evaluation a measured run of `step` (or the step it is modelled on) spent:
    EVAL_FORWARDS eager forwards at a third of its median step time each."""
    num = (step.lease or {"like": step.num})["like"]
    ms = sorted(r["step_time_ms"] for r in recs if r.get("step") == num and r.get("status") == "ok"
                and isinstance(r.get("step_time_ms"), (int, float)))  # fmt: skip
    if not ms:
        return 0.0
    forward = ms[len(ms) // 2] / 3 * (EAGER_OVER_COMPILED if compiled else 1.0)
    return EVAL_FORWARDS * forward / 1000


def _base(step, recs: list) -> float | None:
    num = step.lease["like"]
    mine = [r for r in recs if r.get("step") == num]
    took, ok = preflight.run_seconds(step, mine, "cuda")
    return took if ok else None


def cost_lines(kind: Kind) -> list[str]:
    return [
        f"{kind.name}: {kind.why}; start-up {kind.start_s:.0f} s",
        f"a call: {SETUP_S:.0f} s set-up (measured; {SETUP_AGAIN_S:.0f} s again on the same "
        f"machine, assumed) + {SWEEP_START_S:.0f} s sweep start + runs (+{BETWEEN_RUNS_S:.0f} s "
        f"each) + tests + {END_LEAN_S:.0f} s pack without the compile cache (assumed; "
        f"{END_S:.0f} s measured with it), {TRANSFER_S:.0f} s transfers; {GAP_S:.0f} s idle "
        f"between calls, {CLOSE_S:.0f} s give_back (assumed)",
        "each run less its step-50 evaluation (measuring runs evaluate at their end only): "
        + ("counted" if MID_EVAL_SKIPPED else "not counted"),
        f"the GPU tests: {TESTS_S:.0f} s estimated (never run on CUDA; the sweep's records "
        "stand in for the runs it made)",
    ]
