"""Charts, the tags' pages and the README's results from the sweep's summaries (see --help):

    python plot_results.py [results/<tag> ...] [--no-readme] [--readme PATH] [--rebuild]

The command users run; the work is done in speed_ladder/report/pages/redraw.py.
"""

import sys

from speed_ladder.report.pages.redraw import main

if __name__ == "__main__":
    sys.exit(main())
