"""The sweep's rounds: every job (a step in a tag folder, or the A/A control run) once per round,
K rounds, resuming in the round a killed sweep was in; before each run the machine's load and
the run's predicted memory, after it a line of its result. The plan is driver.py's; its types
(Plan, Pass, Job) are plan.py's, whose fields the rounds read."""

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from speed_ladder import machine
from speed_ladder.files import shown
from speed_ladder.measure import cpu_load
from speed_ladder.measure.breakdown import profiled_runs
from speed_ladder.records import append_jsonl, file_sha256, read_jsonl
from speed_ladder.selection import done_runs, matching
from speed_ladder.spec import config_of, resolved_config
from speed_ladder.store import load_runs
from speed_ladder.sweep import child, preflight
from speed_ladder.sweep.launch import run_once
from speed_ladder.sweep.plan import Job, Plan, summarize


@dataclass
class Progress:
    """What is done and what is left: ok runs per job so far, failures, durations."""

    done: dict[Job, int]
    estimate: dict[Job, float]
    failed: set = field(default_factory=set)
    passed_over: set = field(default_factory=set)  # --budget: left for the next sweep
    t0: float = field(default_factory=time.monotonic)

    def left(self, repeats: int) -> list[Job]:
        return [j for j, n in self.done.items() if n < repeats and j not in self.failed]

    def eta(self, repeats: int) -> float:
        return sum(self.estimate[j] * (repeats - self.done[j]) for j in self.left(repeats)
                   if j not in self.passed_over)  # fmt: skip


def _label(p: Plan, job: Job) -> str:
    ps = p.pass_of(job)
    extra = " (A/A control)" if job.control else ""
    if job.step.distributed:
        extra += f" on {ps.nproc} process{'es' if ps.nproc > 1 else ''}"
    return f"step {job.step.num} {job.step.title}{extra}"


def _start(p: Plan, force: bool) -> Progress:
    """The ok runs each job already has (none with --force), and an estimate of each run: this
    tag's runs, else the committed tag's of this hardware (else the closest), else rough
    (preflight.py)."""
    done, estimate = {}, {}
    name = p.machine.get("device_name")
    guesses = [preflight.committed_runs(ps.hardware, p.spec.preset, name, ps.tag_dir, p.committed)
               if p.committed else (None, []) for ps in p.passes]  # fmt: skip
    for job in p.jobs:
        ps = p.pass_of(job)
        recs = load_runs(ps.tag_dir)
        cfg, sha = ps.configs[job.step.num], ps.shas[job.step.num]
        done[job] = 0 if force else done_runs(recs, job.step, cfg, sha, p.machine, job.control)
        earlier = matching(recs, job.step, cfg, sha, p.machine, job.control)
        if {"--profile", "--trace"} & set(p.flags):  # profiled: latest runs with a breakdown
            done[job] = min(done[job], profiled_runs(earlier))
        same_cfg = [r for r in recs if r.get("step") == job.step.num
                    and config_of(r) == cfg
                    and (r.get("sweep") or {}).get("machine") == p.machine]  # fmt: skip
        compile_s = preflight.compile_seconds(job.step, recs, cfg, p.machine)  # measured here
        took, here = preflight.run_seconds(job.step, earlier or same_cfg, p.device_type, compile_s)
        estimate[job] = (took, preflight.HERE if here else None)
        where, theirs = guesses[job.pass_index]
        if not here and (guess := preflight.committed_seconds(job.step, cfg, theirs)):
            estimate[job] = (guess, where)
        cut = cut_seconds(ps.tag_dir, job, cfg, sha, p.machine)
        if cut and not here:  # no ok run yet, one cut at a --budget's end: it needs more than that
            estimate[job] = (max(estimate[job][0], cut * CUT_FACTOR), preflight.HERE)
    prog = Progress(done, {j: s for j, (s, _) in estimate.items()})
    todo = [estimate[j] for j in prog.left(p.repeats) for _ in range(p.repeats - done[j])]
    tags = ", ".join(shown(ps.tag_dir) for ps in p.passes)
    print(
        f"sweep {' + '.join(ps.tag for ps in p.passes)}: {len(p.jobs)} step run(s) per round, "
        f"{len(todo)} run(s) to do in {p.repeats} round(s); results in {tags}",
        flush=True,
    )
    if todo:
        print(preflight.estimate_line(todo, p.device_type), flush=True)
        if not cpu_load.supported():
            print("note: other processes' CPU use can be measured on Linux only: no busy "
                  "check here, and the records' other_load is null", flush=True)  # fmt: skip
    for job in p.jobs:
        if prog.done[job] >= p.repeats:
            print(f"{_label(p, job)}: up to date ({p.repeats} ok run(s)), skipped", flush=True)
    return prog


def _before_run(p: Plan, job: Job, wait_s: float | None) -> None:
    """The machine's load (waiting for quiet with --wait-quiet), and the memory prediction (the
    step does not print it again: memory_model.PREDICTED_ENV)."""
    check_s = float(os.environ.get("SPEED_LADDER_CHECK_S", cpu_load.CHECK_S))
    if check_s > 0 and cpu_load.supported():
        measure = lambda: cpu_load.measure_others(check_s)
        say = lambda line: print(f"      {line}", flush=True)
        if wait_s:
            cpu_load.wait_quiet(wait_s, say=say, measure=measure)
        else:
            cpu_load.quiet_check(say=say, measure=measure)
    world = p.pass_of(job).nproc if job.step.distributed else 1
    pred = preflight.predict(job.step, p.spec, world, p.data)
    if pred is not None:
        line, warning = preflight.memory_line(pred, p.device_type, p.capacity, world)
        print(f"      memory: {line}", flush=True)
        if warning:
            print(f"      warning: {warning}", flush=True)


def _run_job(p: Plan, job: Job, rnd: int, timeout: float, keep_timeout: bool = True,
             cut_before: float = 0.0) -> dict | None:  # fmt: skip
    ps = p.pass_of(job)
    meta = {
        "run_id": uuid.uuid4().hex,
        "tag": ps.tag,
        "round": rnd,
        "config": ps.configs[job.step.num],
        "code_sha256": ps.shas[job.step.num],
        "script_sha256": file_sha256(job.step.path),
        "machine": p.machine,
        "host": machine.real_host_id(),  # the real one, also where machine.py pools hosts
    }
    flags = p.flags
    if job.control:
        meta["control"] = True
        if p.spec.to_loss is not None:  # time to loss: the spread of seeds is its noise
            meta["control_seed"] = p.spec.seed + 1
            flags = reseeded(p.flags, meta["control_seed"])
    return run_once(job.step, flags, meta, ps.tag_dir, timeout, keep_timeout, cut_before)


def reseeded(flags: list[str], seed: int) -> list[str]:
    """A step's argv with its --seed replaced by `seed` (added where it has none)."""
    out = list(flags)
    if "--seed" in out:
        out[out.index("--seed") + 1] = str(seed)
        return out
    return [*out, "--seed", str(seed)]


def _report(rec: dict) -> None:
    took = preflight.fmt_duration(rec["sweep"]["duration_s"])
    if rec["status"] == "ok":
        tps = rec.get("tokens_per_sec")
        rate = f"{tps:,.0f} tok/s" if isinstance(tps, (int, float)) else "no tok/s"
        busy = ""
        if cpu_load.is_busy(rec.get("other_load")):
            busy = f" (unreliable: other processes used {rec['other_load']:.2f} cores)"
        print(f"      -> ok: {rate} in {took}{busy}", flush=True)
    else:
        log = f" (stderr in {rec['log']})" if rec.get("log") else ""
        print(f"      -> FAILED ({rec['status']}): {rec.get('reason')}{log}", flush=True)


# ---------------------------------------------------------------- --budget
CUTS = "cuts.jsonl"  # runs stopped at a --budget's end: not results, only how long they lasted
CUT_FACTOR = 1.5  # a cut run needed more than it had: expect half as much again


def _cut_key(job: Job, config: dict, sha: str, fp: dict) -> dict:
    return {"step": job.step.num, "control": job.control, "config": config,
            "code_sha256": sha, "machine": fp}  # fmt: skip


def note_cut(tag_dir, job: Job, config: dict, sha: str, fp: dict, seconds: float) -> None:
    """Remember that a run of `job` was stopped unfinished after `seconds`: until the step has an
    ok run, the next sweep expects CUT_FACTOR times that, so a step that cannot fit is not
    started (and cut) again and again; one that is cut again all the same is recorded `failed`
    (launch.run_once's `cut_before`)."""
    append_jsonl(Path(tag_dir) / CUTS, dict(_cut_key(job, config, sha, fp), cut_after_s=seconds))


def cut_seconds(tag_dir, job: Job, config: dict, sha: str, fp: dict) -> float:
    """The longest a run of `job` (this configuration, script, machine fingerprint `fp`) lasted
    before a budget stopped it, or 0."""
    key = _cut_key(job, config, sha, fp)

    def same(c: dict, k: str, v) -> bool:  # a cut noted before the RunSpec: resolved
        return (resolved_config(c.get(k), c.get("machine")) if k == "config" else c.get(k)) == v

    cuts = [c.get("cut_after_s") for c in read_jsonl(Path(tag_dir) / CUTS)
            if isinstance(c, dict) and all(same(c, k, v) for k, v in key.items())]  # fmt: skip
    return max((float(c) for c in cuts if isinstance(c, (int, float))), default=0.0)


def _fits(job: Job, prog: Progress, deadline: float | None) -> float | None:
    """The seconds a run may take under --budget (None: no budget), or 0.0 when its expected
    duration does not fit in what is left. The child's kill grace is kept in hand."""
    if deadline is None:
        return None
    left = deadline - time.monotonic() - child.KILL_GRACE_S
    return left if left > 0 and prog.estimate[job] <= left else 0.0


def run_rounds(p: Plan, force: bool, timeout: float, wait_s: float | None,
               deadline: float | None = None) -> list[Job]:  # fmt: skip
    """Round after round, every job that has fewer ok runs than the round's number. With a
    `deadline` (--budget) a run starts only when its expected duration fits before it (one that
    does not is passed over, and a later one that fits still runs), and one still going at it is
    stopped and not recorded (cuts.jsonl keeps how long it lasted), unless the same job was cut
    before: a second cut is recorded `failed` ("cut twice at N s") and the sweep goes on with
    the next runs, so a step that can never fit is not passed over forever; returns the jobs
    left."""
    prog = _start(p, force)
    if deadline is not None and prog.left(p.repeats):
        print(f"budget: {_left_text(deadline)} left; a run starts only when its expected "
              "duration fits, and one still going at the end is stopped, not recorded",
              flush=True)  # fmt: skip
    passed_over = prog.passed_over
    for rnd in range(1, p.repeats + 1):
        jobs = [j for j in p.jobs if prog.done[j] < rnd and j not in prog.failed]
        for i, job in enumerate(jobs, 1):
            if job in prog.failed or job in passed_over:
                continue
            if _fits(job, prog, deadline) == 0.0:
                _pass_over(p, prog, job, deadline, passed_over)
                continue
            head = f"round {rnd}/{p.repeats} " if p.repeats > 1 else ""
            elapsed = preflight.fmt_duration(time.monotonic() - prog.t0)
            eta = preflight.fmt_duration(prog.eta(p.repeats))
            print(f"{head}[{i}/{len(jobs)}] {_label(p, job)} ... elapsed {elapsed}, "
                  f"ETA {eta}", flush=True)  # fmt: skip
            _before_run(p, job, wait_s)
            allowed = _fits(job, prog, deadline)  # the load check took some of it
            if allowed == 0.0:
                _pass_over(p, prog, job, deadline, passed_over)
                continue
            limit = timeout if allowed is None else min(timeout, allowed)
            ps = p.pass_of(job)
            key = (ps.tag_dir, job, ps.configs[job.step.num], ps.shas[job.step.num], p.machine)
            before = cut_seconds(*key) if limit != timeout else 0.0  # cut once already?
            rec = _run_job(p, job, prog.done[job] + 1, limit, keep_timeout=limit == timeout,
                           cut_before=before)  # fmt: skip
            if rec is not None and rec["sweep"]["exit_code"] is None and before:
                note_cut(*key, allowed)  # cut twice: recorded failed, and the sweep goes on
            if rec is None:  # stopped at the budget's end: not a result of the step
                note_cut(*key, allowed)
                took = preflight.fmt_duration(allowed)
                print(f"      -> stopped unfinished after {took}: the budget ran out (not "
                      f"recorded; noted in {CUTS})", flush=True)  # fmt: skip
                prog.estimate[job] = max(prog.estimate[job], allowed)
                passed_over.add(job)
                continue
            prog.estimate[job] = rec["sweep"]["duration_s"]
            _report(rec)
            if rec["status"] == "ok":
                prog.done[job] += 1
            else:  # no point repeating a failure in this sweep
                prog.failed.add(job)
            summarize(p)
    return [j for j in prog.left(p.repeats) if j in passed_over]


def labels(p: Plan, jobs: list[Job]) -> list[str]:
    """'step 08 torch.compile' (with ' on N processes' for a distributed step) for each job."""
    return [_label(p, j) for j in jobs]


def _left_text(deadline: float) -> str:
    return preflight.fmt_duration(max(0.0, deadline - time.monotonic()))


def _pass_over(p: Plan, prog: Progress, job: Job, deadline: float, passed_over: set) -> None:
    """Say that `job` does not fit in what is left of the budget, and leave it for later."""
    passed_over.add(job)
    need = preflight.fmt_duration(prog.estimate[job])
    print(f"budget: {_left_text(deadline)} left, {_label(p, job)} is expected to take {need}: "
          "left for the next sweep", flush=True)  # fmt: skip
