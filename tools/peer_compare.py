"""Print the peers against the ladder on the same machine (speed_ladder/report/compare/peers.py: how
the peer's records, tools/peer.py's, are set beside the runs of the rungs that train its model).

    python tools/peer_compare.py TAG_DIR
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from speed_ladder.ladder import rungs  # noqa: E402, F401 (tests read the rungs here)
from speed_ladder.report.compare.peers import compare, rungs_for  # noqa: E402, F401


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("tag_dir", type=Path, help="a results folder holding peer.jsonl and runs.jsonl")
    a = ap.parse_args(argv)
    try:
        lines, short = compare(a.tag_dir)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print(f"in short: {short}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
