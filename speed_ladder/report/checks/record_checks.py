"""The checks of `python -m speed_ladder check` that read runs.jsonl record by record (check.py's
docstring numbers them): 1 the lines, 2 each record's script against this clone's history (`Git`),
3 tok/s against the step time, 5 one machine, 6 no busy run, 8 no private path or host name; and
the `Report` every check writes its problems and notes to, with `who`, the record a line names.
"""

import hashlib
import math
import re
import socket
import subprocess
from pathlib import Path

from speed_ladder.files import ROOT
from speed_ladder.measure.cpu_load import is_busy, threshold
from speed_ladder.records import jsonl_lines
from speed_ladder.report.checks.validity import foreign, impossible, misnamed
from speed_ladder.store import RUNS, _snippet, _unparsed, record_problem

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

    def __init__(self, root: Path = ROOT, foreign: dict | None = None):
        self.root, self._cache = root, {}
        self.ok = self._git("rev-parse", "--is-inside-work-tree") is not None
        self.foreign = known_foreign() if foreign is None else foreign

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
    if base in git.foreign:
        rep.problem(f"{who(rec, n)}: git_sha {base[:8]} is not this project's commit (a "
                    f"correction in results/ says so: {git.foreign[base][:90]}); correct it as "
                    "those records do (`corrections`)")  # fmt: skip
    elif base:
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


def known_foreign(results: Path = ROOT / "results") -> dict[str, str]:
    """{sha: why} of every git_sha that a committed record's `corrections` replaced: commits
    known not to be this project's (another repository's HEAD)."""
    out = {}
    for path in sorted(Path(results).glob("*/runs.jsonl")) + sorted(
        Path(results).glob("*/by-hand/*.jsonl")
    ):
        for _, rec, _ in jsonl_lines(path):
            for c in (rec or {}).get("corrections") or [] if isinstance(rec, dict) else []:
                if isinstance(c, dict) and c.get("field") == "git_sha":
                    was = str(c.get("was") or "").removesuffix("-dirty")
                    if was:
                        out[was] = str(c.get("why") or "")
    return out


def check_corrections(rep: Report, n: int, rec: dict, git: Git) -> None:
    """A record corrected by hand says so (`corrections`: field, was, now, why): each is a
    note; one that is not coherent (the field does not hold `now`, no reason, a corrected
    git_sha this clone lacks, so its script cannot be checked at it) is a problem."""
    fixes = rec.get("corrections")
    if fixes is None:
        return
    if not isinstance(fixes, list) or not all(isinstance(c, dict) for c in fixes):
        rep.problem(f"{who(rec, n)}: corrections is not a list of {{field, was, now, why}}")
        return
    for c in fixes:
        field, why = c.get("field"), c.get("why")
        if not isinstance(field, str) or "was" not in c or not (isinstance(why, str) and why):
            rep.problem(f"{who(rec, n)}: a correction without its field, was or why: {c!r:.80}")
            continue
        if c.get("now", rec.get(field)) != rec.get(field):
            rep.problem(f"{who(rec, n)}: a correction says {field} is now {c.get('now')!r:.20}, "
                        f"the record holds {rec.get(field)!r:.20}")  # fmt: skip
        now = rec.get(field)
        if field == "git_sha" and git.ok and not (isinstance(now, str) and git.has(now)):
            rep.problem(f"{who(rec, n)}: corrected git_sha {str(now)[:8]} is not in this clone: "
                        "the correction cannot be checked")  # fmt: skip
        rep.note(f"{field} corrected by hand, as the records show: was {str(c['was'])[:8]}, "
                 f"now {str(now)[:8]}: {why}")  # fmt: skip


# ---------------------------------------------------------------- 3, 6, 8: each record
def check_arithmetic(rep: Report, n: int, rec: dict) -> None:
    """Each reason an ok record is impossible, foreign to its tag or of other hardware than the
    tag names (validity.py), a line each."""
    if _num(rec.get("tokens_per_step")) is None:
        rep.note("no tokens_per_step (an older record): tok/s not checked against step time")
    for why in impossible(rec) + foreign(rec, rep.tag) + misnamed(rec, rep.tag):
        rep.problem(f"{who(rec, n)}: {why}")


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
