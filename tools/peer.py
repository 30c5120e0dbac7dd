"""Make the peer: Raschka's `01_opt_single_gpu.py` (rasbt/LLMs-from-scratch, ch05/10), changed
only so that its tok/s compare with the ladder's on the same machine. The peer stays outside the
repository: this reads a fetched copy and writes the changed one into a git-ignored folder.

    python tools/peer.py SRC [--out data/peer] [--results FILE] [--text ../middlemarch.txt]
                             [--bpe DIR] [--device cuda] [--preset NAME] [--warmup-steps N]
                             [--max-steps N] [--fp32] [--no-dropout] [--force] [--check]
    cd data/peer && python 01_opt_single_gpu.py

The changes, each at an exact anchor of SRC (an upstream edit that moves one is one error line,
never another peer):
- the text: `file_path = "middlemarch.txt"` becomes --text (relative to the peer's folder; by
  default the ladder's data/middlemarch.txt);
- the tokenizer offline: TIKTOKEN_CACHE_DIR is the folder `tiktoken/` beside the peer, where
  --bpe's encoder.json and vocab.bpe are staged under tiktoken's names (default: the offline
  folder's, speed_ladder/files.py mirror());
- training: its train_model_simple_with_timing call becomes `train` below: its own loop body
  over its train loader, timed as the ladder times a step (the same warm-up and window, the
  ladder's clock: CUDA events read at the window's end, no synchronize inside it), no
  evaluation and no sample; the run appends its record to --results (default: peer.jsonl beside
  the peer), which tools/peer_compare.py sets beside the ladder's;
- the loss plot at the end is not drawn;
- the model and batch: --preset's (speed_ladder/presets.py: context, width, heads, layers,
  dropout, and its large batch, as step 10 on trains it); gpt2-124m, the default on CUDA, is
  the published script's own. The window's length is the sweep's for that preset
  (presets.SWEEP_LENGTH: 10 warm-up + 50 timed steps on gpt2-124m), or --warmup-steps and
  --max-steps as the sweep takes them. --device says which preset is the default (gpt2-124m on
  CUDA, cpu elsewhere), as for the sweep; the peer itself runs where it finds a GPU.
--fp32: the model is not cast to bf16 (the peer's best on a CPU without native bf16);
--no-dropout: drop_rate 0.0, the model the ladder trains from its dropout-off rung on. Without
them the peer trains the published script's model in bf16.

Where --results already holds an ok record of this peer (the same source, the same changes)
nothing is written and it says so: a rerun does not run it again (--force does). --check only
checks that SRC is the peer this tool knows.
"""

import argparse
import datetime as dt
import hashlib
import re
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from speed_ladder import machine  # noqa: E402
from speed_ladder.errors import UserError  # noqa: E402
from speed_ladder.files import data_id, mirror  # noqa: E402
from speed_ladder.measure import cpu_load  # noqa: E402
from speed_ladder.measure import device as dev  # noqa: E402
from speed_ladder.measure.clock import StepClock  # noqa: E402
from speed_ladder.measure.data import TIKTOKEN_NAMES, stage_bpe  # noqa: E402
from speed_ladder.measure.settings import resolve_spec  # noqa: E402
from speed_ladder.presets import PRESETS  # noqa: E402
from speed_ladder.records import append_jsonl, file_sha256, git_state, read_jsonl  # noqa: E402
from speed_ladder.spec import preset_name  # noqa: E402
from speed_ladder.sweep.preflight import measuring_values  # noqa: E402

NAME = "01_opt_single_gpu.py"
TEXT = '    file_path = "middlemarch.txt"\n'
IMPORT = "import tiktoken\n"
MAIN = "def main(gpt_config, settings):\n"  # the names the training call passes on
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
TIMED = """    # peer (tools/peer.py): timed as the ladder times a step, its record written
    import sys as _sys
    _sys.path.insert(0, {tools})
    import peer as _peer
    _peer.train(model, optimizer, train_loader, device, calc_loss_batch, gpt_config, settings,
                {peer}, __file__)
    train_losses, val_losses, tokens_seen = [], [], []
"""
MODEL_KEYS = ("context_length", "emb_dim", "n_heads", "n_layers", "drop_rate")


def length(preset: str | None, device: str, warmup: int | None, max_steps: int | None):
    """(preset, warm-up steps, max steps) as the sweep resolves them (spec.py, preflight.py)."""
    device = dev.resolve(device).type if device == "auto" else device  # as the sweep's
    values = {"preset": preset_name(preset, device)[0], "warmup_steps": warmup,
              "max_steps": max_steps}  # fmt: skip
    s = resolve_spec(measuring_values(values, device), device)
    return s.preset, s.warmup_steps, s.max_steps


def peer_name(fp32: bool, no_dropout: bool) -> str:
    return "peer" + ("-no-dropout" if no_dropout else "") + ("-fp32" if fp32 else "")


def make(src: str, text: str, preset: str, warmup: int, max_steps: int, fp32: bool,
         no_dropout: bool = False, peer: dict | None = None,
         text_id: str | None = None) -> tuple[str, list[str]]:  # fmt: skip
    """(SRC's text with the changes, the changes in words); ValueError naming a missing anchor.
    `peer`: what the timed training gets (`train`), the changes added here;
    `text_id`: the text as the changes name it (default: `text`)."""

    def once(s: str, old: str, new: str) -> str:
        if s.count(old) != 1:
            raise ValueError(f"not the peer this tool knows: {old.strip()!r} found {s.count(old)}x")
        return s.replace(old, new)

    def config(s: str, key: str, value) -> str:  # the model config's entry `key` set to value
        s, n = re.subn(rf'("{key}": )[^,\n]+', rf"\g<1>{value}", s, count=1)
        if n != 1:
            raise ValueError(f"not the peer this tool knows: no {key!r} in its config")
        return s

    p = PRESETS[preset]
    batch = p["large_batch_size"]
    changes = [
        f"text: {text_id or text}",
        "tokenizer: GPT-2's BPE from tiktoken/ beside the script (offline)",
        f"training: {warmup} warm-up + {max_steps - warmup} timed optimizer steps in the "
        "ladder's window and clock (tools/peer.py); no evaluation, sample or loss plot",
        f"preset {preset}: " + ", ".join(f"{k} {p[k]}" for k in MODEL_KEYS) + f", batch {batch}",
    ]
    if fp32:
        changes.append("fp32: no bf16 cast of the model")
    if no_dropout:
        changes.append("dropout: drop_rate 0.0")
    out = once(src, TEXT, f"    file_path = {text!r}  # peer (tools/peer.py)\n")
    out = once(out, IMPORT, IMPORT + OFFLINE)
    once(out, MAIN, MAIN)
    if fp32:
        out = once(
            out, CAST, "    model.to(device)  # peer (tools/peer.py): --fp32, no bf16 cast\n"
        )
    found = TRAIN.findall(out)
    if len(found) != 1:
        raise ValueError(f"not the peer this tool knows: its train call found {len(found)}x")
    timed = dict(peer or {}, changes=changes, preset=preset, warmup_steps=warmup,
                 max_steps=max_steps, dropout_off=no_dropout)  # fmt: skip
    block = TIMED.format(tools=repr(str(ROOT / "tools")), peer=repr(timed))
    out = out.replace(found[0], block)
    out = once(out, PLOT, "    pass  # peer (tools/peer.py): no loss plot\n")
    for key in MODEL_KEYS:
        out = config(out, key, p[key])
    out = once(out, '"batch_size": 32,', f'"batch_size": {batch},')
    if no_dropout:  # the model of the ladder's dropout-off rungs: the same config, dropout 0
        out = config(out, "drop_rate", 0.0)
    return out, changes


def _stage(bpe: Path, dest: Path) -> None:
    """--bpe's two files under tiktoken's names in `dest`: from encoder.json and vocab.bpe, or
    from a tiktoken cache folder that has them under those names already."""
    if all((bpe / src).is_file() for src in TIKTOKEN_NAMES):
        stage_bpe(bpe, dest)
    elif all((bpe / name).is_file() for name in TIKTOKEN_NAMES.values()):
        dest.mkdir(parents=True, exist_ok=True)
        for name in TIKTOKEN_NAMES.values():
            (dest / name).write_bytes((bpe / name).read_bytes())
    else:
        raise ValueError(f"--bpe {bpe}: no encoder.json and vocab.bpe there (nor tiktoken's cache)")


def done(results: Path, name: str, sha: str, changes: list[str]) -> bool:
    """Whether `results` holds an ok record of this peer: its name, source and changes."""
    return any(
        isinstance(r, dict) and r.get("status") == "ok" and r.get("peer") == name
        and r.get("source_sha256") == sha and r.get("changes") == changes
        for r in (read_jsonl(results) if results.is_file() else [])
    )  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", type=Path, help=f"a fetched {NAME}")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "peer")
    ap.add_argument("--results", type=Path, help="the record's file (default: OUT/peer.jsonl)")
    ap.add_argument("--text", default="../middlemarch.txt", help="the text, from the peer's folder")
    ap.add_argument("--bpe", type=Path, default=mirror() / "gpt2_bpe")
    ap.add_argument("--device", default="cuda", choices=["auto", "cuda", "cpu", "mps"],
                    help="whose default preset (as the sweep's --device)")  # fmt: skip
    ap.add_argument("--preset", choices=list(PRESETS), help="the ladder's preset model and batch")
    ap.add_argument("--warmup-steps", type=int, help="as the sweep's (default: the preset's)")
    ap.add_argument("--max-steps", type=int, help="as the sweep's, warm-up included")
    ap.add_argument("--fp32", action="store_true", help="no bf16 cast of the model")
    ap.add_argument("--no-dropout", action="store_true", help="drop_rate 0.0")
    ap.add_argument("--force", action="store_true", help="make it even where --results has it")
    ap.add_argument("--check", action="store_true", help="only check SRC's anchors")
    a = ap.parse_args(argv)
    results = (a.results or a.out / "peer.jsonl").resolve()
    name = peer_name(a.fp32, a.no_dropout)
    try:
        preset, warmup, max_steps = length(a.preset, a.device, a.warmup_steps, a.max_steps)
        raw = a.src.read_bytes()
        sha = hashlib.sha256(raw).hexdigest()
        peer = {"name": name, "source": a.src.name, "source_sha256": sha,
                "results": str(results)}  # fmt: skip
        text_id = None if a.check else data_id((a.out / a.text).resolve())  # name and sha256
        script, changes = make(raw.decode("utf-8"), a.text, preset, warmup, max_steps, a.fp32,
                               a.no_dropout, peer, text_id)  # fmt: skip
        if a.check:
            print(f"ok: {a.src} is the peer this tool knows")
            return 0
        if not a.force and done(results, name, sha, changes):
            print(f"up to date: {results} holds this peer's record ({name}); --force makes it")
            return 0
        a.out.mkdir(parents=True, exist_ok=True)
        _stage(a.bpe, a.out / "tiktoken")
        (a.out / NAME).write_text(script, encoding="utf-8")
    except (OSError, ValueError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out / NAME} ({name}: {preset}, {warmup} warm-up + {max_steps - warmup} "
          f"timed steps; the text: {a.text}; its record: {results})")  # fmt: skip
    return 0


# ---------------------------------------------------------------- the peer's run
# `train`, called by the peer in place of its own timed loop, is the ladder's measurement, not a
# copy of it: speed_ladder.measure.clock's StepClock, device.PeakWindow and cpu_load.Meter, driven
# as measure/run.py's Run drives them for a step (`Window`: Run's timing without the profiler and
# the pauses). The first `warmup_steps` steps are not timed; then the device is synchronized, the
# peak counters reset and the clock restarted (the window opens); each step's end is marked with
# its loss, a tensor (CUDA: an event and a pinned copy, nothing waits), with no synchronize and no
# `.item()` until step `max_steps` closes the window (one synchronize, the events and losses
# read). tok/s = tokens per step / the median step time, end-to-end (data loading included). The
# loop body is the peer's own (zero_grad, its calc_loss_batch, backward, step) over its train
# loader, epoch after epoch; the record is one JSON line appended to `results`.
TIMING = (
    "the ladder's: speed_ladder.measure.clock (CUDA events, read at the window's end), "
    "device.PeakWindow, warm-up steps excluded, no synchronize inside the window"
)


class Window:
    """Run's timed window (speed_ladder/measure/run.py) over the peer's steps."""

    def __init__(self, device: torch.device, warmup_steps: int, max_steps: int):
        self.device, self.warmup, self.max_steps = device, warmup_steps, max_steps
        self.clock = StepClock(device)
        self.memory = dev.PeakWindow(device)
        self.load = cpu_load.Meter()
        self.steps_done, self.tokens_per_step = 0, 0
        self.state = "before"  # -> open -> closed
        self.note: str | None = None
        self.peak: tuple = (None, None)
        self.busy: dict = {}
        self._t_print = 0.0

    def begin(self) -> None:
        """Right before the first step (Run.set_model): the clock's first mark."""
        if self.warmup == 0:
            self.start_window()
        self.clock.restart()

    def start_window(self) -> None:
        dev.synchronize(self.device)
        self.state = "open"
        self.note = self.memory.start()
        self.load.start()

    def end_window(self) -> None:
        self.state = "closed"
        dev.synchronize(self.device)
        self.clock.read(wait=True)
        self.peak = self.memory.peak()
        self.busy = self.load.stop()

    def step_done(self, loss: torch.Tensor, tokens: int) -> None:
        """After optimizer.step(): the step's end on the clock (Run.step_done)."""
        self.memory.step_end()
        self.steps_done += 1
        warm = self.steps_done <= self.warmup
        self.clock.step_end(loss, timed=not warm)
        if not warm:
            self.tokens_per_step = tokens
        turned = False
        if self.state == "open" and self.steps_done == self.max_steps:
            self.end_window()
            turned = True
        if self.steps_done == self.warmup:
            self.start_window()
            turned = True
        if turned:
            self.clock.restart()
        now = time.perf_counter()
        if now - self._t_print > 2.0 or self.finished:
            self._t_print = now
            print(self.clock.progress(self.steps_done, self.max_steps, tokens), flush=True)

    @property
    def finished(self) -> bool:
        return self.steps_done >= self.max_steps


def train(model, optimizer, train_loader, device, calc_loss_batch, gpt_config: dict,
          settings: dict, peer: dict, script: str) -> dict:  # fmt: skip
    """The peer's steps in the ladder's window (module doc); appends and returns the record.
    `peer`: what tools/peer.py made (name, source, source_sha256, changes, preset, warmup_steps,
    max_steps, dropout_off, results)."""
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t_begin = time.time()
    if len(train_loader) == 0:
        raise SystemExit("PEER error: the train loader is empty (too little text)")
    w = Window(device, peer["warmup_steps"], peer["max_steps"])
    model.train()
    w.begin()
    while not w.finished:
        for inp_batch, tgt_batch in train_loader:
            optimizer.zero_grad()
            loss = calc_loss_batch(inp_batch, tgt_batch, model, device)
            loss.backward()
            optimizer.step()
            w.step_done(loss, inp_batch.numel())
            if w.finished:
                break
    if w.state != "closed":  # max_steps <= warmup_steps: tools/peer.py refuses it
        raise SystemExit("PEER error: no timed step")
    step_time = statistics.median(w.clock.times)
    tps = w.tokens_per_step / step_time
    reserved, allocated = w.peak
    notes = [n for n in (w.note, cpu_load.busy_note(w.busy.get("other_load"))) if n]
    cuda = device.type == "cuda"
    rec = {
        "peer": peer["name"],
        "status": "ok",
        "script": Path(script).name,
        "source": peer["source"],
        "source_sha256": peer["source_sha256"],
        "script_sha256": file_sha256(script),
        "changes": peer["changes"],
        "device": device.type,
        "device_name": dev.name(device),
        "preset": peer["preset"],
        "batch_size": settings["batch_size"],
        "context_length": gpt_config["context_length"],
        "drop_rate": gpt_config["drop_rate"],
        "dropout_off": peer["dropout_off"],  # --no-dropout: the ladder's dropout-off rungs' model
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        **git_state(ROOT),
        "started_at": started_at,
        "duration_s": round(time.time() - t_begin, 2),
        "machine": machine.of_device(device),
        "host": machine.real_host_id(),
        "tokens_per_sec": round(tps, 1),
        "step_time_ms": round(step_time * 1000, 3),
        "peak_mem_reserved_bytes": reserved,
        "peak_mem_allocated_bytes": allocated,
        "warmup_steps": w.warmup,
        "timed_steps": len(w.clock.times),
        "tokens_per_step": w.tokens_per_step,
        "losses": list(w.clock.losses),
        **w.busy,
        "timing": TIMING,
        "notes": notes,
    }
    append_jsonl(peer["results"], rec)
    gib = (reserved or 0) / 2**30
    print(f"PEER done: {tps:,.0f} tok/s ({settings['batch_size']} x "
          f"{gpt_config['context_length']} tokens / {step_time * 1000:.1f} ms median over "
          f"{rec['timed_steps']} timed steps after {w.warmup} warm-up)  peak mem {gib:.2f} GiB  "
          f"record: {peer['results']}", flush=True)  # fmt: skip
    return rec


if __name__ == "__main__":
    sys.exit(main())
