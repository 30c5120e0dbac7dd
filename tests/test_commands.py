"""Every documented multi-process command works on the default text, by the harness's own
arithmetic: one global batch (per-process batch x processes) of the step's preset fits the training
windows Middlemarch gives at the preset's context (speed_ladder.measure.data.num_windows), and
validation gets a window. Parsed from the code blocks of README.md and docs/*.md and from every
step's docstring: each `torchrun ...` command and each `python -m speed_ladder run ... --nproc N`.
"""

import ast
import shlex
from pathlib import Path

import pytest
from conftest import ROOT

from speed_ladder.ladder import discover, rung, rungs, step_of
from speed_ladder.measure.data import TRAIN_RATIO, num_windows, read_text, token_ids
from speed_ladder.presets import PRESETS

SUMMARIES = {r.summary_file: r.num for r in rungs() if r.summary_file}


def _logical_lines(text: str):
    """Lines with their backslash continuations joined and comments cut."""
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line = (buf + line).split(" #", 1)[0].strip()
        buf = ""
        if line.startswith("torchrun ") or (
            line.startswith("python -m speed_ladder run") and "--nproc" in line
        ):
            yield line


def markdown_pages() -> list[Path]:
    """README.md and the pages under docs/ that it links to."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(page: Path) -> list[str]:
    return page.read_text(encoding="utf-8").split("```")[1::2]  # the fenced code blocks


def documented_commands():
    out = []
    for page in markdown_pages():
        where = page.relative_to(ROOT).as_posix()
        out += [(where, c) for b in code_blocks(page) for c in _logical_lines(b)]
    scripts = [s.path for s in discover(ROOT)] + [ROOT / n for n in SUMMARIES]
    for path in scripts:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        rel = path.relative_to(ROOT).as_posix()
        # the shared usage block names the file as `<this file>` (--help fills it in)
        out += [(rel, c.replace("<this file>", rel)) for c in _logical_lines(doc)]
    return out


COMMANDS = documented_commands()


def _flag(argv, name, default=None):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _step_of(script: str) -> str:
    return step_of(script)


def global_batches(command: str):
    """(step, preset, per-process batch, processes) for each distributed step it launches."""
    argv = shlex.split(command)
    preset = _flag(argv, "--preset") or ("cpu" if _flag(argv, "--device") == "cpu" else "gpt2-124m")
    from speed_ladder.measure.settings import resolve_spec

    p = resolve_spec({"preset": preset}, "cpu")  # the preset's batches
    if argv[0] == "torchrun":
        world = int(_flag(argv, "--nnodes", "1")) * int(_flag(argv, "--nproc_per_node", "1"))
        steps = [_step_of(next(a for a in argv if a.endswith(".py")))]
    else:  # python -m speed_ladder run --steps SPEC --nproc N: its distributed steps, 11 on
        world = int(_flag(argv, "--nproc"))
        from speed_ladder.ladder import parse_steps

        steps = [s.num for s in parse_steps(_flag(argv, "--steps"), discover(ROOT))]
        steps = [s for s in steps if rung(s).distributed]
    for step in steps:
        default = rung(step).batch(p)
        yield step, preset, int(_flag(argv, "--batch-size", default)), world


@pytest.fixture(scope="module")
def middlemarch_ids():
    text, _ = read_text(None)  # data/middlemarch.txt, from the mirror or Gutenberg once
    return token_ids(text)


def test_the_documentation_has_the_multi_gpu_commands():
    worlds = {w for _, c in COMMANDS for *_, w in global_batches(c)}
    assert 16 in worlds  # the two-node command
    assert {2, 4} <= worlds
    assert any(c.startswith("python -m speed_ladder run") for _, c in COMMANDS)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}: {c[:60]}" for w, c in COMMANDS])
def test_each_documented_command_fits_one_global_batch_in_middlemarch(
    where, command, middlemarch_ids
):
    split = int(TRAIN_RATIO * len(middlemarch_ids))
    for step, preset, batch, world in global_batches(command):
        T = PRESETS[preset]["context_length"]
        train = num_windows(split, T)
        val = num_windows(len(middlemarch_ids) - split, T)
        assert batch * world <= train, (
            f"{where}: step {step} on {preset}: {world} processes x batch {batch} = "
            f"{batch * world} windows, Middlemarch has {train} of {T} tokens: {command}"
        )
        assert val >= 1


def speed_ladder_commands() -> list[str]:
    """Every `python -m speed_ladder ...` command in the code blocks of README.md and docs/*.md
    (after `&&` too)."""
    blocks = [b for page in markdown_pages() for b in code_blocks(page)]
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    parts = [p.strip() for line in lines for p in line.split(" #", 1)[0].split("&&")]
    return [p for p in parts if p.startswith("python -m speed_ladder ")]


def test_each_documented_speed_ladder_command_parses():
    from speed_ladder.__main__ import parser

    commands = speed_ladder_commands()
    assert {c.split()[3] for c in commands} == {"run", "check", "publish"}
    for command in commands:  # a bad flag would exit 2 here
        assert parser().parse_args(shlex.split(command)[3:]).command in ("run", "check", "publish")


def test_a_text_too_short_for_the_world_size_names_the_batch_that_fits(tmp_path):
    from speed_ladder.errors import UserError
    from speed_ladder.measure.data import load_split

    text = tmp_path / "short.txt"
    text.write_text((ROOT / "README.md").read_text())
    with pytest.raises(UserError) as e:
        load_split(str(text), 32, 512, 16)
    assert "is the largest per-process batch that fits 16 processes" in str(e.value)
    n = int(str(e.value).split("--batch-size ")[1].split()[0])
    load_split(str(text), 32, n, 16)  # and it does fit
