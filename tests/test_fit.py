"""`python -m speed_ladder fit` (measure/fit.py, report/fit_command.py): how large a model fits,
rung by rung, as the memory model predicts it; the property that no rung's largest model shrinks
when a rung that only saves memory is added or a GPU joins; and the pages made from it
(docs/memory-ladder.md, docs/memory.md's fit table), with a published memory ladder's figures
kept as published. No torch, no training."""

import csv
import json
import time

import pytest
from conftest import ROOT

from speed_ladder import ladder
from speed_ladder.__main__ import main
from speed_ladder.errors import UserError
from speed_ladder.measure import fit
from speed_ladder.measure import memory_model as mm
from speed_ladder.report import fit_command
from speed_ladder.report.pages import memory_page

SIZES = [g * fit.GB for g in (16, 24, 40, 80, 141)]
MEMORY_TERMS = ("loss", "checkpointing", "state", "accumulation")  # what a memory rung changes


def at(row) -> int:
    """The largest model's place in the family (-1: none fits)."""
    return -1 if row.model is None else fit.FAMILY.index(row.model)


def run(capsys, *args):
    try:
        code = main(["fit", *args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sizes_parse_as_gib_gb_or_bare_gb():
    assert fit.parse_size("24GiB") == 24 * 2**30 and fit.parse_size("1.5 gib") == 3 * 2**29
    assert fit.parse_size("80GB") == fit.parse_size("80") == 80 * 10**9
    for bad in ("", "GB", "-4GB", "0", "24TB", "x24"):
        with pytest.raises(UserError, match="is not a size"):
            fit.parse_size(bad)


def test_fit_prints_every_rung_in_seconds(capsys):
    t = time.perf_counter()
    code, out, err = run(capsys, "--memory", "80GiB")
    assert code == 0 and not err and time.perf_counter() - t < 30
    assert "*Predicted*" in out and "80.0 GiB per GPU:" in out
    for r in fit.rungs():
        assert f"| {r.name} | {r.step or '–'} |" in out
        assert f"- {r.step or '–'} {r.name}: " in out  # its time cost, or "not measured"
    assert out.count("| gpt2-124m | gpt2-medium | gpt2-large | gpt2-xl |") == 1


def test_json_rows_for_two_24_gib_gpus(capsys):
    code, out, _ = run(capsys, "--memory", "24GiB", "--nproc", "2", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["rung"] for r in rows] == [r.name for r in fit.rungs()]
    need = {"rung", "model", "params", "batch", "nproc", "memory_bytes", "predicted_bytes", "fits"}
    for r in rows:
        assert need <= set(r) and r["nproc"] == 2 and r["memory_bytes"] == 24 * 2**30
        assert r["fits"] == (r["model"] is not None) and set(r["batches"]) == set(mm.GPT2_FAMILY)


@pytest.mark.parametrize(
    "args", [["--memory", "24TB"], ["--memory", "0"], ["--nproc", "0"], ["--context", "x"]]
)
def test_a_bad_size_or_count_is_one_line(capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 2 and not out and len(err.splitlines()) == 1 and err.startswith("error: ")


def test_without_a_gpu_the_common_sizes_and_with_one_its_own(capsys, monkeypatch):
    monkeypatch.setattr(fit_command, "this_gpu", lambda: None)
    rows = json.loads(run(capsys, "--json")[1])
    assert sorted({r["memory_bytes"] for r in rows}) == [g * fit.GB for g in fit.COMMON_GB]
    h100 = 85_045_346_304  # a simulated GPU's total memory, as torch.cuda reports it
    monkeypatch.setattr(fit_command, "this_gpu", lambda: h100)
    code, out, _ = run(capsys)
    assert code == 0 and "79.2 GiB per GPU:" in out and out.count("per GPU:") == 1


def test_the_largest_model_fits_and_the_next_does_not():
    for r in fit.rungs():
        row = fit.fit_row(r, 40 * fit.GB, 2)
        i = at(row)
        assert row.fits and mm.fits(
            fit.predict(r, row.model, row.batch, 2, fit.CONTEXT), row.memory_bytes
        )
        if i + 1 < len(fit.FAMILY):
            nxt = fit.predict(r, fit.FAMILY[i + 1], row.batch, 2, fit.CONTEXT)
            assert not mm.fits(nxt, row.memory_bytes)
        for name, b in row.batches.items():  # the largest batch fits, the next multiple not
            k = r.memory.micro_batches(fit.model(name)["accum_steps"], fit.MAX_BATCH)
            assert b == 0 or mm.fits(fit.predict(r, name, b, 2, fit.CONTEXT), row.memory_bytes)
            assert not mm.fits(fit.predict(r, name, b + k, 2, fit.CONTEXT), row.memory_bytes)


def _memory_only_pairs():
    """(the rung it builds on, the rung) for each rung of the ladder that changes memory terms
    only, and for all of them together over the last rung."""
    out = []
    for r in ladder.rungs():
        base = ladder.rung(r.after) if r.after else None
        if base is None or r.distributed != base.distributed:
            continue  # DDP (more processes) is no memory rung
        changed = {
            k
            for k in r.memory.__dataclass_fields__
            if getattr(r.memory, k) != getattr(base.memory, k)
        }
        if changed and changed <= set(MEMORY_TERMS):
            out.append(
                (
                    fit.Rung(base.num, base.num, base.memory, None),
                    fit.Rung(r.num, r.num, r.memory, None),
                )
            )
    every = fit.rungs()
    return [*out, (every[-2], every[-1])]


def test_no_largest_model_shrinks_when_a_memory_rung_is_added():
    pairs = _memory_only_pairs()
    assert [b.step for _, b in pairs] == ["12", "13", "14", "18", "21", None]
    for size in SIZES:
        for n in (1, 2, 4, 8):
            for a, b in pairs:
                if b.memory.state == "fsdp2" and a.memory.state != "fsdp2" and n == 1:
                    continue  # FSDP2 on one GPU shards nothing and gathers copies: inactive
                assert at(fit.fit_row(b, size, n)) >= at(fit.fit_row(a, size, n)), (a, b, size, n)


def test_no_largest_model_shrinks_when_a_gpu_is_added():
    """From 2 processes on, for every rung; from 1 to 2 for every rung that shards its state.
    DDP wraps a model only with 2 processes or more, and then its gradient buckets (4 B a
    parameter, PyTorch's default gradient_as_bucket_view=False) are all that one more GPU
    costs a DDP rung's rank: the exception, pinned here."""
    for r in fit.rungs():
        for size in SIZES:
            for n in (1, 2, 4):
                one, more = fit.fit_row(r, size, n), fit.fit_row(r, size, 2 * n)
                if n > 1 or r.memory.state in mm.SHARDED:
                    assert at(more) >= at(one), (r.name, size, n)
        if r.memory.state == "ddp":
            p1, p2 = (fit.predict(r, "gpt2-xl", 8, n, fit.CONTEXT) for n in (1, 2))
            assert p2.total_bytes - p1.total_bytes == p2.buffer_bytes > 0 == p1.buffer_bytes


def test_offload_and_all_rungs_together_fit_the_largest():
    rows = {r.rung: r for r in fit.fit_rows(80 * fit.GB, 1)}
    assert (
        rows["CPU offload"].host_bytes
        == mm.state_bytes(fit.model(rows["CPU offload"].model), 1, "fsdp2")["total"]
    )
    assert at(rows["all of them together"]) >= max(at(r) for r in rows.values())


def test_a_context_of_its_own_changes_the_activations_only():
    short, long = (fit.fit_row(fit.rungs()[0], 24 * fit.GB, 1, t) for t in (512, 2048))
    assert at(short) >= at(long) and short.batches["gpt2-124m"] > long.batches["gpt2-124m"]


def test_the_rungs_are_the_ladders_first_of_each_term():
    got = [(r.step, r.base) for r in fit.rungs()]
    assert got == [
        ("11", "10"),
        ("12", "11"),
        ("13", "12"),
        ("18", "17"),
        ("14", "13"),
        ("21", "14"),
        (None, "21"),
    ]
    assert fit.rungs()[-1].memory.accumulation == ladder.rung("18").memory.accumulation


def test_time_costs_come_from_committed_gpu_records():
    costs = fit_command.time_costs()
    assert set(costs) == {r.step for r in fit.rungs()}
    assert "(nvidia-h200-x1)" in costs["13"] and "of step 12" in costs["13"]
    assert costs[None] == "not measured"


# ---------------------------------------------------------------- the pages
def test_docs_memory_md_holds_the_generated_fit_table():
    text = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")
    assert memory_page.memory_doc(text) == text and memory_page.BEGIN in text
    assert fit.fit_table() in text


def test_the_memory_ladder_page_is_generated():
    page = (ROOT / "docs" / "memory-ladder.md").read_text(encoding="utf-8")
    assert page == memory_page.page_markdown(), "regenerate it: python plot_results.py"
    assert "| CPU offload | 21 |" in page and "*Predicted*" in page


def test_her_figures_are_kept_as_published():
    with open(memory_page.ZHANG, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["peak_mb"] for r in rows] == ["36272", "25194", "15394", "13108", "8502"]
    assert [r["step_time_s"] for r in rows] == ["16.3", "17.2", "23.1", "23.5", "17.1"]
    assert [r["vs_before"] for r in rows] == ["", "-31%", "-39%", "-15%", "-35%"]
    assert all(
        "Ailing Zhang" in r["source"]
        and "Efficient Training in PyTorch" in r["source"]
        and "not measured by this project" in r["source"]
        for r in rows
    )
    with open(memory_page.ZHANG_LARGEST, newline="") as f:
        (claim,) = csv.DictReader(f)
    assert (claim["before_params_m"], claim["after_params_m"], claim["claim"]) == (
        "1795",
        "9183",
        "5x larger",
    )


def test_the_page_sets_our_prediction_beside_hers():
    page = memory_page.page_markdown()
    section = page.split("## Beside a published memory ladder")[1].split("\n## ")[0]
    context, _ = memory_page.infer_context(memory_page._rows(memory_page.ZHANG))
    assert context in memory_page.CONTEXTS and f"**{context}** is inferred" in section
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert len(lines) == 6  # the head and her five rows, each with a ratio
    assert "1,795M before" in section and "9,183M after" in section and "5x larger" in section
    assert "Ours (*predicted*" in section


def test_every_committed_peak_stands_beside_its_prediction():
    """Each tag's ok rows, from its summary: measured / predicted = ratio."""
    from speed_ladder.report.summary import find_tags, read_summary

    section = memory_page.page_markdown().split("## The predictions checked")[1]
    for tag in find_tags(ROOT / "results"):
        assert f"`{tag.name}`" in next(ln for ln in section.splitlines() if "| step |" in ln)
        for r in read_summary(tag).to_dict("records"):
            if r["status"] == "ok":
                got, want = r["peak_reserved_gib"], r["predicted_peak_gib"]
                assert f"| {r['step']} |" in section
                assert f"{got:.2f} / {want:.2f} = {got / want:.2f}" in section, (tag, r["step"])
