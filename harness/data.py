"""The training text and its GPT-2 token ids: download once, tokenize once, split 90/10."""

import hashlib
import io
import os
import urllib.request
from pathlib import Path

import numpy as np

from .errors import UserError
from .files import ROOT, atomic_write_bytes, cache_dir, mirror

DEFAULT_TEXT = ROOT / "data" / "middlemarch.txt"
GUTENBERG_URL = "https://www.gutenberg.org/cache/epub/145/pg145.txt"  # Middlemarch, Gutenberg #145
TRAIN_RATIO = 0.90
# tiktoken's cache names for GPT-2's BPE files (sha1 of their download URLs)
TIKTOKEN_NAMES = {
    "encoder.json": "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6",
    "vocab.bpe": "6d1cbeee0f20b3d9449abfede4726ed8212e3aee",
}


def read_text(data: str | None) -> tuple[str, Path]:
    """The text from --data, else data/middlemarch.txt, downloaded from Gutenberg if missing."""
    if data is not None:
        path = Path(data)
        if not path.is_file():
            raise UserError(f"--data {data}: no such file")
    else:
        path = DEFAULT_TEXT
        local = mirror() / "middlemarch.txt"
        if not path.is_file() and local.is_file():
            print(f"copying Middlemarch from the local mirror {local} to {path}", flush=True)
            atomic_write_bytes(path, local.read_bytes())
        if not path.is_file():
            print(f"downloading Middlemarch (Gutenberg #145) to {path} ...", flush=True)
            try:
                with urllib.request.urlopen(GUTENBERG_URL, timeout=30) as r:
                    atomic_write_bytes(path, r.read())
            except OSError as e:
                raise UserError(
                    f"cannot download {GUTENBERG_URL} ({e.__class__.__name__}: {e}); "
                    "offline? pass a local text with --data PATH"
                ) from None
    try:
        return path.read_text(encoding="utf-8-sig"), path
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def stage_bpe(bpe: Path, dest: Path) -> Path:
    """Copy GPT-2's encoder.json and vocab.bpe into `dest` under tiktoken's cache names."""
    for src, name in TIKTOKEN_NAMES.items():
        if not (dest / name).is_file():
            atomic_write_bytes(dest / name, (bpe / src).read_bytes())
    return dest


def gpt2_tokenizer():
    """tiktoken's GPT-2 BPE; offline it reads its two files from TIKTOKEN_CACHE_DIR."""
    import tiktoken

    bpe = mirror() / "gpt2_bpe"
    if "TIKTOKEN_CACHE_DIR" not in os.environ and bpe.is_dir():  # offline mirror: no download
        os.environ["TIKTOKEN_CACHE_DIR"] = str(stage_bpe(bpe, cache_dir() / "tiktoken"))
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests/urllib errors differ by tiktoken version
        where = os.environ.get("TIKTOKEN_CACHE_DIR", "unset")
        raise UserError(
            f"cannot load the GPT-2 tokenizer ({e.__class__.__name__}); offline, put its "
            f"encoder.json and vocab.bpe in TIKTOKEN_CACHE_DIR (now: {where}) under tiktoken's "
            "cache names, see README 'Offline'; the text itself comes from --data"
        ) from None


def token_ids(text: str) -> np.ndarray:
    """GPT-2 token ids of `text`, cached by the text's sha256."""
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    path = cache_dir() / f"tokens-gpt2-{key}.npy"
    if path.is_file():
        return np.load(path)
    ids = gpt2_tokenizer().encode(text, allowed_special={"<|endoftext|>"})
    arr = np.asarray(ids, dtype=np.uint16)  # GPT-2 vocab 50257 < 2**16
    buf = io.BytesIO()
    np.save(buf, arr)
    atomic_write_bytes(path, buf.getvalue())
    return arr


def num_windows(n_tokens: int, context_length: int) -> int:
    """How many (input, target) windows of stride context_length fit (as the steps' dataset)."""
    return max(0, -(-(n_tokens - context_length) // context_length))


def load_split(data: str | None, context_length: int, batch_size: int, world_size: int):
    """(train_ids, val_ids) as int64 tensors; one clear error when the text is too short."""
    import torch

    text, path = read_text(data)
    ids = token_ids(text)
    split = int(TRAIN_RATIO * len(ids))
    train, val = ids[:split], ids[split:]
    need = batch_size * world_size
    have = num_windows(len(train), context_length)
    if have < need or num_windows(len(val), context_length) < 1:
        raise UserError(
            f"{path.name}: text too short: {len(ids):,} tokens give {have} training windows of "
            f"{context_length + 1} tokens and {num_windows(len(val), context_length)} validation "
            f"windows; one batch needs {need} (batch {batch_size} x {world_size} processes) and "
            "validation needs 1. Use a longer --data text or a smaller --preset"
        )
    return torch.from_numpy(train.astype(np.int64)), torch.from_numpy(val.astype(np.int64))
