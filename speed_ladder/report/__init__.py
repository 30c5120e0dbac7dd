"""Reading results back for people. It may import measure; it never imports speed_ladder.sweep.

Here, what the folders below read: summary.py (a tag's summary.csv, built from its records,
written and read back), rows.py (the cells every table, chart and page shows), by_hand.py (runs
started by hand beside a tag: never rows) and publish.py (`python -m speed_ladder publish`: a
checked tag added to results/, its charts and pages redrawn).

- checks/: whether results can be trusted (`python -m speed_ladder check`);
- charts/: the PNG charts;
- compare/: other results set beside a tag's (the published reference, the committed tag, a
  peer implementation's runs);
- pages/: the Markdown pages (the README's results and ladder table, each tag's page,
  LADDER.md) and plot_results.py's redraw of every chart and page.
"""
