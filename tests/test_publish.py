"""python -m speed_ladder publish: the one act that adds this machine's results to results/.
Everything in tmp_path: a local folder (as results/local/ would hold it) of committed records of
steps 00-01 with their scripts pinned to HEAD, a results folder and a README of their own; the
real results/ is never touched."""

import copy
import hashlib
import json
import subprocess

import pytest
from conftest import ROOT, command_here

from speed_ladder import ladder, machine
from speed_ladder.report import publish
from speed_ladder.report.checks import check
from speed_ladder.report.pages import redraw
from speed_ladder.report.summary import rebuild, write_summary

TEMPLATES = ROOT / "results" / "cpu-amd-epyc-2c-x1" / "runs.jsonl"
README = "# Title\n\n<!-- results:begin -->\nold table\n<!-- results:end -->\n"


@pytest.fixture(scope="module")
def records():
    """The committed records of steps 00 and 01, measuring HEAD's scripts (as check wants)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: the script check needs one")
    out = []
    for line in TEMPLATES.read_text().splitlines():
        r = json.loads(line)
        if r["step"] in ("00", "01"):
            blob = subprocess.run(["git", "show", f"HEAD:{r['script']}"], cwd=ROOT,
                                  capture_output=True, check=True).stdout  # fmt: skip
            r["git_sha"] = head.stdout.strip()
            r["script_sha256"] = r["sweep"]["script_sha256"] = hashlib.sha256(blob).hexdigest()
            r["sweep"].pop("command")
            out.append(r)
    return out


def make_tag(folder, records, name="cpu-amd-epyc-2c-x1", edit=None):
    recs = copy.deepcopy(records)
    if edit:
        edit(recs)
    tag = folder / name
    tag.mkdir(parents=True)
    (tag / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_summary(tag, rebuild(tag, ladder.expected_steps(ladder.discover(ROOT), name))[0])
    return tag


@pytest.fixture
def place(tmp_path):
    """(local, results, readme) in tmp_path."""
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text(README)
    return tmp_path / "local", tmp_path / "results", tmp_path / "README.md"


def tree(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def run_publish(capsys, *args):
    return command_here(capsys, "publish", *args)


def test_publish_checks_copies_and_redraws_and_twice_adds_nothing(place, records, capsys):
    local, results, readme = place
    src = make_tag(local, records)
    kept = tree(src)
    assert publish.publish([], results, local, str(readme)) == 0
    out = capsys.readouterr().out
    dest = results / "cpu-amd-epyc-2c-x1"
    assert (dest / "runs.jsonl").read_bytes() == (src / "runs.jsonl").read_bytes()
    assert "cpu-amd-epyc-2c-x1: 9 new record(s)" in out and "then: git add " in out
    for name in ("summary.csv", "tokens_per_sec.png", "gain_vs_prev.png"):
        assert (dest / name).is_file(), name
    assert "(results/cpu-amd-epyc-2c-x1/README.md)" in readme.read_text()  # its page, linked
    assert "![tok/s](tokens_per_sec.png)" in (dest / "README.md").read_text()
    assert (readme.parent / "LADDER.md").is_file()
    assert tree(src) == kept  # the local folder is left as it was
    assert check.check([dest], say=lambda line: None) == 0
    # publishing again adds nothing: the records go in by run id
    before = (dest / "runs.jsonl").read_bytes()
    assert publish.publish(["cpu-amd-epyc-2c-x1"], results, local, str(readme)) == 0
    assert "cpu-amd-epyc-2c-x1: 0 new record(s)" in capsys.readouterr().out
    assert (dest / "runs.jsonl").read_bytes() == before


def test_the_peers_records_come_along_once(place, records, capsys):
    """peer.jsonl beside runs.jsonl (tools/peer.py's runs of the peer) goes into the tag with
    them, line by line: publishing again adds none twice, and a new round adds its own."""
    local, results, readme = place
    src = make_tag(local, records)
    peers = [{"peer": "peer", "status": "ok", "tokens_per_sec": t} for t in (700.0, 720.0)]
    (src / "peer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in peers))
    assert publish.publish([], results, local, str(readme)) == 0
    assert "9 new record(s) and 2 peer record(s)" in capsys.readouterr().out
    dest = results / "cpu-amd-epyc-2c-x1" / "peer.jsonl"
    assert dest.read_bytes() == (src / "peer.jsonl").read_bytes()
    assert publish.publish([], results, local, str(readme)) == 0
    assert "0 new record(s)\n" in capsys.readouterr().out
    with (src / "peer.jsonl").open("a") as f:
        f.write(json.dumps({"peer": "peer", "status": "ok", "tokens_per_sec": 710.0}) + "\n")
    assert publish.publish([], results, local, str(readme)) == 0
    assert "0 new record(s) and 1 peer record(s)" in capsys.readouterr().out
    assert [json.loads(x)["tokens_per_sec"] for x in dest.read_text().splitlines()] == [
        700.0,
        720.0,
        710.0,
    ]


def test_publish_refuses_what_check_finds_a_problem_in(place, records, capsys):
    local, results, readme = place

    def edit(recs):
        recs[2]["tokens_per_sec"] = 350.0  # step 01 round 1: not 512 tokens / its step time

    src = make_tag(local, records, edit=edit)
    code, out, err = run_publish(capsys, src, "--results-dir", results, "--readme", readme)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("error: 1 problem(s) in ") and "nothing published" in line
    assert "cpu-amd-epyc-2c-x1: step 01 round 1 run " in out and "tokens_per_sec 350" in out
    assert not list(results.iterdir()) and readme.read_text() == README


def test_publish_refuses_a_tag_named_for_other_hardware(place, records, capsys):
    """A sweep's --tag names its folder as its user likes; results/ holds tags named for the
    hardware that made them: check says so, and nothing is published."""
    local, results, readme = place
    src = make_tag(local, records, name="mine-x1")
    code, out, err = run_publish(capsys, src, "--results-dir", results, "--readme", readme)
    assert code == 1 and "nothing published" in err
    assert "its machine writes to cpu-amd-epyc-2c-x1, not mine-x1" in out
    assert not list(results.iterdir()) and readme.read_text() == README


def as_host(host: str):
    """An edit: the records made on another host (another machine's fingerprint)."""

    def edit(recs):
        for r in recs:  # the record's fingerprint and its sweep's: one machine
            r["sweep"]["machine"] = dict(r["sweep"]["machine"], host_id=host)
            if isinstance(r.get("machine"), dict):
                r["machine"] = dict(r["machine"], host_id=host)

    return edit


@pytest.mark.slow  # 12-16 s of charts on 2 cores: the fast suite keeps publish's main path
def test_another_machines_committed_folder_is_never_written(place, records, tmp_path, capsys):
    """results/cpu-amd-epyc-2c-x1 holds another machine's records: this machine's go to
    cpu-amd-epyc-2c-<6 hex of its fingerprint>-x1, the other folder keeps every byte; where
    that one too is another's, nothing is published."""
    local, results, readme = place
    theirs = make_tag(results, records, edit=as_host("0123456789ab"))
    kept = tree(theirs)
    make_tag(local, records)
    code, out, err = run_publish(capsys, local / "cpu-amd-epyc-2c-x1", "--results-dir", results,
                                 "--readme", readme)  # fmt: skip
    assert code == 0, out[-2000:] + err[-2000:]
    mine = results / f"cpu-amd-epyc-2c-{machine.short_id(records[0]['sweep']['machine'])}-x1"
    assert (
        "cpu-amd-epyc-2c-x1 holds another machine's records" in out
        and f"as {mine.name[:-3]}" in out
    )
    assert len((mine / "runs.jsonl").read_text().splitlines()) == 9
    assert tree(theirs) == kept  # its records, summary and (none drawn) charts
    table = readme.read_text()
    assert f"`{mine.name}`" in table and "`cpu-amd-epyc-2c-x1`" in table

    # a third machine, whose suffixed name too holds another's records: nothing is published
    third = dict(records[0]["sweep"]["machine"], host_id="ffffffffffff")
    make_tag(results, records, name=f"cpu-amd-epyc-2c-{machine.short_id(third)}-x1")
    src = make_tag(tmp_path / "third", records, edit=as_host("ffffffffffff"))
    before, text = tree(results), readme.read_text()
    code, _, err = run_publish(capsys, src, "--results-dir", results, "--readme", readme)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and "holds another machine's records" in err
    assert "nothing published" in err and tree(results) == before and readme.read_text() == text


@pytest.mark.slow  # 12-16 s of charts on 2 cores: the fast suite keeps publish's main path
def test_a_local_tag_gets_its_charts_and_never_the_readme(tmp_path, records, monkeypatch):
    """plot_results.py results/local/<tag>: that tag's charts, and the README, LADDER.md and
    results/comparison.png as they were."""
    local = tmp_path / "results" / "local"
    monkeypatch.setattr(redraw, "LOCAL_RESULTS", local)
    src = make_tag(local, records)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert redraw.main([str(src), "--readme", str(readme)]) == 0
    assert (src / "tokens_per_sec.png").is_file()
    assert readme.read_text() == README and not (tmp_path / "LADDER.md").exists()
    assert not list(tmp_path.rglob("comparison.png"))
