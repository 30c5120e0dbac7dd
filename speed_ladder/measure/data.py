"""The training text and its GPT-2 token ids: downloaded once, tokenized once, split 90/10. The
ids are cached per text beside a JSON sidecar that checks them (count, dtype, id range, sha256):
a cache that fails it is rebuilt, and one that cannot be written costs only a tokenization."""

import hashlib
import io
import json
import os
import urllib.request
from pathlib import Path

import numpy as np

from speed_ladder.errors import UserError, warn
from speed_ladder.files import ROOT, atomic_write_bytes, cache_dir, mirror
from speed_ladder.writable import why_unwritable

DEFAULT_TEXT = ROOT / "data" / "middlemarch.txt"
GUTENBERG_URL = "https://www.gutenberg.org/cache/epub/145/pg145.txt"  # Middlemarch, Gutenberg #145
TRAIN_RATIO = 0.90
GPT2_N_VOCAB = 50257  # ids 0..50256 (<|endoftext|> is 50256)
# tiktoken's cache names for GPT-2's BPE files (sha1 of their download URLs)
TIKTOKEN_NAMES = {
    "encoder.json": "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6",
    "vocab.bpe": "6d1cbeee0f20b3d9449abfede4726ed8212e3aee",
}


def check_text_file(data: str) -> Path:
    """--data PATH, checked: a readable file, not a folder."""
    path = Path(data)
    try:
        path.stat()
    except FileNotFoundError:
        raise UserError(f"--data {data}: no such file") from None
    except OSError as e:
        raise UserError(f"--data {data}: cannot read it ({e.strerror})") from None
    if path.is_dir():
        raise UserError(f"--data {data}: is a folder; name a text file")
    if not path.is_file():
        raise UserError(f"--data {data}: not a regular file; name a text file")
    return path


def _default_text() -> Path:
    """data/middlemarch.txt, else (a read-only checkout) the copy in the cache folder, fetched
    from the local mirror or downloaded from Gutenberg where it is missing."""
    if DEFAULT_TEXT.is_file():
        return DEFAULT_TEXT
    path = DEFAULT_TEXT
    if why_unwritable(DEFAULT_TEXT, "file") is not None:  # a read-only checkout
        path = cache_dir() / DEFAULT_TEXT.name
        if path.is_file():
            return path
    local = mirror() / "middlemarch.txt"
    if local.is_file():
        print(f"copying Middlemarch from the local mirror {local} to {path}", flush=True)
        atomic_write_bytes(path, local.read_bytes())
        return path
    print(f"downloading Middlemarch (Gutenberg #145) to {path} ...", flush=True)
    try:
        with urllib.request.urlopen(GUTENBERG_URL, timeout=30) as r:
            body = r.read()
    except OSError as e:
        raise UserError(
            f"cannot download {GUTENBERG_URL} ({e.__class__.__name__}: {e}); "
            "offline? pass a local text with --data PATH"
        ) from None
    atomic_write_bytes(path, body)
    return path


def read_text(data: str | None) -> tuple[str, Path]:
    """The text from --data, else data/middlemarch.txt, downloaded from Gutenberg if missing."""
    path = check_text_file(data) if data is not None else _default_text()
    try:
        return path.read_text(encoding="utf-8-sig"), path
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8"
        ) from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror})") from None


def stage_bpe(bpe: Path, dest: Path) -> Path:
    """Copy GPT-2's encoder.json and vocab.bpe into `dest` under tiktoken's cache names."""
    for src, name in TIKTOKEN_NAMES.items():
        if not (dest / name).is_file():
            atomic_write_bytes(dest / name, (bpe / src).read_bytes())
    return dest


def gpt2_tokenizer():
    """tiktoken's GPT-2 BPE; offline it reads its two files from TIKTOKEN_CACHE_DIR."""
    import tiktoken

    where = os.environ.get("TIKTOKEN_CACHE_DIR")
    if where and Path(where).exists() and not Path(where).is_dir():
        raise UserError(f"TIKTOKEN_CACHE_DIR={where}: is a file, not a folder")
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
            "cache names, see docs/gpu-machines.md, 'Offline use'; the text itself comes from "
            "--data"
        ) from None


def _sidecar(path: Path) -> Path:
    return path.with_suffix(".json")


def _describe(arr: np.ndarray, text_sha: str) -> dict:
    """What checks a cache of token ids: count, dtype, id range and a sha256 of the ids."""
    return {
        "tokenizer": "gpt2",
        "text_sha256": text_sha,
        "count": int(arr.size),
        "dtype": str(arr.dtype),
        "min_id": int(arr.min()) if arr.size else None,
        "max_id": int(arr.max()) if arr.size else None,
        "ids_sha256": hashlib.sha256(arr.astype("<u2").tobytes()).hexdigest(),
    }


def _load_checked(path: Path, text_sha: str) -> tuple[np.ndarray | None, str | None]:
    """(ids, None) from a cache that loads and matches its sidecar, else (None, why not)."""
    try:
        meta = json.loads(_sidecar(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no {_sidecar(path).name} to check it against"
    except (OSError, ValueError) as e:
        return None, f"unreadable {_sidecar(path).name} ({e.__class__.__name__})"
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:  # truncated, garbage, a folder, an unreadable file ...
        return None, f"does not load ({e.__class__.__name__}: {str(e)[:80]})"
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint16 or arr.ndim != 1:
        return None, f"holds {getattr(arr, 'dtype', type(arr).__name__)}, not 1-d uint16 ids"
    if arr.size and int(arr.max()) >= GPT2_N_VOCAB:
        return None, f"holds id {int(arr.max())}, outside GPT-2's vocabulary"
    have = _describe(arr, text_sha)
    if not isinstance(meta, dict):
        return None, f"{_sidecar(path).name} is not a JSON object"
    for k, v in have.items():
        if (said := meta.get(k)) != v:
            return None, f"{k} is {v!r}, its sidecar says {said!r}"
    return arr, None


def token_ids(text: str) -> np.ndarray:
    """GPT-2 token ids of `text`, cached by the text's sha256 and checked on every load."""
    text_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    path = cache_dir() / f"tokens-gpt2-{text_sha[:32]}.npy"
    if path.exists() or _sidecar(path).exists():
        arr, why = _load_checked(path, text_sha)
        if arr is not None:
            return arr
        warn(f"token cache {path} failed its check ({why}); rebuilding it from the text")
    ids = gpt2_tokenizer().encode(text, allowed_special={"<|endoftext|>"})
    arr = np.asarray(ids, dtype=np.uint16)  # GPT-2 vocab 50257 < 2**16
    buf = io.BytesIO()
    np.save(buf, arr)
    try:
        atomic_write_bytes(path, buf.getvalue())
        meta = json.dumps(_describe(arr, text_sha), indent=1) + "\n"
        atomic_write_bytes(_sidecar(path), meta.encode())
    except OSError as e:
        warn(f"token ids not cached in {path.parent} ({e.strerror}); tokenizing again next run")
    return arr


def num_windows(n_tokens: int, context_length: int) -> int:
    """How many (input, target) windows of stride context_length fit (as the steps' dataset)."""
    return max(0, -(-(n_tokens - context_length) // context_length))


def _split(data: str | None) -> tuple[np.ndarray, np.ndarray, Path]:
    """(train ids, validation ids, the text's path): the text's first TRAIN_RATIO, the rest."""
    text, path = read_text(data)
    ids = token_ids(text)
    split = int(TRAIN_RATIO * len(ids))
    return ids[:split], ids[split:], path


def train_windows(data: str | None, context_length: int) -> int:
    """The training windows the text gives (step 20's batch over every process stops there)."""
    return num_windows(len(_split(data)[0]), context_length)


def _too_short_fix(have: int, need: int, world_size: int) -> str:
    """What to change when a text of `have` training windows is too short for the run."""
    fit = have // world_size
    if have >= need:
        return "Use a longer --data text or a smaller --preset"
    if fit >= 1:
        procs = f"{world_size} process{'es' * (world_size > 1)}"
        largest = f"--batch-size {fit} is the largest per-process batch that fits {procs}"
        return f"{largest}; or a longer --data text"
    return f"use at most {have} processes, a longer --data text or a smaller --preset"


def load_split(data: str | None, context_length: int, batch_size: int, world_size: int):
    """(train_ids, val_ids) as int64 tensors; one clear error when the text is too short."""
    import torch

    train, val, path = _split(data)
    total = len(train) + len(val)
    need = batch_size * world_size
    have = num_windows(len(train), context_length)
    if have < need or num_windows(len(val), context_length) < 1:
        fix = _too_short_fix(have, need, world_size)
        raise UserError(
            f"{path.name}: text too short: {total:,} tokens give {have} training windows of "
            f"{context_length + 1} tokens and {num_windows(len(val), context_length)} validation "
            f"windows; one batch needs {need} (batch {batch_size} x {world_size} processes) and "
            f"validation needs 1. {fix}"
        )
    return torch.from_numpy(train.astype(np.int64)), torch.from_numpy(val.astype(np.int64))
