"""The sweep's types: what `python -m speed_ladder run` plans (driver.py) and its rounds run
(rounds.py). A `Plan` is the whole sweep: its `Pass`es (one per tag folder), the `Job`s run once
per round, and the one `RunSpec` (speed_ladder.spec) its runs are resolved to; `summarize` writes
every pass's summary.csv from its records."""

from dataclasses import dataclass, field
from pathlib import Path

from speed_ladder.ladder import Step
from speed_ladder.report.summary import table_and_runs, write_summary
from speed_ladder.selection import settled
from speed_ladder.spec import RunSpec
from speed_ladder.store import load_runs


@dataclass(frozen=True)
class Job:
    """One run per round: a step of a pass (by its index in Plan.passes), or the A/A control."""

    pass_index: int
    step: Step
    control: bool = False


@dataclass
class Pass:
    """One tag folder's part of the sweep: its steps, on `nproc` processes when distributed."""

    tag: str
    tag_dir: Path
    nproc: int
    ladder: list[Step]  # the steps this tag holds (its summary's rows)
    steps: list[Step]  # the chosen ones, run in this sweep
    configs: dict[str, dict]  # per step: the sweep configuration its runs are matched by
    shas: dict[str, str]  # per step: its script's code_sha256 (records.code_sha256)
    hardware: str = ""  # this machine's hardware tag with the -xN (what --tag may name otherwise)


@dataclass
class Plan:
    """The sweep: what runs, where, how often, and with which settings."""

    passes: list[Pass]
    flags: list[str]  # the step flags every run gets (flags.child_argv)
    repeats: int
    machine: dict  # this machine's fingerprint
    spec: RunSpec  # every run's settings, as each step resolves them (speed_ladder.spec)
    control: bool
    capacity: int | None = None  # one device's memory: the GPU's, or the machine's RAM
    committed: Path | None = None  # the committed results, a first guess of each run's duration
    data: str | None = None  # --data, resolved (None: the default text)
    jobs: list[Job] = field(default_factory=list)

    @property
    def device_type(self) -> str:
        return self.spec.device

    def pass_of(self, job: Job) -> Pass:
        return self.passes[job.pass_index]


def summarize(plan: Plan) -> dict[str, object]:
    """Every pass's summary, written to its summary.csv (the -x1 pass first: the others' scaling
    efficiency is over its runs). Its folder's name is the tag its records are judged by, as a
    rebuilt summary's are (report/checks/validity.py): an impossible or foreign ok record is
    `invalid` here too, never `ok` until a rebuild. A step this sweep did not measure is summarized
    from its last records, as a rebuild does (selection.settled)."""
    out, single = {}, None
    for ps in plan.passes:
        recs, tag = load_runs(ps.tag_dir), Path(ps.tag_dir).name
        configs, shas = settled(recs, ps.ladder, ps.configs, ps.shas)
        df, used = table_and_runs(ps.ladder, recs, configs, shas, plan.repeats, plan.machine,
                                  single=single, nproc=ps.nproc, tag=tag)  # fmt: skip
        if ps.nproc == 1:
            single = used
        write_summary(ps.tag_dir, df)
        out[ps.tag] = df
    return out
