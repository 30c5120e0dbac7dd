"""Make the peer: Raschka's `01_opt_single_gpu.py` (rasbt/LLMs-from-scratch, ch05/10), changed
only so that its tok/s compare with the ladder's on the same machine. The peer stays outside the
repository: this reads a fetched copy and writes the changed one into a git-ignored folder.

    python tools/peer.py SRC [--out data/peer] [--text ../middlemarch.txt] [--bpe DIR]
                             [--steps 40] [--preset cpu] [--fp32] [--no-dropout]

The changes, each at an exact anchor of SRC (an upstream edit that moves one is one error line,
never another peer):
- the text: `file_path = "middlemarch.txt"` becomes --text (relative to the peer's folder; by
  default the ladder's data/middlemarch.txt);
- the tokenizer offline: TIKTOKEN_CACHE_DIR is the folder `tiktoken/` beside the peer, where
  --bpe's encoder.json and vocab.bpe are staged under tiktoken's names (default: the offline
  folder's, speed_ladder/files.py mirror());
- training: its train_model_simple_with_timing call becomes --steps optimizer steps over the
  train loader (epochs repeated), a synchronize (CUDA) and a clock after every optimizer step,
  no evaluation and no sample; it prints `PEER median step <ms> ms tok/s <n> ...` over the steps
  after the first 10, and the peak reserved GiB on CUDA;
- the loss plot at the end is not drawn.
--preset cpu: the ladder's cpu preset model (speed_ladder/presets.py) at its large batch, as
step 10 trains it; --fp32: the model is not cast to bf16 (the peer's best on a CPU without
native bf16); --no-dropout: drop_rate 0.0, the model step 16 trains. Without them the peer
trains the published script's model and batch in bf16.
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from speed_ladder.files import mirror  # noqa: E402
from speed_ladder.measure.data import stage_bpe  # noqa: E402
from speed_ladder.presets import PRESETS  # noqa: E402

NAME = "01_opt_single_gpu.py"
TEXT = '    file_path = "middlemarch.txt"\n'
IMPORT = "import tiktoken\n"
CAST = "    model.to(device).to(torch.bfloat16)\n"
TRAIN = re.compile(
    r"    train_losses, val_losses, tokens_seen = train_model_simple_with_timing\(\n.*?\n    \)\n",
    re.S,
)
PLOT = (
    "    plot_losses(epochs_tensor, tokens_seen, train_losses, val_losses)\n"
    '    plt.savefig("loss.pdf")\n'
)
OFFLINE = """import os as _os  # peer (tools/peer.py): GPT-2's BPE from the folder beside this file
_os.environ.setdefault(
    "TIKTOKEN_CACHE_DIR", _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "tiktoken")
)
"""
TIMED = """    # peer (tools/peer.py): STEPS optimizer steps, a synchronize and a clock after each
    import statistics
    times, done = [], 0
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    sync()
    last = time.perf_counter()
    if len(train_loader) == 0:
        raise SystemExit("PEER error: the train loader is empty (too little text)")
    while done < STEPS:
        for inp_batch, tgt_batch in train_loader:
            optimizer.zero_grad()
            loss = calc_loss_batch(inp_batch, tgt_batch, model, device)
            loss.backward()
            optimizer.step()
            sync()
            now = time.perf_counter()
            times.append(now - last)
            last, done = now, done + 1
            if done == STEPS:
                break
    med = statistics.median(times[10:])
    print(f"PEER median step {med * 1000:.1f} ms tok/s {inp_batch.numel() / med:.1f} "
          f"loss {loss.item():.3f} steps 11-{STEPS}")
    if device.type == "cuda":
        print(f"PEER peak reserved GiB {torch.cuda.max_memory_reserved() / 2**30:.2f}")
    train_losses, val_losses, tokens_seen = [], [], []
"""


def make(src: str, text: str, steps: int, preset: str | None, fp32: bool, no_dropout=False) -> str:
    """SRC's text with the changes (the module doc); ValueError naming a missing anchor."""

    def once(s: str, old: str, new: str) -> str:
        if s.count(old) != 1:
            raise ValueError(f"not the peer this tool knows: {old.strip()!r} found {s.count(old)}x")
        return s.replace(old, new)

    def config(s: str, key: str, value) -> str:  # the model config's entry `key` set to value
        s, n = re.subn(rf'("{key}": )[^,\n]+', rf"\g<1>{value}", s, count=1)
        if n != 1:
            raise ValueError(f"not the peer this tool knows: no {key!r} in its config")
        return s

    out = once(src, TEXT, f"    file_path = {text!r}  # peer (tools/peer.py)\n")
    out = once(out, IMPORT, IMPORT + OFFLINE)
    if fp32:
        out = once(
            out, CAST, "    model.to(device)  # peer (tools/peer.py): --fp32, no bf16 cast\n"
        )
    found = TRAIN.findall(out)
    if len(found) != 1:
        raise ValueError(f"not the peer this tool knows: its train call found {len(found)}x")
    out = out.replace(found[0], TIMED.replace("STEPS", str(steps)))
    out = once(out, PLOT, "    pass  # peer (tools/peer.py): no loss plot\n")
    if preset:
        p = PRESETS[preset]
        for key in ("context_length", "emb_dim", "n_heads", "n_layers", "drop_rate"):
            out = config(out, key, p[key])
        out = once(out, '"batch_size": 32,', f'"batch_size": {p["large_batch_size"]},')
    if no_dropout:  # step 16's model: the same config with dropout 0
        out = config(out, "drop_rate", 0.0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", type=Path, help=f"a fetched {NAME}")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "peer")
    ap.add_argument("--text", default="../middlemarch.txt", help="the text, from the peer's folder")
    ap.add_argument("--bpe", type=Path, default=mirror() / "gpt2_bpe")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps (> 10)")
    ap.add_argument("--preset", choices=["cpu"], help="the ladder's preset model and large batch")
    ap.add_argument("--fp32", action="store_true", help="no bf16 cast of the model")
    ap.add_argument("--no-dropout", action="store_true", help="drop_rate 0.0 (step 16's model)")
    a = ap.parse_args(argv)
    try:
        if a.steps <= 10:
            raise ValueError(f"--steps {a.steps}: the median is over the steps after the first 10")
        if not (a.bpe / "encoder.json").is_file() or not (a.bpe / "vocab.bpe").is_file():
            raise ValueError(f"--bpe {a.bpe}: no encoder.json and vocab.bpe there")
        peer = make(
            a.src.read_text(encoding="utf-8"), a.text, a.steps, a.preset, a.fp32, a.no_dropout
        )
        a.out.mkdir(parents=True, exist_ok=True)
        stage_bpe(a.bpe, a.out / "tiktoken")
        (a.out / NAME).write_text(peer, encoding="utf-8")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out / NAME} (the text: {a.text}; {a.steps} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
