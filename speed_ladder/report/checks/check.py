"""`python -m speed_ladder check [results/<tag> ...]`: whether a results folder measured on another
machine can be trusted, before it is merged (no folder: every results/<tag>/ with a runs.jsonl,
results/reference aside).

It prints one line per **problem**, `<tag>: <problem>`, naming the record (step, round, run id's
first 8 hex digits, line in runs.jsonl); then **notes**, `note: <tag>: ...`, which are not
counted (one line for the same note on several records); then `N tag(s) checked, K problem(s)`.
Exit 0 without problems, 1 with some, 2 on bad input (no such folder, no runs.jsonl in it).

1. Every line of runs.jsonl is a record (`store.record_problem`), each run id once.
2. Each record's `script_sha256` is its `script` as of its `git_sha` in this clone (or that
   file checked out with CRLF ends), and equals `sweep.script_sha256`. A HEAD whose file differs
   is a note ("changed since": the record measured the step as it then was). A mismatch is a
   problem, unless the commit was `-dirty` and HEAD's file matches (a note). A commit not in
   this clone (a user's local one) or none is a note, and the script is looked up in this
   clone's history of the file: no version matching it is a problem. Whether an unknown commit
   is foreign cannot be told from the clone alone (a contributor's unpushed commit looks the
   same), so a sha is a problem as foreign only where a committed record's `corrections` names
   it so (`known_foreign`; the H200 tag's ffc5486c, another repository's HEAD). A record's
   git_sha is null, with `git_sha_reason`, where the project's root is not the top of its git
   repository. A `corrections` entry (field, was, now, why) is a note; one whose field
   does not hold `now`, without a why, or a corrected git_sha this clone lacks is a problem
   (a corrected sha in the clone has its script checked as above).
3. ok records that cannot be right or are foreign to the tag (validity.py), one line per
   reason: a required field missing; a number not finite or not above 0 (tok/s, step time,
   memory, MFU, ...), a loss NaN, infinite or negative, a count not 1 or more; losses not one
   per step (max_steps + profiled); tokens_per_step not batch x context x processes, tok/s not
   tokens_per_step / step time (within a relative 1e-3 or 0.05 tok/s); on a GPU an MFU above
   100% of its datasheet peak (recorded, or from tok/s x flops per token), on a CPU, whose peak
   is measured (MFU above 100% there is a low peak, `mfu_invalid`), more than 4 TFLOP/s per
   core; peak memory above the GPU's (machine.gpus[].memory_gib) or the RAM; a script that is
   not its step's file; device_name, machine, torch, preset or device not its fingerprint's,
   sweep's or spec's; a world size not the tag's; a machine whose tag is another. The summary
   counts such a record as a failed run: status `invalid`, never `ok`; all but the last, a tag
   named for other hardware, which is a problem here and so for `publish` (a sweep's folder is
   named by --tag as its user likes). A record without `tokens_per_step` (older) is a note.
4. summary.csv agrees with the summary rebuilt from runs.jsonl as `plot_results.py --rebuild` does
   (`summary.rebuild`; a `-xN` tag's scaling against the `-x1` tag beside it) in every cell that
   comes from the records, to the digits summary.csv keeps (`parity` too, judged under this
   checkout's rules, speed_ladder/data/ladder.json; `parity_detail` is not compared: its words are
   the rules'); a row with a result but no records, or a step with records but no row, is a problem.
   `busy_runs` is check 6's: the summary counts it against the busy threshold of the machine that
   computes it.
5. One machine: every fingerprint (`sweep.machine`, else the record's `machine`; a pooled
   sweep's `pool:NAME` is in it) equals the tag's most common one, as whole dicts. A record
   without one (older) is a note.
6. The summary rests on no run measured busy: `other_load` above `cpu_load.threshold` of the
   measuring machine's cores (a CPU run's fingerprint has them; else this machine's, as
   `cpu_load.is_busy`). A busy run the summary does not use (a later `--force` run replaced it) is a
   note, and so is an ok record without `other_load` (older) or with null (not Linux).
7. A `verdict` of faster / slower or a `mem_verdict` of more / less (gains.py) rests on 2 or
   more rounds of the step and of its `prev_step`, a noise floor, and an interval without 1.0
   around an effect above the floor and 1%.
8. No string in a record, at any depth, holds an absolute path (`/x/...`, `/home/`, `/root/`,
   `/Users/`, `/work/`, `/tmp/`, `~/`, `C:\\`) or this machine's host name, and every host id is
   a hash (12 hex digits) or `pool:NAME`.
9. No record ran through Triton's interpreter (`interpreted: true`: step 12's Liger on a CPU
   with TRITON_INTERPRET=1): its numbers are numerics checks, not measurements.
10. Runs started by hand beside the tag (`by-hand/*.jsonl`) get checks 2, 3 (impossible) and
   8, and a note that they are not sweep runs: never summary rows, gains or chart bars.

The checks are record_checks.py's (1, 2, 3, 5, 6, 8) and summary_checks.py's (4, 7); this
module runs them on each tag (and check 9 itself) and is the command.
"""

from pathlib import Path

from speed_ladder import ladder
from speed_ladder.errors import UserError
from speed_ladder.files import RESULTS, ROOT
from speed_ladder.report.by_hand import BY_HAND
from speed_ladder.report.checks.record_checks import (
    Git,
    Report,
    check_arithmetic,
    check_busy,
    check_corrections,
    check_machines,
    check_private,
    check_script,
    host_names,
    read_records,
    who,
)
from speed_ladder.report.checks.summary_checks import check_claims, check_summary, rebuilt
from speed_ladder.report.checks.validity import impossible
from speed_ladder.store import RUNS


# ---------------------------------------------------------------- a tag, the command
def check_tag(tag_dir: Path, steps=None, git: Git | None = None) -> Report:
    tag_dir, git = Path(tag_dir), git or Git()
    steps = ladder.discover(ROOT) if steps is None else steps
    rep, hosts = Report(tag_dir.name), host_names()
    records = read_records(tag_dir / RUNS, rep)
    df, used, columns = rebuilt(tag_dir, steps, records, rep)
    for n, rec in records:
        check_script(rep, n, rec, git)
        check_corrections(rep, n, rec, git)
        if rec.get("status") == "ok":
            check_arithmetic(rep, n, rec)
            check_busy(rep, n, rec, used)
        check_private(rep, n, rec, hosts)
        if rec.get("interpreted") is True:
            rep.problem(f"{who(rec, n)}: ran through Triton's interpreter (TRITON_INTERPRET=1): "
                        "numerics only, not a measurement")  # fmt: skip
    check_machines(rep, records)
    check_claims(rep, check_summary(rep, tag_dir, records, df, columns))
    check_by_hand(rep, tag_dir, git, hosts)
    return rep


def check_by_hand(rep: Report, tag_dir: Path, git: Git, hosts) -> None:
    """Runs started by hand beside a tag (`by-hand/*.jsonl`: not sweep runs, never in its
    summary) are checked as records are: script, corrections, impossible, private."""
    for path in sorted((tag_dir / BY_HAND).glob("*.jsonl")):
        sub = Report(f"{rep.tag}/{BY_HAND}/{path.name}")
        for n, rec in read_records(path, sub):
            check_script(sub, n, rec, git)
            check_corrections(sub, n, rec, git)
            for why in impossible(rec):
                sub.problem(f"{who(rec, n)}: {why}")
            check_private(sub, n, rec, hosts)
        rep.problems += [f"{BY_HAND}/{path.name}: {p}" for p in sub.problems]
        for t, k in sub.notes.items():
            rep.notes[f"{BY_HAND}/{path.name}: {t}"] = k
        rep.note(f"{BY_HAND}/{path.name}: run by hand, not a sweep run: not in the summary")


def tag_dirs(results: Path = RESULTS) -> list[Path]:
    """Every results/<tag>/ with a runs.jsonl, results/reference aside."""
    return sorted(p.parent for p in Path(results).glob(f"*/{RUNS}") if p.parent.name != "reference")


def check(dirs, say=print) -> int:
    """Check tag folders (none: every results/<tag>/), say the lines; the exit status."""
    tags = [Path(d) for d in dirs] if dirs else tag_dirs()
    for t in tags:  # bad input before any work
        if not (t / RUNS).is_file():
            why = "no such folder" if not t.is_dir() else f"no {RUNS} there"
            raise UserError(f"{t}: {why} (a results/<tag> folder of python -m speed_ladder run)")
    if not tags:
        say(f"no {RESULTS.name}/<tag>/{RUNS} to check")
    steps, git, problems = ladder.discover(ROOT), Git(), 0
    for t in tags:
        rep = check_tag(t, steps, git)
        problems += len(rep.problems)
        for line in rep.lines():
            say(line)
    say(f"{len(tags)} tag(s) checked, {problems} problem(s)")
    return 1 if problems else 0


def add_tags_command(sub, name: str, doc: str, summary: str, exits: str, dest: str,
                     metavar: str, tags_help: str):  # fmt: skip
    """A `python -m speed_ladder` command over tag folders: its help (the first paragraph of its
    module's `doc`, then what its exit codes mean) and its positional folders, none or more."""
    p = sub.add_parser(name, help=summary, description=doc.split("\n\n")[0] + " " + exits)
    p.add_argument(dest, nargs="*", metavar=metavar, help=tags_help)
    return p


def add_check_parser(sub):
    p = add_tags_command(
        sub, "check", __doc__, "validate results folders (another machine's, before merging them)",
        "Exit 0: no problems; 1: problems; 2: bad input. `note:` lines are not problems.",
        "dirs", "results/<tag>", "tag folders (default: every results/<tag>/ with a runs.jsonl)",
    )  # fmt: skip
    p.set_defaults(func=lambda args: check(args.dirs))
    return p
