"""The Markdown the results are read in, and what writes it: the README's results (readme.py)
and its ladder table (ladder_table.py), each tag's page, results/<tag>/README.md
(tag_page.py), LADDER.md (ladder_page.py), and redraw.py, what `plot_results.py` runs: every
chart and page drawn again from the summaries."""
