"""The documentation's links: every relative markdown link in README.md and docs/*.md names a file
(or folder) that exists in the checkout, and every `#anchor` a heading of the page it points to;
each docs page says what it covers and links back to README.md, and README.md links every page."""

import re
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans (links there are not links)."""
    text = "".join(text.split("```")[0::2])
    return re.sub(r"`[^`\n]*`", "", text)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = "".join(page.read_text(encoding="utf-8").split("```")[0::2])
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def relative_links(page: Path) -> list[str]:
    links = LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [u for u in links if not re.match(r"[a-z][a-z0-9+.-]*:", u)]  # http:, https:, mailto:


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/measurement.md", "docs/multi-gpu.md", "docs/memory.md"} <= names
    assert {"docs/gpu-machines.md", "docs/developing.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    links = relative_links(page)
    assert links, f"{page.name}: no links found"
    broken = []
    for url in links:
        path, _, anchor = url.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(url)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(url)
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_docs_page_says_what_it_covers_and_links_back(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ") and lines[1] == ""
    assert "(../README.md)" in lines[2], f"{page.name}: line 3 says what it covers, links back"


def test_the_readme_links_every_docs_page_and_keeps_the_ci_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    ci = [line for line in readme.splitlines() if re.match(r"pip install .*python -m pytest", line)]
    assert ci and ci[0].startswith('pip install -e ".[test]" && python -m pytest')  # .ci/run's


def test_the_glossary_defines_the_words_the_pages_use():
    """Each word a learner meets in README, LADDER.md and the steps without its meaning."""
    text = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    defined = {m.lower() for m in re.findall(r"^- \*\*(.+?)\*\*", text, flags=re.M)}
    words = "TF32, compute capability, foreach, H2D, all-reduce, mesh, master weights, MFU, "
    words += "a world of one, memory model, A/A control"
    assert not [w for w in words.split(", ") if w.lower() not in defined], defined
    assert "`cpu-small`" in text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.index("MFU (model FLOPs utilization") == readme.index("MFU")  # at first use
    assert "laptop" not in readme.lower()  # every CPU result is a 2-core server VM
