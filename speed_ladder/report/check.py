"""`python -m speed_ladder check [results/<tag> ...]`: whether a results folder measured on another
machine can be trusted, before it is merged (no folder: every results/<tag>/ with a runs.jsonl,
results/reference aside).

It prints one line per **problem**, `<tag>: <problem>`, naming the record (step, round, run id's
first 8 hex digits, line in runs.jsonl); then **notes**, `note: <tag>: ...`, which are not
counted (one line for the same note on several records); then `N tag(s) checked, K problem(s)`.
Exit 0 without problems, 1 with some, 2 on bad input (no such folder, no runs.jsonl in it).

1. Every line of runs.jsonl is a record (`runs.record_problem`), each run id once.
2. Each record's `script_sha256` is its `script` as of its `git_sha` in this clone (or that
   file checked out with CRLF ends), and equals `sweep.script_sha256`. A HEAD whose file differs
   is a note ("changed since": the record measured the step as it then was). A mismatch is a
   problem, unless the commit was `-dirty` and HEAD's file matches (a note). A commit not in
   this clone (a user's local one) or none is a note, and the script is looked up in this
   clone's history of the file: no version matching it is a problem.
3. ok records: `tokens_per_sec` = `tokens_per_step` / step time, within a relative 1e-3 or 0.05
   tok/s (its rounding). A record without `tokens_per_step` (older) is a note.
4. summary.csv agrees with the summary rebuilt from runs.jsonl as `plot_results.py --rebuild`
   does (`summary.rebuild`; a `-xN` tag's scaling against the `-x1` tag beside it) in every
   cell that comes from the records, to the digits summary.csv keeps (`parity` too, judged
   under this checkout's tests/loss_parity.json; `parity_detail` is not compared: its words are
   the manifest's); a row with a result but no records, or a step with records but no row, is a
   problem. `busy_runs` is check 6's: the summary counts it against the busy threshold of the
   machine that computes it.
5. One machine: every fingerprint (`sweep.machine`, else the record's `machine`; a pooled
   sweep's `pool:NAME` is in it) equals the tag's most common one, as whole dicts. A record
   without one (older) is a note.
6. The summary rests on no run measured busy: `other_load` above `load.threshold` of the
   measuring machine's cores (a CPU run's fingerprint has them; else this machine's, as
   `load.is_busy`). A busy run the summary does not use (a later `--force` run replaced it) is a
   note, and so is an ok record without `other_load` (older) or with null (not Linux).
7. A `verdict` of faster / slower or a `mem_verdict` of more / less (gains.py) rests on 2 or
   more rounds of the step and of its `prev_step`, a noise floor, and an interval without 1.0
   around an effect above the floor and 1%.
8. No string in a record, at any depth, holds an absolute path (`/x/...`, `/home/`, `/root/`,
   `/Users/`, `/work/`, `/tmp/`, `~/`, `C:\\`) or this machine's host name, and every host id is
   a hash (12 hex digits) or `pool:NAME`.
9. No record ran through Triton's interpreter (`interpreted: true`: step 12's Liger on a CPU
   with TRITON_INTERPRET=1): its numbers are numerics checks, not measurements.
"""

import contextlib
import hashlib
import io
import math
import re
import socket
import subprocess
from pathlib import Path

from speed_ladder import gains, ladder
from speed_ladder.errors import UserError
from speed_ladder.files import RESULTS, ROOT
from speed_ladder.measure.cpu_load import is_busy, threshold
from speed_ladder.records import jsonl_lines
from speed_ladder.report.rows import number, text
from speed_ladder.report.summary import _DIGITS, SUMMARY, read_summary, rebuild
from speed_ladder.spec import config_of
from speed_ladder.store import RUNS, _snippet, _unparsed, matching, ok_since_failure, record_problem

# the verdicts that claim a change (gains.add_effects): column -> (words, the "up" word, ratio,
# noise floor)
CLAIMS = {
    "verdict": ({"faster", "slower"}, "faster", "gain_vs_prev", "noise_floor"),
    "mem_verdict": ({"more", "less"}, "more", "mem_vs_prev", "mem_noise_floor"),
}
MEASURED = ["runs", "tokens_per_sec_median", "tokens_per_sec_min", "tokens_per_sec_max",
            "speedup_vs_00", "peak_reserved_gib", "peak_reserved_gib_min", "mfu", "train_loss",
            "val_loss", "other_load_max"]  # fmt: skip
# `parity` (ok/off/not comparable) is checked; `parity_detail` is not: its words are
# tests/loss_parity.json's, which may be reworded without changing a verdict
TEXTS = ("status", "prev_step", "verdict", "mem_verdict", "noise_source", "parity")
SCALING = [c for c in gains.COLUMNS if c.startswith("scaling")]
_PATH = re.compile(r"(?:^|[\s=:'\"(,])(?:/[\w.-]+/|~/|[A-Za-z]:\\)|/(?:home|root|Users|work|tmp)/")
_HOST_ID = re.compile(r"[0-9a-f]{12}|pool:[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Report:
    """A tag's problems (counted) and notes (not counted; a repeated note is one line)."""

    def __init__(self, tag: str):
        self.tag, self.problems, self.notes = tag, [], {}

    def problem(self, what: str) -> None:
        self.problems.append(what)

    def note(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def lines(self) -> list[str]:
        notes = [f"note: {self.tag}: {t}" + (f" ({n} records)" if n > 1 else "")
                 for t, n in self.notes.items()]  # fmt: skip
        return [f"{self.tag}: {p}" for p in self.problems] + notes


def who(rec: dict, line: int) -> str:
    """'step 05 round 2 run 40b8f7fc (line 13)'; the A/A control says so."""
    sw = rec.get("sweep") or {}
    bits = [f"step {rec.get('step')}"]
    bits += [f"round {sw['round']}"] if isinstance(sw.get("round"), int) else []
    bits += ["A/A control"] if sw.get("control") else []
    bits += [f"run {sw['run_id'][:8]}"] if isinstance(sw.get("run_id"), str) else []
    return " ".join(bits) + f" (line {line})"


def _num(v) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


# ---------------------------------------------------------------- 1. the lines
def read_records(path: Path, rep: Report) -> list[tuple[int, dict]]:
    """(line number, record) of each usable line; every other line is a problem."""
    out, seen = [], {}
    for n, value, raw in jsonl_lines(path):
        why = _unparsed(raw) if value is None else record_problem(value)
        rid = None if why else (value.get("sweep") or {}).get("run_id")
        if why:
            rep.problem(f"line {n} is not a record ({why}): {_snippet(raw)}")
        elif rid is not None and rid in seen:
            rep.problem(f"{who(value, n)}: the same run as line {seen[rid]} (a copied line?)")
        else:
            seen[rid] = n
            out.append((n, value))
    if not out:
        rep.problem(f"{RUNS} holds no records")
    return out


# ---------------------------------------------------------------- 2. the script
class Git:
    """The ladder's files as this clone's history has them (cached)."""

    def __init__(self, root: Path = ROOT):
        self.root, self._cache = root, {}
        self.ok = self._git("rev-parse", "--is-inside-work-tree") is not None

    def _git(self, *args: str) -> bytes | None:
        try:
            res = subprocess.run(["git", *args], cwd=self.root, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout if res.returncode == 0 else None

    def has(self, sha: str) -> bool:
        if ("has", sha) not in self._cache:
            ok = re.fullmatch(r"[0-9a-f]{7,64}", sha) is not None
            ok = ok and self._git("cat-file", "-e", f"{sha}^{{commit}}") is not None
            self._cache["has", sha] = ok
        return self._cache["has", sha]

    def digests(self, rev: str, path: str) -> set[str] | None:
        """sha256 of the file at `rev`, as committed and with CRLF line ends (a Windows
        checkout); None when `rev` has no such file."""
        if ("at", rev, path) not in self._cache:
            blob = self._git("cat-file", "blob", f"{rev}:{path}")
            crlf = blob and blob.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
            sums = None if blob is None else {hashlib.sha256(b).hexdigest() for b in (blob, crlf)}
            self._cache["at", rev, path] = sums
        return self._cache["at", rev, path]

    def find(self, path: str, digest: str) -> str | None:
        """The newest commit in HEAD's history whose `path` has this sha256, or None."""
        if ("log", path) not in self._cache:
            log = self._git("log", "--format=%H", "HEAD", "--", path) or b""
            self._cache["log", path] = log.decode().split()
        found = (c for c in self._cache["log", path] if digest in (self.digests(c, path) or ()))
        return next(found, None)


def check_script(rep: Report, n: int, rec: dict, git: Git) -> None:
    step, script, digest = rec.get("step"), rec.get("script"), rec.get("script_sha256")
    if not script or not digest:
        rep.problem(f"{who(rec, n)}: no script or script_sha256: what did it measure?")
        return
    if (rec.get("sweep") or {}).get("script_sha256") not in (None, digest):
        rep.problem(f"{who(rec, n)}: script_sha256 differs from sweep.script_sha256: {script} "
                    "changed between the sweep's start and the run")  # fmt: skip
    if not git.ok:
        rep.note("not a git checkout here: the scripts' sha256 are not checked")
        return
    sha = rec.get("git_sha") if isinstance(rec.get("git_sha"), str) else ""
    base, dirty = sha.removesuffix("-dirty"), sha.endswith("-dirty")
    head = git.digests("HEAD", script) or set()
    if base and git.has(base):
        at = git.digests(base, script)
        if at is None:
            rep.problem(f"{who(rec, n)}: {script} does not exist at its git_sha {base[:8]}")
        elif digest in at and digest not in head:
            rep.note(f"step {step}: {script} changed since {base[:8]}, where it was measured")
        elif digest not in at and dirty and digest in head:
            rep.note(f"step {step}: measured at {base[:8]} with changes to {script} that HEAD has")
        elif digest not in at:
            also = ", though it matches HEAD's" if digest in head else ""
            rep.problem(f"{who(rec, n)}: script_sha256 is not {script} as of its git_sha "
                        f"{sha[:8]}{'-dirty' if dirty else ''}{also}")  # fmt: skip
        return
    if base:
        rep.note(f"commit {base[:8]} is not in this clone (a local commit?): scripts checked "
                 "against this clone's history instead")  # fmt: skip
    elif rec.get("status") == "ok":
        rep.note("no git_sha (not measured in a git checkout?): scripts checked against history")
    if digest in head:
        return
    when = git.find(script, digest)
    if when:
        rep.note(f"step {step}: {script} as of {when[:8]} was measured (HEAD's file differs)")
    else:
        rep.problem(f"{who(rec, n)}: script_sha256 matches no version of {script} in this clone "
                    "(a modified script, or a newer one: git fetch)")  # fmt: skip


# ---------------------------------------------------------------- 3, 6, 8: each record
def check_arithmetic(rep: Report, n: int, rec: dict) -> None:
    tps, ms = _num(rec.get("tokens_per_sec")), _num(rec.get("step_time_ms"))
    tok = _num(rec.get("tokens_per_step"))
    if tps is None or ms is None:
        rep.problem(f"{who(rec, n)}: an ok record without tokens_per_sec or step_time_ms")
    elif tok is None:
        rep.note("no tokens_per_step (an older record): tok/s not checked against step time")
    elif ms <= 0 or tok <= 0:
        rep.problem(f"{who(rec, n)}: step_time_ms {ms:g}, tokens_per_step {tok:g}")
    elif abs(tps - tok / (ms / 1000)) > max(1e-3 * tok / (ms / 1000), 0.051):
        rep.problem(f"{who(rec, n)}: tokens_per_sec {tps:g} is not tokens_per_step / step time "
                    f"= {tok:g} / {ms / 1000:g} s = {tok / (ms / 1000):.1f}")  # fmt: skip


def fingerprint(rec: dict):
    sw = rec.get("sweep") or {}
    return sw["machine"] if sw.get("machine") is not None else rec.get("machine")


def check_busy(rep: Report, n: int, rec: dict, used: set | None) -> None:
    """A busy run is a problem when the summary rests on it (`used`: run ids; None: unknown),
    a note when a later run replaced it (`--force` measured it again)."""
    load, fp = _num(rec.get("other_load")), fingerprint(rec)
    cores = fp.get("device_count") if isinstance(fp, dict) and rec.get("device") == "cpu" else None
    cores = cores if isinstance(cores, int) and cores > 0 else None
    if "other_load" not in rec:
        rep.note("no other_load (an older record): whether the machine was busy is unknown")
    elif load is None:
        rep.note("other_load is null (measured outside Linux?): busy or not is unknown")
    elif not (load > threshold(cores) if cores else is_busy(load)):
        return
    elif used is not None and (rec.get("sweep") or {}).get("run_id") not in used | {None}:
        rep.note(f"step {rec.get('step')}: a run measured busy that the summary does not use")
    else:
        rep.problem(f"{who(rec, n)}: measured on a busy machine: other processes used "
                    f"{load:.2f} CPU cores (busy above {threshold(cores):g})")  # fmt: skip


def strings(value, where: str = ""):
    """(where, string) of every string in a record, at any depth: ('sweep.command[0]', ...)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{where}[{i}]")
    elif isinstance(value, str):
        yield where, value


def host_names() -> list[re.Pattern]:
    """This machine's host names as whole words (not 'localhost', nor under 3 letters)."""
    names = {x for x in (socket.gethostname(), socket.getfqdn()) if len(x) >= 3}
    names = {x for x in names if x.split(".")[0] != "localhost"}
    return [re.compile(rf"(?<![\w.-]){re.escape(x)}(?![\w-])", re.IGNORECASE) for x in names]


def check_private(rep: Report, n: int, rec: dict, hosts: list[re.Pattern]) -> None:
    paths = [(w, s) for w, s in strings(rec) if _PATH.search(s)]
    if paths:
        more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
        rep.problem(f"{who(rec, n)}: an absolute path in {paths[0][0]}: {paths[0][1][:70]!r}{more}")
    named = [w for w, s in strings(rec) if any(h.search(s) for h in hosts)]
    if named:
        rep.problem(f"{who(rec, n)}: this machine's host name in {', '.join(named[:3])}")
    sw = rec.get("sweep") or {}
    ids = {
        "machine.host_id": (rec.get("machine") or {}).get("host_id"),
        "sweep.machine.host_id": (sw.get("machine") or {}).get("host_id"),
        "sweep.host": sw.get("host"),
    }
    for w, v in ids.items():
        if v is not None and not (isinstance(v, str) and _HOST_ID.fullmatch(v)):
            rep.problem(f"{who(rec, n)}: {w} {str(v)[:40]!r} is not a hashed host id")


# ---------------------------------------------------------------- 5. one machine
def check_machines(rep: Report, records: list[tuple[int, dict]]) -> None:
    kinds: list[tuple] = []  # (fingerprint, its records), compared as whole dicts
    for n, rec in records:
        fp = fingerprint(rec)
        if fp is None:
            rep.note("no machine fingerprint (an older record)")
            continue
        for k in kinds:
            if k[0] == fp:
                k[1].append((n, rec))
                break
        else:
            kinds.append((fp, [(n, rec)]))
    main = max(kinds, key=lambda k: len(k[1]), default=(None, []))
    for fp, recs in kinds:
        if fp is main[0]:
            continue
        if isinstance(fp, dict) and isinstance(main[0], dict):
            keys = sorted(set(fp) | set(main[0]), key=str)
            diff = "; ".join(f"{k} {fp.get(k)!r} vs {main[0].get(k)!r}" for k in keys
                             if fp.get(k) != main[0].get(k))  # fmt: skip
        else:
            diff = repr(fp)[:80]
        for n, rec in recs:
            rep.problem(f"{who(rec, n)}: another machine than the tag's {len(main[1])} other "
                        f"records: {diff}")  # fmt: skip
    hosts = {(r.get("sweep") or {}).get("host") for _, r in main[1]} - {None}
    if len(hosts) > 1:
        rep.note(f"pooled: its runs come from {len(hosts)} hosts (sweep.host)")


# ---------------------------------------------------------------- 4, 7: summary.csv
def _differs(col: str, a, b) -> bool:
    if col in TEXTS:
        return text(a) != text(b)
    x, y = number(a), number(b)
    if x is None or y is None:
        return (x is None) != (y is None)
    return not math.isclose(x, y, rel_tol=1e-9, abs_tol=1.01 * 10.0 ** -_DIGITS.get(col, 4))


def _cell(v) -> str:
    return f"{number(v):g}" if number(v) is not None else repr(text(v)) if text(v) else "empty"


def rebuilt(tag_dir: Path, steps, records, rep: Report):
    """(the summary `plot_results.py --rebuild` would write, the run ids it rests on: its rows'
    runs and the A/A control's, the columns to compare). The summary and the ids are None when
    no summary can be rebuilt (a problem says why)."""
    n = ladder.tag_processes(tag_dir.name)
    one = tag_dir.parent / re.sub(r"-x\d+$", "-x1", tag_dir.name)
    columns = [*TEXTS, *MEASURED, *(c for c in gains.NUMBERS if n > 1 or c not in SCALING)]
    if n > 1 and not (one / RUNS).is_file():
        rep.note(f"no {one.name}/{RUNS} beside it: scaling efficiency not checked")
        columns = [c for c in columns if c not in SCALING]
    with contextlib.redirect_stderr(io.StringIO()):  # its warnings are problems above
        try:
            single = None
            if n > 1 and (one / RUNS).is_file():
                single = rebuild(one, ladder.expected_steps(steps, one.name))[1]
            expected = ladder.expected_steps(steps, tag_dir.name)
            df, used = rebuild(tag_dir, expected, single, n)
        except (TypeError, ValueError, KeyError, ZeroDivisionError) as e:
            rep.problem(f"no summary can be rebuilt from {RUNS}: {type(e).__name__}: {e}")
            return None, None, columns
    runs = [r for rs in used.values() for r in rs]
    if used:  # the control runs of the first step, as summary.collect takes them
        first = next(s for s in expected if s.num in used)
        sw = used[first.num][-1].get("sweep") or {}
        ctl = matching([r for _, r in records], first, config_of(used[first.num][-1]),
                       sw.get("script_sha256"), sw.get("machine"), control=True)  # fmt: skip
        runs += ok_since_failure(ctl)[-max(len(rs) for rs in used.values()) :]
    return df, {(r.get("sweep") or {}).get("run_id") for r in runs}, columns


def check_summary(rep: Report, tag_dir: Path, records, df, columns) -> list[dict]:
    """summary.csv against its records (`df`: the summary rebuilt from them); returns its rows,
    for the claims."""
    if not (tag_dir / SUMMARY).is_file():
        rep.problem(f"no {SUMMARY}")
        return []
    try:
        theirs = {r["step"]: r for r in read_summary(tag_dir).to_dict("records")}
    except UserError as e:
        rep.problem(str(e))
        return []
    have = {rec.get("step") for _, rec in records}
    for step, row in theirs.items():
        if step not in have and text(row.get("status")) not in (None, "not run"):
            rep.problem(f"{SUMMARY} step {step}: a row ({row['status']}) with no records")
    for step in sorted(have - set(theirs), key=str):
        rep.problem(f"{SUMMARY}: no row for step {step}, which has records")
    mine = {} if df is None else {r["step"]: r for r in df.to_dict("records")}
    for step in sorted(set(theirs) & set(mine)):
        a, b = theirs[step], mine[step]
        bad = [c for c in columns if _differs(c, a.get(c), b.get(c))]
        said = ", ".join(f"{c} {_cell(a.get(c))} (records: {_cell(b.get(c))})" for c in bad[:3])
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            rep.problem(f"{SUMMARY} step {step} disagrees with {RUNS}: {said}{more}")
    for step in sorted(have & set(theirs) - set(mine), key=str) if df is not None else []:
        rep.note(f"step {step} is not in this checkout's ladder: its row is not checked")
    return list(theirs.values())


def check_claims(rep: Report, rows: list[dict]) -> None:
    by_step = {r["step"]: r for r in rows}
    for row in (r for r in rows if text(r.get("status")) == "ok"):
        for col, (words, up, ratio, floor_col) in CLAIMS.items():
            said, prev = text(row.get(col)), text(row.get("prev_step"))
            if said not in words:
                continue
            where = f"{SUMMARY} step {row['step']}: {col} {said!r}"
            runs = [int(number(r.get("runs")) or 0) for r in (row, by_step.get(prev, {}))]
            r, lo, hi = (number(row.get(c)) for c in (ratio, f"{ratio}_lo", f"{ratio}_hi"))
            floor = number(row.get(floor_col))
            if min(runs) < 2:
                rep.problem(f"{where} rests on {min(runs)} round(s) of it and of step {prev}; a "
                            "claim needs 2 or more")  # fmt: skip
            elif floor is None:
                rep.problem(f"{where} without a noise floor ({floor_col} is empty)")
            elif r is None or lo is None or hi is None or lo <= 1.0 <= hi:
                rep.problem(f"{where}: its interval [{lo}-{hi}] does not exclude 1.0")
            elif abs(r - 1) <= max(floor, gains.MIN_EFFECT) or (r > 1) != (said == up):
                rep.problem(f"{where}: {r:g}x, within the noise floor {floor:g} or 1%, or the "
                            "other way")  # fmt: skip


# ---------------------------------------------------------------- a tag, the command
def check_tag(tag_dir: Path, steps=None, git: Git | None = None) -> Report:
    tag_dir, git = Path(tag_dir), git or Git()
    steps = ladder.discover(ROOT) if steps is None else steps
    rep, hosts = Report(tag_dir.name), host_names()
    records = read_records(tag_dir / RUNS, rep)
    df, used, columns = rebuilt(tag_dir, steps, records, rep)
    for n, rec in records:
        check_script(rep, n, rec, git)
        if rec.get("status") == "ok":
            check_arithmetic(rep, n, rec)
            check_busy(rep, n, rec, used)
        check_private(rep, n, rec, hosts)
        if rec.get("interpreted") is True:
            rep.problem(f"{who(rec, n)}: ran through Triton's interpreter (TRITON_INTERPRET=1): "
                        "numerics only, not a measurement")  # fmt: skip
    check_machines(rep, records)
    check_claims(rep, check_summary(rep, tag_dir, records, df, columns))
    return rep


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


def add_check_parser(sub):
    p = sub.add_parser(
        "check",
        help="validate results folders (another machine's, before merging them)",
        description=__doc__.split("\n\n")[0] + " Exit 0: no problems; 1: problems; 2: bad "
        "input. `note:` lines are not problems.",
    )
    p.add_argument(
        "dirs",
        nargs="*",
        metavar="results/<tag>",
        help="tag folders (default: every results/<tag>/ with a runs.jsonl)",
    )
    p.set_defaults(func=lambda args: check(args.dirs))
    return p
