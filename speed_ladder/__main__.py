"""python -m speed_ladder: the ladder's tools.

python -m speed_ladder run                          # every step, results/local/<tag>/ + charts
python -m speed_ladder run --steps 05-08 --repeats 3
python -m speed_ladder run --device cpu --preset tiny --max-steps 5 --data the-verdict.txt
python -m speed_ladder check results/<tag>          # a results folder validated (another machine's)
python -m speed_ladder publish                      # checked, results/local/<tag> into results/
python -m speed_ladder fit --memory 24GiB --nproc 2  # how large a model fits, rung by rung
"""

import argparse
import sys

from speed_ladder.errors import UserError, fail, pipe_safe
from speed_ladder.flags import Parser
from speed_ladder.report import fit_command, publish
from speed_ladder.report.checks import check
from speed_ladder.sweep import command as sweep_command


def main(argv=None) -> int:
    return pipe_safe(_main, argv)  # `--help | head`: a closed pipe is one line, not a traceback


def parser() -> Parser:
    """`python -m speed_ladder`'s command line: its commands and their flags."""
    p = Parser(
        prog="python -m speed_ladder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sweep_command.add_run_parser(sub)
    check.add_check_parser(sub)
    publish.add_publish_parser(sub)
    fit_command.add_fit_parser(sub)
    return p


def _main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    try:
        return args.func(args)
    except UserError as e:
        fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
