"""Which of a tag's records count (runs.jsonl, as store.py reads it).

A step's runs are its records of one sweep configuration (`sweep.config`, spec.sweep_config),
one version of its code (`version`) and one machine's fingerprint (`sweep.machine`, see
machine.py): `matching`. A step counts as done when it holds enough `ok` runs, none of them
followed by a failure (`done_runs`: what the sweep skips a step on); its summary row takes the
last `--repeats` of them, and the A/A control runs beside them (`collect`). A record's
`sweep.round` says in which round of an interleaved sweep it ran; `sweep.control` marks the A/A
control run (gains.py).

The configuration and code a step's runs are matched by are the sweep's own for the steps it
measures; for a step it did not measure, and for a summary rebuilt from runs.jsonl alone, its
last record's (`settled`, `judged_by`). Whether an ok record can be right and belongs to its tag
is report/checks/validity.py's: the summary marks such a record `invalid` before it selects.
"""

from speed_ladder.ladder import Step
from speed_ladder.spec import config_of


def version(rec: dict) -> str | None:
    """The code a record's sweep ran: its `sweep.code_sha256` (records.code_sha256: docstrings
    and comments left out), or where it has none (an older record) its `sweep.script_sha256`."""
    sw = rec.get("sweep") or {}
    return sw.get("code_sha256") or sw.get("script_sha256")


def matching(
    records: list[dict], step: Step, config: dict, sha: str, machine=None, control: bool = False
) -> list[dict]:
    """The records of `step` run with this sweep configuration (spec.sweep_config; a record's is
    read by spec.config_of, which resolves one that holds the sweep's flags) and this code
    (`version`), on `machine` (a fingerprint; None: any machine); the A/A control runs with
    `control`, else the others."""
    out = []
    for r in records:
        sw = r.get("sweep") or {}
        if (
            r.get("step") == step.num
            and config_of(r) == config
            and version(r) == sha
            and (machine is None or sw.get("machine") == machine)
            and bool(sw.get("control")) == control
        ):
            out.append(r)
    return out


def ok_since_failure(records: list[dict]) -> list[dict]:
    """The ok records after the last failed one."""
    last_fail = max((i for i, r in enumerate(records) if r.get("status") != "ok"), default=-1)
    return records[last_fail + 1 :]


def done_runs(records, step: Step, config: dict, sha: str, machine=None, control=False) -> int:
    """ok runs that count toward --repeats (same config, script and machine, after the last
    failure)."""
    return len(ok_since_failure(matching(records, step, config, sha, machine, control)))


def foreign(records: list[dict], machine: dict) -> list[dict]:
    """The records not made on `machine` (a record without a fingerprint is another's)."""
    return [r for r in records if (r.get("sweep") or {}).get("machine") != machine]


def used_runs(runs: list[dict], repeats: int) -> list[dict]:
    """The runs a row summarizes: the last `repeats` ok ones, when the last run was ok."""
    if not runs or runs[-1].get("status") != "ok":
        return []
    return ok_since_failure(runs)[-repeats:]


def collect(steps, records, configs: dict, shas: dict, repeats: int, machine=None):
    """(per step, its matching runs (this config, script and machine); the runs its row uses;
    the A/A control runs, by step)."""
    runs = {s.num: matching(records, s, configs[s.num], shas[s.num], machine) for s in steps}
    used = {s.num: used_runs(runs[s.num], repeats) for s in steps}
    used = {k: v for k, v in used.items() if v}
    control = {}  # each sweep's first step runs twice a round: any step may have them
    for s in steps:
        if s.num in used:
            ctl = matching(records, s, configs[s.num], shas[s.num], machine, True)
            if ctl := ok_since_failure(ctl)[-repeats:]:
                control[s.num] = ctl
    return runs, used, control


def last_config(records: list[dict], step: Step):
    """(config, sha, machine) of a step's last non-control record in a tag, and its rounds."""
    mine = [r for r in records if r.get("step") == step.num
            and not (r.get("sweep") or {}).get("control")]  # fmt: skip
    if not mine:
        return {}, "", None, 1
    sw, config = mine[-1].get("sweep") or {}, config_of(mine[-1])
    same = matching(mine, step, config, version(mine[-1]), sw.get("machine"))
    rounds = [(r.get("sweep") or {}).get("round") or (r.get("sweep") or {}).get("repeat") or 1
              for r in same]  # fmt: skip
    return config, version(mine[-1]), sw.get("machine"), max(rounds, default=1)


def settled(records: list[dict], steps: list[Step], configs: dict, shas: dict):
    """(configs, shas) with, for each step that no record of `configs`/`shas` (a sweep's own:
    this checkout's script, this run's settings) measured, its last record's instead, as
    `judged_by` takes them: a sweep of some steps summarizes the others as `check` and
    `publish` judge them (a step whose file changed since its runs keeps them, with a note)."""
    configs, shas = dict(configs), dict(shas)
    for s in steps:
        mine = [r for r in records if r.get("step") == s.num]
        if not any(version(r) == shas.get(s.num) for r in mine):
            config, sha, _, _ = last_config(records, s)
            if sha:
                configs[s.num], shas[s.num] = config, sha
    return configs, shas


def judged_by(records: list[dict], steps: list[Step]):
    """(configs, shas, rounds, machine) of a summary rebuilt from a tag's records alone
    (report/summary.py's `rebuild`): per step, its last record's configuration and script; as
    many rounds as they hold; the one machine that made them, or None (any) where several did."""
    groups = {s.num: last_config(records, s) for s in steps}
    configs = {n: g[0] for n, g in groups.items()}
    shas = {n: g[1] for n, g in groups.items()}
    repeats = max((g[3] for g in groups.values()), default=1)
    machines = {str(g[2]) for g in groups.values() if g[1]}
    machine = groups[next(n for n, g in groups.items() if g[1])][2] if len(machines) == 1 else None
    return configs, shas, repeats, machine
