"""The ladder: its step scripts, what each rung is, how `--steps` names them, and which of them a
results tag of N processes holds. What a rung is lives in speed_ladder/data/ladder.json, one entry
per step file, stating only what it changes over the rung it builds on (`after`, and why:
`after_why`); the loader folds each entry onto that rung's state. No code elsewhere compares step
numbers (tests/test_no_step_literals.py); a new rung is its file plus one entry
(docs/developing.md)."""

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from speed_ladder.errors import UserError
from speed_ladder.files import ROOT

REGISTRY = Path(__file__).parent / "data" / "ladder.json"
BASELINE = "00"  # the first rung, which every speedup is over
ADD_A_RUNG = "docs/developing.md, Add a rung"

# What memory_model.py, spec.py and parity know how to model: a value outside these is new code.
TERMS = {
    # tf32: fp32's bytes; bf16-weights: bf16 model, fp32 masters for AdamW (autocast still on)
    "precision": ("fp32", "tf32", "bf16-autocast", "bf16-weights"),
    # flash: no (B, H, T, T) scores; cudnn: cuDNN's fused kernel on CUDA, the same memory
    "attention": ("materialized", "flash", "cudnn"),
    "vocab": ("gpt2", "padded"),  # 50257 or 50304 rows
    # the preset's setting the rung trains with; fits: large_batch_size, grown to fit a GPU (20)
    "batch": ("batch_size", "large_batch_size", "fits"),
    "loss": ("logits", "fused"),  # fused: chunked / Liger linear + cross-entropy
    "checkpointing": (False, True),
    "state": ("single", "ddp", "fsdp2", "fsdp2-offload"),  # offload: shards in host memory
    "compiled": (False, True),  # torch.compile: the sweep times its compile
    "distributed": (False, True),  # sets up a process group: launched through torchrun
    "dropout": ("preset", "off"),  # off: dropout 0 whatever the preset says (no masks)
    # each batch in the run's accum_steps micro-batches, one optimizer step
    "accumulation": (False, True),
}


@dataclass(frozen=True)
class Memory:
    """The terms of the memory model a rung has, after every rung before it."""

    precision: str
    attention: str
    vocab: str
    batch: str
    loss: str
    checkpointing: bool
    state: str
    dropout: str = "preset"  # "off": the rung trains without dropout
    accumulation: bool = False  # micro-batches, one optimizer step per batch

    @property
    def bf16_autocast(self) -> bool:
        """Step 05's autocast is on (where bf16 is fast): every rung from it."""
        return self.precision in ("bf16-autocast", "bf16-weights")

    @property
    def bf16_weights(self) -> bool:
        """The model's weights are bf16 (where bf16 is fast), fp32 masters in the optimizer."""
        return self.precision == "bf16-weights"

    @property
    def flash(self) -> bool:
        """A fused attention kernel: no (B, H, T, T) scores kept (step 07's or cuDNN's)."""
        return self.attention in ("flash", "cudnn")

    @property
    def padded_vocab(self) -> bool:
        return self.vocab == "padded"

    @property
    def large_batch(self) -> bool:
        return self.batch != "batch_size"

    def micro_batches(self, accum_steps: int, batch: int) -> int:
        """The micro-batches a batch of `batch` sequences is split into: `accum_steps` where this
        rung accumulates and they split the batch into equal parts, else 1."""
        if not self.accumulation or accum_steps <= 1 or batch % accum_steps:
            return 1
        return accum_steps

    def drop_rate(self, cfg: dict) -> float:
        """The dropout this rung trains a model of config `cfg` with: 0 where it takes dropout
        out (step 16 on), whatever the preset says; else the preset's."""
        return 0.0 if self.dropout == "off" else cfg.get("drop_rate") or 0.0

    @property
    def activations(self) -> str:
        """What the model keeps: `logits`, `fused` (no full logits), `checkpointed`."""
        return "checkpointed" if self.checkpointing else self.loss


@dataclass(frozen=True)
class Step:
    num: str  # "05"
    path: Path
    title: str  # the docstring's `Step NN: <title>.`
    distributed: bool = False
    compiled: bool = False
    memory: Memory | None = None
    summary: str = ""  # the README table's "what it changes"
    parity: dict = field(default_factory=dict, compare=False)  # {"cpu": ..., "cuda": ...}
    summary_file: str | None = None  # a file at the root that copies this rung
    after: str | None = None  # the rung this one is "that rung + one idea" of; None: the first
    api: tuple[str, ...] = ()  # what its diff against `after` adds a line using (the idea)
    after_why: str = ""  # why it builds on `after`, not on the file before it

    @property
    def rel(self) -> str:
        try:
            return self.path.relative_to(ROOT).as_posix()
        except ValueError:
            return str(self.path)

    def batch(self, spec) -> int:
        """The batch this rung trains with under a run's settings (a spec.RunSpec): where it
        fits its batch to a GPU, the batch it starts from."""
        return spec.large_batch_size if self.memory and self.memory.large_batch else spec.batch_size


_TITLE = re.compile(
    r"^\s*(?:[rRuU]?)(?:\"\"\"|''')\s*Step\s+\d+(?:\s*\(after step \d+\))?:\s*(.*?)\.(?:\s|$)"
)


def step_title(path: Path) -> str:
    """`Step NN (after step MM): <title>.` (`Step 00: <title>.` for the first rung) from the
    docstring's first line; the file name if there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except OSError:
        first = ""
    m = _TITLE.match(first)
    if m and m.group(1).strip():
        return m.group(1).strip()
    return path.stem[3:].replace("_", " ") if path.stem[:2].isdigit() else path.stem


@dataclass(frozen=True)
class Entry:
    """A rung's entry in the registry, as written (ladder.json's `about` says each field)."""

    num: str
    file: str | None = None
    summary: str = ""
    changes: dict = field(default_factory=dict)
    parity: dict = field(default_factory=dict)
    api: tuple[str, ...] = ()
    after: str | None = "<unset>"  # without `after`: the file before it
    after_why: str = ""
    summary_file: str | None = None


def _entries(path: Path) -> dict[str, Entry]:
    try:
        rungs = json.loads(path.read_text(encoding="utf-8"))["rungs"]
        entries = [Entry(**e | {"api": tuple(e.get("api", ()))}) for e in rungs]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{path}: not a ladder registry ({e})") from None
    return {str(e.num): e for e in entries}


def _fold(state: dict, e: Entry, where: str) -> dict:
    """The state after a rung: the one it builds on (`after`) with the entry's `changes`,
    checked."""
    for k, v in e.changes.items():
        if k not in TERMS or v not in TERMS[k]:
            known = ", ".join(f"{t}: {'/'.join(map(str, vs))}" for t, vs in TERMS.items())
            raise UserError(
                f"{where}: changes {k}={v!r} is not a term the harness models "
                f"({known}); a new one is code in measure/memory_model.py"
            )
    state = dict(state, **e.changes)
    missing = [k for k in TERMS if k not in state]
    if missing:
        raise UserError(f"{where}: the first rung must state every term ({', '.join(missing)})")
    if state["checkpointing"] and state["loss"] != "fused":
        raise UserError(f"{where}: checkpointing is modelled after a fused loss only")
    return state


def _step(f: Path, e: Entry, state: dict, after: str | None) -> Step:
    memory = Memory(**{k: state[k] for k in Memory.__dataclass_fields__})
    return Step(
        num=f.name[:2],
        path=f,
        title=step_title(f),
        distributed=state["distributed"],
        compiled=state["compiled"],
        memory=memory,
        summary=e.summary,
        parity=e.parity,
        summary_file=e.summary_file,
        after=after,
        api=e.api,
        after_why=e.after_why,
    )


def _after(e: Entry, earlier: list[str], where: str) -> str | None:
    """The rung an entry builds on: its `after`, which must name a rung before it in file
    order; without one, the file before it (None for the first)."""
    if e.after == Entry.after:  # not given
        return earlier[-1] if earlier else None
    after = e.after
    if not isinstance(after, str) or after not in earlier:
        known = f"steps {earlier[0]}-{earlier[-1]}" if earlier else "none: it is the first rung"
        raise UserError(f"{where}: after {after!r} is not a rung before it in file order ({known})")
    return after


def _check_parity(e: Entry, where: str) -> None:
    cpu, cuda = e.parity.get("cpu"), e.parity.get("cuda")
    if not isinstance(cpu, dict) or cpu.get("rule") not in ("exact", "close") or "why" not in cpu:
        raise UserError(f"{where}: parity.cpu needs a rule (exact or close) and its why")
    if not isinstance(cuda, dict) or "why" not in cuda or not isinstance(cuda.get("holds"), dict):
        raise UserError(
            f"{where}: parity.cuda needs its why and holds: {{preset: {{steps, atol, source}}}}"
        )


def discover(ladder_dir: Path = ROOT, registry: Path | None = None) -> list[Step]:
    """00_orig.py, then steps/NN_*.py in order, each with its registry entry. The registry is
    speed_ladder/data/ladder.json for this checkout, where every step file needs an entry and
    every entry a step file; another ladder's (`--ladder-dir`, the tests' fixtures) is its own
    ladder.json if it has one, and a step file without an entry there is a plain rung (fp32,
    eager, one process). Each rung's state is the rung's `after` (default: the file before it)
    with the entry's `changes`."""
    ladder_dir = Path(ladder_dir).resolve()
    strict = registry is not None or ladder_dir == ROOT.resolve()
    if registry is None:
        registry = REGISTRY if ladder_dir == ROOT.resolve() else ladder_dir / "ladder.json"
    entries = _entries(registry) if strict or registry.is_file() else {}
    files = [ladder_dir / "00_orig.py"] if (ladder_dir / "00_orig.py").is_file() else []
    files += sorted((ladder_dir / "steps").glob("[0-9][0-9]_*.py"))
    steps, seen, states = [], [], {}
    initial = {
        "precision": "fp32",
        "attention": "materialized",
        "vocab": "gpt2",
        "batch": "batch_size",
        "loss": "logits",
        "checkpointing": False,
        "state": "single",
        "compiled": False,
        "distributed": False,
        "dropout": "preset",
        "accumulation": False,
    }
    initial = initial if not strict else {}
    reg = _rel(registry)
    for f in files:
        num = f.name[:2]
        if num in seen:
            raise UserError(f"two scripts for step {num} in {ladder_dir}: check steps/{num}_*.py")
        seen.append(num)
        rel = _rel(f, ladder_dir)
        if num not in entries and strict:
            raise UserError(f"{rel} has no entry in {reg}: add one ({ADD_A_RUNG})")
        e = entries.get(num, Entry(num))
        where = f"{reg}, rung {num}"
        if e.file not in (None, rel):
            raise UserError(f"{where}: file {e.file} is not {rel}")
        if strict and steps:
            _check_parity(e, where)
        after = _after(e, seen[:-1], where)
        states[num] = _fold(states[after] if after else initial, e, where)
        steps.append(_step(f, e, states[num], after))
    if not steps:
        raise UserError(f"no step scripts in {ladder_dir} (00_orig.py, steps/NN_*.py)")
    extra = sorted(set(entries) - set(seen))
    if extra:
        raise UserError(f"{reg}: rung {', '.join(extra)} has no step file in {ladder_dir}")
    return steps


def _rel(path: Path, base: Path = ROOT) -> str:
    try:
        return Path(path).resolve().relative_to(Path(base).resolve()).as_posix()
    except ValueError:
        return str(path)


@cache
def rungs() -> tuple[Step, ...]:
    """This checkout's ladder (discover(ROOT)), read once."""
    return tuple(discover(ROOT))


def rung(num: str) -> Step:
    """This checkout's rung `num`."""
    if s := first(lambda s: s.num == num):
        return s
    raise UserError(f"no step {num} in {_rel(REGISTRY)} (steps {rungs()[0].num}-{rungs()[-1].num})")


def next_num() -> str:
    """The number a rung appended after this checkout's last would take ("18" after "17")."""
    return f"{int(rungs()[-1].num) + 1:02d}"


def step_of(path: Path | str) -> str:
    """The number of this checkout's rung whose step file (or summary file) `path` is."""
    name = Path(path).name
    for s in rungs():
        if name in (s.path.name, s.summary_file):
            return s.num
    raise UserError(f"{path}: not a step file of this ladder ({_rel(REGISTRY)})")


def first(pred, steps=None) -> Step | None:
    """The first rung of `steps` (this checkout's) for which pred(step) holds, or None."""
    return next((s for s in (rungs() if steps is None else steps) if pred(s)), None)


def descendants(num: str, steps=None) -> list[Step]:
    """The rungs of `steps` (this checkout's) that build on rung `num`, directly or through
    others (`after`), in file order: where a change to `num` must go on."""
    tree, out = {num}, []
    for s in rungs() if steps is None else steps:
        if s.after in tree:
            tree.add(s.num)
            out.append(s)
    return out


def lineage(num: str) -> list[Step]:
    """This checkout's rung `num` and every rung it builds on (`after`, transitively), the
    first rung first: the rungs whose ideas a run of `num` carries."""
    chain, at = [], num
    while at is not None:
        chain.append(rung(at))
        at = chain[-1].after
    return chain[::-1]


def skips(steps: list[Step]) -> list[bool]:
    """For each rung of `steps`: whether it builds on another rung than the file before it (an
    `after` of its own), which the README's ladder table and LADDER.md say."""
    return [s.after != (b.num if b else None) for b, s in zip([None, *steps], steps, strict=False)]


def bases(nums: list[str]) -> list[str | None]:
    """For each step of `nums` (a results tag's steps, in ladder order) the step its effect and
    loss parity are judged against: its rung's `after` where it is a rung of this checkout,
    else the step before it in `nums` (None for the first)."""
    after = {s.num: s.after for s in rungs()}
    return [after[n] if n in after else (nums[i - 1] if i else None) for i, n in enumerate(nums)]


DIFFS = Path("steps") / "diffs"  # a rung's diff against the rung it builds on: DIFFS/NN.diff


def unified(a: Path, b: Path, root: Path = ROOT) -> str:
    """The unified diff of step file `a` to `b`, as steps/diffs/NN.diff holds it (written by
    `python tools/ladder.py goldens`; LADDER.md links it)."""
    old, new = (Path(f).read_text().splitlines(keepends=True) for f in (a, b))
    diff = difflib.unified_diff(old, new, fromfile=_rel(a, root), tofile=_rel(b, root), n=3)
    return "".join(diff)


def parse_steps(spec: str | None, steps: list[Step]) -> list[Step]:
    """`05-08`, `00,07,10` or a mix (`00-02,07`); every number named must be a step."""
    if spec is None or spec.strip() in ("", "all"):
        return list(steps)
    by_num = {s.num: s for s in steps}
    known = f"{steps[0].num}-{steps[-1].num}" if len(steps) > 1 else steps[0].num

    def num(text: str) -> str:
        text = text.strip()
        if not text.isdigit():
            raise UserError(f"--steps {spec}: {text!r} is not a step number (e.g. 05-08,10)")
        n = text.zfill(2)
        if n not in by_num:
            raise UserError(f"--steps {spec}: no step {n} in the ladder (steps {known})")
        return n

    chosen: set[str] = set()
    for part in spec.split(","):
        if not part.strip():
            continue
        if "-" in part:
            lo, _, hi = part.partition("-")
            lo, hi = num(lo), num(hi)
            if lo > hi:
                raise UserError(f"--steps {spec}: range {lo}-{hi} runs backwards")
            chosen.update(n for n in by_num if lo <= n <= hi)
        else:
            chosen.add(num(part))
    if not chosen:
        raise UserError(f"--steps {spec}: no steps named (e.g. 05-08 or 00,07,10)")
    return [s for s in steps if s.num in chosen]


# ---------------------------------------------------------------- results tags of N processes
_PROCESSES = re.compile(r"-x(\d+)$")


TO_LOSS_TAG = "-to-loss"  # a --to-loss sweep's tags: <hardware>-to-loss-xN, records of their own


def processes_suffix(nproc: int) -> str:
    """`-xN`: how a results tag says it ran its distributed steps on N processes."""
    return f"-x{nproc}"


def tag_processes(tag: str) -> int:
    """N of a tag's `-xN` suffix; 1 without one."""
    m = _PROCESSES.search(tag)
    return int(m.group(1)) if m else 1


def expected_steps(steps: list[Step], tag: str) -> list[Step]:
    """The steps a results tag holds: all of them; for a tag of N > 1 processes only the
    distributed ones, since the sweep runs every other step as one process, the same as the
    single-process tag."""
    if tag_processes(tag) > 1:
        return [s for s in steps if s.distributed]
    return list(steps)
