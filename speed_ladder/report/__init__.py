"""Reading results back for people: the summaries, the gains, the table rows, the charts,
the README's results, the tags' pages and LADDER.md, and the results validator (`python -m
speed_ladder check`). It may import measure; it never imports speed_ladder.sweep."""
