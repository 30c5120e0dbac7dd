"""Figures live where they are generated. Hand-written prose (README.md outside its generated
blocks, docs/*.md, each step file's docstring; LADDER.md is generated whole, from those
docstrings and docs/steps.md) quotes no measured figure of this project's: a number followed by
x, tok/s, GiB, GB, MB, %, s, ms or minutes. Such a figure belongs in a page plot_results.py
writes from the records, naming its tag (README's results, LADDER.md, results/<tag>/README.md),
or in a prediction of the memory model, marked *predicted*; a published one (Raschka's) in
results/reference/, rendered beside ours. Code (fenced or `inline`: a command, a constant and
its value, an output) is not prose. What else may stand is NOT_MEASURED: figures that are no
measurement of ours, each with its reason."""

import ast
import re

import pytest
from conftest import ROOT

FIGURE = re.compile(
    r"(?<![\w.^/-])\d[\d,]*(?:\.\d+)?(?:[x×]|\s?(?:tok/s|GiB|GB|MB|%|ms|s|min|minutes))(?![\w/])"
)
# a figure whose line matches one of these stays: (the pattern, why it is no measurement of ours)
NOT_MEASURED = [
    (r"\b(?:\d+x )?\d+ GB\b(?! reserved)", "a GPU's memory as sold, a product's spec"),
    (r"\b100%", "a bound: the whole"),
    (r"~25% speedup|up to 75% speed-up|up to 8x on an A100", "a cited source's own claim"),
    (r"\d+ GiB CUDA context and \d+%", "the memory model's constants (memory_model.py)"),
    (r"within 10 minutes on 2 cores", "CI's time limit for the tests, a requirement"),
]
GENERATED = re.compile(r"<!-- (\w+):begin.*?-->.*?<!-- \1:end -->", re.S)


def prose_of_markdown(text: str) -> str:
    """A page without its generated blocks, fenced code and inline code."""
    text = GENERATED.sub("", text)
    text = "".join(text.split("```")[0::2])
    return re.sub(r"`[^`\n]*`", "", text)


def pages() -> dict[str, str]:
    """{where: its hand-written prose}: README.md, docs/*.md, every step file's docstring."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = {p.relative_to(ROOT).as_posix(): prose_of_markdown(p.read_text("utf-8")) for p in docs}
    for p in [ROOT / "00_orig.py", *sorted((ROOT / "steps").glob("*.py"))]:
        doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
        out[p.relative_to(ROOT).as_posix()] = re.sub(r"`[^`\n]*`", "", doc)
    return out


def figures(text: str) -> list[str]:
    """The measured-looking figures of `text` that NOT_MEASURED does not explain, with their
    line."""
    found = []
    for line in text.splitlines():
        allowed = [m.span() for pattern, _ in NOT_MEASURED for m in re.finditer(pattern, line)]
        for m in FIGURE.finditer(line):
            if not any(a <= m.start() < b for a, b in allowed):
                found.append(f"{m.group(0)!r} in: {line.strip()}")
    return found


@pytest.mark.parametrize("where", sorted(pages()))
def test_hand_written_prose_quotes_no_measured_figure(where):
    found = figures(pages()[where])
    assert not found, f"{where}: a figure by hand (generate it, or say it without):\n" + "\n".join(
        found
    )


def test_the_rule_finds_figures_and_lets_specs_code_and_generated_blocks_be():
    text = (
        "Step 05 reads 1.48x, 16% noise, 217 tok/s, 1.85 GiB and 32.6 s; 2 ms a step.\n"
        "An 80 GB GPU, 4x 80 GB, MFU above 100%, `--budget 840` and 2^-8 and 1e-3 are fine.\n"
        "<!-- results:begin -->\n12.5K tok/s: 11.35x\n<!-- results:end -->\n"
    )
    found = [f.split(" in: ")[0] for f in figures(prose_of_markdown(text))]
    assert found == ["'1.48x'", "'16%'", "'217 tok/s'", "'1.85 GiB'", "'32.6 s'", "'2 ms'"]
