"""The suite's own inputs (tests/conftest.py, missing_inputs): a short text and GPT-2's BPE files
come from the offline folder (SPEED_LADDER_SHARED, speed_ladder/files.py mirror()) or are
downloaded once. A clone with neither (offline, no mirror) gets one line and exit 4 before any
test, not the same error in every one of ~550 tests. pytest runs in a copy of the checkout that
has no data/ folder, the network cut by a proxy that refuses every connection."""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import BPE, ROOT, VERDICT

CASE = "def test_nothing():\n    pass\n"


@pytest.fixture
def clone(tmp_path):
    """The package, the test set-up and one empty test, without data/ or a mirror beside it."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "speed_ladder", repo / "speed_ladder",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (repo / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", repo / "tests" / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", repo)
    (repo / "tests" / "test_case.py").write_text(CASE)
    return repo


def pytest_in(repo, mirror, tiktoken_cache):
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    env |= {
        "SPEED_LADDER_SHARED": str(mirror),
        "TIKTOKEN_CACHE_DIR": str(tiktoken_cache),
        "https_proxy": "http://127.0.0.1:9",  # the discard port: every download is refused
        "http_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_case.py"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def error_lines(p):
    return [line for line in (p.stdout + p.stderr).splitlines() if "the tests need" in line]


def test_no_text_and_no_network_is_one_line_and_exit_4(clone, tmp_path):
    (tmp_path / "tk").mkdir()
    p = pytest_in(clone, tmp_path / "no-mirror", tmp_path / "tk")
    assert p.returncode == 4, p.stdout + p.stderr
    (line,) = error_lines(p)
    assert line.startswith("ERROR: the tests need a text and GPT-2's BPE files (cannot download")
    assert str(tmp_path / "no-mirror" / "data") in line and "SPEED_LADDER_SHARED" in line
    assert "passed" not in p.stdout and "Traceback" not in p.stdout + p.stderr


def test_a_text_without_the_bpe_files_is_one_line_and_exit_4(clone, tmp_path):
    (tmp_path / "mirror" / "data").mkdir(parents=True)
    shutil.copy(VERDICT, tmp_path / "mirror" / "data" / "the-verdict.txt")
    (tmp_path / "tk").mkdir()  # an empty tiktoken cache: it would download
    p = pytest_in(clone, tmp_path / "mirror", tmp_path / "tk")
    assert p.returncode == 4, p.stdout + p.stderr
    (line,) = error_lines(p)
    assert "cannot load the GPT-2 tokenizer" in line
    assert "passed" not in p.stdout


@pytest.mark.skipif(not BPE.is_dir(), reason="needs the offline mirror's BPE files")
def test_with_the_mirror_the_tests_run_offline(clone, tmp_path):
    data = tmp_path / "mirror" / "data"
    data.mkdir(parents=True)
    shutil.copy(VERDICT, data / "the-verdict.txt")
    shutil.copytree(BPE, data / "gpt2_bpe")
    (tmp_path / "tk").mkdir()
    p = pytest_in(clone, tmp_path / "mirror", tmp_path / "tk")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 passed" in p.stdout and not error_lines(p)
