"""Shared test set-up: offline tokenizer cache, a private cache dir, helpers to run scripts."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPEED_LADDER_SHARED", ROOT.parent / "shared"))
VERDICT = SHARED / "data" / "the-verdict.txt"
BPE = SHARED / "data" / "gpt2_bpe"
# tiktoken looks its GPT-2 files up under these names (sha1 of their download URLs)
TIKTOKEN_NAMES = {
    "encoder.json": "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6",
    "vocab.bpe": "6d1cbeee0f20b3d9449abfede4726ed8212e3aee",
}


@pytest.fixture(scope="session", autouse=True)
def offline_env(tmp_path_factory):
    """Point tiktoken at a copy of ../shared/data/gpt2_bpe and the harness at a private cache."""
    if not BPE.is_dir():
        pytest.exit(f"tests need the GPT-2 BPE files in {BPE} (set SPEED_LADDER_SHARED)", 2)
    tk = tmp_path_factory.mktemp("tiktoken")
    for src, name in TIKTOKEN_NAMES.items():
        shutil.copy(BPE / src, tk / name)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tk)
    os.environ["SPEED_LADDER_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield


def run_script(args, timeout=600, env=None, cwd=ROOT):
    """Run a command, return CompletedProcess with text output."""
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def py(script, *args, **kw):
    return run_script([sys.executable, str(ROOT / script), *map(str, args)], **kw)


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
