"""The flags every step script shares, in one table (STEP_FLAGS): the step scripts' parser
(`parse_args`), the flags the sweep passes through to every step (`add_step_flags(...,
passed_only=True)`) and a step's argv in the sweep (`child_argv`)."""

import argparse
import os
import sys
from dataclasses import dataclass, field

from speed_ladder.errors import UserError, fail
from speed_ladder.presets import PRESETS, check_name

PROFILE_STEPS = 3  # --profile without a number (speed_ladder.measure.profile)

DEVICES = ("auto", "cpu", "cuda", "mps")


class Parser(argparse.ArgumentParser):
    """A parser whose errors are one line: `error: <message> (see --help)`, exit status 2."""

    def error(self, message):
        fail(f"{message} (see --help)")


def _int_at_least(lowest: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {value}")
        return value

    return parse


positive, non_negative = _int_at_least(1), _int_at_least(0)

MAX_SEED = 2**63 - 1


def seed(text: str) -> int:
    """A seed from 0 to 2**63-1: torch.manual_seed takes a uint64 (a negative one wraps around
    to another seed), DistributedSampler adds the epoch to it (overflowing near 2**64), and
    records keep it as an int64 (pandas, JSON readers)."""
    value = non_negative(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be at most 2**63-1 = {MAX_SEED}, got {value}")
    return value


def loss_target(text: str) -> float | str:
    """--to-loss: a validation loss above 0 (in nats: GPT-2's vocabulary starts near 10.8), or
    `preset` (bare --to-loss): the preset's measured target."""
    if text == "preset":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a loss such as 6.5, got {text!r}") from None
    if not 0 < value < 100:  # nan and inf fail here too
        raise argparse.ArgumentTypeError(f"must be a loss above 0 (nats), got {text}")
    return value


@dataclass(frozen=True)
class Flag:
    """One step flag: its name, help, argparse options, and whether the sweep passes it to every
    step."""

    name: str
    help: str
    options: dict = field(default_factory=dict)  # argparse's type, default, choices, metavar
    passed: bool = False

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")


STEP_FLAGS = (
    Flag(
        "--device",
        "where to train (default: cuda, else mps, else cpu)",
        {"choices": DEVICES, "default": "auto"},
        passed=True,
    ),
    Flag(
        "--preset",
        f"one of {', '.join(PRESETS)} (default: gpt2-124m on CUDA, cpu elsewhere)",
        {"metavar": "NAME"},
        passed=True,
    ),
    Flag(
        "--max-steps",
        "stop after N optimizer steps, warm-up included, and skip the epoch-end sample "
        "(default: the preset's)",
        {"type": positive, "metavar": "N"},
        passed=True,
    ),
    Flag("--epochs", "epochs over the text", {"type": positive, "metavar": "N"}),
    Flag(
        "--warmup-steps",
        "steps left out of the timed window (default: the preset's)",
        {"type": non_negative, "metavar": "N"},
        passed=True,
    ),
    Flag(
        "--batch-size",
        "sequences per step and process (default: the preset's)",
        {"type": positive, "metavar": "N"},
    ),
    Flag(
        "--accum-steps",
        "micro-batches each batch is split into from step 18 on, one optimizer step per batch "
        "(default: the preset's, 2)",
        {"type": positive, "metavar": "N"},
    ),
    Flag(
        "--workers",
        "DataLoader worker processes for the training batches, kept alive across epochs "
        "(default: 4 on CUDA, 0 elsewhere: loaded in the training process)",
        {"type": non_negative, "metavar": "N"},
        passed=True,
    ),
    Flag(
        "--to-loss",
        "train until the validation loss reaches L (bare: the preset's measured target), "
        "evaluating every few thousand tokens, or until --token-budget tokens; the record says "
        "the tokens and training time it took (docs/measurement.md, time to a target loss)",
        {"type": loss_target, "nargs": "?", "const": "preset", "metavar": "L"},
        passed=True,
    ),
    Flag(
        "--token-budget",
        "with --to-loss: tokens after which the run stops, target not reached (default: the "
        "preset's)",
        {"type": positive, "metavar": "N"},
        passed=True,
    ),
    Flag(
        "--data",
        "training text (default: data/middlemarch.txt, downloaded once)",
        {"metavar": "PATH"},
        passed=True,
    ),
    Flag(
        "--results",
        "append one JSON record of this run (a measuring run: no epoch-end sample)",
        {"metavar": "FILE"},
    ),
    Flag(
        "--seed",
        "seed for weights and data order, 0 to 2**63-1 (default: 123)",
        {"type": seed, "default": 123, "metavar": "N"},
        passed=True,
    ),
    Flag(
        "--profile",
        f"after the timed window (without --max-steps: after the warm-up) profile N more steps "
        f"(default {PROFILE_STEPS}) with torch.profiler and record where their time goes "
        "(time_breakdown); profiled steps are never timed",
        {"type": positive, "nargs": "?", "const": PROFILE_STEPS, "metavar": "N"},
        passed=True,
    ),
    Flag(
        "--trace",
        "also write the profiled steps' Chrome/Perfetto trace into DIR (implies --profile)",
        {"metavar": "DIR"},
        passed=True,
    ),
    Flag(
        "--memory-snapshot",
        "CUDA: record the allocator's history of the training steps into FILE, the pickle "
        "pytorch.org/memory_viz draws (recording slows the steps)",
        {"metavar": "FILE"},
    ),
)


def add_step_flags(parser: argparse.ArgumentParser, passed_only: bool = False) -> None:
    """Every step flag (a step script's parser), or only those the sweep passes through to every
    step, their help saying so (the sweep's parser)."""
    for f in STEP_FLAGS:
        if f.passed or not passed_only:
            help = f"{f.help}; passed to each step" if passed_only else f.help
            parser.add_argument(f.name, help=help, **f.options)


def child_argv(values: dict) -> list[str]:
    """The passed-through flags with a value, as a step's command line: `--device auto ...`."""
    out = []
    for f in STEP_FLAGS:
        if f.passed and values.get(f.dest) is not None:
            out += [f.name, str(values[f.dest])]
    return out


def parse_args(doc: str | None, argv=None) -> argparse.Namespace:
    """The step flags; --help prints the step's docstring, whose run commands (the same in
    every file, so that they never show in a neighbour diff) say `<this file>`: the path the
    script was started by stands there."""
    if doc:
        doc = doc.replace("<this file>", shown_path(sys.argv[0]))
    p = Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_flags(p)
    args = p.parse_args(argv)
    try:
        check_name(args.preset)
    except UserError as e:
        fail(str(e))
    return args


def shown_path(script: str) -> str:
    """A script's path as a command line in the working folder would name it."""
    try:
        return os.path.relpath(script)
    except ValueError:  # Windows: another drive
        return script
