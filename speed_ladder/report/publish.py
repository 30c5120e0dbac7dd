"""`python -m speed_ladder publish [TAG ...]`: this machine's results added to the committed ones,
the one act that writes results/<tag>/ (a sweep writes only results/local/, which git ignores).

1. **Which.** Each named tag (a folder, or a tag's name in results/local/), else every
   results/local/<tag>/ with a runs.jsonl. A tag brings the other process counts of its hardware
   with it (its `-x1` and `-xN` folders go together: an `-xN` summary's scaling is over the
   `-x1` beside it).
2. **Checked first.** `python -m speed_ladder check` (checks/check.py) runs on each; a single
   problem and nothing is published: its lines, then one `error:` line, exit 1.
3. **Where.** results/<tag>/, unless a folder there of that hardware holds another machine's
   records (their fingerprint, machine.py; a folder with files but no runs.jsonl counts as
   another's): then results/<hardware>-<6 hex of this machine>-xN, as the sweep names a folder
   of its own, and it says so; that one too held by another machine is an error. Records go in
   by run id: a record results/<tag>/runs.jsonl already has is not added again (publishing
   twice adds nothing), and the lines there stay as they are; a failed run's log comes along,
   and so do the peer's records (peer.jsonl, tools/peer.py), line by line.
4. **Then** each published tag's summary is rebuilt from its runs.jsonl, and what
   plot_results.py draws is drawn: the published tags' charts, results/comparison.png and
   gpu_vs_a100.png, the README's results, LADDER.md and the published tags' pages (another
   tag's charts and page are left as they are). Where no record was new, nothing is redrawn.
   The local folder is left as it is.
"""

import glob
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

from speed_ladder import machine
from speed_ladder.errors import UserError, is_environment_os_error, os_error_line
from speed_ladder.files import LOCAL_RESULTS, RESULTS, ROOT, atomic_write_bytes, portable_path
from speed_ladder.records import jsonl_lines
from speed_ladder.report.checks import check
from speed_ladder.report.compare.peers import PEERS
from speed_ladder.report.pages import redraw
from speed_ladder.report.summary import find_tags, read_summary
from speed_ladder.selection import foreign
from speed_ladder.store import RUNS, load_runs

_TAG = re.compile(r"(.+)(-x\d+)$")


def _name(path: Path) -> str:
    return portable_path(path)


def chosen(names, local: Path = LOCAL_RESULTS) -> list[Path]:
    """The tag folders to publish (see the module docstring, 1.), each with its siblings."""
    if names:
        tags = []
        for n in names:
            p = Path(n)
            if not (p / RUNS).is_file() and (Path(local) / n / RUNS).is_file():
                p = Path(local) / n
            if not (p / RUNS).is_file():
                why = "no such folder" if not p.is_dir() else f"no {RUNS} there"
                raise UserError(f"{n}: {why} (a tag folder of python -m speed_ladder run, or "
                                f"a tag's name in {_name(local)}/)")  # fmt: skip
            tags.append(p)
    else:
        tags = sorted(p.parent for p in Path(local).glob(f"*/{RUNS}"))
        if not tags:
            raise UserError(f"no {_name(local)}/<tag>/{RUNS} to publish: run `python -m "
                            "speed_ladder run` first")  # fmt: skip
    out = []
    for t in tags:
        m = _TAG.fullmatch(t.name)
        if m is None:
            raise UserError(f"{t}: not a tag folder (its name ends in -x<processes>)")
        siblings = [s.parent for s in t.parent.glob(f"{glob.escape(m.group(1))}-x*/{RUNS}")
                    if re.fullmatch(re.escape(m.group(1)) + r"-x\d+", s.parent.name)]  # fmt: skip
        out += [s for s in sorted(siblings, key=lambda s: s.name) if s not in out]
    return out


def fingerprint_of(tag_dir: Path) -> dict:
    """The machine that made a tag folder's records: their most common fingerprint."""
    prints = [(r.get("sweep") or {}).get("machine") or r.get("machine") for r in load_runs(tag_dir)]
    counts = Counter(repr(p) for p in prints if isinstance(p, dict))
    if not counts:
        raise UserError(f"{tag_dir}: no record with a machine fingerprint: nothing to publish")
    top = counts.most_common(1)[0][0]
    return next(p for p in prints if repr(p) == top)


def _held(dest: Path, fp: dict) -> dict | None:
    """The fingerprint of another machine whose records `dest` holds (or {} where it holds
    files but no runs.jsonl), else None."""
    if (dest / RUNS).is_file():
        others = foreign(load_runs(dest), fp)
        return ((others[-1].get("sweep") or {}).get("machine") or {}) if others else None
    return {} if dest.is_dir() and any(dest.iterdir()) else None


def destination(base: str, suffixes: list[str], fp: dict, results: Path) -> str:
    """The hardware part of the committed tag this machine's folders go to (module docstring,
    3.)."""
    mine = machine.short_id(fp)
    candidates = [base] + ([f"{base}-{mine}"] if not base.endswith(f"-{mine}") else [])
    for cand in candidates:
        taken = [(results / (cand + s), held) for s in suffixes
                 if (held := _held(results / (cand + s), fp)) is not None]  # fmt: skip
        if not taken:
            if cand != base:
                print(f"{_name(results / (base + suffixes[0]))} holds another machine's records; "
                      f"this machine's are published as {cand}-x...", flush=True)  # fmt: skip
            return cand
        where, held = taken[0]
    raise UserError(
        f"{_name(where)} holds another machine's records ({machine.describe(held or None)}); "
        "results of two machines never share a folder: nothing published"
    )


def merge(src: Path, dest: Path) -> int:
    """Add src's records that dest's runs.jsonl lacks (by run id) and their logs; returns how
    many. dest's lines stay as they are."""
    have = {(r.get("sweep") or {}).get("run_id") for r in load_runs(dest)} - {None}
    new, logs = [], []
    for _, r, raw in jsonl_lines(src / RUNS):
        rid = (r.get("sweep") or {}).get("run_id") if isinstance(r, dict) else None
        if r is None or rid in have:
            continue
        have.add(rid)
        new.append(raw.rstrip(b"\r\n") + b"\n")
        if isinstance(r.get("log"), str):
            logs.append(r["log"])
    dest.mkdir(parents=True, exist_ok=True)
    for log in logs:  # before the records that name them
        if (src / log).is_file() and not (dest / log).exists():
            (dest / log).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / log, dest / log)
    _append(dest / RUNS, new)
    return len(new)


def merge_peers(src: Path, dest: Path) -> int:
    """Add src's peer records (peer.jsonl: tools/peer.py's runs of the peer beside the sweep's)
    that dest's lacks, line for line; returns how many. dest's lines stay as they are."""
    if not (src / PEERS).is_file():
        return 0
    have = {raw.strip() for _, _, raw in jsonl_lines(dest / PEERS)}  # none where it is missing
    new = []
    for _, r, raw in jsonl_lines(src / PEERS):
        line = raw.strip()
        if isinstance(r, dict) and line not in have:
            have.add(line)
            new.append(line + b"\n")
    if new:
        dest.mkdir(parents=True, exist_ok=True)
    _append(dest / PEERS, new)
    return len(new)


def _append(path: Path, lines: list[bytes]) -> None:
    """`lines` (each ending in a newline) after what `path` holds, in one atomic write; nothing
    written where there are none."""
    if not lines:
        return
    old = path.read_bytes() if path.is_file() else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    atomic_write_bytes(path, old + b"".join(lines))


def publish(names, results: Path = RESULTS, local: Path = LOCAL_RESULTS,
            readme: str | None = str(ROOT / "README.md"), say=print) -> int:  # fmt: skip
    """The command (module docstring); the exit status."""
    tags = chosen(names, local)
    problems = 0
    for t in tags:
        rep = check.check_tag(t)
        problems += len(rep.problems)
        for line in rep.lines():
            say(line)
    if problems:
        print(f"error: {problems} problem(s) in {', '.join(_name(t) for t in tags)} (above): "
              "nothing published; fix what they say (docs/developing.md, \"Add your machine's "
              "results\"), then publish", file=sys.stderr)  # fmt: skip
        return 1
    groups: dict[str, list[Path]] = {}
    for t in tags:
        groups.setdefault(_TAG.fullmatch(t.name).group(1), []).append(t)
    plan = []
    for base, group in groups.items():  # every destination decided before anything is written
        fp = fingerprint_of(group[0])
        suffixes = [_TAG.fullmatch(t.name).group(2) for t in group]
        dest = destination(base, suffixes, fp, Path(results))
        plan += [(t, Path(results) / (dest + s)) for t, s in zip(group, suffixes, strict=True)]
    added = 0
    for src, dest in plan:
        n, peers = merge(src, dest), merge_peers(src, dest)
        added += n + peers
        also = f" and {peers} peer record(s)" if peers else ""
        say(f"published {_name(src)} -> {_name(dest)}: {n} new record(s){also}")
    if not added:
        say("nothing new: the summaries, charts and README stay as they are")
        return 0
    dests = [dest for _, dest in plan]
    redraw.rebuild_summaries(dests)
    draw(dests, Path(results), readme, say)
    say("then: git add " + " ".join(_name(d) for d in dests)
        + " README.md LADDER.md results/*.png, commit from this checkout (the "
        "records' git_sha) and open a pull request")  # fmt: skip
    return 0


def draw(dests: list[Path], results: Path, readme: str | None, say=print) -> None:
    """What plot_results.py draws, for the published tags: their charts and pages, the
    comparisons of every committed tag, the README's results and LADDER.md (other tags' charts
    and pages are left as they are: publishing one machine's results changes no other's
    files)."""
    tags = find_tags(results)
    for t in tags:  # every summary readable before anything is drawn
        read_summary(t)
    for path in redraw.draw_charts(dests, tags):
        say(f"wrote {_name(path)}")
    if readme:
        redraw.write_docs(Path(readme), tags, say, pages=dests)


def add_publish_parser(sub):
    local = _name(LOCAL_RESULTS)
    p = check.add_tags_command(
        sub, "publish", __doc__,
        "check this machine's results and add them to results/ (then README, LADDER.md)",
        "Exit 0: published; 1: check found problems; 2: bad input.", "tags", "TAG",
        f"tag names in {local}/ or tag folders (default: every {local}/<tag>/ with a runs.jsonl)",
    )  # fmt: skip
    p.add_argument(
        "--results-dir",
        default=str(RESULTS),
        metavar="DIR",
        help="where the committed tags are (default: results/ in the repository)",
    )
    p.add_argument(
        "--readme",
        default=str(ROOT / "README.md"),
        metavar="PATH",
        help="the README whose results plot_results.py regenerates (default: README.md)",
    )
    p.set_defaults(func=_command)
    return p


def _command(args) -> int:
    """publish, with a full or read-only disk or Ctrl-C as one `error:` line (the records
    already appended stay: publishing again adds only what is missing)."""
    try:
        return publish(args.tags, Path(args.results_dir), readme=args.readme)
    except KeyboardInterrupt:
        print("error: interrupted; publish again to finish (it adds only what is missing)",
              file=sys.stderr)  # fmt: skip
        return 130
    except OSError as e:
        if not is_environment_os_error(e):
            raise
        print(f"error: {os_error_line(e)}; publish again to finish", file=sys.stderr)
        return 1
