"""The flags every step script shares, and the wrapper that turns bad input into one line."""

import argparse
import sys
import traceback

import torch

from .errors import UserError, fail
from .presets import PRESETS


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
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


_positive, _non_negative = _int_at_least(1), _int_at_least(0)


def parse_args(doc: str | None, argv=None) -> argparse.Namespace:
    p = _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda", "mps"],
        default="auto",
        help="where to train (default: cuda, else mps, else cpu)",
    )
    p.add_argument(
        "--preset",
        metavar="NAME",
        help=f"one of {', '.join(PRESETS)} (default: gpt2-124m on CUDA, cpu elsewhere)",
    )
    p.add_argument(
        "--max-steps",
        type=_positive,
        metavar="N",
        help="stop after N optimizer steps, warm-up included, and skip the epoch-end "
        "sample (default: the preset's)",
    )
    p.add_argument("--epochs", type=_positive, metavar="N", help="epochs over the text")
    p.add_argument(
        "--warmup-steps",
        type=_non_negative,
        metavar="N",
        help="steps left out of the timed window (default: the preset's)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive,
        metavar="N",
        help="sequences per step and process (default: the preset's)",
    )
    p.add_argument(
        "--data",
        metavar="PATH",
        help="training text (default: data/middlemarch.txt, downloaded once)",
    )
    p.add_argument(
        "--results",
        metavar="FILE",
        help="append one JSON record of this run (a measuring run: no epoch-end sample)",
    )
    p.add_argument("--seed", type=int, default=123, help="seed for weights and data order")
    args = p.parse_args(argv)
    if args.preset is not None and args.preset not in PRESETS:
        fail(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    return args


def main(fn) -> None:
    """Run a step's main(): user errors and OOM become one line, a record and a non-zero exit."""
    from . import run as run_mod

    try:
        fn()
    except UserError as e:
        run_mod.record_failure("error", str(e))
        fail(str(e))
    except torch.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        run_mod.record_failure("oom", first)
        fail(f"out of memory: {first}", code=3)
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    except Exception as e:
        traceback.print_exc()
        run_mod.record_failure("error", f"{e.__class__.__name__}: {e}")
        sys.exit(1)
